"""JSON-lines reading after a kill: a cut-off last line is skipped and repaired, other damage is
one line naming the file and line."""

import json

import pytest

from meds_cli.core.errors import UserError
from meds_cli.core.jsonl import append_rows, drop_cut_off_tail, read_rows, rewrite_rows, split_rows

ROWS = [{"step": 1, "reward": 0.5}, {"step": 2, "reward": 0.75, "text": "é"}]


def written(tmp_path, tail: bytes = b""):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in ROWS) + tail)
    return path


@pytest.mark.parametrize("tail", [b'{"step": 3, "rew', b'{', b'{"step": 3, "text": "\xc3', b"  \n", b""])
def test_a_cut_off_last_line_is_skipped(tmp_path, tail):
    assert read_rows(written(tmp_path, tail)) == ROWS


def test_every_cut_of_a_row_reads_as_the_rows_before_it(tmp_path):
    full = json.dumps({"step": 3, "reward": 1.0, "text": "ü"}).encode() + b"\n"
    for cut in range(len(full)):
        rows = read_rows(written(tmp_path, full[:cut]))
        # a cut right before the newline leaves a whole row: kept
        assert rows == ROWS + ([json.loads(full)] if cut == len(full) - 1 else [])


def test_repair_then_append_starts_a_line_of_its_own(tmp_path):
    path = written(tmp_path, b'{"step": 3, "rew')
    assert drop_cut_off_tail(path) == ROWS
    append_rows(path, [{"step": 3}])
    assert read_rows(path) == ROWS + [{"step": 3}]
    assert path.read_bytes().endswith(b'{"step": 3}\n')


def test_a_whole_last_row_without_newline_gets_one(tmp_path):
    path = written(tmp_path, b'{"step": 3}')
    assert drop_cut_off_tail(path) == ROWS + [{"step": 3}]
    append_rows(path, [{"step": 4}])
    assert [r["step"] for r in read_rows(path)] == [1, 2, 3, 4]


@pytest.mark.parametrize("middle, what", [(b"garbage\n", "is not valid JSON"), (b"[1, 2]\n", "holds a list"),
                                          (b"\xff\xfe\n", "is not valid JSON")])
def test_damage_before_the_last_line_names_the_line(tmp_path, middle, what):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1}\n' + middle + b'{"step": 3}\n')
    with pytest.raises(UserError) as error:
        read_rows(path)
    assert f"{path} line 2 {what}" in str(error.value)


def test_missing_file_has_no_rows(tmp_path):
    assert read_rows(tmp_path / "none.jsonl") == []
    assert drop_cut_off_tail(tmp_path / "none.jsonl") == []


def test_rewrite_is_atomic_and_leaves_no_partial_file(tmp_path):
    path = written(tmp_path, b'{"cut')
    rewrite_rows(path, ROWS[:1])
    assert read_rows(path) == ROWS[:1]
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.jsonl"]


def test_split_rows_reports_where_the_whole_rows_end():
    data = b'{"a": 1}\n{"b": 2}\n{"c"'
    assert split_rows(data) == ([{"a": 1}, {"b": 2}], len(data) - 4)

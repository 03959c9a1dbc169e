"""Reading data files: a UTF-8 byte-order mark is fine, a bad line is counted where it is."""

import pytest

from benchmarks.data_files import Skipped, read_rows
from meds_cli.core.errors import UserError


def test_byte_order_mark_is_read_past(tmp_path):
    jsonl, listed = tmp_path / "a.jsonl", tmp_path / "b.json"
    jsonl.write_bytes(b'\xef\xbb\xbf{"problem": "p"}\n{"problem": "q"}\n')
    listed.write_bytes(b'\xef\xbb\xbf [{"problem": "p"}]')
    skipped = Skipped("a")
    assert [(r.index, r.where, r.data) for r in read_rows(jsonl, skipped)] == [
        (0, "line 1", {"problem": "p"}), (1, "line 2", {"problem": "q"})]
    assert skipped.total == 0
    assert [(r.index, r.where) for r in read_rows(listed, Skipped("b"))] == [(0, "row 0")]


def test_bad_lines_keep_the_numbering_of_the_good_ones(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"n": 0}\n\n{oops\n\xc3\x28\n{"n": 1}\n')
    skipped = Skipped(str(path))
    rows = read_rows(path, skipped)
    # Blank lines are not rows; a bad line still takes its place, so later rows keep their index.
    assert [(r.index, r.where, r.data) for r in rows] == [(0, "line 1", {"n": 0}), (3, "line 5", {"n": 1})]
    assert skipped.summary() == "1 not valid JSON (line 3), 1 not UTF-8 text (line 4)"


def test_summary_names_the_first_three_places():
    skipped = Skipped("x")
    for line in range(1, 6):
        skipped.add("without an answer", f"line {line}")
    assert skipped.summary() == "5 without an answer (line 1, line 2, line 3, ...)"


def test_folder_instead_of_a_file(tmp_path):
    with pytest.raises(UserError, match="is not a file"):
        read_rows(tmp_path, Skipped("x"))

"""Broken data files through the command line: one line and exit code 2 when nothing is usable,
a warning line and a note in the eval report when some rows are skipped."""

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from typer.testing import CliRunner

from meds_cli.app import app

ROOT = Path(__file__).resolve().parent.parent


def meds(*args, cwd):
    """`python -m meds_cli ...` in a fresh process, as a user runs it."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "meds_cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=300)


def assert_one_error_line(result):
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stdout + result.stderr
    return lines[0]


BROKEN_BENCHMARK = b'{"problem": "a", "answer": \n\xff\xfe\nnot json\n{"problem": "b"}\n'


def test_eval_with_an_unusable_benchmark_file(tmp_path):
    (tmp_path / "data" / "math500").mkdir(parents=True)
    (tmp_path / "data" / "math500" / "test.jsonl").write_bytes(BROKEN_BENCHMARK)
    result = meds("eval", "--model", "tiny-llama", "--benchmarks", "math500", "--data-dir", tmp_path / "data",
                  "--output", tmp_path / "out", cwd=tmp_path)
    line = assert_one_error_line(result)
    assert "math500/test.jsonl" in line
    assert ("no usable row: 2 not valid JSON (line 1, line 3), 1 not UTF-8 text (line 2), "
            "1 without an answer (line 4)") in line
    assert not (tmp_path / "out").exists()


def test_train_with_a_math_file_that_is_not_json(tmp_path):
    path = tmp_path / "broken.json"
    path.write_bytes(b'[{"problem": "p", "answer": "1"}')
    result = meds("train", "--task", "math", "--model", "tiny-llama", "--set", f"task.path={path}",
                  "--output", tmp_path / "run", cwd=tmp_path)
    line = assert_one_error_line(result)
    assert str(path) in line and "is not valid JSON (line 1, column 33" in line
    assert not (tmp_path / "run").exists()


def test_train_with_a_math_file_without_usable_rows(tmp_path):
    # In-process (the fresh-process path is the test above): the same one line, exit code 2;
    # tests/test_tasks.py goes through the other ways a file can be unusable.
    path = tmp_path / "broken.jsonl"
    path.write_bytes(b'{"problem": "caf\xe9", "answer": "1"}\n{"problem": "p"}\n')
    result = CliRunner().invoke(app, ["train", "--task", "math", "--model", "tiny-llama", "--set", f"task.path={path}",
                                      "--output", str(tmp_path / "run")])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    assert result.output.startswith("error: ") and str(path) in result.output
    assert "no usable row: 1 not UTF-8 text (line 1), 1 without an answer (line 2)" in " ".join(result.output.split())
    assert not (tmp_path / "run").exists()


def test_eval_skips_bad_rows_and_reports_them(tmp_path):
    rows = [{"problem": "compute 1+1", "answer": "2"}, b'{"problem": "cut', {"problem": "compute 2*3", "answer": None},
            {"problem": "compute 9-4", "answer": "5"}]
    (tmp_path / "math500").mkdir()
    (tmp_path / "math500" / "test.jsonl").write_bytes(
        b"".join((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n" for r in rows))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = CliRunner().invoke(app, ["eval", "--model", "tiny-llama", "--benchmarks", "math500", "--data-dir",
                                          str(tmp_path), "--output", str(tmp_path / "out"), "--k", "1", "--n", "1",
                                          "--max-new-tokens", "4", "-q"])
    finally:
        torch.set_num_threads(threads)
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "out" / "results.json").read_text())["benchmarks"]["math500"]["data"]
    assert data["skipped"] == {"not valid JSON": 1, "without an answer": 1} and data["problems"] == 2
    assert data["count_ok"] is False
    assert data["note"] == ("2 problems where math500 has 500; "
                            "skipped 2 of 4 rows: 1 not valid JSON (line 2), 1 without an answer (line 3)")
    output = " ".join(result.output.split())  # the table caption may wrap
    assert f"warning: math500: {data['note']}" in output

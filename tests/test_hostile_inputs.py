"""Every `meds` command under hostile input: a binary file, JSON of the wrong shape, a read-only
place, a full disk, a file where the output folder goes, the current folder as output. Each must
end in one line and exit code 2, with no traceback and nothing on disk changed.

Read-only and full places are faked (tests/hostile.py: tests run as root, which writes through
chmod); a real full tmpfs is used where `mount` works, for a run that fills its disk halfway."""

import errno
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from meds_cli.app import app
from meds_cli.engine.run_folders.checkpoint_store import all_steps, checkpoints_root
from tests.hostile import BINARY, WRONG_SHAPE, disk_state, refuse_writes_under

TINY = ["--set", "model.name=tiny-llama", "--set", "task.name=copy", "--set", "rollout.max_new_tokens=2",
        "--set", "rollout.prompts_per_step=2", "--set", "rollout.group_size=4", "--set", "model.lora.rank=4",
        "--set", "optim.warmup_steps=0", "--set", "train.checkpoint_every=1"]
ROWS = [{"problem": "compute 1+1", "answer": "2"}, {"problem": "compute 2*3", "answer": "6"}]
RESULTS = {"model": "m", "config": {}, "average": {},
           "benchmarks": {"math500": {"pass@k": {"1": 0.5}, "maj@k": {"1": 0.5}, "problems": 2}}}
EVAL = ["--benchmarks", "math500", "--k", "1", "--max-new-tokens", "2", "-q", "--data-dir", "{data}"]


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A folder with everything the commands read: a MEDS run with a checkpoint, benchmark data,
    two results files, hostile files, an existing file, and `place`, where writes get refused."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("world")
    result = invoke("train", *TINY, "--algo", "meds", "--steps", 1, "-q", "--output", root / "run")
    assert result.exit_code == 0, result.output
    (root / "data" / "math500").mkdir(parents=True)
    (root / "data" / "math500" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    for name in ("r1", "r2"):
        (root / f"{name}.json").write_text(json.dumps({**RESULTS, "model": name}))
    (root / "binary.bin").write_bytes(BINARY)
    (root / "wrong.json").write_text(WRONG_SHAPE)
    (root / "notes.txt").write_text("keep me\n")
    (root / "place").mkdir()
    (root / "place" / "keep.txt").write_text("keep me too\n")
    return root


# What each command writes, with OUT where the output goes.
WRITERS = {
    "train": ["train", *TINY, "--steps", "1", "-q", "--output", "OUT"],
    "eval": ["eval", "{root}/run", *EVAL, "--output", "OUT"],
    "eval --compare": ["eval", "--compare", "{root}/r1.json", "{root}/r2.json", "--output", "OUT"],
    "cluster-inspect": ["cluster-inspect", "{root}/run", "--output", "OUT"],
    "ablate": ["ablate", *TINY, "--steps", "1", "--features", "logits", "--no-baseline", "-q", "--k", "1",
               "--limit", "1", "--output", "OUT"],
    "export": ["export", "{root}/run", "--output", "OUT"],
}
# Files that are not what the command expects, in each place a command reads a user's file.
READERS = {
    "train -c": ["train", "-c", "FILE", "--steps", "1"],
    "ablate --grid": ["ablate", "--grid", "FILE", "--dry-run"],
    "eval --compare": ["eval", "--compare", "FILE", "{root}/r1.json"],
    "eval RUN": ["eval", "FILE", *EVAL],
    "cluster-inspect RUN": ["cluster-inspect", "FILE"],
    "export RUN": ["export", "FILE", "--output", "{root}/exported"],
}
PLACES = {"read-only": (errno.EROFS, "Read-only file system"), "full": (errno.ENOSPC, "No space left on device")}


def fill(args: list[str], root: Path, **names) -> list[str]:
    return [names.get(a, a).replace("{root}", str(root)).replace("{data}", str(root / "data")) for a in args]


def one_line(result) -> str:
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output  # an uncaught error exits 1
    errors = [line for line in lines if line.startswith("error:")]
    assert errors == lines[-1:], result.output
    return lines[-1]


@pytest.mark.parametrize("command", WRITERS)
@pytest.mark.parametrize("place", PLACES)
def test_a_place_that_refuses_writes(world, monkeypatch, command, place):
    code, reason = PLACES[place]
    before = disk_state(world)
    refuse_writes_under(world / "place", code, monkeypatch)
    line = one_line(invoke(*fill(WRITERS[command], world, OUT=str(world / "place" / "out"))))
    monkeypatch.undo()
    assert reason in line and str(world / "place") in line, line
    assert disk_state(world) == before


@pytest.mark.parametrize("command", WRITERS)
def test_an_existing_file_as_output(world, command):
    before = disk_state(world)
    line = one_line(invoke(*fill(WRITERS[command], world, OUT=str(world / "notes.txt"))))
    assert "notes.txt" in line, line
    assert disk_state(world) == before


@pytest.mark.parametrize("command", ["train", "export"])
def test_the_current_folder_as_output(world, monkeypatch, command):
    monkeypatch.chdir(world)  # holds files: a run or an export must not go there
    before = disk_state(world)
    one_line(invoke(*fill(WRITERS[command], world, OUT=".")))
    assert disk_state(world) == before


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("file", ["binary.bin", "wrong.json"])
def test_a_file_that_is_not_what_it_claims(world, reader, file):
    before = disk_state(world)
    line = one_line(invoke(*fill(READERS[reader], world, FILE=str(world / file))))
    assert file in line, line
    assert disk_state(world) == before


def test_every_command_ends_its_failures_in_one_line():
    """A command registered without the wrapper would let a full disk end in a traceback."""
    names = {info.name for info in app.registered_commands}
    assert {"train", "eval", "list", "cluster-inspect", "ablate", "export"} <= names
    for info in app.registered_commands:
        assert getattr(info.callback, "one_line_errors", False), info.name


@pytest.mark.parametrize("part, sets", [("samples", ["train.log_samples_every=1"]),
                                        ("tensorboard", ["train.report_to=tensorboard"])])
def test_a_full_disk_under_a_runs_logs_stops_it_resumably(tmp_path, monkeypatch, part, sets):
    if part == "tensorboard":
        pytest.importorskip("tensorboard")
    run = tmp_path / "run"
    refuse_writes_under(run / part, errno.ENOSPC, monkeypatch)
    extra = sum((["--set", s] for s in sets), [])
    line = one_line(invoke("train", *TINY, *extra, "--steps", 1, "-q", "--output", run))
    assert line == (f"error: disk full while writing '{run / part}' (No space left on device); the run has no "
                    f"checkpoint yet, so a resume starts it over from step 0: free some space, then run meds train "
                    f"--resume {run}")
    assert (run / "config.yaml").is_file() and not (run / ".lock").exists()


# ---------------------------------------------------------------- the user's reward functions

HOSTILE_REWARDS = """
def clears(prompts, completions, **kwargs):
    completions.clear()
    return []

def hangs(prompts, completions, **kwargs):
    while True:
        pass
"""


@pytest.mark.parametrize("function, sets, expected", [
    ("clears", [], "reward function '{file}:clears' returned 0 values for 8 responses"),
    ("hangs", ["reward.function_timeout_s=0.5"], "reward function '{file}:hangs' did not return within 0.5 s"),
])
def test_a_hostile_reward_function_stops_the_run_in_one_line(tmp_path, function, sets, expected):
    file = tmp_path / "rewards.py"
    file.write_text(HOSTILE_REWARDS)
    run = tmp_path / "run"
    extra = sum((["--set", s] for s in [f"reward.functions={file}:{function}", *sets]), [])
    line = one_line(invoke("train", *TINY, *extra, "--steps", 1, "-q", "--output", run))
    assert expected.format(file=file) in line, line
    assert (run / "config.yaml").is_file() and not (run / ".lock").exists()  # a run folder to resume, unlocked


# ---------------------------------------------------------------- a real full disk


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB tmpfs (root in CI can mount one); skipped where mounting is not allowed."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if shutil.which("mount") is None or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)],
                                                       capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def resize(disk: Path, size: str) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(disk)], check=True)


def leave_free(folder: Path, free: int) -> Path:
    """Fill the filesystem of `folder` until `free` bytes are left; returns the filler file."""
    filler = folder / "filler"
    stats = os.statvfs(folder)
    with filler.open("wb") as f:
        f.write(b"\0" * max(0, stats.f_bavail * stats.f_frsize - free))
    return filler


def test_a_disk_that_fills_up_mid_run_stops_it_resumably(small_disk):
    run = small_disk / "run"
    result = invoke("train", *TINY, "--algo", "grpo", "--steps", 1, "-q", "--output", run)
    assert result.exit_code == 0, result.output
    filler = leave_free(small_disk, 64 * 1024)  # room for a metrics line, not for a checkpoint
    line = one_line(invoke("train", "--resume", run, "--steps", 2, "-q"))
    assert line == (f"error: disk full while writing checkpoint 2 (No space left on device); the run can resume from "
                    f"checkpoint 1: free some space, then run meds train --resume {run}")
    assert [p.name for p in checkpoints_root(run).iterdir()] == ["step_1"]  # no half checkpoint, no temp folder
    filler.unlink()
    result = invoke("train", "--resume", run, "--steps", 2, "-q")
    assert result.exit_code == 0, result.output
    assert all_steps(run) == [1, 2]


def test_a_disk_that_fills_up_mid_eval_keeps_the_samples_for_the_rerun(world, small_disk):
    resize(small_disk, "12k")  # three pages: the eval's lock, its state file and part of its samples
    rows = [{"problem": f"compute {i}+1", "answer": str(i + 1)} for i in range(12)]
    (world / "data12" / "math500").mkdir(parents=True, exist_ok=True)
    (world / "data12" / "math500" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = small_disk / "eval"
    command = ["eval", world / "run", "--benchmarks", "math500", "--k", "2", "--max-new-tokens", "40", "-q",
               "--data-dir", world / "data12", "--output", out]
    line = one_line(invoke(*command))
    assert line == ("error: could not write the eval outputs (No space left on device); free some space (or choose a "
                    "place with room); then run the same command: it keeps the samples drawn so far")
    assert sorted(p.name for p in out.iterdir()) == ["eval_state.json", "samples.jsonl"]  # no half results.json
    before = (out / "samples.jsonl").read_bytes().splitlines()[:-1]  # the last line may be cut short
    resize(small_disk, "4m")
    result = invoke(*command)
    assert result.exit_code == 0, result.output
    after = (out / "samples.jsonl").read_bytes().splitlines()
    # The rerun kept what was drawn (but the last draw's rows, which may be incomplete) and drew the rest.
    assert len(before) >= 4 and sum(row in after for row in before) >= len(before) - 1
    results = json.loads((out / "results.json").read_text())
    assert len(after) == 24 and results["benchmarks"]["math500"]["problems"] == 12


def test_a_comparison_whose_write_fails_leaves_no_new_folder(world, tmp_path, monkeypatch):
    """The folder is made, then writing into it fails (a full disk after mkdir): the command ends in
    one line and removes the folder it created (core/files.output_folder)."""
    out = tmp_path / "new" / "cmp"
    refuse_writes_under(out / "compare.json", errno.ENOSPC, monkeypatch)
    result = invoke("eval", "--compare", world / "r1.json", world / "r2.json", "--output", out)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "No space left on device" in result.output
    assert not (tmp_path / "new").exists()

"""Faults of `meds train` / `eval` / `cluster-inspect` end in one clear line (exit 2, no
traceback) with nothing lost and nothing executed; resumes reach the weights of an uninterrupted
run. The tiny model on the copy task, a few steps each."""

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from meds_cli.app import app
from meds_cli.engine.run_folders import checkpoints as checkpoints_module
from meds_cli.engine.run_folders import run_dir as runs
from meds_cli.engine.run_folders.checkpoint_store import all_steps, checkpoint_path, write_manifest
from meds_cli.engine.run_folders.resume import RESUMES_FILE
from meds_cli.engine.run_folders.state_codec import load_state
from tests.cli_errors import one_error_line
from tests.hostile import plant

ROOT = Path(__file__).resolve().parent.parent
STEPS = 4
TRAIN = ["train", "--model", "tiny-llama", "--task", "copy", "--algo", "grpo", "-q",
         "--set", "rollout.max_new_tokens=2", "--set", "rollout.prompts_per_step=2", "--set", "rollout.group_size=4",
         "--set", "model.lora.rank=4", "--set", "optim.lr=0.01", "--set", "optim.warmup_steps=0"]


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def final_error_line(result) -> str:
    """A fault in the middle of a run: what the run printed so far, then one error line, exit 2."""
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert result.exit_code == 2, result.output
    assert [line for line in lines if line.startswith("error:")] == lines[-1:], result.output
    assert "Traceback" not in result.output
    return lines[-1]


def train(*args):
    return invoke(*TRAIN, *args)


def weights(run: Path, step: int) -> dict:
    return load_file(str(checkpoint_path(run, step) / "weights.safetensors"))


def same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and len(a) > 0 and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """An uninterrupted run of STEPS steps with a checkpoint after every step (all kept)."""
    torch.set_num_threads(1)  # set before the per-test fixture of conftest runs
    run = tmp_path_factory.mktemp("straight") / "run"
    result = invoke(*TRAIN, "--steps", STEPS, "--output", run, "--set", "train.checkpoint_every=1",
                    "--set", "train.keep_checkpoints=0")
    assert result.exit_code == 0, result.output
    assert all_steps(run) == [1, 2, 3, 4]
    return run


@pytest.fixture
def copy_of(straight, tmp_path):
    def make() -> Path:
        run = tmp_path / "run"
        shutil.copytree(straight, run)
        return run

    return make


def metrics_steps(run: Path) -> list[int]:
    return [row["step"] for row in runs.metrics_rows(run)]


# ---------------------------------------------------------------- resume: which checkpoint


def test_run_without_checkpoint_restarts_from_step_zero(straight, copy_of):
    run = copy_of()
    shutil.rmtree(run / "checkpoints")  # as if killed before its first checkpoint
    result = train("--resume", run)
    assert result.exit_code == 0, result.output
    assert "no checkpoint yet: starting it over from step 0" in result.output
    assert metrics_steps(run) == [1, 2, 3, 4]
    assert same_weights(weights(run, STEPS), weights(straight, STEPS))


def test_broken_newest_checkpoint_falls_back_and_says_so(straight, copy_of):
    run = copy_of()
    data = (checkpoint_path(run, 4) / "optimizer.safetensors").read_bytes()
    (checkpoint_path(run, 4) / "optimizer.safetensors").write_bytes(data[: len(data) // 3])
    (checkpoint_path(run, 3) / "rng_0.json").unlink()
    result = train("--resume", run)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "step_4 is unusable (optimizer.safetensors is cut short" in text and "using step 2" in text
    assert "step_3 is unusable (rng_0.json is missing); using step 2" in text
    assert metrics_steps(run) == [1, 2, 3, 4]
    assert same_weights(weights(run, STEPS), weights(straight, STEPS))


def test_resume_from_a_chosen_step(straight, copy_of):
    run = copy_of()
    result = train("--resume", run, "--step", 1)
    assert result.exit_code == 0, result.output
    assert metrics_steps(run) == [1, 2, 3, 4]
    assert same_weights(weights(run, STEPS), weights(straight, STEPS))
    assert json.loads((run / RESUMES_FILE).read_text())["checkpoint"] == "step_1"


def test_no_usable_checkpoint_is_one_line_and_its_advice_works(straight, copy_of):
    run = copy_of()
    for step in all_steps(run):
        (checkpoint_path(run, step) / "manifest.json").unlink()
    line = one_error_line(train("--resume", run))
    assert "no usable checkpoint" in line and f"delete {run / 'checkpoints'}" in line
    shutil.rmtree(run / "checkpoints")  # what the message says to do
    result = train("--resume", run)
    assert result.exit_code == 0, result.output
    assert same_weights(weights(run, STEPS), weights(straight, STEPS))


def test_missing_step_is_one_line(copy_of):
    line = one_error_line(train("--resume", copy_of(), "--step", 7))
    assert "no checkpoint at step 7; checkpoints: 1, 2, 3, 4" in line


def test_cut_off_metrics_line_never_breaks_resume_or_reports(straight, copy_of):
    run = copy_of()
    (checkpoint_path(run, 4) / "manifest.json").unlink()  # resume from 3 ...
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 5, "rew')  # ... after a kill in the middle of a metrics write
    assert metrics_steps(run) == [1, 2, 3, 4]  # every report reads the whole rows
    from meds_cli.commands.ablate_report import variant_result

    assert [step for step, _ in variant_result(run, run / "none.json")["reward_curve"]] == [1, 2, 3, 4]
    result = train("--resume", run)
    assert result.exit_code == 0, result.output
    assert metrics_steps(run) == [1, 2, 3, 4]
    assert (run / "metrics.jsonl").read_text().endswith("}\n")


def test_retention_keeps_the_newest_checkpoints(tmp_path):
    run = tmp_path / "run"
    result = train("--steps", 4, "--output", run, "--set", "train.checkpoint_every=1",
                   "--set", "train.keep_checkpoints=2")
    assert result.exit_code == 0, result.output
    assert all_steps(run) == [3, 4]
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]


# ---------------------------------------------------------------- resume: changed settings


@pytest.mark.parametrize("args, key, old, new", [
    (["--set", "model.lora.rank=8"], "model.lora.rank", "4", "8"),
    (["--algo", "dapo"], "algo.name", "'grpo'", "'dapo'"),
    (["--model", "smollm2-135m"], "model.name", "'tiny-llama'", "'smollm2-135m'"),
    (["--seed", "3"], "train.seed", "0", "3"),
    (["--set", "task.name=arithmetic"], "task.name", "'copy'", "'arithmetic'"),
])
def test_changes_a_checkpoint_cannot_take_are_refused(copy_of, args, key, old, new):
    run = copy_of()
    before = (run / "config.yaml").read_text()
    line = one_error_line(train("--resume", run, *args))
    assert f"cannot change {key}" in line and f"the run has {old}, this command gives {new}" in line
    assert (run / "config.yaml").read_text() == before and not (run / RESUMES_FILE).exists()


def test_world_size_change_is_refused(copy_of):
    run = copy_of()
    folder = checkpoint_path(run, 4)
    state = json.loads((folder / "state.json").read_text())
    (folder / "state.json").write_text(json.dumps({**state, "world_size": 2}))
    write_manifest(folder, step=4)
    line = one_error_line(train("--resume", run, "--steps", 5))
    assert "world size changed" in line and "written by 2 processes, this run has 1" in line


def test_changes_that_apply_are_applied_and_logged(copy_of):
    run = copy_of()
    result = train("--resume", run, "--steps", 5, "--set", "optim.lr=0.02", "--set", "eval.every=1",
                   "--set", "eval.problems=2")
    assert result.exit_code == 0, result.output
    assert "optim.lr 0.01 -> 0.02" in " ".join(result.output.split())
    row = json.loads((run / RESUMES_FILE).read_text())
    assert row["step"] == 4 and row["checkpoint"] == "step_4"
    assert (row["changes"]["optim.lr"] == {"from": 0.01, "to": 0.02}
            and row["changes"]["train.steps"] == {"from": 4, "to": 5})
    optimizer = load_state(checkpoint_path(run, 5), "optimizer")
    assert [group["lr"] for group in optimizer["param_groups"]] == [0.02]
    assert "eval/accuracy" in runs.metrics_rows(run)[-1]
    assert "lr: 0.02" in (run / "config.yaml").read_text()


# ---------------------------------------------------------------- the run folder


def test_second_train_on_a_running_folder_refuses_at_once(tmp_path):
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "meds_cli", *TRAIN, "--steps", "500", "--output", str(run),
           "--set", "train.checkpoint_every=0"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    first = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not runs.metrics_rows(run):
            time.sleep(0.2)
        assert runs.metrics_rows(run), "the first run never started"
        config = (run / "config.yaml").read_text()
        start = time.perf_counter()
        for args in (["--steps", 3, "--output", run], ["--resume", run]):
            line = one_error_line(train(*args))
            assert f"run folder '{run}' is in use by process {first.pid}" in line
        assert time.perf_counter() - start < 20  # refused before any model loads
        assert (run / "config.yaml").read_text() == config
        assert first.poll() is None  # the first run goes on
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    result = train("--resume", run, "--steps", 2)  # the lock died with its process
    assert result.exit_code == 0, result.output


def test_output_that_is_a_file(tmp_path):
    target = tmp_path / "notes.txt"
    target.write_text("keep me")
    assert "is a file, not a folder" in one_error_line(train("--steps", 1, "--output", target))
    assert "is a file, not a folder" in one_error_line(train("--steps", 1, "--output", target / "run"))
    assert target.read_text() == "keep me"


def test_output_in_a_read_only_place(tmp_path, monkeypatch):
    if os.geteuid() != 0:  # root writes anywhere: then only the simulated case below runs
        place = tmp_path / "ro"
        place.mkdir()
        place.chmod(0o500)
        try:
            line = one_error_line(train("--steps", 1, "--output", place / "run"))
            assert "could not create the run folder" in line and "Permission denied" in line
        finally:
            place.chmod(0o700)
    real_mkdir = Path.mkdir

    def read_only(self, *args, **kwargs):
        if self.name == "run":
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", read_only)
    line = one_error_line(train("--steps", 1, "--output", tmp_path / "run"))
    assert "could not create the run folder" in line and "Read-only file system" in line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("failing", ["state", "weights", "manifest"])
def test_full_disk_while_writing_a_checkpoint(tmp_path, monkeypatch, failing):
    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "checkpoint file")

    if failing == "state":  # after weights, adapter and the optimizer went out
        real = checkpoints_module.save_state
        monkeypatch.setattr(checkpoints_module, "save_state",
                            lambda state, folder, name: (no_space() if name == "scheduler"
                                                         else real(state, folder, name)))
    elif failing == "weights":
        monkeypatch.setattr("safetensors.torch.save_file", no_space)
    else:
        monkeypatch.setattr(checkpoints_module, "write_manifest", no_space)
    run = tmp_path / "run"
    line = final_error_line(train("--steps", 2, "--output", run, "--set", "train.checkpoint_every=1"))
    assert line == (f"error: disk full while writing checkpoint 1 (No space left on device); the run has no checkpoint "
                    f"yet, so a resume starts it over from step 0: free some space, then run meds train --resume {run}")
    assert list((run / "checkpoints").iterdir()) == []  # no half checkpoint, no .tmp folder
    assert not (run / ".lock").exists()
    monkeypatch.undo()
    result = train("--resume", run)  # once there is room again, the run goes on
    assert result.exit_code == 0, result.output
    assert all_steps(run) == [1, 2]


def test_full_disk_while_writing_metrics(tmp_path, monkeypatch):
    def no_space(self, row):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path))

    monkeypatch.setattr(runs.MetricsLog, "append", no_space)
    line = final_error_line(train("--steps", 1, "--output", tmp_path / "run"))
    assert "No space left on device" in line and "metrics.jsonl" in line


# ---------------------------------------------------------------- run folders are data, never code


def crafted_run(copy_of, tmp_path, target: str, *, update_manifest: bool = True):
    """A run whose checkpoint step_4 has `target` replaced by a pickle that would create a marker."""
    run = copy_of()
    marker = tmp_path / "executed"
    for step in (1, 2, 3):
        shutil.rmtree(checkpoint_path(run, step))  # nothing to fall back on
    plant(checkpoint_path(run, 4) / target, marker)
    if update_manifest:  # anyone can rewrite the manifest: it is no defence, the loader is
        write_manifest(checkpoint_path(run, 4), step=4)
    return run, marker


@pytest.mark.parametrize("target", ["optimizer.json", "optimizer.safetensors", "scheduler.json", "rng_0.json",
                                    "algorithm_0.json", "algorithm_0.safetensors", "weights.safetensors"])
def test_crafted_file_stops_resume_and_runs_nothing(copy_of, tmp_path, target):
    run, marker = crafted_run(copy_of, tmp_path, target)
    line = one_error_line(train("--resume", run, "--steps", 5))
    assert target in line
    assert not marker.exists()


def test_crafted_file_with_a_stale_manifest_is_refused_too(copy_of, tmp_path):
    run, marker = crafted_run(copy_of, tmp_path, "optimizer.json", update_manifest=False)
    line = one_error_line(train("--resume", run, "--steps", 5))
    assert "no usable checkpoint" in line and "optimizer.json" in line
    assert not marker.exists()


def test_old_pickle_checkpoints_are_never_unpickled(copy_of, tmp_path):
    run = copy_of()
    marker = tmp_path / "executed"
    folder = checkpoint_path(run, 4)
    for name in ("optimizer", "scheduler", "rng_0", "algorithm_0"):
        for suffix in (".json", ".safetensors"):
            (folder / f"{name}{suffix}").unlink()
        plant(folder / f"{name}.pt", marker)
    write_manifest(folder, step=4)
    line = one_error_line(train("--resume", run, "--steps", 5))
    assert "pickle files" in line and not marker.exists()
    line = one_error_line(invoke("cluster-inspect", run, "--step", 4))
    assert "pickle files" in line and not marker.exists()


@pytest.mark.parametrize("target", ["algorithm_0.json", "algorithm_0.safetensors"])
def test_crafted_memory_stops_cluster_inspect(copy_of, tmp_path, target):
    run, marker = crafted_run(copy_of, tmp_path, target)
    line = one_error_line(invoke("cluster-inspect", run))
    assert target in line and not marker.exists()


@pytest.mark.parametrize("target",
                         ["adapter/adapter_model.safetensors", "weights.safetensors", "adapter/adapter_model.bin"])
def test_crafted_weights_stop_eval(copy_of, tmp_path, target):
    run, marker = crafted_run(copy_of, tmp_path, target, update_manifest=False)
    if target.endswith(".bin"):  # peft would unpickle a .bin adapter if the safetensors one were gone
        (checkpoint_path(run, 4) / "adapter/adapter_model.safetensors").unlink()
    if target == "weights.safetensors":  # weights are used when the run has no adapter folder
        shutil.rmtree(checkpoint_path(run, 4) / "adapter")
    write_manifest(checkpoint_path(run, 4), step=4)
    data = tmp_path / "data"
    (data / "math500").mkdir(parents=True)
    (data / "math500" / "test.jsonl").write_text(json.dumps({"problem": "compute 1+1", "answer": "2"}) + "\n")
    line = one_error_line(invoke("eval", run, "--benchmarks", "math500", "--data-dir", data, "--k", "1",
                                 "--max-new-tokens", "2", "--backend", "hf", "-q"))
    expected = "adapters in pickle files are not loaded" if target.endswith(".bin") else Path(target).name
    assert expected in line and not marker.exists()

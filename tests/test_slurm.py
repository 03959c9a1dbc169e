"""`meds ablate --launcher slurm` against a real Slurm (marked slurm: `make test-slurm`, after
`sudo bash scripts/slurm_local.sh start`; skipped where sinfo reaches no cluster). The tiny model,
2 steps: a 2-variant x 2-seed grid through the real sbatch equal to the same grid run here
(`--collect` before and after, a rerun that submits nothing while the tasks run), a task killed
with scancel and a requeued one each resuming from its checkpoint and ending equal to an
uninterrupted run, a failing task named in the report while the other finishes, and every bad
setting one line before anything is submitted."""

import json
import shutil
import subprocess
import time

import pytest
from typer.testing import CliRunner

from meds_cli.app import app
from tests.test_ablate import TINY_SETS
from tests.test_launchers import report_rows, step_rows

pytestmark = pytest.mark.slurm
runner = CliRunner()


@pytest.fixture(autouse=True, scope="module")
def cluster():
    if shutil.which("sinfo") is None or subprocess.run(["sinfo"], capture_output=True).returncode != 0:
        pytest.skip("no Slurm cluster reachable here (sudo bash scripts/slurm_local.sh start)")


def ablate(folder, *extra, steps=2, features="logits,random"):
    sets = sum((["--set", s] for s in TINY_SETS), [])
    return runner.invoke(app, ["ablate", *sets, "--steps", str(steps), "--features", features, "--no-baseline",
                               "--output", str(folder), "--k", "2", "-q", *extra])


def job_id(output: str) -> str:
    return output.split("submitted Slurm job ")[1].split(":")[0]


def slurm_holds(job: str) -> bool:
    out = subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True)
    return bool(out.stdout.strip())


def wait_for(condition, timeout: float = 600, what: str = "") -> None:
    end = time.time() + timeout
    while not condition():
        assert time.time() < end, f"timed out waiting for {what}"
        time.sleep(0.2)


def flat(output: str) -> str:
    return " ".join(output.split())


def test_grid_through_sbatch_equals_the_same_grid_here(tmp_path):
    folder = tmp_path / "slurm"
    submitted = ablate(folder, "--launcher", "slurm", "--seeds", "0,1", "--no-wait")
    assert submitted.exit_code == 0, submitted.output
    job = job_id(submitted.output)
    assert f"squeue -j {job}" in submitted.output and "meds ablate --collect" in flat(submitted.output)
    script = (folder / "ablate.sbatch").read_text()
    assert "#SBATCH --array=0-3" in script and "features-random_seed-1" in script

    early = runner.invoke(app, ["ablate", "--collect", str(folder)])  # before: nothing has finished yet
    assert early.exit_code == 0, early.output
    assert "4 of 4 tasks not finished" in early.output and "no task has finished yet" in early.output
    assert "features-logits_seed-0: queued" in early.output or "features-logits_seed-0: running" in early.output

    again = ablate(folder, "--launcher", "slurm", "--seeds", "0,1")  # the tasks still run: nothing resubmitted
    assert again.exit_code == 0, again.output
    assert "nothing to submit; still queued or running from before" in flat(again.output)
    assert list(json.loads((folder / "slurm_jobs.json").read_text())) == [job]
    for name in ("features-logits_seed-0", "features-random_seed-1"):
        logs = list((folder / name).glob(f"slurm-{job}_*.out"))
        assert len(logs) == 1 and "meds: array task" in logs[0].read_text()

    after = runner.invoke(app, ["ablate", "--collect", str(folder)])
    assert after.exit_code == 0 and "not finished" not in after.output, after.output

    here = ablate(tmp_path / "here", "--seeds", "0,1")
    assert here.exit_code == 0, here.output
    assert report_rows(folder) == report_rows(tmp_path / "here")  # same seeds: the same numbers
    for name in ("features-logits_seed-0", "features-random_seed-1"):
        assert step_rows(folder / name) == step_rows(tmp_path / "here" / name)

    done = ablate(folder, "--launcher", "slurm", "--seeds", "0,1")  # all finished: nothing submitted
    assert done.exit_code == 0 and done.output.count("finished, skipped") == 4, done.output


def interrupted_then_finished(tmp_path, interrupt, *extra):
    """One task of 6 steps (a checkpoint every step), interrupted by `interrupt(job)` once its
    step-2 checkpoint is written; returns the task folder, the job id and the command's output."""
    folder = tmp_path / "slurm"
    submitted = ablate(folder, "--launcher", "slurm", "--no-wait", *extra, steps=6, features="logits")
    assert submitted.exit_code == 0, submitted.output
    job, run = job_id(submitted.output), folder / "features-logits"
    wait_for(lambda: (run / "checkpoints" / "step_2").is_dir(), what="the step-2 checkpoint")
    interrupt(job)
    return folder, run, job


def test_a_task_killed_with_scancel_resumes_when_resubmitted(tmp_path):
    folder, run, job = interrupted_then_finished(
        tmp_path, lambda job: subprocess.run(["scancel", job], check=True))
    wait_for(lambda: not slurm_holds(job), what="the cancelled job to leave the queue")
    assert not (run / "eval").exists()
    collected = runner.invoke(app, ["ablate", "--collect", str(folder)])
    assert "features-logits: unfinished: meds: stopped by Slurm (SIGTERM: scancel" in flat(collected.output), \
        collected.output

    resumed = ablate(folder, "--launcher", "slurm", steps=6, features="logits")  # resubmits the unfinished task
    assert resumed.exit_code == 0, resumed.output
    second = job_id(resumed.output)
    assert second != job and list(json.loads((folder / "slurm_jobs.json").read_text())) == [job, second]
    log = (run / f"slurm-{second}_0.out").read_text()
    assert "features-logits: resuming from step" in log

    whole = ablate(tmp_path / "here", steps=6, features="logits")
    assert whole.exit_code == 0, whole.output
    assert step_rows(run) == step_rows(tmp_path / "here" / "features-logits")
    assert report_rows(folder) == report_rows(tmp_path / "here")


def test_a_requeued_task_resumes_from_its_checkpoint(tmp_path):
    folder, run, job = interrupted_then_finished(
        tmp_path, lambda job: subprocess.run(["scontrol", "requeue", f"{job}_0"], check=True), "--requeue")
    assert "#SBATCH --requeue" in (folder / "ablate.sbatch").read_text()
    wait_for(lambda: (run / "eval" / "heldout" / "results.json").is_file(), what="the requeued task to finish")
    log = (run / f"slurm-{job}_0.out").read_text()
    assert "start 1 after requeues" in log and "features-logits: resuming from step" in log, log
    whole = ablate(tmp_path / "here", steps=6, features="logits")
    assert whole.exit_code == 0, whole.output
    assert step_rows(run) == step_rows(tmp_path / "here" / "features-logits")


def test_a_failing_task_is_named_while_the_other_finishes(tmp_path):
    grid = tmp_path / "grid.yaml"
    grid.write_text("variants:\n  - {name: ok, set: {meds.features: logits}}\n"
                    "  - {name: broken, set: {task.name: math, task.path: /no/such.jsonl}}\n")
    sets = sum((["--set", s] for s in TINY_SETS), [])
    result = runner.invoke(app, ["ablate", *sets, "--steps", "2", "--grid", str(grid), "--no-baseline", "--output",
                                 str(tmp_path / "abl"), "--k", "2", "-q", "--launcher", "slurm"])
    assert result.exit_code == 1, result.output
    assert "broken: failed: data file /no/such.jsonl not found" in flat(result.output)
    summary = json.loads((tmp_path / "abl" / "summary.json").read_text())
    assert [r["variant"] for r in summary["rows"]] == ["ok"]
    assert list((tmp_path / "abl" / "broken").glob("slurm-*_1.out"))  # its log stays


@pytest.mark.parametrize("options, message", [
    (["--slurm-partition", "gpu"], "--slurm-partition 'gpu' is not a partition of this cluster; sinfo knows: "
                                   "debug, short"),
    (["--slurm-partition", "short", "--slurm-time", "1:00:00"],
     "--slurm-time 1:00:00 is longer than partition 'short' allows (10 minutes)"),
    (["--slurm-gpus-per-task", "1"], "--slurm-gpus-per-task 1: partition 'debug' has no GPUs"),
    (["--slurm-cpus-per-task", "512"], "--slurm-cpus-per-task 512: the nodes of partition 'debug' have at most"),
])
def test_bad_settings_against_the_real_cluster(tmp_path, options, message):
    before = subprocess.run(["squeue", "-h"], capture_output=True, text=True).stdout
    result = ablate(tmp_path / "abl", "--launcher", "slurm", *options)
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and message in lines[0], result.output
    assert not (tmp_path / "abl").exists()
    assert subprocess.run(["squeue", "-h"], capture_output=True, text=True).stdout == before  # nothing submitted


def test_multi_node_train_on_one_node_two_cpu_processes_resumes_after_a_requeue(tmp_path):
    run = tmp_path / "run"
    sets = sum((["--set", s] for s in TINY_SETS), [])
    result = runner.invoke(app, ["train", *sets, "--steps", "4", "--launcher", "slurm", "--nodes", "1",
                                 "--processes-per-node", "2", "--requeue", "--output", str(run)])
    assert result.exit_code == 0, result.output
    job = job_id(result.output)
    assert (run / "train.sbatch").is_file() and (run / "config.yaml").is_file()
    wait_for(lambda: (run / "checkpoints" / "step_2").is_dir(), what="the step-2 checkpoint")
    subprocess.run(["scontrol", "requeue", job], check=True)
    wait_for(lambda: not slurm_holds(job), what="the requeued job to end")
    log = (run / f"slurm-{job}.out").read_text()
    assert "start 0 after requeues: meds train --config" in log
    assert f"start 1 after requeues: meds train --resume {run}" in log and "resumed" in log, log
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4]
    # two processes in one gloo group wrote the checkpoints
    assert json.loads((run / "checkpoints" / "step_4" / "state.json").read_text())["world_size"] == 2


def test_gpus_where_the_partition_has_none_is_one_line_for_train(tmp_path):
    sets = sum((["--set", s] for s in TINY_SETS), [])
    result = runner.invoke(app, ["train", *sets, "--launcher", "slurm", "--gpus-per-node", "8",
                                 "--output", str(tmp_path / "run")])
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and "--gpus-per-node 8: partition 'debug' has no GPUs" in lines[0]
    assert not (tmp_path / "run").exists()


def test_an_ablation_folder_with_a_space_runs_through_a_real_sbatch(tmp_path):
    """Issue 43: a space in the folder once ended in `sbatch: error: Invalid directive found in batch
    script`; the #SBATCH values are quoted now, and Slurm reads them whole."""
    folder = tmp_path / "my grid"
    result = ablate(folder, "--launcher", "slurm", steps=1, features="logits")
    assert result.exit_code == 0, result.output
    assert (folder / "features-logits" / "eval" / "heldout" / "results.json").is_file()
    assert list((folder / "features-logits").glob("slurm-*_0.out"))  # the log went where --output said

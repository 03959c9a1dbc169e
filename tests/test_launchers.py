"""Launchers (meds_cli/engine/launchers): Slurm time limits and sinfo read by hand-made examples,
every bad launcher setting as one line before anything is written or submitted, the sbatch
script a person reads, the thread and GPU share of `--jobs N`, and (slow) `--jobs 2` equal to the
same grid in this process, with a failing task named in the report while the other finishes.
The runs through the real Slurm are in tests/test_slurm.py."""

import json
import math
import subprocess

import pytest
from typer.testing import CliRunner

from meds_cli.app import app
from meds_cli.core.errors import UserError
from meds_cli.engine.launchers import slurm_settings
from meds_cli.engine.launchers.local import task_environment, thread_share
from meds_cli.engine.launchers.slurm_array import render_array_script
from meds_cli.engine.launchers.slurm_settings import SlurmSettings
from meds_cli.engine.launchers.tasks import Task
from tests.test_ablate import TINY_SETS

runner = CliRunner()


def test_slurm_time_forms():
    # sbatch --time: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS
    assert slurm_settings.time_minutes("30") == 30
    assert slurm_settings.time_minutes("10:30") == 10.5  # 10 min 30 s
    assert slurm_settings.time_minutes("4:00:00") == 240
    assert slurm_settings.time_minutes("1:02:30") == 62.5  # 60 + 2 + 0.5
    assert slurm_settings.time_minutes("1-12") == 2160  # 1440 + 12 * 60
    assert slurm_settings.time_minutes("2-01:30") == 2970  # 2880 + 60 + 30
    assert slurm_settings.time_minutes("0-00:00:30") == 0.5
    assert slurm_settings.time_minutes("INFINITE") == math.inf and slurm_settings.time_minutes("unlimited") == math.inf
    for bad in ("4h", "1:2:3:4", "", "-5", "1-"):
        with pytest.raises(ValueError):
            slurm_settings.time_minutes(bad)


SINFO = """debug*|infinite|(null)|2
short|10:00|(null)|2
gpu|1-00:00:00|gpu:a100:8(S:0-1)|64
gpu|1-00:00:00|(null)|128
"""


def test_partitions_from_sinfo():
    parts = slurm_settings.parse_partitions(SINFO)
    assert parts["debug"] == slurm_settings.Partition("debug", True, math.inf, False, 2)
    assert parts["short"] == slurm_settings.Partition("short", False, 10, False, 2)
    # two node kinds in one partition: GPUs on some nodes, the larger node's CPUs
    assert parts["gpu"] == slurm_settings.Partition("gpu", False, 1440, True, 128)


@pytest.mark.parametrize("settings, message", [
    (SlurmSettings(partition="debg"), "--slurm-partition 'debg' is not a partition of this cluster (did you mean "
                                      "'debug'?); sinfo knows: debug, short, gpu"),
    (SlurmSettings(partition="short", time="30"), "--slurm-time 30 is longer than partition 'short' allows "
                                                  "(10 minutes)"),
    (SlurmSettings(time="2-00"), None),  # debug, the default partition, has no limit
    (SlurmSettings(gpus_per_task=1), "--slurm-gpus-per-task 1: partition 'debug' has no GPUs"),
    (SlurmSettings(partition="gpu", gpus_per_task=1, time="12:00:00"), None),
    (SlurmSettings(cpus_per_task=4), "--slurm-cpus-per-task 4: the nodes of partition 'debug' have at most 2 CPUs"),
])
def test_settings_against_the_cluster(settings, message):
    parts = slurm_settings.parse_partitions(SINFO)
    if message is None:
        slurm_settings.check_against_cluster(settings, parts)
        return
    with pytest.raises(UserError) as caught:
        slurm_settings.check_against_cluster(settings, parts)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


@pytest.mark.parametrize("settings, message", [
    (SlurmSettings(time="4h"), "--slurm-time '4h' is not a Slurm time limit"),
    (SlurmSettings(mem="lots"), "--slurm-mem 'lots' is not a Slurm memory size"),
    (SlurmSettings(max_parallel=0), "--slurm-max-parallel 0: give 1 or more"),
    (SlurmSettings(cpus_per_task=0), "--slurm-cpus-per-task 0: give 1 or more"),
    (SlurmSettings(extra=["qos"]), "--slurm-extra 'qos' is not KEY=VALUE"),
])
def test_bad_forms(settings, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(")):
        slurm_settings.check_settings(settings)


def ablate(folder, *extra):
    sets = sum((["--set", s] for s in TINY_SETS), [])
    return runner.invoke(app, ["ablate", *sets, "--steps", "2", "--features", "logits,random", "--no-baseline",
                               "--output", str(folder), "--k", "2", "-q", *extra])


def one_line(result) -> str:
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    return lines[0]


def test_no_sbatch_is_one_line_before_anything(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch (nor anything else) on PATH
    line = one_line(ablate(tmp_path / "abl", "--launcher", "slurm"))
    assert "sbatch, which is not on PATH" in line and "--launcher local" in line and "slurm_local.sh" in line
    assert not (tmp_path / "abl").exists()


@pytest.mark.parametrize("options, message", [
    (["--launcher", "kubernetes"], "--launcher 'kubernetes' is not a launcher; accepted: local, slurm"),
    (["--jobs", "0"], "--jobs 0: give the number of tasks to run at once, 1 or more"),
    (["--slurm-time", "1:00:00"], "the --slurm-* options need --launcher slurm"),
    (["--launcher", "slurm", "--jobs", "2"], "--jobs is for --launcher local"),
    (["--no-wait"], "--no-wait needs --launcher slurm"),
    (["--launcher", "slurm", "--slurm-time", "soon"], "--slurm-time 'soon' is not a Slurm time limit"),
])
def test_bad_launcher_options_are_one_line(tmp_path, options, message):
    line = one_line(ablate(tmp_path / "abl", *options))
    assert message in line
    assert not (tmp_path / "abl").exists()


def test_collect_of_a_folder_that_is_no_ablation(tmp_path):
    line = one_line(runner.invoke(app, ["ablate", "--collect", str(tmp_path)]))
    assert f"'{tmp_path}' is not an ablation folder (no tasks.json in it)" in line


def test_the_array_script_reads_and_parses(tmp_path):
    tasks = [Task(name, tmp_path / name, ["python", "-m", "meds_cli", "ablate-task", str(tmp_path / name)])
             for name in ("a_seed-0", "b c")]
    settings = SlurmSettings(partition="gpu", time="4:00:00", gpus_per_task=1, cpus_per_task=8, mem="64G",
                             account="lab", max_parallel=1, extra=["qos=high"], requeue=True)
    script = render_array_script(tasks, tmp_path, settings, tmp_path)
    for line in ("#SBATCH --array=0-1%1", "#SBATCH --partition=gpu", "#SBATCH --time=4:00:00",
                 "#SBATCH --gpus-per-task=1", "#SBATCH --cpus-per-task=8", "#SBATCH --mem=64G",
                 "#SBATCH --account=lab", "#SBATCH --qos=high", "#SBATCH --requeue",
                 f"    0) TASK={tmp_path}/a_seed-0 ;;", f"    1) TASK='{tmp_path}/b c' ;;",
                 f"    1) COMMAND=(python -m meds_cli ablate-task '{tmp_path}/b c') ;;"):
        assert line in script, line
    assert 'exec >>"$TASK/slurm-${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}.out" 2>&1' in script
    (tmp_path / "s.sbatch").write_text(script)
    assert subprocess.run(["bash", "-n", str(tmp_path / "s.sbatch")]).returncode == 0
    assert "#SBATCH --no-requeue" in render_array_script(tasks, tmp_path, SlurmSettings(), tmp_path)


def test_dry_run_prints_the_script_and_submits_nothing(tmp_path):
    result = ablate(tmp_path / "abl", "--launcher", "slurm", "--dry-run", "--slurm-max-parallel", "1")
    assert result.exit_code == 0, result.output
    assert "#SBATCH --array=0-1%1" in result.output and "features-random" in result.output
    assert not (tmp_path / "abl").exists()


def test_threads_and_gpus_of_parallel_tasks():
    assert thread_share(2, 2) == 1 and thread_share(4, 16) == 4 and thread_share(3, 2) == 1
    env = task_environment(slot=9, jobs=16, cores=64, gpus=8, base={"A": "1"})
    assert env == {"A": "1", "OMP_NUM_THREADS": "4", "CUDA_VISIBLE_DEVICES": "1"}  # slot 9 of 8 GPUs: GPU 1
    assert "CUDA_VISIBLE_DEVICES" not in task_environment(0, 2, 2, 0, {})


def step_rows(run):
    """metrics.jsonl without the timings: what two runs of one config must agree on."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if "time" not in k and not k.endswith("_s")} for row in rows]


def report_rows(folder):
    rows = json.loads((folder / "summary.json").read_text())["rows"]
    return [{k: v for k, v in row.items() if "time" not in k} for row in rows]


@pytest.mark.slow
def test_jobs_2_equals_this_process_and_names_a_failing_task(tmp_path):
    grid = tmp_path / "grid.yaml"
    grid.write_text("axes:\n  meds.features: [logits, random]\n"
                    "variants:\n  - {name: broken, set: {task.name: math, task.path: /no/such.jsonl}}\n")
    parallel = ablate(tmp_path / "parallel", "--jobs", "2", "--grid", str(grid))
    assert parallel.exit_code == 1, parallel.output
    text = " ".join(parallel.output.split())
    assert "running 3 tasks, 2 at once on this machine (1 CPU threads each)" in text
    assert "broken_seed" not in text and "broken: failed: data file /no/such.jsonl not found" in text
    assert "1 tasks failed (broken)" in text
    summary = json.loads((tmp_path / "parallel" / "summary.json").read_text())
    assert [r["variant"] for r in summary["rows"]] == ["features-logits", "features-random"]
    assert summary["unfinished"] == {"broken": {"state": "failed", "last_line": "data file /no/such.jsonl not found"}}
    assert "- broken: failed: data file /no/such.jsonl not found" in (tmp_path / "parallel" / "summary.md").read_text()
    assert (tmp_path / "parallel" / "broken" / "task.log").stat().st_size > 0
    here = ablate(tmp_path / "here")
    assert here.exit_code == 0, here.output
    assert report_rows(tmp_path / "parallel") == report_rows(tmp_path / "here")
    for name in ("features-logits", "features-random"):
        assert step_rows(tmp_path / "parallel" / name) == step_rows(tmp_path / "here" / name)


def train(*options):
    sets = sum((["--set", s] for s in TINY_SETS), [])
    return runner.invoke(app, ["train", *sets, "--steps", "2", *options])


def test_multi_node_train_script(tmp_path):
    result = train("--launcher", "slurm", "--nodes", "2", "--processes-per-node", "2", "--output",
                   str(tmp_path / "run"), "--requeue", "--slurm-time", "1-00", "--dry-run")
    assert result.exit_code == 0, result.output
    script = result.stdout  # the script; the "dry run: would create ..." line goes to stderr
    assert "dry run: would create" in result.output
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --requeue", "#SBATCH --time=1-00",
                 f"#SBATCH --output={tmp_path}/run/slurm-%j.out", "export ACCELERATE_USE_CPU=1",
                 'export MAIN_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
                 '    ARGS=(train --resume "$RUN")'):
        assert line in script, line
    assert ("--multi_gpu --num_machines $SLURM_NNODES --machine_rank $SLURM_NODEID --num_processes "
            "$((SLURM_NNODES * 2)) --main_process_ip $MAIN_ADDR --main_process_port $MAIN_PORT") in script
    (tmp_path / "train.sbatch").write_text(script)
    assert subprocess.run(["bash", "-n", str(tmp_path / "train.sbatch")]).returncode == 0
    assert not (tmp_path / "run").exists()
    gpus = train("--launcher", "slurm", "--nodes", "4", "--gpus-per-node", "8", "--dry-run")
    assert "#SBATCH --gpus-per-node=8" in gpus.output and "ACCELERATE_USE_CPU" not in gpus.output
    assert "$((SLURM_NNODES * 8))" in gpus.output


@pytest.mark.parametrize("options, message", [
    (["--nodes", "2"], "--nodes, --gpus-per-node, --processes-per-node, --server-nodes, --requeue and the "
                       "--slurm-* options need --launcher slurm"),
    (["--server-nodes", "1"], "--server-nodes, --requeue and the --slurm-* options need --launcher slurm"),
    (["--launcher", "slurm", "--nodes", "0"], "--nodes 0: give 1 or more"),
    (["--launcher", "slurm", "--gpus-per-node", "8", "--processes-per-node", "2"],
     "--processes-per-node 2 with --gpus-per-node 8: a node runs one process per GPU"),
    (["--launcher", "slurm", "--slurm-time", "1 day"], "--slurm-time '1 day' is not a Slurm time limit"),
    (["--launcher", "slurm", "--resume", "runs/x"], "--launcher slurm starts a new run"),
    (["--launcher", "lsf"], "--launcher 'lsf' is not a launcher; accepted: local, slurm"),
])
def test_bad_train_launch_options_are_one_line(tmp_path, options, message):
    line = one_line(train("--output", str(tmp_path / "run"), *options))
    assert message in line
    assert not (tmp_path / "run").exists()


def test_train_without_sbatch_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    line = one_line(train("--launcher", "slurm", "--output", str(tmp_path / "run")))
    assert "sbatch, which is not on PATH" in line
    assert not (tmp_path / "run").exists()


def test_a_grid_files_slurm_section_under_the_flags(tmp_path):
    grid = tmp_path / "grid.yaml"
    grid.write_text("axes:\n  meds.features: [logits]\n"
                    "slurm: {partition: short, time: '5', cpus-per-task: 2, extra: {qos: high}, requeue: true}\n")
    result = ablate(tmp_path / "abl", "--grid", str(grid), "--launcher", "slurm", "--dry-run",
                    "--slurm-time", "8", "--slurm-extra", "constraint=x")
    assert result.exit_code == 0, result.output
    for line in ("#SBATCH --partition=short", "#SBATCH --time=8", "#SBATCH --cpus-per-task=2", "#SBATCH --qos=high",
                 "#SBATCH --constraint=x", "#SBATCH --requeue"):
        assert line in result.stdout, line
    assert ablate(tmp_path / "abl", "--grid", str(grid), "--dry-run").exit_code == 0  # a local run ignores it
    grid.write_text("slurm: {partitions: gpu}\n")
    line = one_line(ablate(tmp_path / "abl", "--grid", str(grid), "--dry-run"))
    assert "unknown slurm key 'partitions' (did you mean 'partition'?)" in line

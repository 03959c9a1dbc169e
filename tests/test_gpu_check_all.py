"""scripts/gpu_check_all.py (`make gpu-check`): the rows it plans for a machine's GPUs, command
lines that meds and accelerate accept (checked with --dry-run on CPU), the table's parts, and
one line with exit code 2 where no GPU is visible."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from meds_cli.app import app
from tests.script_module import load_script

ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURE = ROOT / "configs" / "gpu_check" / "qwen2.5-math-1.5b"


def runner_module():
    return load_script("gpu_check_all")


def _plan(gpus):
    return runner_module().plan(gpus, "/venv/bin/python", ARCHITECTURE, Path("/tmp/gpu-check"))


TWO_GPU_ROWS = ["vLLM tensor parallel 2", "vllm-server, LoRA, server on GPU 2 of 2",
                "vllm-server, full weights over NCCL"]


def test_rows_in_order_and_the_two_gpu_rows_skipped_on_one():
    names = [row.name for row in _plan(1)]
    assert names == ["gpu_check.py, 1.5B architecture", "hf engine", "vLLM colocated, sleep level 1",
                     "vLLM colocated, sleep level 2", "LoRA, vLLM adapter sync", "FSDP2 on every GPU",
                     "vLLM tensor parallel 2", "hf-worker, k=1 off-policy", "vllm-server, LoRA, server on GPU 2 of 2",
                     "vllm-server, full weights over NCCL"]
    assert {row.name: row.skip for row in _plan(1) if row.skip} == \
        {name: "skipped: needs 2 GPUs, this machine has 1" for name in TWO_GPU_ROWS}
    assert [row.name for row in _plan(2)] == names and not any(row.skip for row in _plan(2))
    assert all(row.time_limit_s > 0 for row in _plan(2))


def test_the_server_and_worker_rows_run_what_their_names_say():
    rows = {row.name: row.argv for row in _plan(2)}
    worker = rows["hf-worker, k=1 off-policy"]
    assert "rollout.engine=hf-worker" in worker and "rollout.max_staleness=1" in worker
    assert worker[1:3] == ["-m", "meds_cli"]  # one training process
    for name in TWO_GPU_ROWS[1:]:
        argv = rows[name]
        assert {"rollout.engine=vllm-server", "rollout.server.start=true", "rollout.server.gpus=1"} <= set(argv)
        assert argv[1:3] == ["-m", "meds_cli"]  # one training process on GPU 1 of 2, the server on GPU 2
    assert "model.lora.enabled=true" in rows[TWO_GPU_ROWS[1]] and "rollout.vllm.sync=adapter" in rows[TWO_GPU_ROWS[1]]
    assert "model.lora.enabled=false" in rows[TWO_GPU_ROWS[2]]


def test_fsdp2_runs_one_process_per_gpu_under_accelerate():
    fsdp = next(row for row in _plan(8) if row.name.startswith("FSDP2"))
    argv = fsdp.argv
    assert argv[:3] == ["/venv/bin/python", "-m", "accelerate.commands.launch"]
    assert argv[argv.index("--num_processes") + 1] == "8" and "train.sharding=fsdp2" in argv
    assert "rollout.prompts_per_step=8" in argv
    # prompts divide over the processes
    three = next(row for row in _plan(3) if row.name.startswith("FSDP2")).argv
    assert "rollout.prompts_per_step=6" in three and "rollout.hf.generation_batch_size=48" in three


def test_the_launchers_accept_their_arguments():
    from accelerate.commands.launch import launch_command_parser
    from torch.distributed.run import get_args_parser

    launched = [row for row in _plan(2) if "accelerate.commands.launch" in row.argv]
    assert [row.name for row in launched] == ["FSDP2 on every GPU", "vLLM tensor parallel 2"]
    for row in launched:
        args = launch_command_parser().parse_args(row.argv[3:])
        assert args.multi_gpu and args.num_processes == 2 and args.module
    # one GPU: FSDP2 still needs a process group, of one process
    fsdp = next(row for row in _plan(1) if row.name.startswith("FSDP2"))
    assert fsdp.argv[1:3] == ["-m", "torch.distributed.run"]
    args = get_args_parser().parse_args(fsdp.argv[3:])
    assert args.standalone and args.nproc_per_node == "1" and args.module and args.training_script == "meds_cli"


def test_every_meds_command_line_is_accepted(tmp_path):
    """Each run's arguments after `-m meds_cli`, with --dry-run: the config loads and validates
    (model.name is the architecture folder, whose config.json is all a dry run reads)."""
    cli = CliRunner()
    for row in _plan(2)[1:]:
        args = row.argv[row.argv.index("meds_cli") + 1:]
        args[args.index("--output") + 1] = str(tmp_path / "run")
        result = cli.invoke(app, [*args, "--dry-run"])
        assert result.exit_code == 0, (row.name, result.output[-2000:])
        assert "dry run: nothing was loaded" in result.output
        assert "rollout.min_new_tokens=256" in args and f"model.name={ARCHITECTURE}" in args


def test_first_error_line_finds_what_went_wrong():
    first = runner_module().first_error_line
    assert first("loading\nerror: rollout.engine=vllm needs the vllm package\n", 1) == \
        "error: rollout.engine=vllm needs the vllm package"
    traceback = "Traceback (most recent call last):\n  File \"x.py\", line 1\n" \
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    assert first(traceback, 1) == "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert first("something odd\nlast words\n", 3) == "last words"
    assert first("", -9) == "exit code -9"


def test_memory_speed_and_table():
    module = runner_module()
    assert module.gpu_memory_mib("1024\n81559\n") == [1024, 81559]
    # gpu_check.py's step table (its own header and column order)
    stdout = ("Qwen2.5-Math-1.5B architecture, ...\n"
              "step  generate s  score s  train s  total s  gen tok/s  train tok/s  resp len\n"
              "   1        4.29     0.00     1.92     6.48       14.9        199.9       8.0\n"
              "   2        1.95     0.00     4.45     6.46       35.1         86.4       8.0\n"
              "peak GPU memory: 30.0 GiB allocated\n")
    assert module.check_tokens_per_s(stdout) == pytest.approx((14.9 + 35.1) / 2)
    results = [module.Result("hf engine", "passed", 31.25, 812.4),
               module.Result("vLLM tensor parallel 2", "error: needs the vllm package")]
    lines = module.table(results).splitlines()
    assert lines[0].split()[:2] == ["setup", "result"] and len(lines) == 3
    assert lines[1].startswith("hf engine") and lines[1].split()[-2:] == ["31.2", "812"]
    assert lines[2].split()[-2:] == ["-", "-"] and "error: needs the vllm package" in lines[2]


def test_run_speed_is_the_mean_of_the_steps(tmp_path):
    module = runner_module()
    assert module.run_tokens_per_s(tmp_path) is None
    rows = [{"step": 1, "tokens_per_s": 100.0}, {"step": 2, "tokens_per_s": 300.0}, {"event": "eval"}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert module.run_tokens_per_s(tmp_path) == 200.0


def test_without_a_gpu_it_says_so_in_one_line_and_exits_2():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check_all.py")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert done.stdout.splitlines() == [runner_module().NO_GPU] and done.stderr == ""


def test_vllm_rows_are_skipped_without_vllm_and_skips_count_as_passed():
    module = runner_module()
    rows = module.plan(2, "/venv/bin/python", ARCHITECTURE, Path("/tmp/gpu-check"), vllm=False)
    skipped = [row.name for row in rows if row.skip]
    assert skipped == ["vLLM colocated, sleep level 1", "vLLM colocated, sleep level 2", "LoRA, vLLM adapter sync",
                       *TWO_GPU_ROWS]  # the hf-worker row runs without vLLM
    assert all(row.skip == "skipped: vLLM not installed" for row in rows if row.skip)
    result = module.run_row(next(row for row in rows if row.skip), env={})
    assert result.outcome == "skipped: vLLM not installed" and result.peak_gib is None
    assert module.counts_as_passed("passed") and module.counts_as_passed(result.outcome)
    assert not module.counts_as_passed("timed out after 100 s")


def test_the_kits_limits_fit_its_budget_and_the_tiny_plan_runs_on_cpu():
    module = runner_module()
    kit = module.plan(1, "/venv/bin/python", ARCHITECTURE, Path("/tmp/gpu-check"), tokenizer="/kit/tokenizer",
                      limits=module.KIT_LIMITS_S, vllm=False)
    assert {row.name: row.time_limit_s for row in kit if not row.skip} == \
        {"gpu_check.py, 1.5B architecture": 180, "hf engine": 100, "FSDP2 on every GPU": 120}
    assert next(row.skip for row in kit if row.name == "hf-worker, k=1 off-policy") == module.NOT_IN_KIT
    # the rows one H200 without vLLM runs, plus about a minute of install and model building, in 8 minutes
    assert sum(row.time_limit_s for row in kit if not row.skip) + 60 <= 480
    assert kit[0].argv[-2:] == ["--tokenizer", "/kit/tokenizer"] and "--tiny" not in kit[0].argv
    tiny = module.plan(1, "/venv/bin/python", ARCHITECTURE, Path("/tmp/gpu-check"), tiny=True)
    assert "--tiny" in tiny[0].argv
    hf = next(row for row in tiny if row.name == "hf engine").argv
    assert "rollout.max_new_tokens=8" in hf and "train.mixed_precision=no" in hf and "train.steps=2" in hf
    assert not next(row for row in tiny if row.name == "hf-worker, k=1 off-policy").skip  # runs on the CPU too


def test_a_row_past_its_limit_is_stopped_with_its_children(tmp_path):
    """A launcher's workers are stopped with it: a child that would outlive the row writes a file."""
    module = runner_module()
    marker = tmp_path / "child-lived"
    (tmp_path / "child.py").write_text(f"import time\ntime.sleep(3)\nopen({str(marker)!r}, 'w').write('x')\n")
    (tmp_path / "row.py").write_text(f"import subprocess, sys, time\n"
                                     f"subprocess.Popen([sys.executable, {str(tmp_path / 'child.py')!r}])\n"
                                     f"print('started', flush=True)\ntime.sleep(60)\n")
    code, stdout, _ = module.run_limited([sys.executable, str(tmp_path / "row.py")], dict(os.environ), limit_s=1)
    assert code is None and stdout.strip() == "started"
    import time

    time.sleep(4)
    assert not marker.exists()


def test_a_row_that_fell_back_says_so_in_the_table():
    """One GPU under train.sharding=fsdp2 trains unsharded (the first H200 run): its row must not read
    a plain "passed", and the note counts even where rich wrapped it over two lines."""
    module = runner_module()
    wrapped = ("note: train.sharding=fsdp2 with one process has nothing to shard; training \n"
               "unsharded\nrun-5: step 1 -> 2")
    assert module.passed_outcome(wrapped) == "passed (1 process: not sharded)"
    assert module.counts_as_passed(module.passed_outcome(wrapped))
    assert module.passed_outcome("run-1: step 1 -> 2\nsharded over 2 processes") == "passed"

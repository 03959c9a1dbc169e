"""`meds train --launcher slurm --server-nodes 1` (commands/slurm_server_node.py, the script of
engine/launchers/slurm_train.py): the script text (bash -n, the server's command and environment,
the URL and port, training on the other nodes), the script run by bash with stand-ins for
`scontrol`, `srun` and Python on three made-up nodes (the server on the first, the machine ranks
of the other two, the URL they are given, the server stopped at the end; a hostile run folder
runs nothing), and each refusal in one line with nothing created. A real Slurm here has one
node, which a 2-node script cannot be submitted to, so no test goes through sbatch."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from meds_cli.app import app
from meds_cli.commands.slurm_server_node import server_dtype, server_node
from meds_cli.engine.config import load_config
from meds_cli.engine.launchers.slurm_settings import SlurmSettings
from meds_cli.engine.launchers.slurm_train import render_train_script
from tests.test_ablate import TINY_SETS
from tests.test_launchers import one_line

ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURE = ROOT / "configs" / "gpu_check" / "qwen2.5-math-1.5b"  # config.json only: all a submission reads
SERVER_SETS = [*TINY_SETS, f"model.name={ARCHITECTURE}", "rollout.engine=vllm-server", "rollout.server.start=true",
               "rollout.server.port=8123"]


def submit(*options, sets=SERVER_SETS):
    return CliRunner().invoke(app, ["train", *sum((["--set", s] for s in sets), []), "--launcher", "slurm",
                                    *options])


def test_the_dry_run_script_serves_on_the_first_node_and_trains_on_the_others(tmp_path):
    result = submit("--nodes", "3", "--gpus-per-node", "8", "--server-nodes", "1", "--output",
                    str(tmp_path / "run"), "--dry-run")
    assert result.exit_code == 0, result.output
    script = result.stdout
    (tmp_path / "train.sbatch").write_text(script)
    assert subprocess.run(["bash", "-n", str(tmp_path / "train.sbatch")]).returncode == 0
    for line in ("#SBATCH --nodes=3", "#SBATCH --gpus-per-node=8", "SERVER_NODE=${NODES[0]}",
                 'TRAIN_NODES=("${NODES[@]:1}")', "export MAIN_ADDR=${TRAIN_NODES[0]}",
                 'SERVER_URL="http://$SERVER_NODE:"8123',
                 'ARGS+=(--set "rollout.server.url=$SERVER_URL" --set rollout.server.start=false)',
                 'srun --kill-on-bad-exit=1 --nodes "$TRAIN_NNODES" --ntasks "$TRAIN_NNODES" -w "$TRAIN_NODELIST" '):
        assert line in script, line
    server = next(line for line in script.splitlines() if line.startswith("srun --nodes 1"))
    assert server.startswith('srun --nodes 1 --ntasks 1 -w "$SERVER_NODE" env VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 '
                             "VLLM_SERVER_DEV_MODE=1 ")
    assert f"-m vllm.entrypoints.openai.api_server --model {ARCHITECTURE} --host 0.0.0.0 --port 8123" in server
    assert "--enable-lora --max-lora-rank 8" in server and "--dtype bfloat16" in server
    assert server.endswith('>> "$RUN/vllm-server.log" 2>&1 &') and f"RUN={tmp_path}/run\n" in script
    assert "--num_machines $TRAIN_NNODES --machine_rank $MACHINE_RANK --num_processes $((TRAIN_NNODES * 8))" in script
    assert "trap 'kill \"$SERVER_STEP\"" in script
    assert not (tmp_path / "run").exists()


FAKE_SLURM = {
    "scontrol": '#!/bin/bash\necho "$3" | tr , "\\n"\n',
    # srun: the command once per node of -w with SLURMD_NODENAME set; one node: exec'd, so a signal reaches it
    "srun": '#!/bin/bash\nnodes=""\nwhile [[ $1 == -* ]]; do case $1 in -w) nodes=$2; shift 2;; '
            '--nodes|--ntasks) shift 2;; *) shift;; esac; done\n'
            'if [[ $nodes != *,* ]]; then SLURMD_NODENAME=$nodes exec "$@"; fi\n'
            'for n in ${nodes//,/ }; do SLURMD_NODENAME=$n "$@"; done\n',
    # python: the server records and waits to be stopped; anything else (accelerate launch) waits for the
    # server's line, as the trainer waits for /health, then records
    "python": '#!/bin/bash\nif [[ "$*" == *vllm.entrypoints* ]]; then\n'
              '  echo "server on $SLURMD_NODENAME dev=$VLLM_SERVER_DEV_MODE lora=$VLLM_ALLOW_RUNTIME_LORA_UPDATING: $*"'
              ' >> "$LOG"\n'
              '  trap \'echo "server stopped" >> "$LOG"; exit 0\' TERM\n  while true; do sleep 0.1; done\nfi\n'
              'for i in $(seq 100); do grep -q "^server on" "$LOG" 2>/dev/null && break; sleep 0.1; done\n'
              'echo "train on $SLURMD_NODENAME: $*" >> "$LOG"\n',
}


@pytest.mark.parametrize("folder", ["run", "my run's \"x\" $(touch ran) `touch ran`;x"])
def test_the_script_run_by_bash_places_server_and_training_and_stops_the_server(tmp_path, folder):
    bin_dir, marker, log = tmp_path / "bin", tmp_path / "ran", tmp_path / "calls.log"
    bin_dir.mkdir()
    for name, text in FAKE_SLURM.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    run = tmp_path / folder
    run.mkdir()
    cfg = load_config(overrides=SERVER_SETS)
    script = render_train_script(run, nodes=3, gpus_per_node=4, processes_per_node=4, settings=SlurmSettings(),
                                 python=str(bin_dir / "python"), workdir=tmp_path,
                                 server=server_node(cfg, 4, python=str(bin_dir / "python")))
    (tmp_path / "train.sbatch").write_text(script)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "LOG": str(log),
           "SLURM_JOB_NODELIST": "n0,n1,n2", "SLURM_JOB_ID": "77", "SLURM_NNODES": "3"}
    done = subprocess.run(["bash", str(tmp_path / "train.sbatch")], env=env, capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    calls = log.read_text().splitlines()
    server = [c for c in calls if c.startswith("server on")]
    trained = [c for c in calls if c.startswith("train on")]
    assert len(server) == 1 and server[0].startswith("server on n0 dev=1 lora=1:") and "--port 8123" in server[0]
    assert [c.split(":")[0] for c in trained] == ["train on n1", "train on n2"]
    for rank, line in enumerate(trained):
        assert f"--num_machines 2 --machine_rank {rank} --num_processes 8 --main_process_ip n1" in line
        assert "--set rollout.server.url=http://n0:8123 --set rollout.server.start=false" in line
        assert f"--config {run}/config.yaml --output {run}" in line  # the folder read whole
    assert calls[-1] == "server stopped" and not marker.exists()
    assert (run / "vllm-server.log").is_file()  # the server's output in the run folder, whatever its name


@pytest.mark.parametrize("options, sets, message", [
    (["--nodes", "1", "--server-nodes", "1"], SERVER_SETS,
     "--server-nodes 1 with --nodes 1 leaves no node to training: give --nodes 2 or more"),
    (["--nodes", "3", "--server-nodes", "2"], SERVER_SETS, "--server-nodes 2: give 0 or 1"),
    (["--nodes", "2", "--server-nodes", "1"], [*TINY_SETS, f"model.name={ARCHITECTURE}"],
     "--server-nodes 1 runs the vLLM server of rollout.engine=vllm-server; this run's rollout.engine is hf"),
    (["--nodes", "2", "--server-nodes", "1"], [*SERVER_SETS, "model.lora.enabled=false"],
     "full weights (no LoRA, or rollout.vllm.sync=merged) to another node are not built"),
    (["--nodes", "2", "--server-nodes", "1"], [*SERVER_SETS, "rollout.vllm.sync=merged"],
     "full weights (no LoRA, or rollout.vllm.sync=merged) to another node are not built"),
    (["--nodes", "2", "--server-nodes", "1"],
     [*SERVER_SETS, "rollout.server.start=false", "rollout.server.url=http://h:1"],
     "set rollout.server.start=true, not rollout.server.url (http://h:1)"),
    (["--nodes", "2", "--server-nodes", "1"], [*SERVER_SETS, "rollout.server.gpus=1"],
     "with --server-nodes 1 the server has its node's GPUs: drop rollout.server.gpus"),
])
def test_bad_server_node_settings_are_one_line_with_nothing_made(tmp_path, options, sets, message):
    line = one_line(submit(*options, "--output", str(tmp_path / "run"), "--dry-run", sets=sets))
    assert message in line
    assert not (tmp_path / "run").exists()


def test_the_servers_dtype_follows_what_training_will_compute_in():
    def cfg(*sets):
        return load_config(overrides=[*SERVER_SETS, *sets])

    def auto(*sets):
        return cfg("rollout.vllm.dtype=auto", *sets)

    assert server_dtype(auto(), gpus_per_node=8) == "bfloat16"  # mixed_precision auto on GPUs: bf16
    assert server_dtype(auto(), gpus_per_node=0) == "auto"  # on CPUs the trainer decides when it starts
    assert server_dtype(auto("train.mixed_precision=fp16"), 8) == "float16"
    assert server_dtype(auto("train.mixed_precision=no"), 8) == "auto"  # the checkpoint's own
    assert server_dtype(cfg("rollout.vllm.dtype=float32", "train.mixed_precision=fp16"), 8) == "float32"

"""One training run over several nodes on Slurm: the sbatch script `meds train --launcher slurm`
writes into the run folder (<run>/train.sbatch), as TRL's and verl's Slurm examples do it: one
`srun` task per node, each starting `accelerate launch` for that node's processes, the main
node's address and a port taken from Slurm's environment, and the run folder on the shared path.
The first start trains from the folder's config.yaml; a requeued job (preemption, node failure)
finds the run's command.txt and resumes from the last checkpoint, as `meds train --resume` does.

With a server node (`--server-nodes 1`, rollout.engine=vllm-server) the first node of the
allocation runs `vllm serve` (serve_command's argv and the environment it needs, written by the
command), as a background `srun` step of one task pinned to that node; training runs on the other
nodes, told `rollout.server.url=http://<that node>:<port>` and `rollout.server.start=false`, and
the server step is stopped when the script ends (an EXIT trap), however training ended."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

from meds_cli.engine.launchers.script_text import comment, directive, output_directive, shell_word
from meds_cli.engine.launchers.slurm_settings import SlurmSettings, sbatch_lines

SCRIPT = "train.sbatch"
SERVER_LOG = "vllm-server.log"
MAIN_PORT = "export MAIN_PORT=$((20000 + SLURM_JOB_ID % 10000))\n"  # the main node's port, from the job id
ALL_NODES_TRAIN = ("# The main node (machine rank 0) and its port, from Slurm's environment.\n"
                   'export MAIN_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)\n' + MAIN_PORT)


@dataclass(frozen=True)
class ServerNode:
    """The vLLM server on a node of its own: its command line (listening on every interface),
    its port and the environment variables it needs."""

    argv: list[str]
    port: int
    env: dict[str, str] = field(default_factory=dict)


def _server_lines(server: ServerNode) -> str:
    """The script's lines that split the nodes, start the server in the background on the first
    and stop it at exit (after RUN is set); every value through script_text."""
    variables = " ".join(shell_word("a server variable", f"{k}={v}") for k, v in server.env.items())
    serve = " ".join(shell_word("the server's command", word) for word in server.argv)
    port = shell_word("rollout.server.port", server.port)
    return f"""# The first node runs the vLLM server, the others train (machine rank: a node's place among them).
NODES=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))
SERVER_NODE=${{NODES[0]}}
TRAIN_NODES=("${{NODES[@]:1}}")
export TRAIN_NNODES=${{#TRAIN_NODES[@]}}
export TRAIN_NODELIST=$(IFS=,; echo "${{TRAIN_NODES[*]}}")
export MAIN_ADDR=${{TRAIN_NODES[0]}}
{MAIN_PORT}SERVER_URL="http://$SERVER_NODE:"{port}
srun --nodes 1 --ntasks 1 -w "$SERVER_NODE" env {variables} {serve} >> "$RUN/{SERVER_LOG}" 2>&1 &
SERVER_STEP=$!
trap 'kill "$SERVER_STEP" 2>/dev/null || true; wait "$SERVER_STEP" 2>/dev/null || true' EXIT
echo "meds: vLLM server on $SERVER_NODE ($SERVER_URL, log $RUN/{SERVER_LOG}); training on $TRAIN_NODELIST"
"""


def render_train_script(run_dir: Path, *, nodes: int, gpus_per_node: int, processes_per_node: int,
                        settings: SlurmSettings, python: str, workdir: Path, server: ServerNode | None = None) -> str:
    """The run's sbatch script; every value through script_text (checked, quoted), so a control
    character in the run folder's path (--output, train.output_dir, train.runs_root, train.tag)
    or anywhere else is one line before anything is made. `server`: the vLLM server on the
    first node (the module docstring), training on the other nodes - 1."""
    run_dir = run_dir.resolve()
    where = "the run folder (--output, train.output_dir, or train.runs_root and train.tag)"
    output = output_directive(where, run_dir, "slurm-%j.out")  # first: its errors name the run folder
    run = shell_word(where, run_dir)
    gpu_line = [directive("gpus-per-node", gpus_per_node)] if gpus_per_node else []
    training_nodes = nodes - (1 if server else 0)
    total = training_nodes * processes_per_node
    # Several processes: torch.distributed.run (accelerate's --multi_gpu launcher); on CPUs it needs
    # ACCELERATE_USE_CPU=1 to join them in a gloo group (accelerate's --cpu launcher starts one process).
    mode = "--multi_gpu" if total > 1 else ("--cpu" if not gpus_per_node else "")
    cpu = "" if gpus_per_node else "export ACCELERATE_USE_CPU=1  # no GPUs: processes join a gloo group on the CPU\n"
    machines, rank = "$SLURM_NNODES", "$SLURM_NODEID"
    if server:  # the step's own node ids are not the training nodes' ranks: each finds its place among them
        machines, rank = "$TRAIN_NNODES", "$MACHINE_RANK"
    launch = (f"{shell_word('the Python path', python)} -m accelerate.commands.launch {mode} "
              f"--num_machines {machines} "
              f"--machine_rank {rank} --num_processes $(({machines.lstrip('$')} * {processes_per_node})) "
              f"--main_process_ip $MAIN_ADDR --main_process_port $MAIN_PORT --mixed_precision no --dynamo_backend no "
              f'-m meds_cli "$@"').replace("  ", " ")
    if server:
        launch = ('MACHINE_RANK=0; for n in ${TRAIN_NODELIST//,/ }; do [[ $n == "$SLURMD_NODENAME" ]] && break; '
                  'MACHINE_RANK=$((MACHINE_RANK + 1)); done; ' + launch)
    served = " and its vLLM server on a node of its own" if server else ""
    header = "\n".join([
        comment(f"meds train: one run on {training_nodes} node(s) x {processes_per_node} processes "
                f"({gpus_per_node or 'no'} GPUs a node){served},"),
        comment(f"run folder {run_dir}. Written by `meds train --launcher slurm`; by hand: sbatch "
                f"{shlex.quote(str(run_dir / SCRIPT))}"),
        directive("job-name", f"meds-{run_dir.name}", where),
        directive("nodes", nodes), directive("ntasks-per-node", 1), *gpu_line, *sbatch_lines(settings),
        output, directive("open-mode", "append")])
    nodes_lines = _server_lines(server) if server else ALL_NODES_TRAIN
    to_server = ('ARGS+=(--set "rollout.server.url=$SERVER_URL" --set rollout.server.start=false)\n'
                 if server else "")
    training_step = ('--nodes "$TRAIN_NNODES" --ntasks "$TRAIN_NNODES" -w "$TRAIN_NODELIST" ' if server else "")
    return f"""#!/bin/bash
{header}
set -euo pipefail
{cpu}RUN={run}
{nodes_lines}# First start: train from the run folder's config. After a requeue: resume from the last checkpoint.
if [[ -f "$RUN/command.txt" ]]; then
    ARGS=(train --resume "$RUN")
else
    ARGS=(train --config "$RUN/config.yaml" --output "$RUN" --launched)
fi
{to_server}echo "meds: job $SLURM_JOB_ID on $SLURM_JOB_NODELIST (main $MAIN_ADDR:$MAIN_PORT), \\
start ${{SLURM_RESTART_COUNT:-0}} after requeues: meds ${{ARGS[*]}}"
cd {shell_word('the working folder', workdir)}
# One task per node; each starts accelerate launch for its node's processes (single quotes: each node's own
# SLURM_NODEID).
srun --kill-on-bad-exit=1 {training_step}bash -c {shlex.quote(launch)} meds "${{ARGS[@]}}"
"""

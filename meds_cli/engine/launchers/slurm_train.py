"""One training run over several nodes on Slurm: the sbatch script `meds train --launcher slurm`
writes into the run folder (<run>/train.sbatch), as TRL's and verl's Slurm examples do it: one
`srun` task per node, each starting `accelerate launch` for that node's processes, the main
node's address and a port taken from Slurm's environment, and the run folder on the shared path.
The first start trains from the folder's config.yaml; a requeued job (preemption, node failure)
finds the run's command.txt and resumes from the last checkpoint, as `meds train --resume` does."""

from __future__ import annotations

import shlex
from pathlib import Path

from meds_cli.engine.launchers.script_text import comment, directive, output_directive, shell_word
from meds_cli.engine.launchers.slurm_settings import SlurmSettings, sbatch_lines

SCRIPT = "train.sbatch"


def render_train_script(run_dir: Path, *, nodes: int, gpus_per_node: int, processes_per_node: int,
                        settings: SlurmSettings, python: str, workdir: Path) -> str:
    """The run's sbatch script; every value through script_text (checked, quoted), so a control
    character in the run folder's path (--output, train.output_dir, train.runs_root, train.tag)
    or anywhere else is one line before anything is made."""
    run_dir = run_dir.resolve()
    where = "the run folder (--output, train.output_dir, or train.runs_root and train.tag)"
    output = output_directive(where, run_dir, "slurm-%j.out")  # first: its errors name the run folder
    run = shell_word(where, run_dir)
    gpu_line = [directive("gpus-per-node", gpus_per_node)] if gpus_per_node else []
    total = nodes * processes_per_node
    # Several processes: torch.distributed.run (accelerate's --multi_gpu launcher); on CPUs it needs
    # ACCELERATE_USE_CPU=1 to join them in a gloo group (accelerate's --cpu launcher starts one process).
    mode = "--multi_gpu" if total > 1 else ("--cpu" if not gpus_per_node else "")
    cpu = "" if gpus_per_node else "export ACCELERATE_USE_CPU=1  # no GPUs: processes join a gloo group on the CPU\n"
    launch = (f"{shell_word('the Python path', python)} -m accelerate.commands.launch {mode} "
              "--num_machines $SLURM_NNODES "
              f"--machine_rank $SLURM_NODEID --num_processes $((SLURM_NNODES * {processes_per_node})) "
              f"--main_process_ip $MAIN_ADDR --main_process_port $MAIN_PORT --mixed_precision no --dynamo_backend no "
              f'-m meds_cli "$@"').replace("  ", " ")
    header = "\n".join([
        comment(f"meds train: one run on {nodes} node(s) x {processes_per_node} processes "
                f"({gpus_per_node or 'no'} GPUs a node),"),
        comment(f"run folder {run_dir}. Written by `meds train --launcher slurm`; by hand: sbatch "
                f"{shlex.quote(str(run_dir / SCRIPT))}"),
        directive("job-name", f"meds-{run_dir.name}", where),
        directive("nodes", nodes), directive("ntasks-per-node", 1), *gpu_line, *sbatch_lines(settings),
        output, directive("open-mode", "append")])
    return f"""#!/bin/bash
{header}
set -euo pipefail
# The main node (machine rank 0) and its port, from Slurm's environment.
export MAIN_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MAIN_PORT=$((20000 + SLURM_JOB_ID % 10000))
{cpu}RUN={run}
# First start: train from the run folder's config. After a requeue: resume from the last checkpoint.
if [[ -f "$RUN/command.txt" ]]; then
    ARGS=(train --resume "$RUN")
else
    ARGS=(train --config "$RUN/config.yaml" --output "$RUN" --launched)
fi
echo "meds: job $SLURM_JOB_ID on $SLURM_JOB_NODELIST (main $MAIN_ADDR:$MAIN_PORT), start ${{SLURM_RESTART_COUNT:-0}} \\
after requeues: meds ${{ARGS[*]}}"
cd {shell_word('the working folder', workdir)}
# One task per node; each starts accelerate launch for its node's processes (single quotes: each node's own
# SLURM_NODEID).
srun --kill-on-bad-exit=1 bash -c {shlex.quote(launch)} meds "${{ARGS[@]}}"
"""

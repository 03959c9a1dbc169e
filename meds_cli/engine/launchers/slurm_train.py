"""One training run over several nodes on Slurm: the sbatch script `meds train --launcher slurm`
writes into the run folder (<run>/train.sbatch), as TRL's and verl's Slurm examples do it: one
`srun` task per node, each starting `accelerate launch` for that node's processes, the main
node's address and a port taken from Slurm's environment, and the run folder on the shared path.
The first start trains from the folder's config.yaml; a requeued job (preemption, node failure)
finds the run's command.txt and resumes from the last checkpoint, as `meds train --resume` does."""

from __future__ import annotations

import shlex
from pathlib import Path

from meds_cli.engine.launchers.slurm_settings import SlurmSettings, sbatch_lines

SCRIPT = "train.sbatch"


def render_train_script(run_dir: Path, *, nodes: int, gpus_per_node: int, processes_per_node: int,
                        settings: SlurmSettings, python: str, workdir: Path) -> str:
    run_dir = run_dir.resolve()
    run = shlex.quote(str(run_dir))
    gpu_line = [f"#SBATCH --gpus-per-node={gpus_per_node}"] if gpus_per_node else []
    total = nodes * processes_per_node
    # Several processes: torch.distributed.run (accelerate's --multi_gpu launcher); on CPUs it needs
    # ACCELERATE_USE_CPU=1 to join them in a gloo group (accelerate's --cpu launcher starts one process).
    mode = "--multi_gpu" if total > 1 else ("--cpu" if not gpus_per_node else "")
    cpu = "" if gpus_per_node else "export ACCELERATE_USE_CPU=1  # no GPUs: processes join a gloo group on the CPU\n"
    launch = (f"{shlex.quote(python)} -m accelerate.commands.launch {mode} --num_machines $SLURM_NNODES "
              f"--machine_rank $SLURM_NODEID --num_processes $((SLURM_NNODES * {processes_per_node})) "
              f"--main_process_ip $MAIN_ADDR --main_process_port $MAIN_PORT --mixed_precision no --dynamo_backend no "
              f"-m meds_cli \"$@\"").replace("  ", " ")
    return f"""#!/bin/bash
# meds train: one run on {nodes} node(s) x {processes_per_node} processes ({gpus_per_node or 'no'} GPUs a node),
# run folder {run_dir}. Written by `meds train --launcher slurm`; by hand: sbatch {shlex.quote(str(run_dir / SCRIPT))}
#SBATCH --job-name=meds-{run_dir.name}
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node=1
{chr(10).join(gpu_line + sbatch_lines(settings))}
#SBATCH --output={run_dir}/slurm-%j.out
#SBATCH --open-mode=append
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
cd {shlex.quote(str(workdir))}
# One task per node; each starts accelerate launch for its node's processes (single quotes: each node's own
# SLURM_NODEID).
srun --kill-on-bad-exit=1 bash -c '{launch}' meds "${{ARGS[@]}}"
"""

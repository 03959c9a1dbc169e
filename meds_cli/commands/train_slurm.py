"""`meds train --launcher slurm`: one run over --nodes N nodes, submitted as the sbatch script of
meds_cli/engine/launchers/slurm_train.py. The run folder is made here, on the shared path, with
the resolved config.yaml and train.sbatch in it; the job trains from them (every node starts
`accelerate launch`), and a requeued job resumes from the last checkpoint. With --server-nodes 1
the first node runs the run's vLLM server instead (slurm_server_node.py). Bad settings are one
line before anything is created or submitted."""

from __future__ import annotations

import sys
from pathlib import Path

from meds_cli.core.errors import UserError
from meds_cli.core.markup import plain
from meds_cli.engine.config import dump_yaml
from meds_cli.engine.launchers.slurm_settings import SlurmSettings, check_before_submit, check_settings, sbatch_submit
from meds_cli.engine.launchers.slurm_train import SCRIPT, render_train_script
from meds_cli.engine.run_folders import run_dir as runs

PREPARED = ("config.yaml", SCRIPT, "slurm-*.out")  # what the run folder holds before the job starts training


def processes_of(nodes: int, gpus_per_node: int, processes_per_node: int | None) -> int:
    """Processes a node runs: one per GPU, or --processes-per-node on CPUs (default 1)."""
    if nodes < 1:
        raise UserError(f"--nodes {nodes}: give 1 or more")
    if gpus_per_node < 0:
        raise UserError(f"--gpus-per-node {gpus_per_node}: give 0 (CPUs) or more")
    if processes_per_node is not None and processes_per_node < 1:
        raise UserError(f"--processes-per-node {processes_per_node}: give 1 or more")
    if gpus_per_node and processes_per_node not in (None, gpus_per_node):
        raise UserError(f"--processes-per-node {processes_per_node} with --gpus-per-node {gpus_per_node}: a node "
                        "runs one process per GPU; --processes-per-node is for CPU runs")
    return gpus_per_node or processes_per_node or 1


def unprepare(run_dir: Path, existed: bool) -> None:
    """Take back what a submission that failed made (its config.yaml and script, the folder where
    it made it), so the rerun is a fresh submission, not a run it would ask to --resume."""
    for name in ("config.yaml", SCRIPT):
        (run_dir / name).unlink(missing_ok=True)
    if not existed:
        try:
            run_dir.rmdir()
        except OSError:  # something else is in it now: left as it is
            pass


def submit_training(config_files, overrides, shortcuts, *, nodes: int, gpus_per_node: int,
                    processes_per_node: int | None, settings: SlurmSettings, dry_run: bool, console,
                    server_nodes: int = 0) -> dict:
    from meds_cli.commands.slurm_server_node import check_server_nodes, server_node
    from meds_cli.commands.train import check_before_loading, prepare_run
    from meds_cli.engine.training.algorithm_setup import build_algorithm

    per_node = processes_of(nodes, gpus_per_node, processes_per_node)
    if dry_run:
        check_settings(settings)
    else:
        check_before_submit(settings, gpus_per_node)  # check_settings, then the cluster
    plan = prepare_run(config_files, overrides, shortcuts, None)
    cfg, run_dir = plan.cfg, plan.run_dir.resolve()
    for note in check_before_loading(plan, config_files, overrides, shortcuts):
        console.print(note, markup=False, highlight=False, soft_wrap=True)
    check_server_nodes(cfg, nodes, server_nodes)
    sections = build_algorithm(cfg).config_sections
    server = server_node(cfg, gpus_per_node) if server_nodes else None
    script = render_train_script(run_dir, nodes=nodes, gpus_per_node=gpus_per_node, processes_per_node=per_node,
                                 settings=settings, python=sys.executable, workdir=Path.cwd(), server=server)
    if dry_run:
        print(script, end="")
        console.print(f"dry run: would create {plain(run_dir)} and submit the script above; nothing was created",
                      highlight=False, soft_wrap=True)
        return {"run_dir": str(run_dir), "script": script}
    existed = run_dir.exists()
    runs.claim_run_dir(run_dir)
    cfg.train.output_dir = ""  # as the trainer writes it: the folder is where the file is
    try:
        dump_yaml(cfg, run_dir / "config.yaml", sections=sections)
        (run_dir / SCRIPT).write_text(script)
        job = sbatch_submit(run_dir / SCRIPT)
    except BaseException:
        unprepare(run_dir, existed)
        raise
    shape = f"{nodes - 1} node(s) x {per_node} processes and a vLLM server node" if server else \
        f"{nodes} node(s) x {per_node} processes"
    console.print(f"submitted Slurm job {job}: {shape}, run folder {run_dir}\n"
                  f"follow it: squeue -j {job}; tail -f {run_dir}/slurm-{job}.out (sacct -j {job} where accounting "
                  "is on)", markup=False, highlight=False, soft_wrap=True)
    return {"run_dir": str(run_dir), "job": job}

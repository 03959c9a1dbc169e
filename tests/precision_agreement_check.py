"""Run under tests/cpu_launch.py: the run's Accelerator made by make_accelerator with
train.mixed_precision auto, where each process's CPU calibration answers differently (process 0:
bf16 faster, the others: not). Writes, per process, the precision its Accelerator computes in
and how many times it timed the CPU, to OUT/rank-<i>.json."""

import json
import os
import sys
from pathlib import Path

from meds_cli.core import cpu_calibration
from meds_cli.engine.training.sharding import close_process_group, make_accelerator
from tests.conftest import tiny_config

out = Path(sys.argv[1])
rank = int(os.environ["RANK"])
os.environ.pop(cpu_calibration.PIN_VARIABLE, None)  # the suite's pin would skip the calibration
os.environ.pop("ACCELERATE_MIXED_PRECISION", None)  # the launch's value would win over auto
timed = []


def calibrated_here(key, path, unit, why, packings, measure_fn):
    """This process's own answer: bf16 faster on process 0 only, as if the CPUs differed."""
    timed.append(rank)
    return cpu_calibration.Calibration(cpu_calibration.FastPaths("none", rank == 0, f"process {rank}'s timing"),
                                       f"calibrated {path}")


cpu_calibration._calibrated = calibrated_here
cpu_calibration.native_bf16_unit = lambda environ=None, flags=None: ("AMX-BF16", "CPU has AMX-BF16")
accelerator = make_accelerator(tiny_config("train.mixed_precision=auto").train)
(out / f"rank-{accelerator.process_index}.json").write_text(json.dumps(
    {"world": accelerator.num_processes, "mixed_precision": accelerator.mixed_precision, "timed": len(timed)}))
close_process_group(accelerator)  # not at interpreter exit, where gloo's threads sometimes abort

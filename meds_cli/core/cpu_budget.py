"""How many cores this process may use, for torch's thread count and for worker pools, and
how its threads wait.

A process gets the cores its affinity mask allows, divided among the processes of this node
that a launcher started (`accelerate launch` and torchrun set LOCAL_WORLD_SIZE), so N training
processes never run N x cores threads between them. Grader and sandbox pools size themselves
from the same budget: more workers than cores only makes every step slower.

Waiting: torch's OpenMP threads spin after each parallel region by default. When anything else
shares the cores (grader and sandbox workers, another run), a spinning thread holds the time
slice the late thread needs; decoding SmolLM2 (32 x 48 tokens, 2 threads, a busy 2-core
machine) took 170-240 s instead of 37-39 s with sleeping waits. So meds asks for passive
waiting before torch loads, unless the user set OMP_WAIT_POLICY or GOMP_SPINCOUNT.
"""

from __future__ import annotations

import os


def cores_available() -> int:
    """Cores in this process's affinity mask (all cores where the platform has no masks)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def local_processes() -> int:
    """Processes a launcher started on this node (1 when not launched)."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def cores_for_this_process() -> int:
    return max(1, cores_available() // local_processes())


def worker_count(requested: int | None = None, cap: int = 16) -> int:
    """A pool size that does not oversubscribe this process's cores: `requested` if given and
    smaller, else this process's share of the cores (at most `cap`)."""
    budget = min(cap, cores_for_this_process())
    return max(1, min(requested, budget) if requested else budget)


def prefer_passive_waiting() -> None:
    """OMP_WAIT_POLICY=PASSIVE unless the user chose a wait policy; effective only before torch
    (OpenMP) is loaded, so meds_cli sets it on import."""
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"


def configure_torch_threads() -> int:
    """Set torch's intra-op threads to this process's share of the cores, unless OMP_NUM_THREADS
    says otherwise (a launcher or the user chose); returns the thread count in force."""
    import torch

    if not os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(cores_for_this_process())
    return torch.get_num_threads()

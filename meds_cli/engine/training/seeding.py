"""Random state of a run: Python's, numpy's and torch's generators seeded from one value, and the
value each step reseeds from, so that sampling after a resume repeats exactly."""

from __future__ import annotations

import random

import numpy as np
import torch


def seed_everything(value: int) -> None:
    random.seed(value)
    np.random.seed(value % 2**32)
    torch.manual_seed(value)


def step_seed(seed: int, step: int, rank: int) -> int:
    """A value of its own for every (seed, step, process): a step's samples depend on nothing else."""
    return (seed * 1_000_003 + step * 7919 + rank * 104_729) % 2**63

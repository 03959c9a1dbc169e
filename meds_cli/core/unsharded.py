"""One FSDP2 context for every reader of whole parameters: the units given are all-gathered for
the duration and sharded again after, however the body ends. Training gathers the whole policy
for sampling (engine/training/sharding.py), weight sync one unit at a time (engine/rollout/
weight_sync.py); both go through here, so a change to how a unit is gathered is made once."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterable


@contextmanager
def unsharded(units: Iterable):
    """Each of `units` (FSDP2 modules; none: nothing to do) unsharded, in order, then resharded."""
    units = list(units)
    for unit in units:
        unit.unshard()
    try:
        yield
    finally:
        for unit in units:
            unit.reshard()

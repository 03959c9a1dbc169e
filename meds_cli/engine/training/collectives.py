"""The few values the processes of one run agree on: whether any process still wants a round,
the smallest count every process has, a step's metrics averaged, a count summed, the values
of every process gathered (an algorithm's, through its context). Every process
makes the same calls in the same order (a collective every process must enter); with one process
nothing is exchanged. The loop (engine/trainer.py) and the rooms' functions it calls take a
`Collectives`, not the accelerator; the collectives themselves live in engine/training/sharding.py,
beside the ones the update calls with the accelerator."""

from __future__ import annotations

import torch

from meds_cli.engine.training.sharding import global_max, global_min, global_sum


class Collectives:
    def __init__(self, accelerator):
        self.acc = accelerator
        self.world = accelerator.num_processes

    def any(self, flag: bool) -> bool:
        return global_sum(self.acc, 1.0 if flag else 0.0) > 0

    def min(self, value: int) -> int:
        return int(global_min(self.acc, value))

    def sum(self, value: float) -> float:
        return global_sum(self.acc, value)

    def max(self, value: int) -> int:
        return int(global_max(self.acc, value))

    def gather(self, value) -> list:
        """[value of process 0, value of process 1, ...] (picklable values; one process: [value])."""
        if self.world == 1:
            return [value]
        out = [None] * self.world
        torch.distributed.all_gather_object(out, value)  # pickled; on the process's own device under NCCL
        return out

    def mean_of_numbers(self, row: dict) -> dict:
        """`row` with each number except the step averaged over processes (one reduce, keys sorted
        so that every process sends its values in the same order)."""
        if self.world == 1:
            return row
        keys = sorted(k for k, v in row.items() if isinstance(v, (int, float)) and k != "step")
        values = torch.tensor([float(row[k]) for k in keys], device=self.acc.device)
        mean = self.acc.reduce(values, reduction="mean").tolist()
        return {**row, **dict(zip(keys, mean))}

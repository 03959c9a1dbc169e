"""The training processes an engine apart serves (`rollout.engine` hf-worker or vllm-server under
DDP): this process's rank, how many there are, and the two values they agree on.

Every process has an engine apart of its own (its own hf worker, its own client of the servers)
and samples its own share of each step's prompts with its own seeds, as with the colocated
engines. The processes agree at points every one of them reaches in the same order (each
`generate` and `prefetch` of the pipeline, each push to a server):

  - whether any process's engine failed (`any`), so that a dead worker in one process ends every
    process in one line, instead of leaving the others waiting in their next collective until the
    process group's timeout;
  - for the server, the oldest policy version a request still in flight names on any process
    (`min`), so that process 0 unloads no adapter another process's request still names.

With one process nothing is exchanged: `any` and `min` give the value back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


def _itself(value):
    return value


@dataclass(frozen=True)
class TrainingProcesses:
    rank: int = 0
    world: int = 1
    any: Callable[[bool], bool] = _itself  # True on every process when it is True on one
    min: Callable[[int], int] = _itself  # the smallest value over processes, on every process

    @property
    def pushes(self) -> bool:
        """This process sends the policy to a shared server (process 0; the others follow)."""
        return self.rank == 0


ONE_PROCESS = TrainingProcesses()  # a run of one training process: nothing to agree on

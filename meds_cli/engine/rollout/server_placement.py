"""Where a vLLM server that meds starts runs on this node: `rollout.server.gpus: M` gives it the
last M of the node's N visible GPUs and leaves the first N - M to training.

Why the last M: the training processes keep accelerate's own mapping of a node's process to a
device (local rank r computes on cuda:r, counting the GPUs this process sees), so they need no
CUDA_VISIBLE_DEVICES of their own and a launcher (accelerate launch, torchrun, the Slurm script)
works unchanged; only the server is narrowed, through its CUDA_VISIBLE_DEVICES. The processes of
a node then train on GPUs 0 .. P-1, which must all lie before the server's: P <= N - M, checked.

Only the node's first process (local rank 0) starts the server; the node's other processes
connect to it. Pure functions (the plan) and the environment they read are kept apart, so the
plan is tested without GPUs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, Sequence

from meds_cli.core.errors import UserError

KEY = "rollout.server.gpus"
ACCEPTED = "a count M of GPUs, 1 or more (the server takes the last M of the node's, training the rest)"


def server_gpus_valid(value) -> bool:
    """The config check: '' (not placed) or a count of at least 1."""
    return value == "" or parse_server_gpus(value, strict=False) is not None


def parse_server_gpus(value, strict: bool = True) -> int | None:
    """The count M of rollout.server.gpus ('' : None, the server not placed). The older form, a
    CUDA_VISIBLE_DEVICES list such as '2,3', is refused (strict) naming the count to give."""
    if value == "" or value is None:
        return None
    text = str(value).strip()
    if not isinstance(value, bool) and text.isdigit() and int(text) >= 1:
        return int(text)
    if not strict:
        return None
    hint = ""
    if "," in text:
        hint = f" ('{text}' is a device list, the older form: give its length, {len(text.split(','))})"
    raise UserError(f"{KEY}={value!r} is not {ACCEPTED}{hint}")


@dataclass(frozen=True)
class Placement:
    """The GPUs of the server and of training on one node, as CUDA_VISIBLE_DEVICES names them
    for a process started from this one."""

    server_devices: tuple[str, ...]
    trainer_devices: tuple[str, ...]

    @property
    def trainer_processes(self) -> int:
        """Training processes the node can run, one per GPU left to training."""
        return len(self.trainer_devices)

    def server_visible(self) -> str:
        return ",".join(self.server_devices)


def plan_placement(devices: Sequence[str], server_gpus: int, node_processes: int = 1) -> Placement:
    """Split the node's visible `devices` (N of them): the last `server_gpus` (M) for the server,
    the first N - M for training, whose `node_processes` processes compute on the first of them
    (the module docstring). Each bad value is one line naming it and what is accepted."""
    count = len(devices)
    if count == 0:
        raise UserError(f"{KEY}={server_gpus} places the server on GPUs, but this process sees none "
                        "(torch.cuda.device_count() is 0, or CUDA_VISIBLE_DEVICES is empty): run on a GPU node, "
                        "or leave rollout.server.gpus unset and pin a CPU server with rollout.server.cores")
    if server_gpus < 1:
        raise UserError(f"{KEY}={server_gpus} is not {ACCEPTED}")
    if server_gpus >= count:
        accepted = f"give 1 to {count - 1}" if count > 1 else "use a node with 2 or more, or rollout.server.url"
        raise UserError(f"{KEY}={server_gpus} leaves no GPU to training: this node has {count} GPU(s) visible "
                        f"and training needs one; {accepted}")
    trainer, server = tuple(devices[:count - server_gpus]), tuple(devices[count - server_gpus:])
    if node_processes > len(trainer):
        raise UserError(f"{KEY}={server_gpus}: {node_processes} training processes on this node would compute on "
                        f"GPUs {', '.join(devices[:node_processes])}, overlapping the server's "
                        f"({', '.join(server)}); run at most {len(trainer)} process(es) a node, or give a smaller "
                        f"{KEY}")
    return Placement(server, trainer)


def visible_devices(env: Mapping[str, str] | None = None, count: int | None = None) -> list[str]:
    """The GPUs this process sees, as a child's CUDA_VISIBLE_DEVICES would name them: the entries
    of this process's CUDA_VISIBLE_DEVICES where it is set (as many as torch counts), else
    '0' .. 'N-1'. `count`: torch's count (read here where None)."""
    env = os.environ if env is None else env
    if count is None:
        import torch

        count = torch.cuda.device_count()  # 0 without CUDA
    given = env.get("CUDA_VISIBLE_DEVICES")
    if given is None:
        return [str(i) for i in range(count)]
    return [entry.strip() for entry in given.split(",") if entry.strip()][:count]


def node_rank(env: Mapping[str, str] | None = None) -> int:
    """This process's rank among its node's training processes (LOCAL_RANK of torchrun and
    accelerate launch; 0 without a launcher)."""
    return int((os.environ if env is None else env).get("LOCAL_RANK", 0))


def node_processes(env: Mapping[str, str] | None = None) -> int:
    """Training processes of this node (LOCAL_WORLD_SIZE; 1 without a launcher)."""
    return int((os.environ if env is None else env).get("LOCAL_WORLD_SIZE", 1))


def placement_note(placement: Placement, processes: int) -> str | None:
    """One line where GPUs left to training stay unused: more of them than processes."""
    idle = placement.trainer_processes - processes
    if idle <= 0:
        return None
    used = ", ".join(placement.trainer_devices[:processes])
    return (f"the vLLM server runs on GPU(s) {placement.server_visible()}; training runs {processes} process(es) on "
            f"GPU(s) {used}, leaving {idle} unused: `accelerate launch --num_processes {placement.trainer_processes} "
            f"-m meds_cli train ...` trains on all {placement.trainer_processes} (process r on GPU r)")

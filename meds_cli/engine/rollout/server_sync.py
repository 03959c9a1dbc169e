"""How the vllm-server engine sends the policy to its server(s) after each optimizer step: one
strategy object per kind of weights, behind VLLMServerEngine.push_policy (vllm_server.py).

A strategy is told the servers and a way to call their routes (`attach`), then for each policy
version `prepare`s it on the trainer's thread (when push_policy is called, before the next
update can change the weights), `apply`s it on the engine's ordered thread, between the jobs
queued before and after the push, and `release`s what the versions older than the oldest one a
request in flight names still hold.

- AdapterSync (LoRA with rollout.vllm.sync=adapter): `prepare` saves the adapter (peft
  save_pretrained) under <scratch>/server-adapters/policy-v<version>; `apply` loads it with
  `/v1/load_lora_adapter` under that new name (`load_inplace`: a resumed run pushing a version
  again replaces what a server kept) and tells the server the version (`/update_weight_version`,
  dev mode; a server without it is not told again); `release` unloads the older adapters.
  Requests name the adapter. With several training processes only process 0 (`pushes`) saves,
  loads and unloads; the others name the version's adapter once process 0 has loaded it
  (vllm_server.VLLMServerEngine lines them up).
- FullWeightSync (no LoRA, or rollout.vllm.sync=merged): the weights, LoRA folded in, cast to
  the server's dtype, go through vLLM 0.32's own weight-transfer engine over NCCL
  (vllm/distributed/weight_transfer/: the trainer-side NCCLTrainerWeightTransferEngine, made by
  WeightTransferTrainerFactory.trainer_init, drives the routes of vllm/entrypoints/rl/online/:
  `/init_weight_transfer_engine` once, then per version `/start_weight_update`,
  `/update_weights` while it broadcasts the tensors, `/finish_weight_update` naming the
  version). Around it meds pauses the server (`/pause?mode=wait`, which also clears its prefix
  cache, computed with the old weights) and resumes it (`/resume`). The tensors are read from the
  live parameters, so the engine first lets the jobs queued before the push run (they sample
  the previous version) and the trainer waits for them (`reads_live_weights`). The NCCL group of
  each server is the trainer (rank 0) and the server's workers (`/get_world_size`); the send
  itself is injected (`transfer`), so the tests record the tensors without vLLM or a GPU.
"""

from __future__ import annotations

import shutil
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Protocol, Sequence

import torch

from meds_cli.core.errors import UserError
from meds_cli.engine.rollout.weight_sync import adapter_weights, merged_weights

ABSENT = object()  # what `call` gives for a route the server does not have (absent_ok)

# call(url, route, body, absent_ok=False) -> the answer; failures raise RolloutEngineGone (one line)
Call = Callable[..., object]


class PolicySync(Protocol):
    """One way of sending the policy to the servers (the module docstring)."""

    served_model: str | None  # what requests name: the current adapter, or None (the server's model)
    reads_live_weights: bool  # True: the jobs queued before a push must run before `prepare`

    def attach(self, urls: Sequence[str], call: Call) -> None: ...

    def prepare(self, version: int, weights: dict | None = None) -> object: ...

    def apply(self, version: int, prepared: object) -> None: ...

    def release(self, oldest: int) -> None: ...


def adapter_name(version: int) -> str:
    """The name (and folder) policy version `version`'s adapter is served under."""
    return f"policy-v{version}"


# ---------------------------------------------------------------- LoRA adapters


class AdapterSync:
    """LoRA adapters through vLLM's runtime LoRA routes (the module docstring). `pushes`: this
    process loads the adapters (process 0); the others only name them."""

    reads_live_weights = False

    def __init__(self, policy, scratch_dir: Path, pushes: bool = True):
        self.policy, self.pushes = policy, pushes
        self.folder = Path(scratch_dir) / "server-adapters"
        self.served_model: str | None = None
        self.tells_version = True  # False once a server says it has no /update_weight_version (no dev mode)
        self.loaded: list[int] = []  # versions loaded on the servers and not yet unloaded (process 0)
        self.urls: list[str] = []
        self.call: Call = lambda *a, **k: None

    def attach(self, urls: Sequence[str], call: Call) -> None:
        self.urls, self.call = list(urls), call

    def prepare(self, version: int, weights: dict | None = None) -> Path | None:
        """Save the adapter now (the next update must not reach it); `weights`: an earlier version's
        trained weights in place of the live adapter's."""
        # on every process: a gather under FSDP2
        state = adapter_weights(self.policy) if weights is None else {n: t for n, t in weights.items()
                                                                       if ".lora_" in n}
        if not self.pushes:
            return None
        folder = self.folder / adapter_name(version)
        if folder.exists():
            shutil.rmtree(folder)  # a resumed run pushes its versions again
        self.policy.save_pretrained(str(folder), state_dict=state)
        return folder

    def apply(self, version: int, folder: Path | None) -> None:
        if folder is not None:
            for url in self.urls:
                self.call(url, "/v1/load_lora_adapter", {"lora_name": folder.name, "lora_path": str(folder.resolve()),
                                                         "load_inplace": True})
                if self.tells_version and self.call(url, "/update_weight_version", {"new_version": str(version)},
                                                    absent_ok=True) is ABSENT:
                    self.tells_version = False
            self.loaded.append(version)
        self.served_model = adapter_name(version)

    def release(self, oldest: int) -> None:
        """Unload (and delete the folders of) the adapters older than `oldest`, which no request in
        flight names any more."""
        for version in [v for v in self.loaded if v < oldest]:
            for url in self.urls:
                self.call(url, "/v1/unload_lora_adapter", {"lora_name": adapter_name(version)})
            shutil.rmtree(self.folder / adapter_name(version), ignore_errors=True)
            self.loaded.remove(version)


# ---------------------------------------------------------------- full weights over NCCL


@dataclass(frozen=True)
class WeightMeta:
    """One tensor as vLLM's weight transfer declares it (its ParamMeta: name, dtype, shape)."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]


class PolicyWeights:
    """The policy as vLLM's WeightSource: plain transformers names and tensors, LoRA folded in,
    cast to the server's dtype (weight_sync.merged_weights), read again on every pass."""

    def __init__(self, policy, dtype: torch.dtype | None):
        self.policy, self.dtype = policy, dtype
        self._meta: list[WeightMeta] | None = None

    def metadata(self) -> list[WeightMeta]:
        """The names, dtypes and shapes, from one pass the first time (they never change)."""
        if self._meta is None:
            self._meta = [WeightMeta(name, t.dtype, tuple(t.shape)) for name, t in self]
        return self._meta

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        with torch.no_grad():
            yield from merged_weights(self.policy, self.dtype)


class RouteClient:
    """vLLM's VLLMWeightSyncClient (the four routes its trainer-side engines drive) over meds's own
    calls, so a failing route ends the run in one line; `finish_weight_update` names the version
    being sent (vLLM's NCCL engine calls it without one)."""

    def __init__(self, url: str, call: Call):
        self.url, self.call = url, call
        self.version: str | None = None

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        self.call(self.url, "/init_weight_transfer_engine", {"init_info": init_info})

    def start_weight_update(self) -> None:
        self.call(self.url, "/start_weight_update", {})

    def update_weights(self, update_info) -> None:
        self.call(self.url, "/update_weights", {"update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.call(self.url, "/finish_weight_update", {"weight_version": weight_version or self.version})


@dataclass(frozen=True)
class Rendezvous:
    """Where the trainer (NCCL rank 0) meets one server's workers."""

    address: str
    port: int
    world_size: int  # the trainer and the server's workers


# transfer(client, source, rendezvous) -> an object whose send_weights() sends one version
Transfer = Callable[[RouteClient, PolicyWeights, Rendezvous], object]


def vllm_nccl_transfer(client: RouteClient, source: PolicyWeights, rendezvous: Rendezvous):
    """vLLM's own trainer-side NCCL engine, rendezvoused with one server (its init route runs
    while the trainer opens its end of the group)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
    from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

    init = NCCLTrainerInitInfo(master_address=rendezvous.address, master_port=rendezvous.port,
                               world_size=rendezvous.world_size, rank=0)
    return WeightTransferTrainerFactory.trainer_init(init, client=client, source=source)


def nccl_transfer_unavailable() -> str | None:
    """Why vLLM's NCCL weight transfer cannot run in this process, or None."""
    import importlib.util

    if not torch.cuda.is_available() or not torch.distributed.is_nccl_available():
        return ("needs GPUs and NCCL, and this machine has none (torch.cuda.is_available() is false): use "
                "model.lora.enabled=true with rollout.vllm.sync=adapter, or train on a GPU machine")
    if importlib.util.find_spec("vllm") is None:
        return ("uses vLLM's trainer-side weight transfer, so it needs the vllm package in the trainer's Python "
                "(pip install -e '.[vllm]')")
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class FullWeightSync:
    """Full weights through vLLM's weight-transfer engine over NCCL (the module docstring).
    `address`: where the servers reach the trainer; `port`: the first server's rendezvous port
    (the next servers take the ports after it; 0: free ones)."""

    served_model = None
    reads_live_weights = True

    def __init__(self, policy, dtype: torch.dtype | None, *, address: str, port: int = 0,
                 transfer: Transfer | None = None):
        self.source = PolicyWeights(policy, dtype)
        self.address, self.port = address, port
        self.transfer = transfer or vllm_nccl_transfer  # looked up now: the tests put a fake in its place
        self.urls: list[str] = []
        self.call: Call = lambda *a, **k: None
        self.senders: list[tuple[RouteClient, object]] = []  # per server, made at the first push

    def attach(self, urls: Sequence[str], call: Call) -> None:
        self.urls, self.call = list(urls), call

    def prepare(self, version: int, weights: dict | None = None) -> None:
        """Send version `version` to every server now, from the live weights (earlier versions'
        full weights are not kept: engines.make_engine keeps none for a resume)."""
        if weights is not None:
            raise ValueError("full-weight sync sends the live weights only")
        if not self.senders:
            self.senders = [self._rendezvous(url, index) for index, url in enumerate(self.urls)]
        for client, sender in self.senders:
            client.version = str(version)
            self.call(client.url, "/pause?mode=wait&clear_cache=true", {})
            sender.send_weights()
            self.call(client.url, "/resume", {})

    def apply(self, version: int, prepared: object) -> None:
        """Nothing left: the weights were sent in `prepare`."""

    def release(self, oldest: int) -> None:
        """Nothing held: the server keeps one set of weights."""

    def _rendezvous(self, url: str, index: int) -> tuple[RouteClient, object]:
        answer = self.call(url, "/get_world_size?include_dp=true", None)
        workers = answer.get("world_size") if isinstance(answer, dict) else None
        if not isinstance(workers, int) or workers < 1:
            raise UserError(f"the vLLM server at {url} answered /get_world_size with {answer!r}, not its worker "
                            "count; is it vLLM 0.32 started with VLLM_SERVER_DEV_MODE=1?")
        port = self.port + index if self.port else free_port()
        client = RouteClient(url, self.call)
        return client, self.transfer(client, self.source, Rendezvous(self.address, port, 1 + workers))


def torch_dtype(name: str) -> torch.dtype | None:
    """The torch dtype of a vLLM dtype name (None for 'auto': sent as the weights are)."""
    from meds_cli.engine.model_io.model import DTYPES

    found = DTYPES[name]
    return None if found == "auto" else found

"""prepare_policy under FSDP2 (issue 37): the model is sharded before anything moves to the
device, so no process holds the full model there (7B in float32: 28 GB on every GPU). fully_shard
moves each unit's parameters to the mesh's device itself, one unit at a time, then keeps the
shard; this records the order of the calls, which is what shows on CPU."""

from types import SimpleNamespace

import torch

from meds_cli.engine.config import LoraConfig
from meds_cli.engine.model_io.model import apply_lora
from meds_cli.engine.model_io.tiny import tiny_model_and_tokenizer
from meds_cli.engine.training import sharding, update
from tests.conftest import tiny_config


def test_fsdp2_shards_before_any_move_of_the_whole_model(monkeypatch):
    events = []
    model, _ = tiny_model_and_tokenizer()
    model = apply_lora(model, LoraConfig(rank=4))
    real_to = torch.nn.Module.to

    def recording_to(module, *args, **kwargs):
        if module is model or module is sharding.causal_lm(model):
            events.append(("to", module.__class__.__name__))
        return real_to(module, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "to", recording_to)
    monkeypatch.setattr(sharding, "device_mesh", lambda acc: events.append(("mesh",)) or "mesh")

    def recording_shard(module, mesh, *, param_dtype=None):
        events.append(("shard", mesh))
        return sharding.Sharded(root=sharding.causal_lm(module))

    monkeypatch.setattr(sharding, "shard_model", recording_shard)
    acc = SimpleNamespace(num_processes=2, device=torch.device("cpu"), mixed_precision="no",
                          prepare=lambda optimizer: optimizer)
    cfg = tiny_config("train.sharding=fsdp2")
    policy = update.prepare_policy(acc, model, cfg.train, cfg.optim, lambda text: None)
    assert policy.sharded is not None
    shard_at = events.index(("shard", "mesh"))
    assert not [e for e in events[:shard_at] if e[0] == "to"], events

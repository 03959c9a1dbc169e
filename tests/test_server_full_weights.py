"""Full-weight sync to a vLLM server (engine/rollout/server_sync.py: FullWeightSync), without vLLM
or a GPU: the fake server (tests/fake_vllm_server.py) records the routes in order with their JSON
and keeps vLLM's rules for them, and a fake trainer-side transfer, injected where vLLM's
NCCLTrainerWeightTransferEngine goes, drives the same routes and records the tensors it would
broadcast (names, shapes, dtypes, values). Checked: the init handshake (the trainer and the
server's workers), pause / start / update / finish naming the version / resume for each version,
every weight sent once per optimizer step (merged LoRA weights with sync=merged), the jobs queued
before a push sampled before it, and the one-line refusal on a machine without GPUs."""

from __future__ import annotations

import copy

import pytest
import torch

from meds_cli.core.errors import UserError
from meds_cli.engine.model_io.tiny import tiny_model_and_tokenizer
from meds_cli.engine.rollout import server_sync
from meds_cli.engine.rollout.sampling_engine import SampleRequest
from meds_cli.engine.rollout.server_sync import FullWeightSync
from meds_cli.engine.rollout.vllm_server import VLLMServerEngine
from tests.fake_vllm_server import FakeVLLMServer
from tests.test_vllm_server import SETTINGS, _steps, _trainer

PUSH = ["/pause?mode=wait&clear_cache=true", "/start_weight_update", "/update_weights", "/finish_weight_update",
        "/resume"]


class FakeTransfer:
    """Where vLLM's trainer-side NCCL engine goes: made once per server with its rendezvous (the
    init route called as vLLM's does), then each send_weights drives start / update (the update
    info vLLM sends: names, dtype names, shapes) / finish through the client while it records
    each tensor of the source as the broadcast would send it."""

    def __init__(self):
        self.rendezvous = []
        self.sends: list[dict[str, torch.Tensor]] = []

    def __call__(self, client, source, rendezvous):
        client.init_weight_transfer_engine({"master_address": rendezvous.address, "master_port": rendezvous.port,
                                            "rank_offset": 1, "world_size": rendezvous.world_size})
        self.rendezvous.append(rendezvous)
        return _Sender(self, client, source)


class _Sender:
    def __init__(self, fake: FakeTransfer, client, source):
        self.fake, self.client, self.source = fake, client, source

    def send_weights(self):
        meta = self.source.metadata()
        self.client.start_weight_update()
        self.client.update_weights({"names": [m.name for m in meta],
                                    "dtype_names": [str(m.dtype).split(".")[-1] for m in meta],
                                    "shapes": [list(m.shape) for m in meta]})
        sent = {}
        for (name, tensor), declared in zip(self.source, meta, strict=True):
            assert (name, tensor.dtype, tuple(tensor.shape)) == (declared.name, declared.dtype, declared.shape)
            assert name not in sent  # once per send
            sent[name] = tensor.detach().clone()
        self.fake.sends.append(sent)
        self.client.finish_weight_update()


@pytest.fixture
def fake():
    server = FakeVLLMServer(world_size=2).start()
    yield server
    server.stop()


def _routes(server, skip_completions: bool = True) -> list[str]:
    return [r for r in server.routes if not (skip_completions and r == "/v1/completions")]


def _finished_versions(server) -> list[str]:
    return [body["weight_version"] for route, body in server.calls if route == "/finish_weight_update"]


# ---------------------------------------------------------------- the engine


def test_each_version_is_sent_between_pause_and_resume_naming_it(fake, tmp_path):
    model, _ = tiny_model_and_tokenizer(layers=2)
    transfer = FakeTransfer()
    sync = FullWeightSync(model, torch.bfloat16, address="10.0.0.5", port=29555, transfer=transfer)
    engine = VLLMServerEngine([fake.url], policy=model, scratch_dir=tmp_path, sync=sync)
    try:
        for version in (0, 1):
            engine.push_policy(version)
            engine.result(engine.submit([SampleRequest((3, 4), (1, 2))], SETTINGS))
    finally:
        engine.close()
    assert _routes(fake) == ["/init_weight_transfer_engine", *PUSH, *PUSH]
    assert fake.routes.count("/v1/completions") == 4 and not fake.paused
    (init,) = [body["init_info"] for route, body in fake.calls if route == "/init_weight_transfer_engine"]
    assert init == {"master_address": "10.0.0.5", "master_port": 29555, "rank_offset": 1, "world_size": 3}
    assert _finished_versions(fake) == ["0", "1"] and fake.weight_version == "1" and engine.pushes == [0, 1]
    # the update route carries what vLLM's NCCL engine declares: every weight, its dtype and shape
    update = next(body["update_info"] for route, body in fake.calls if route == "/update_weights")
    names = [name for name, _ in model.named_parameters()]
    assert update["names"] == names and set(update["dtype_names"]) == {"bfloat16"}
    assert update["shapes"] == [list(p.shape) for p in model.parameters()]
    for sent in transfer.sends:  # every weight once, cast to the server's dtype, the model's values
        assert list(sent) == names
        for name, p in model.named_parameters():
            assert torch.equal(sent[name], p.detach().to(torch.bfloat16)), name
    assert all("model" not in body for body in fake.completions)  # the server's own model, no adapter


def test_merged_lora_weights_are_sent_as_plain_weights(fake, tmp_path):
    from peft import LoraConfig, get_peft_model

    base, _ = tiny_model_and_tokenizer(layers=2)
    names = [name for name, _ in base.named_parameters()]
    policy = get_peft_model(copy.deepcopy(base), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_()  # a trained adapter: its delta is not zero
    expected = copy.deepcopy(policy).merge_and_unload().state_dict()
    transfer = FakeTransfer()
    engine = VLLMServerEngine([fake.url], policy=policy, scratch_dir=tmp_path,
                              sync=FullWeightSync(policy, None, address="127.0.0.1", transfer=transfer))
    try:
        engine.push_policy(0)
        engine.result(engine.submit([SampleRequest((3,), (1,))], SETTINGS))
    finally:
        engine.close()
    (sent,) = transfer.sends
    assert list(sent) == names  # the base model's names: no lora_A/B, no base_layer
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(sent[q], base.state_dict()[q])  # the adapter's delta is in it
    for name in names:
        assert torch.allclose(sent[name], expected[name], atol=1e-6), name


def test_a_server_without_the_world_size_route_is_named_in_one_line(tmp_path):
    server = FakeVLLMServer(world_size=0).start()
    model, _ = tiny_model_and_tokenizer(layers=1)
    engine = VLLMServerEngine([server.url], policy=model, scratch_dir=tmp_path,
                              sync=FullWeightSync(model, None, address="127.0.0.1", transfer=FakeTransfer()))
    try:
        with pytest.raises(UserError) as error:
            engine.push_policy(0)
    finally:
        engine.close()
        server.stop()
    assert f"the vLLM server at {server.url} answered /get_world_size with" in str(error.value)
    assert "VLLM_SERVER_DEV_MODE=1" in str(error.value) and "\n" not in str(error.value)


# ---------------------------------------------------------------- in the trainer


@pytest.fixture
def nccl_faked(monkeypatch):
    """GPUs, NCCL and vLLM as if present, vLLM's NCCL engine replaced by the fake transfer."""
    transfer = FakeTransfer()
    monkeypatch.setattr(server_sync, "nccl_transfer_unavailable", lambda: None)
    monkeypatch.setattr(server_sync, "vllm_nccl_transfer", transfer)
    return transfer


@pytest.mark.parametrize("k", [0, 1])
def test_full_fine_tuning_sends_every_weight_once_per_optimizer_step(fake, nccl_faked, tmp_path, k):
    trainer = _trainer(tmp_path, fake.url, k, "model.lora.enabled=false", "train.steps=3")
    names = [name for name, p in trainer.model.named_parameters()]
    rows = _steps(trainer, 3)
    assert len(rows) == 3 and _finished_versions(fake) == [str(v) for v in range(3 - k)]
    assert [list(sent) for sent in nccl_faked.sends] == [names] * (3 - k)
    # each version holds one more update: the weights the server gets change from push to push
    first, second = nccl_faked.sends[:2]
    assert any(not torch.equal(first[n], second[n]) for n in names)
    # no request is sampled while the server is paused: a push waits for the jobs queued before it
    routes = _routes(fake, skip_completions=False)
    for start in [i for i, r in enumerate(routes) if r.startswith("/pause")]:
        assert "/v1/completions" not in routes[start:routes.index("/resume", start)]
    assert _routes(fake) == ["/init_weight_transfer_engine", *PUSH * (3 - k)]


def test_lora_with_sync_merged_sends_the_merged_weights(fake, nccl_faked, tmp_path):
    trainer = _trainer(tmp_path, fake.url, 0, "rollout.vllm.sync=merged")
    assert trainer.source.pipeline.snapshot is None  # live weights only: no adapter kept for a checkpoint
    base_names = [n.replace("base_model.model.", "").replace(".base_layer", "")
                  for n, _ in trainer.model.named_parameters() if ".lora_" not in n]
    _steps(trainer, 2)
    assert [sorted(sent) for sent in nccl_faked.sends] == [sorted(base_names)] * 2
    assert not [route for route, _ in fake.calls if "lora_adapter" in route]  # no adapter routes


def test_on_a_machine_without_gpus_full_weights_are_refused_in_one_line(fake, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(UserError) as error:
        _trainer(tmp_path, fake.url, 0, "model.lora.enabled=false")
    message = str(error.value)
    assert "sends full weights here (no LoRA, or rollout.vllm.sync=merged)" in message
    assert "needs GPUs and NCCL" in message and "\n" not in message
    assert fake.calls == []  # refused before anything reached the server

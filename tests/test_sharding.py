"""FSDP2 helpers (meds_cli/engine/training/sharding.py): which Accelerate setups the loop accepts, where the
shards go, gathered parameters for generate, global gradient clipping, full-state checkpoints;
and (slow) two real processes sharded with FSDP2 make the update one process makes, and resume
from a full-state checkpoint is exact."""

import json
import socket
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from meds_cli.core.errors import UserError
from meds_cli.engine.config import LoraConfig
from meds_cli.engine.model_io.model import apply_lora
from meds_cli.engine.model_io.tiny import tiny_model_and_tokenizer
from meds_cli.engine.training import sharding
from tests.cpu_launch import ROOT, launch_cpu
from tests.float64 import FLOAT64_RTOL, assert_equal_in_float64


def fake_accelerator(kind: str, accumulation: int = 1, processes: int = 1):
    from accelerate.utils import DistributedType

    return SimpleNamespace(distributed_type=getattr(DistributedType, kind), gradient_accumulation_steps=accumulation,
                           num_processes=processes)


def test_supported_setups_pass(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    for kind in ("NO", "MULTI_CPU", "MULTI_GPU"):
        for mode in sharding.SHARDINGS:
            sharding.check_distributed_setup(fake_accelerator(kind), mode)
    monkeypatch.setenv("WORLD_SIZE", "2")
    sharding.check_distributed_setup(fake_accelerator("MULTI_CPU", processes=2), "fsdp2")


def test_processes_that_accelerate_did_not_join_are_refused(monkeypatch):
    """`accelerate launch --multi_gpu` on a machine without GPUs starts N lone processes."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(UserError, match="2 processes were launched but Accelerate joined 1.*ACCELERATE_USE_CPU=1"):
        sharding.check_distributed_setup(fake_accelerator("NO"), "none")


@pytest.mark.parametrize("kind, accumulation, sharding_mode, words", [
    ("DEEPSPEED", 1, "none", ["DeepSpeed", "train.sharding=fsdp2"]),
    ("FSDP", 1, "none", ["FSDP plugin", "train.sharding=fsdp2"]),
    ("MULTI_GPU", 4, "none", ["gradient_accumulation_steps=4", "micro_batch_size"]),
    ("NO", 1, "zero3", ["'zero3'", "none, fsdp2"]),
])
def test_unsupported_setups_are_refused_in_one_line(kind, accumulation, sharding_mode, words, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(UserError) as err:
        sharding.check_distributed_setup(fake_accelerator(kind, accumulation), sharding_mode)
    message = str(err.value)
    assert "\n" not in message and all(w in message for w in words), message


def test_decoder_layers_are_found_through_peft():
    model, _ = tiny_model_and_tokenizer()
    assert [type(m).__name__ for m in sharding.decoder_layers(model)] == ["LlamaDecoderLayer"] * 4
    wrapped = apply_lora(model, LoraConfig(rank=4))
    assert sharding.causal_lm(wrapped) is model
    assert len(sharding.decoder_layers(wrapped)) == 4
    with pytest.raises(UserError, match="no decoder layers"):
        sharding.decoder_layers(torch.nn.Linear(2, 2))


def test_clip_gradients_matches_torch_on_plain_tensors():
    torch.manual_seed(0)
    a, b = torch.nn.Parameter(torch.randn(3, 4)), torch.nn.Parameter(torch.randn(5))
    c, d = torch.nn.Parameter(a.detach().clone()), torch.nn.Parameter(b.detach().clone())
    for p in (a, b, c, d):
        p.grad = torch.ones_like(p) * 0.5
    norm = sharding.clip_gradients([a, b], 0.3)
    expected = torch.nn.utils.clip_grad_norm_([c, d], 0.3)
    assert norm == pytest.approx(float(expected)) and norm == pytest.approx(0.5 * 17 ** 0.5)
    assert torch.allclose(a.grad, c.grad) and torch.allclose(b.grad, d.grad)
    assert torch.linalg.vector_norm(torch.cat([a.grad.flatten(), b.grad])) == pytest.approx(0.3, rel=1e-5)
    # max_norm 0 only measures
    for p in (a, b):
        p.grad = torch.ones_like(p)
    assert sharding.clip_gradients([a, b], 0.0) == pytest.approx(17 ** 0.5)
    assert torch.equal(a.grad, torch.ones_like(a))


@contextmanager
def one_process_group():
    """A gloo group of one process, so fully_shard runs inside the test process."""
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_sharded_model_generates_trains_and_round_trips_its_state():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    plain, tokenizer = tiny_model_and_tokenizer()
    plain = apply_lora(plain, LoraConfig(rank=4))
    model, _ = tiny_model_and_tokenizer()
    model = apply_lora(model, LoraConfig(rank=4))
    prompt = torch.tensor([[5, 6, 7, 8]])
    expected = plain.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                              max_new_tokens=5, min_new_tokens=5, pad_token_id=0)
    with one_process_group():
        sharded = sharding.shard_model(model, init_device_mesh("cpu", (1,)))
        assert sharded.root is sharding.causal_lm(model) and len(sharded.layers) == 4
        assert all(isinstance(p, DTensor) for p in model.parameters())
        with sharding.gathered_parameters(sharded), torch.no_grad():
            generated = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                       max_new_tokens=5, min_new_tokens=5, pad_token_id=0)
        assert torch.equal(generated, expected)
        assert all(isinstance(p, DTensor) for p in model.parameters())  # sharded again afterwards
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.1)
        model(input_ids=prompt).logits.square().mean().backward()
        norm = sharding.clip_gradients([p for p in model.parameters() if p.requires_grad], 1e-3)
        assert isinstance(norm, torch.Tensor) and not isinstance(norm, DTensor) and norm > 1e-3
        optimizer.step()
        state = sharding.full_state(model)
        names = {n for n, p in plain.named_parameters() if p.requires_grad}
        assert set(state) == names and all(type(v) is torch.Tensor for v in state.values())
        optim_state = sharding.full_optimizer_state(model, optimizer)
        assert len(optim_state["state"]) == len(names)
        # load into a fresh sharded model: the same full state comes back out
        other, _ = tiny_model_and_tokenizer()
        other = apply_lora(other, LoraConfig(rank=4))
        sharding.shard_model(other, init_device_mesh("cpu", (1,)))
        other_optimizer = torch.optim.AdamW([p for p in other.parameters() if p.requires_grad], lr=0.1)
        sharding.load_full_state(other, state)
        sharding.load_full_optimizer_state(other, other_optimizer, optim_state)
        again = sharding.full_state(other)
        assert all(torch.equal(again[k], state[k]) for k in state)
        step = lambda s: {k: v["step"] for k, v in s["state"].items()}  # noqa: E731
        assert step(sharding.full_optimizer_state(other, other_optimizer)) == step(optim_state)


# ---------------------------------------------------------------- two real processes (slow)


def run_check(processes: int, out, *extra) -> dict:
    launch_cpu(processes, [str(ROOT / "tests" / "fsdp2_check.py"), str(out), *extra])
    record = json.loads((out / "record.json").read_text())
    assert record["world"] == processes  # really that many processes
    return record


@pytest.mark.slow
def test_fsdp2_two_processes_match_one_and_resume_exactly(tmp_path):
    one = run_check(1, tmp_path / "one")
    two = run_check(2, tmp_path / "two")
    assert two["grad_norms"] == pytest.approx(one["grad_norms"], rel=FLOAT64_RTOL)
    assert two["generated"] == one["generated"]  # gathered parameters, processes generating different lengths
    for step in (1, 2):
        a = load_file(str(tmp_path / "one" / f"weights_step{step}.safetensors"))
        b = load_file(str(tmp_path / "two" / f"weights_step{step}.safetensors"))
        assert a.keys() == b.keys() and a
        for name in a:  # float64 throughout (tests/fsdp2_check.py): equal to rounding on any CPU
            assert_equal_in_float64(b[name], a[name], f"step {step} {name}")
    start = load_file(str(tmp_path / "one" / "weights_step1.safetensors"))
    assert any(not torch.equal(start[n], a[n]) for n in a)  # step 2 moved the weights
    resumed = run_check(2, tmp_path / "resumed", "--resume", str(tmp_path / "two" / "checkpoint"))
    assert resumed["grad_norms"] == two["grad_norms"][1:]
    straight = load_file(str(tmp_path / "two" / "weights_step2.safetensors"))
    again = load_file(str(tmp_path / "resumed" / "weights_step2.safetensors"))
    assert all(torch.equal(straight[n], again[n]) for n in straight)


@pytest.mark.slow
def test_fsdp2_full_weights_two_processes_match_one(tmp_path):
    one = run_check(1, tmp_path / "one", "--full-weights")
    two = run_check(2, tmp_path / "two", "--full-weights")
    assert two["grad_norms"] == pytest.approx(one["grad_norms"], rel=FLOAT64_RTOL)
    a = load_file(str(tmp_path / "one" / "weights_step2.safetensors"))
    b = load_file(str(tmp_path / "two" / "weights_step2.safetensors"))
    assert len(a) == 39  # every weight of the tiny Llama trains
    for name in a:  # float64 throughout (tests/fsdp2_check.py): equal to rounding on any CPU
        assert_equal_in_float64(b[name], a[name], name)

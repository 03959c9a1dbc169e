"""bf16 on a CPU (engine/training/precision.py, engine/rollout/packed_linear.py): auto picks it
only from the calibration, the run says why in one line, decoding multiplies bf16 weight copies
made once per batch with float32 logits, the update keeps float32 weights and optimizer state,
the sampler's log-probs stay at bf16 rounding from the scoring pass's, and float32 decoding packs
weights only where the calibration measured packing faster. bf16 is forced here:
this suite runs on machines without bf16 units, where bf16 is emulated (slower, same numbers)."""

import pytest
import torch

from meds_cli.core.cpu_calibration import Timings, cpu_fast_paths
from meds_cli.engine.rollout import packed_linear
from meds_cli.engine.rollout.decoder_step import DecoderStep
from meds_cli.engine.rollout.hf_sampler import HFEngine
from meds_cli.engine.rollout.sampling_engine import SampleRequest, SamplingSettings
from meds_cli.engine.trainer import Trainer
from meds_cli.engine.training.precision import choose_mixed_precision, precision_line
from tests.conftest import tiny_config
from tests.tiny_policy import lora_policy

AMX = frozenset({"amx_bf16", "avx512_bf16"})
SMALL = ("rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=4", "optim.lr=0.05",
         "train.steps=1")


def _never_measured(**_):
    raise AssertionError("bf16 was timed on a CPU without bf16 units")


def test_auto_under_an_avx512_core_cap_is_float32_and_says_why(tmp_path):
    environ = {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE", "MEDS_CPU_CALIBRATION_FILE": str(tmp_path / "c.json")}

    def paths(env):  # a CPU with AMX-BF16, capped by oneDNN's variable
        return cpu_fast_paths(env, flags=AMX, measure_fn=lambda **kw: Timings({8: 1.0, 64: 1.0}))

    value, why = choose_mixed_precision("auto", environ=environ, gpu_bf16=False, on_gpu=False, cpu_paths=paths)
    assert value == "no"
    assert precision_line(value, why) == ("precision: float32 (ONEDNN_MAX_CPU_ISA=AVX512_CORE leaves oneDNN no bf16 "
                                          f"units, calibrated {tmp_path / 'c.json'})")


def test_auto_picks_bf16_where_the_calibration_measured_it_faster(tmp_path):
    environ = {"MEDS_CPU_CALIBRATION_FILE": str(tmp_path / "c.json")}
    # bf16 2x float32 at every row count (hand-made): 2.00 >= 1.1
    timings = Timings({8: 0.2, 64: 0.4, 1536: 4.0}, {}, {8: 0.1, 64: 0.2, 1536: 2.0})

    def paths(env):
        return cpu_fast_paths(env, flags=AMX, measure_fn=lambda **kw: timings)

    value, why = choose_mixed_precision("auto", environ=environ, gpu_bf16=False, on_gpu=False, cpu_paths=paths)
    assert value == "bf16"
    assert precision_line(value, why).startswith("precision: bf16 (CPU has AMX-BF16; bf16 linear 2.00 / 2.00 / 2.00x")
    # forced either way, nothing is asked of the calibration
    assert choose_mixed_precision("no", cpu_paths=_never_measured) == ("no", "train.mixed_precision: no")
    assert choose_mixed_precision("bf16", cpu_paths=_never_measured)[0] == "bf16"


def _requests(tokenizer):
    prompts = [tokenizer.encode("12+"), tokenizer.encode("7")]
    return [SampleRequest(p, (11 * i + 1, 11 * i + 2, 11 * i + 3)) for i, p in enumerate(prompts)]


@pytest.mark.parametrize("direct_steps", [True, False])
def test_bf16_decoding_converts_each_weight_once_per_batch(monkeypatch, direct_steps):
    model, tokenizer = lora_policy(seed=3)
    conversions = []
    monkeypatch.setattr(packed_linear, "bf16_copy", lambda t: (conversions.append(t.shape), t.to(torch.bfloat16))[1])
    engine = HFEngine(model, tokenizer.pad_token_id, 16, direct_steps=direct_steps)
    groups = []
    for new_tokens in (2, 12):
        settings = SamplingSettings(1.0, 1.0, new_tokens, (), min_new_tokens=new_tokens)
        conversions.clear()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            samples = engine.generate(_requests(tokenizer), settings)
        groups.append(len(conversions))
        assert all(len(s.token_ids) == new_tokens for request in samples for s in request)
    layers = len(model.get_base_model().model.layers)
    # per decoder layer: q/k/v stacked, o, gate/up stacked, down; and the head: whatever the length
    assert groups == [4 * layers + 1] * 2
    assert all(isinstance(lp, float) for request in samples for s in request for lp in s.logprobs)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert "forward" not in model.get_base_model().model.layers[0].mlp.down_proj.__dict__  # restored


def _collect(trainer):
    torch.manual_seed(0)
    batch, _, _ = trainer.collect({"time_generate_s": 0.0, "time_score_s": 0.0, "generated_tokens": 0})
    return batch


def _mismatch(batch) -> float:
    mask = batch.response_mask.bool()
    return (batch.sampler_logp - batch.old_logp)[mask].abs().max().item()


@pytest.mark.usefixtures("fresh_accelerate_state")
def test_a_bf16_step_keeps_float32_weights_and_optimizer_state(tmp_path, monkeypatch):
    # padded scoring: the sampler's decode is padded too, so both sum the same products in the same order;
    # packed rows change the kernels' shapes, and bf16 rounding then differs by ~2e-3 (measured)
    cfg = tiny_config(*SMALL, "train.mixed_precision=bf16", "train.scoring_pass=always", "rollout.is_correction=tis",
                      "train.padding_free=false")
    trainer = Trainer(cfg, tmp_path)
    assert trainer.precision == "precision: bf16 (train.mixed_precision: bf16)"  # said when training starts
    plans, plan = [], DecoderStep.plan.__func__
    monkeypatch.setattr(DecoderStep, "plan", classmethod(lambda cls, *a, **k: plans.append(plan(cls, *a, **k))
                                                         or plans[-1]))
    before = {n: p.detach().clone() for n, p in trainer.unwrapped.named_parameters() if p.requires_grad}
    batch = _collect(trainer)
    assert batch.sampler_logp.dtype == batch.old_logp.dtype == torch.float32
    # the decode steps ran directly over the bf16 copies, past Accelerate's autocast wrapper
    assert plans and all(p is not None for p in plans)
    # the sampler's and the scoring pass's log-probs of the same tokens: both computed in bf16
    assert _mismatch(batch) < 1e-3
    outputs = []
    layer = trainer.unwrapped.get_base_model().model.layers[0].mlp.down_proj
    hook = layer.register_forward_hook(lambda m, i, out: outputs.append(out.dtype))
    stats = trainer.update(batch)
    hook.remove()
    assert outputs and set(outputs) == {torch.bfloat16}  # the update's products under bf16 autocast
    assert stats["optimizer_steps"] == 1
    trainable = {n: p for n, p in trainer.unwrapped.named_parameters() if p.requires_grad}
    assert {p.dtype for p in trainable.values()} == {torch.float32}
    assert any(not torch.equal(before[n], p) for n, p in trainable.items())  # it learned something
    state = [v for s in trainer.optimizer.optimizer.state.values() for v in s.values() if v.dim() > 0]
    assert state and {v.dtype for v in state} == {torch.float32}  # AdamW's moments


@pytest.mark.usefixtures("fresh_accelerate_state")
def test_float32_sampler_and_scoring_agree_to_float32_rounding(tmp_path):
    trainer = Trainer(tiny_config(*SMALL, "train.mixed_precision=no", "train.scoring_pass=always"), tmp_path)
    assert _mismatch(_collect(trainer)) < 1e-5


@pytest.mark.parametrize("measured_fastest", ["none", "mkl", "onednn"])
def test_float32_decoding_packs_as_the_calibration_measured_fastest(monkeypatch, measured_fastest):
    from meds_cli.core.cpu_calibration import Calibration, FastPaths
    from meds_cli.engine.rollout import hf_sampler

    model, tokenizer = lora_policy(seed=4)
    monkeypatch.setattr(hf_sampler, "cpu_fast_paths",
                        lambda: Calibration(FastPaths(measured_fastest, False, "hand-made"), "test"))
    entered = []
    real = hf_sampler.packed_linears
    monkeypatch.setattr(hf_sampler, "packed_linears", lambda m, **kw: (entered.append(kw), real(m, **kw))[1])
    settings = SamplingSettings(1.0, 1.0, 16, (), min_new_tokens=16)  # long enough to pay for packing
    HFEngine(model, tokenizer.pad_token_id, 16).generate(_requests(tokenizer), settings)
    assert entered == ([] if measured_fastest == "none" else [{"bf16": False, "packing": measured_fastest}])
    entered.clear()
    HFEngine(model, tokenizer.pad_token_id, 16, packing="mkl").generate(_requests(tokenizer), settings)
    assert entered == [{"bf16": False, "packing": "mkl"}]  # asked for explicitly: packed whatever was measured


def test_an_unknown_packing_is_refused_in_one_line():
    model, tokenizer = lora_policy(seed=4)
    with pytest.raises(ValueError, match="packing 'fast' is unknown; accepted: none, mkl, onednn"):
        HFEngine(model, tokenizer.pad_token_id, 16, packing="fast")


@pytest.mark.usefixtures("fresh_accelerate_state")
def test_training_starts_with_the_precision_line(tmp_path, capsys):
    trainer = Trainer(tiny_config(*SMALL, "train.mixed_precision=no"), tmp_path)
    assert "precision:" not in capsys.readouterr().err  # not before the run starts (a refused resume says only why)
    trainer.train()
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("precision:")]
    assert lines == ["precision: float32 (train.mixed_precision: no)"]


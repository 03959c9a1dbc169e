"""MEDS's logit-lens features taken from the forwards that sampled the responses
(meds_cli/engine/rollout/lens_probe.py) equal those of a separate scoring pass, and with the `hf`
engine the trainer plans no scoring pass for MEDS on DAPO."""

import pytest
import torch

from algorithms.meds import ANCHOR_INDEX, ANCHOR_KIND, FEATURES
from algorithms.meds_features import lens_logits
from meds_cli.core.forward import LensProbe, decoder_layers, output_head, position_ids_for
from meds_cli.core.records import Problem
from meds_cli.engine.rollout.batch import rollouts_from_samples, sample_rollouts
from meds_cli.engine.rollout.hf_sampler import HFEngine
from meds_cli.engine.rollout.sampling_engine import Sample, SamplingSettings, stop_token_ids
from meds_cli.engine.trainer import Trainer
from meds_cli.engine.training.algorithm_setup import build_algorithm
from meds_cli.engine.training.scoring import score_rollouts
from tests.conftest import tiny_config
from tests.float64 import assert_equal_in_float64, float64_norms
from tests.tiny_policy import lora_policy

PROMPTS = ["12+3=", "7*8=(", "hello", "9"]  # different lengths: left padding in the prefill


def float64_policy(seed):
    """The LoRA policy in float64 (tests/float64.py): the decode loop runs with the adapter merged
    into the weights and attends through its KV cache, the full forward does neither, so in
    float32 the two differ by rounding that depends on the CPU's kernels; in float64 they agree
    to ~1e-15 relative on every machine."""
    model, tokenizer = lora_policy(seed=seed)
    return model.double(), tokenizer


def assert_same_float32_features(actual, expected):
    """MEDS keeps its features in float32 (the clustering's input): two float64 computations that
    agree to ~1e-15 can still round to neighbouring float32 values, one ulp (2^-23 relative) apart."""
    assert actual.dtype == expected.dtype == torch.float32
    ulp = torch.finfo(torch.float32).eps
    torch.testing.assert_close(actual, expected, rtol=0, atol=2 * ulp * float(expected.abs().max()))


def sampled_batch(model, tokenizer, probe, *, group_size=3, max_new_tokens=10, batch_size=16):
    problems = [Problem(id=f"p{i}", question=p, answer="5") for i, p in enumerate(PROMPTS)]
    settings = SamplingSettings(1.0, 1.0, max_new_tokens, stop_token_ids(tokenizer), lens=probe)
    torch.manual_seed(0)
    return sample_rollouts(HFEngine(model, tokenizer.pad_token_id, batch_size), tokenizer, PROMPTS, problems,
                           group_size, settings)


@pytest.mark.parametrize("final_norm", [False, True])
def test_recorded_lens_equals_a_full_forward_at_every_response_token(final_norm):
    with float64_norms():
        check_recorded_lens(final_norm)


def check_recorded_lens(final_norm):
    model, tokenizer = float64_policy(seed=5)
    layers = (0, 1, 3, 4)  # the embeddings (a pre-hook), inner layers, the last (the final norm's output)
    # generation_batch_size 5 splits a prompt's samples over two decode batches
    batch = sampled_batch(model, tokenizer, LensProbe(layers, final_norm), batch_size=5)
    lengths = batch.response_lengths.tolist()
    assert min(lengths) < max(lengths)  # some rows stopped early and left the decode batch
    with torch.no_grad():
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                    position_ids=position_ids_for(batch.attention_mask), output_hidden_states=True)
    norm, head = output_head(model)
    for i, n in enumerate(lengths):
        assert batch.sampler_lens[i].shape == (n, len(layers))
        columns = batch.prompt_width - 1 + torch.arange(n)
        expected = lens_logits(out.hidden_states, list(layers), torch.full((n,), i), columns,
                               batch.response_ids[i, :n], head, norm if final_norm else None)
        assert_equal_in_float64(batch.sampler_lens[i], expected, f"row {i}")


@pytest.mark.parametrize("spec", ["last_half", "[0, 2, -1]"])
def test_meds_features_from_the_sampler_equal_the_scoring_pass(spec):
    with float64_norms():
        check_features_from_the_sampler(spec)


def check_features_from_the_sampler(spec):
    model, tokenizer = float64_policy(seed=5)
    overrides = ("algo.name=meds", f"meds.layers={spec}", "meds.final_norm=true")
    through_pass = build_algorithm(tiny_config(*overrides))
    probed = build_algorithm(tiny_config(*overrides))
    needs = probed.forward_needs(num_layers=4, records_lens=True)
    probe = needs.lens
    assert probe is not None and not needs.hidden_states
    batch = sampled_batch(model, tokenizer, probe)
    score_rollouts(model, batch, micro_batch_size=5, with_reference=False, wants_hidden_states=True,
                   observe=lambda view: through_pass.observe_forward(batch, view), tokenizer=tokenizer)
    expected = {key: batch.extras.pop(key) for key in (FEATURES, ANCHOR_INDEX, ANCHOR_KIND)}
    score_rollouts(model, batch, micro_batch_size=5, with_reference=False, wants_hidden_states=False,
                   observe=lambda view: probed.observe_forward(batch, view), tokenizer=tokenizer)
    assert FEATURES not in batch.extras  # a probed MEDS ignores the scoring pass
    probed.observe_probe(batch, tokenizer)
    assert batch.extras[ANCHOR_INDEX].tolist() == expected[ANCHOR_INDEX].tolist()
    assert batch.extras[ANCHOR_KIND] == expected[ANCHOR_KIND]
    assert_same_float32_features(batch.extras[FEATURES], expected[FEATURES])


class CharTokenizer:
    """One character per token id: token i is text[i]."""

    pad_token_id = 0

    def __init__(self, text):
        self.text = text

    def decode(self, ids, skip_special_tokens=True):
        return "".join(self.text[i] for i in ids)

    def batch_decode(self, seqs, skip_special_tokens=True):
        return [self.decode(s) for s in seqs]


def test_features_are_the_recorded_values_at_the_answer_token():
    """from_lens picks, per response, the recorded row of y*: the token after `\\boxed{`, or the last one."""
    texts = ["ab\\boxed{7}", "xyz"]
    tokenizer = CharTokenizer("".join(texts))
    ids = [list(range(len(texts[0]))), list(range(len(texts[0]), len(texts[0]) + 3))]
    lens = [torch.arange(len(t) * 2, dtype=torch.float32).view(len(t), 2) + 100 * i for i, t in enumerate(ids)]
    samples = [[Sample(t, stopped=True, lens=v)] for t, v in zip(ids, lens)]
    problems = [Problem(id="a", question="q", answer="7"), Problem(id="b", question="q", answer="7")]
    batch = rollouts_from_samples(tokenizer, [(0,), (0,)], samples, problems, 1, [])
    algo = build_algorithm(tiny_config("algo.name=meds", "meds.layers=last:2", "rollout.group_size=2"))
    algo.forward_needs(num_layers=4, records_lens=True)
    algo.observe_probe(batch, tokenizer)
    assert batch.extras[ANCHOR_INDEX].tolist() == [9, 2]  # '7' (after 'ab\boxed{'), the last 'z'
    assert batch.extras[ANCHOR_KIND] == ["boxed", "last"]
    assert batch.extras[FEATURES].tolist() == [lens[0][9].tolist(), lens[1][2].tolist()]


def _planned(tmp_path, *overrides):
    return Trainer(tiny_config("rollout.prompts_per_step=2", "rollout.group_size=4", "rollout.max_new_tokens=6",
                               *overrides, output_dir=tmp_path), tmp_path)


def test_meds_on_dapo_runs_no_scoring_pass_with_the_hf_engine(tmp_path):
    trainer = _planned(tmp_path / "hf", "algo.name=meds", "meds.layers=last:2")
    assert trainer.lens_probe == LensProbe((3, 4), False) and trainer.scoring is None
    passes = []
    trainer._score = lambda batch, timing: passes.append(batch.size)
    row = trainer.train_step()
    assert passes == [] and row["groups_trained"] > 0  # trained, shaped by MEDS, with no scoring pass
    assert "meds/wrong_penalty_mean" in row or "meds/clusters_per_prompt" in row
    # KL to the reference still needs the pass (reference log-probs); MEDS still reads the sampler.
    kl = _planned(tmp_path / "kl", "algo.name=meds", "algo.base=grpo", "grpo.kl_coef=0.1")
    assert kl.lens_probe is not None and kl.scoring == "trained"
    # Semantic features are not logit-lens values: the pass stays (the engine still records the
    # diversity probe's values for diversity/eigen_ratio_top1, which MEDS does not read).
    semantic = _planned(tmp_path / "sem", "algo.name=meds", "meds.features=hidden_mean")
    assert semantic.lens_probe == LensProbe((3, 4), False) and semantic.scoring == "trained"
    no_probe = _planned(tmp_path / "none", "algo.name=meds", "meds.features=hidden_mean", "train.diversity_layers=none")
    assert no_probe.lens_probe is None and no_probe.scoring == "trained"


def test_an_engine_without_lens_values_keeps_the_scoring_pass(tmp_path, monkeypatch):
    original = HFEngine.__init__

    def records_nothing(self, *args, **kwargs):  # an engine that records no lens values, as vLLM
        original(self, *args, **kwargs)
        self.records_lens = False

    monkeypatch.setattr(HFEngine, "__init__", records_nothing)
    trainer = _planned(tmp_path, "algo.name=meds", "meds.layers=last:2")
    assert trainer.lens_probe is None and trainer.scoring == "trained"
    passes = []
    score = trainer._score
    trainer._score = lambda batch, timing: (passes.append(batch.size), score(batch, timing))
    row = trainer.train_step()  # MEDS got its features from the pass
    assert passes and "meds/clusters_per_prompt" in row


def test_under_bf16_autocast_the_trainer_samples_in_the_scoring_pass_precision(tmp_path, fresh_accelerate_state):
    """The trainer samples under the update's autocast, as the scoring pass runs, so the lens
    values recorded while decoding are computed in the precision the scoring pass reads (sampled
    outside it, they measured up to 2.2e-3 apart from the pass's on one machine). Asserted on what
    decides it, the dtype every projection of the decode loop and of the scoring pass computes in:
    the values themselves differ by bf16 rounding between an incremental and a whole forward, by
    an amount that depends on the CPU's kernels (0 on AVX-512, 7e-4 under ATEN_CPU_CAPABILITY=avx2).
    Accelerate's prepare() puts the model's own forward under autocast; under FSDP2 the model is
    not prepared (engine/training/update.py), so the test takes that wrapper off, as there."""
    trainer = _planned(tmp_path, "algo.name=meds", "meds.layers=[1, 3, 4]", "train.mixed_precision=bf16")
    assert trainer.acc.mixed_precision == "bf16" and trainer.lens_probe is not None
    trainer.unwrapped.forward = trainer.unwrapped._original_forward  # the forward as FSDP2 leaves it
    q_proj = decoder_layers(trainer.unwrapped)[0].self_attn.q_proj
    projection = getattr(q_proj, "base_layer", q_proj)  # the matmul itself, under the LoRA wrapper
    seen = []
    hook = projection.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    try:
        torch.manual_seed(0)
        timing = {"time_generate_s": 0.0, "time_score_s": 0.0, "generated_tokens": 0}
        batch = trainer._sample([0, 1], timing)
        decoding, seen[:] = list(seen), []
        trainer._score(batch, timing)
        scoring = list(seen)
    finally:
        hook.remove()
    assert batch.sampler_lens is not None and len(decoding) > 2  # a prefill and a forward per new token
    assert set(decoding) == set(scoring) == {torch.bfloat16}

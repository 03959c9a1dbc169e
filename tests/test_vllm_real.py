"""The `vllm` rollout engine against the real vLLM (its CPU build, vllm-cpu, in .venv-vllm:
`make test-vllm`). Marked `vllm`: the default suite leaves these out, and they skip where vllm is
not installed. tests/test_vllm_engine.py tests the same engine against a fake, everywhere.

Most runs use a small random Llama written to a folder (the tiny tokenizer, head size 64, two
layers) with a reward function that gives every group a spread, so that a large learning rate
moves the policy at every step; the comparisons of log-probs and of eval backends use the
embedded SmolLM2-135M, whose distributions are those of a trained model.
"""

from __future__ import annotations

import gc
import json
import math
import os
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB per engine; the default takes a fifth of the memory

from typer.testing import CliRunner  # noqa: E402

from benchmarks.generation import GenerationSettings, Request  # noqa: E402
from benchmarks.tasks import build_task  # noqa: E402
from meds_cli.app import app  # noqa: E402
from meds_cli.engine.config import load_config  # noqa: E402
from meds_cli.engine.model_io.model import load_model_and_tokenizer, resolve_model  # noqa: E402
from meds_cli.engine.model_io.tiny import tiny_model_and_tokenizer  # noqa: E402
from meds_cli.engine.rollout.batch import sample_rollouts, sampling_settings  # noqa: E402
from meds_cli.engine.rollout.engines import make_backend  # noqa: E402
from meds_cli.engine.rollout.eval_backends import ModelSpec  # noqa: E402
from meds_cli.engine.rollout.vllm_engine import VLLMConfig, VLLMEngine  # noqa: E402
from meds_cli.engine.trainer import Trainer  # noqa: E402
from meds_cli.engine.training.scoring import score_rollouts  # noqa: E402
from tests.conftest import needs_embedded  # noqa: E402

runner = CliRunner()
FLOAT32_EPS = 2.0 ** -23  # float32's relative rounding step (torch.finfo(torch.float32).eps)
# Sampler and trainer compute the same float32 log-probs with different kernels (vLLM's oneDNN
# matmuls and its own attention against torch's), so they agree to rounding, not bit for bit. A
# log-prob is logit - logsumexp(logits): each of the L decoder layers adds a rounding error of a
# few eps relative to the size of the hidden state, which the remaining layers carry to the
# logits; with |logit| of order 10 and the error of a sum of d = hidden-size products growing as
# sqrt(d) * eps, |d logp| is of order 10 * L * sqrt(d) * eps: 9e-4 for SmolLM2 (L = 30,
# d = 576), 4e-5 for the random model (L = 2, d = 256). The bounds below are that estimate; a
# policy that did not reach vLLM misses them by orders of magnitude (the sync-off test).
TOLERANCE_SMOLLM2 = 10 * 30 * math.sqrt(576) * FLOAT32_EPS
TOLERANCE_RANDOM = 10 * 2 * math.sqrt(256) * FLOAT32_EPS
REWARD = '''
def digit_share(completions, **kwargs):
    """The share of digits in a response: random responses differ, so every group has a spread."""
    return [sum(c.isdigit() for c in text) / max(1, len(text)) for text in completions]
'''


@pytest.fixture(autouse=True)
def free_engines():
    yield
    gc.collect()  # an engine of a finished test goes before the next one is built


@pytest.fixture(scope="module")
def random_model(tmp_path_factory) -> Path:
    """A random two-layer Llama (head size 64, as vLLM's CPU attention needs) with the tiny
    character tokenizer, saved as a model folder vLLM and transformers both load."""
    folder = tmp_path_factory.mktemp("random-llama")
    model, tokenizer = tiny_model_and_tokenizer(layers=2, hidden=256, seed=3)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tied_random_model(tmp_path_factory) -> Path:
    """The random model with its output head tied to the embeddings, as SmolLM2's: vLLM serves
    the head from the embedding tensor, which a full-weight push must update as well."""
    from transformers import LlamaForCausalLM

    folder = tmp_path_factory.mktemp("tied-random-llama")
    model, tokenizer = tiny_model_and_tokenizer(layers=2, hidden=256, seed=3)
    config = model.config
    config.tie_word_embeddings = True
    torch.manual_seed(4)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def reward_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("reward") / "rewards.py"
    path.write_text(REWARD)
    return path


def run_settings(model: Path, reward: Path, algo: str, *extra: str) -> list[str]:
    return [f"model.name={model}", "task.name=copy", f"algo.name={algo}", "rollout.engine=vllm",
            "rollout.vllm.dtype=float32", "rollout.vllm.enforce_eager=true", "rollout.vllm.max_model_len=256",
            "rollout.max_new_tokens=8", "rollout.prompts_per_step=4", "rollout.group_size=4",
            "rollout.hf.generation_batch_size=16", "train.micro_batch_size=16", "train.checkpoint_every=0",
            "optim.warmup_steps=0", "optim.lr=0.05", "model.lora.rank=8", f"reward.functions={reward}:digit_share",
            "dapo.dynamic_sampling=false", "meds.cluster_workers=1", *extra]


def mismatch_per_step(tmp_path: Path, settings: list[str], steps: int, *, sync: bool = True) -> list[dict]:
    cfg = load_config(overrides=[*settings, f"train.steps={steps}", f"train.output_dir={tmp_path}"])
    trainer = Trainer(cfg, tmp_path)
    assert isinstance(trainer.engine, VLLMEngine)
    if not sync:  # the engine never hears of an update: it keeps the policy it was built with
        trainer.engine.policy_updated = lambda: None
    rows = [trainer.train_step() for _ in range(steps)]
    for row in rows:
        trainer.step = row["step"]
    del trainer
    return [{k: row[k] for k in ("step", "mismatch/kl_k3", "mismatch/logp_abs_diff", "loss")} for row in rows]


@pytest.mark.parametrize("algo, sync", [("grpo", "lora-adapter"), ("dapo", "lora-merged"), ("meds", "full"),
                                        ("grpo", "full-tied")])
def test_the_policy_reaches_vllm_after_every_step(tmp_path, random_model, tied_random_model, reward_file, algo, sync):
    full = ["model.lora.enabled=false", "optim.lr=0.003"]
    extra = {"lora-adapter": ["rollout.vllm.sync=adapter"], "lora-merged": ["rollout.vllm.sync=merged"],
             "full": full, "full-tied": full}[sync]
    model = tied_random_model if sync == "full-tied" else random_model
    rows = mismatch_per_step(tmp_path, run_settings(model, reward_file, algo, *extra), steps=4)
    print(algo, sync, rows)
    for row in rows:
        assert row["mismatch/logp_abs_diff"] < TOLERANCE_RANDOM, rows
        # k3 = e^d - 1 - d is about d^2 / 2, below float32's own rounding of e^d (eps per token)
        # here: its bound is the same rounding level.
        assert row["mismatch/kl_k3"] < TOLERANCE_RANDOM, rows


@pytest.mark.parametrize("sync", ["lora-adapter", "full"])
def test_without_the_sync_the_mismatch_grows(tmp_path, random_model, reward_file, sync):
    extra = {"lora-adapter": [], "full": ["model.lora.enabled=false", "optim.lr=0.003"]}[sync]
    rows = mismatch_per_step(tmp_path, run_settings(random_model, reward_file, "grpo", *extra), steps=4, sync=False)
    print("sync off", sync, rows)
    gaps = [row["mismatch/logp_abs_diff"] for row in rows]
    assert gaps[0] < TOLERANCE_RANDOM  # the first push still happens: the engine starts on the policy
    # From the first update on, vLLM samples from a policy the trainer has left behind.
    assert all(gap > 100 * TOLERANCE_RANDOM for gap in gaps[1:]), rows


@needs_embedded
@pytest.mark.parametrize("temperature", [0.6, 1.0, 1.3])
def test_sampler_logprobs_equal_the_trainers_to_float32_rounding(temperature, smollm2_engine):
    engine, model, tokenizer = smollm2_engine
    cfg = load_config(overrides=["model.name=smollm2-135m", "task.name=arithmetic",
                                 f"rollout.temperature={temperature}", "rollout.top_p=1.0",
                                 "rollout.max_new_tokens=24"])
    task = build_task(cfg.task, 0)
    problems = task.train[:4]
    torch.manual_seed(1)
    batch = sample_rollouts(engine, tokenizer, [task.prompt(p, tokenizer) for p in problems], problems, 2,
                            sampling_settings(cfg.rollout, tokenizer))
    sampler = batch.sampler_logp.clone()
    score_rollouts(model, batch, 8, with_reference=False, temperature=temperature)
    mask = batch.response_mask.bool()
    gap = (batch.old_logp - sampler)[mask].abs()
    print(temperature, "max", gap.max().item(), "mean", gap.mean().item(), "tokens", int(mask.sum()))
    assert mask.sum() > 40
    assert gap.max() < TOLERANCE_SMOLLM2


@pytest.fixture(scope="module")
def smollm2_engine():
    model, tokenizer = load_model_and_tokenizer("smollm2-135m", "float32")
    model.eval()
    engine = VLLMEngine(resolve_model("smollm2-135m"), options=VLLMConfig(dtype="float32", sleep_level=0,
                                                                         max_model_len=1024, enforce_eager=True))
    yield engine, model, tokenizer
    del engine
    gc.collect()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_a_resumed_run_sends_its_checkpoint_to_vllm(tmp_path, random_model, reward_file):
    run = tmp_path / "run"
    settings = run_settings(random_model, reward_file, "grpo", "train.checkpoint_every=2")
    sets = [a for s in settings for a in ("--set", s)]
    result = invoke("train", *sets, "--steps", "2", "--output", run, "-q")
    assert result.exit_code == 0, result.output
    result = invoke("train", "--resume", run, "--steps", "3", "-q")
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    print("resume", [(r["step"], r["mismatch/logp_abs_diff"]) for r in rows])
    assert [r["step"] for r in rows] == [1, 2, 3]
    # Two steps at lr 0.05 moved the policy far from the base model vLLM loads from its folder:
    # step 3 samples at rounding level only if the resumed adapter was sent to vLLM.
    assert rows[2]["mismatch/logp_abs_diff"] < TOLERANCE_RANDOM
    result = invoke("eval", run, "--backend", "vllm", "--benchmarks", "math500", "--data-dir", tiny_data(tmp_path),
                    "--k", "2", "--n", "2", "--max-new-tokens", "8", "-q", "--output", tmp_path / "eval")
    assert result.exit_code == 0, result.output
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert results["backend"] == "vllm" and results["checkpoint"].endswith("step_3")
    assert results["benchmarks"]["math500"]["problems"] == 3


def tiny_data(tmp_path: Path) -> Path:
    """A math500-format folder of problems in the tiny tokenizer's characters."""
    folder = tmp_path / "data"
    (folder / "math500").mkdir(parents=True, exist_ok=True)
    rows = [{"problem": "compute 1+1", "answer": "2"}, {"problem": "compute 2*3", "answer": "6"},
            {"problem": "compute 9-4", "answer": "5"}]
    (folder / "math500" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def arithmetic_data(tmp_path: Path, count: int) -> Path:
    """A math500-format folder of one-digit sums, a set SmolLM2-135M gets partly right."""
    folder = tmp_path / "arith"
    (folder / "math500").mkdir(parents=True, exist_ok=True)
    pairs = [(a, b) for a in range(1, 10) for b in range(1, 10)][::7][:count]
    (folder / "math500" / "test.jsonl").write_text("".join(
        json.dumps({"problem": f"What is {a} + {b}?", "answer": str(a + b)}) + "\n" for a, b in pairs))
    return folder


@needs_embedded
def test_meds_eval_with_vllm_on_a_bare_model_writes_what_hf_writes(tmp_path):
    data = arithmetic_data(tmp_path, 12)
    common = ["--model", "smollm2-135m", "--benchmarks", "math500", "--data-dir", data, "--max-new-tokens", "32", "-q",
              "--temperature", "0", "--k", "1", "--n", "1"]
    responses = {}
    for backend in ("hf", "vllm"):
        out = tmp_path / backend
        result = invoke("eval", *common, "--backend", backend, "--output", out)
        assert result.exit_code == 0, result.output
        assert json.loads((out / "results.json").read_text())["backend"] == backend
        rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
        responses[backend] = [r["response"] for r in sorted(rows, key=lambda r: r["problem_id"])]
    # Greedy: the same float32 model picks the same tokens except at near ties, so nearly every
    # response is the same text.
    same = sum(a == b for a, b in zip(responses["hf"], responses["vllm"]))
    assert same >= 10, list(zip(responses["hf"], responses["vllm"]))


@needs_embedded
def test_both_backends_grade_the_same_problems_alike():
    """SmolLM2 gets no benchmark answer boxed at this size, so the seeded set is the arithmetic
    task's (graded by its last integer): each eval backend samples 8 answers to 16 problems."""
    task = build_task(load_config(overrides=["task.name=arithmetic"]).task, 0)
    problems = task.train[:16]
    settings = GenerationSettings(temperature=0.6, top_p=1.0, max_new_tokens=24, batch_size=64)
    passed = {}
    for name in ("hf", "vllm"):
        backend = make_backend(name, ModelSpec("smollm2-135m"), settings)
        requests = [Request(task.prompt(p, backend.tokenizer), 8, 100 + i) for i, p in enumerate(problems)]
        texts = [text for generated in backend.generate(requests) for text in generated.texts]
        verdicts = task.grade([(p, t) for p, group in zip(problems, [texts[i:i + 8] for i in range(0, 128, 8)])
                               for t in group])
        passed[name] = sum(v.correct for v in verdicts) / len(verdicts)
        del backend
        gc.collect()
    print("pass@1 over 128 samples", passed)
    # Other random numbers, one distribution: pass@1 over 128 samples each differs by sampling
    # noise only (4 standard errors of the difference of two such means).
    p = (passed["hf"] + passed["vllm"]) / 2
    assert 0 < p < 1, passed  # a set the model gets partly right: the comparison can fail
    assert abs(passed["hf"] - passed["vllm"]) <= 4 * math.sqrt(2 * p * (1 - p) / 128), passed


@pytest.mark.parametrize("setting, words", [
    (["--set", "rollout.temperature=2.5"], ["rollout.temperature=2.5 is above 2"]),
    (["--set", "rollout.vllm.max_model_len=100000"], ["vLLM refused", "max_model_len"]),
    (["--set", "model.name=tiny-llama"], ["cannot load 'tiny-llama'"]),
])
def test_bad_vllm_settings_end_in_one_line(tmp_path, random_model, reward_file, setting, words):
    sets = [a for s in run_settings(random_model, reward_file, "grpo") for a in ("--set", s)]
    result = invoke("train", *sets, *setting, "--steps", "1", "--output", tmp_path / "run", "-q")
    # The output may hold the model's loading bar and the engine's notes before it; the refusal
    # itself is the one last line, with no traceback.
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    assert result.exit_code == 2 and errors == lines[-1:] and "Traceback" not in result.output, result.output
    for word in words:
        assert word in errors[0], errors[0]

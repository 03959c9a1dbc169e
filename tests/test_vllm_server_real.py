"""The `vllm-server` engine against a real `vllm serve` (vllm-cpu in .venv-vllm:
`.venv-vllm/bin/python -m pytest -q -m vllm tests/test_vllm_server_real.py`). Marked `vllm`: the
default suite leaves it out (each test starts a server, a minute or more on 2 cores), and it
skips where vllm is not installed. tests/test_vllm_server.py tests the engine against a fake.

meds starts the server itself (`rollout.server.start`, on 127.0.0.1, VLLM_SERVER_DEV_MODE=1 and
VLLM_ALLOW_RUNTIME_LORA_UPDATING=1, --enable-lora, float32, eager) on the random two-layer Llama
of tests/test_vllm_real.py, and stops it when the trainer closes, however the test ends.
"""

from __future__ import annotations

import math
import os
import socket
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB for the server's KV cache

from meds_cli.engine.config import load_config  # noqa: E402
from meds_cli.engine.model_io.tiny import tiny_model_and_tokenizer  # noqa: E402
from meds_cli.engine.rollout.vllm_server import VLLMServerEngine  # noqa: E402
from meds_cli.engine.trainer import Trainer  # noqa: E402

# As tests/test_vllm_real.py: 10 * layers * sqrt(hidden) * float32 eps, the rounding the two
# kernels' float32 log-probs may differ by on the random model; a policy that did not reach the
# server misses it by orders of magnitude.
TOLERANCE_RANDOM = 10 * 2 * math.sqrt(256) * 2.0 ** -23
REWARD = '''
def digit_share(completions, **kwargs):
    return [sum(c.isdigit() for c in text) / max(1, len(text)) for text in completions]
'''


@pytest.fixture(scope="module")
def random_model(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("random-llama")
    model, tokenizer = tiny_model_and_tokenizer(layers=2, hidden=256, seed=3)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_steps(tmp_path: Path, model: Path, k: int, steps: int = 3) -> list[dict]:
    reward = tmp_path / "rewards.py"
    reward.write_text(REWARD)
    cfg = load_config(overrides=[
        f"model.name={model}", "task.name=copy", "algo.name=grpo", "rollout.engine=vllm-server",
        "rollout.server.start=true", f"rollout.server.port={free_port()}", "rollout.server.health_timeout_s=900",
        "rollout.vllm.dtype=float32", "rollout.vllm.enforce_eager=true", "rollout.vllm.max_model_len=256",
        "rollout.vllm.max_num_batched_tokens=2048", "train.mixed_precision=no", "rollout.max_new_tokens=8",
        "rollout.prompts_per_step=4", "rollout.group_size=4", "train.micro_batch_size=16", "train.checkpoint_every=0",
        "optim.warmup_steps=0", "optim.lr=0.05", "model.lora.rank=8", f"reward.functions={reward}:digit_share",
        f"rollout.max_staleness={k}", f"train.steps={steps}", f"train.output_dir={tmp_path}"])
    trainer = Trainer(cfg, tmp_path)
    server = trainer.engine.engine.server
    try:
        assert isinstance(trainer.engine.engine, VLLMServerEngine)
        rows = [trainer.train_step() for _ in range(steps)]
        # a version per update that a later step samples from (at k = 1 the last update is sampled by no step)
        assert trainer.engine.engine.pushes == list(range(steps - k))
    finally:
        trainer.close()
    assert server.exit_code() is not None  # stopped with the run
    assert "Loaded new LoRA adapter" in (tmp_path / "vllm-server.log").read_text()
    print(k, [{key: r[key] for key in ("mismatch/logp_abs_diff", "rollout/staleness_max", "loss")} for r in rows])
    return rows


def test_after_each_adapter_push_the_servers_logprobs_are_the_trainers(tmp_path, random_model):
    """k = 0: every step samples from the adapter pushed after the previous update, and the
    trainer scores those tokens with the same weights, so the gap is float32 rounding."""
    rows = run_steps(tmp_path, random_model, 0)
    for row in rows:
        assert row["mismatch/logp_abs_diff"] < TOLERANCE_RANDOM, rows
        assert row["rollout/staleness_max"] == 0.0
    assert len({row["loss"] for row in rows}) > 1  # the policy moved


def test_three_steps_at_k1_train_on_rollouts_one_version_old(tmp_path, random_model):
    rows = run_steps(tmp_path, random_model, 1)
    assert rows[0]["rollout/staleness_max"] == 0.0 and rows[0]["mismatch/logp_abs_diff"] < TOLERANCE_RANDOM
    assert [r["rollout/staleness_max"] for r in rows[1:]] == [1.0, 1.0]

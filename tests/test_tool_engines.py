"""The tool turn loop wired into the engines (issue 56): a scripted fake RolloutEngine through
batch.sample_rollouts (the batch the trainer gets), and real runs of the embedded SmolLM2 with
rollout.tools on (slow)."""

import json

import pytest

from meds_cli.core.records import Problem
from meds_cli.engine.rollout.batch import sample_rollouts
from meds_cli.engine.rollout.sampling_engine import Sample, SamplingSettings
from meds_cli.engine.rollout.tools.settings import ToolSettings
from meds_cli.engine.rollout.tools.turn_loop import turn_seed
from tests.conftest import needs_embedded
from tests.scripted_tool_engine import CharTokenizer, ScriptedEngine

EOS = 3  # a character no script holds: the scripted engine's stop id


class BatchTokenizer(CharTokenizer):
    """The char tokenizer with what batch.py reads of a transformers tokenizer."""

    pad_token_id = 0

    def __call__(self, texts, add_special_tokens=False):
        return {"input_ids": [self.encode(t) for t in texts]}

    def __len__(self):
        return 0x110000

    def decode(self, ids, skip_special_tokens=False) -> str:
        return super().decode([i for i in ids if not (skip_special_tokens and i == EOS)])

    def batch_decode(self, rows, skip_special_tokens=False):
        return [self.decode(r, skip_special_tokens) for r in rows]


class ScriptedRolloutEngine:
    """ScriptedEngine behind the RolloutEngine interface: each request's samples continue its
    script, pausing at the settings' stop strings, ending with EOS when the script does."""

    name = "scripted"

    def __init__(self, prompts, scripts):
        self.scripted = ScriptedEngine(prompts, [s + chr(EOS) for s in scripts])
        self.asked: list[tuple] = []  # (budget, stop strings, seeds) of every request

    def generate(self, requests, settings: SamplingSettings):
        out = []
        for request in requests:
            self.asked.append((request.budget(settings), settings.stop_strings, request.seeds))
            group = []
            for _ in request.seeds:
                [turn] = self.scripted([list(request.prompt_ids)], [request.budget(settings)],
                                       list(settings.stop_strings))
                ended = turn.finished and bool(turn.token_ids) and turn.token_ids[-1] == EOS
                group.append(Sample(turn.token_ids, ended, turn.logprobs, paused=not turn.finished))
            out.append(group)
        return out


PROMPT = "Q: 6 * 7?\n"
SCRIPT = "Compute.\n```python\nprint(6 * 7)\n```\nSo \\boxed{42}."


def settings(tools=True, max_new_tokens=400):
    return SamplingSettings(1.0, 1.0, max_new_tokens, (EOS,),
                            tools=ToolSettings(tools=["python"], tool_time_limit_s=5.0) if tools else None)


def test_sample_rollouts_with_tools_lays_out_observations_masks_and_stats():
    engine = ScriptedRolloutEngine([PROMPT], [SCRIPT])
    tokenizer = BatchTokenizer()
    batch = sample_rollouts(engine, tokenizer, [PROMPT], [Problem("p0", PROMPT, "42")], 1, settings(), seeds=[[11]])
    observation = "```output\n42\n```\n"
    first, second = SCRIPT.split("So ")[0], "So " + SCRIPT.split("So ")[1]
    assert batch.response_texts == [first + observation + second]
    assert batch.observation_spans == [[(len(first), len(first) + len(observation))]]
    assert batch.answer_texts == [first + second]
    n = len(first) + len(observation) + len(second) + 1  # the EOS kept
    mask = batch.response_mask[0, :n].tolist()
    assert mask == [1.0] * len(first) + [0.0] * len(observation) + [1.0] * (len(second) + 1)
    assert batch.attention_mask[0, batch.prompt_width:batch.prompt_width + n].tolist() == [1] * n
    assert batch.sampler_logp[0, len(first):len(first) + len(observation)].abs().sum() == 0
    assert batch.sampler_logp[0, :len(first)].lt(0).all() and not batch.truncated[0]
    assert batch.tool_stats[0].calls == 1 and batch.tool_stats[0].errors == 0
    # two turns: the first with the response's own seed and the whole budget (what was prefetched), the
    # second with its remaining budget and seed turn_seed(11, 1)
    stops = ("\n```\n", "```output", "</code>")
    assert engine.asked == [(400, stops, (11,)), (400 - len(first) - len(observation), stops, (turn_seed(11, 1),))]


def test_without_tools_the_batch_is_sampled_in_one_call_as_before():
    engine = ScriptedRolloutEngine([PROMPT], [SCRIPT])
    batch = sample_rollouts(engine, BatchTokenizer(), [PROMPT], [Problem("p0", PROMPT, "42")], 1, settings(tools=False),
                            seeds=[[11]])
    assert batch.response_texts == [SCRIPT] and batch.observation_spans == [] and batch.tool_stats == []
    assert engine.asked == [(400, (), (11,))]


def test_turn_seeds_are_the_seed_first_then_distinct_and_fixed():
    assert turn_seed(5, 0) == 5
    seeds = {turn_seed(s, t) for s in range(50) for t in range(1, 6)}
    assert len(seeds) == 250 and all(0 <= s < 2**62 for s in seeds)
    assert turn_seed(5, 3) == turn_seed(5, 3)


# ------------------------------------------------------------------ the embedded SmolLM2, two steps

# The model rarely writes a ```python block, so the tag pair is one it writes all the time on the
# arithmetic task: "=" opens a block and a newline closes it ("3 + 4 = 7\n" runs " 7" as Python).
# The path is the real one (stop strings, the sandbox, observations, masks); the code is trivial.
FORCING = ["rollout.tools=[python]", "rollout.code_tags=['=', '\n']", "rollout.max_tool_calls=2",
           "rollout.tool_time_limit_s=5"]


def two_tool_steps(tmp_path, *overrides):
    from meds_cli.engine.config import load_config
    from meds_cli.engine.trainer import Trainer

    cfg = load_config(["configs/smollm2.yaml"], [
        "train.steps=2", "rollout.prompts_per_step=2", "rollout.group_size=4", "rollout.max_new_tokens=48",
        "dapo.max_gen_batches=1", "train.checkpoint_every=100", *FORCING, *overrides])
    rows = Trainer(cfg, tmp_path).train()
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    return rows, samples, metrics


@needs_embedded
@pytest.mark.slow
@pytest.mark.parametrize("engine", [["rollout.engine=hf"], ["rollout.engine=hf-worker"],
                                    ["rollout.engine=hf-worker", "rollout.max_staleness=1"]],
                         ids=["hf", "hf-worker-k0", "hf-worker-k1"])
def test_two_steps_of_smollm2_with_tools(tmp_path, engine):
    rows, samples, metrics = two_tool_steps(tmp_path, *engine)
    assert [row["step"] for row in rows] == [1, 2]
    step_rows = [m for m in metrics if "tools/calls_mean" in m]
    assert len(step_rows) == 2
    assert sum(m["tools/calls_mean"] for m in step_rows) > 0  # blocks ran: observations were inserted
    assert all(m.get("rollout/prefetch_miss", 0) == 0 for m in metrics)
    assert samples and all("tools" in s for s in samples)

"""The tool turn loop wired into the engines (issue 56): a scripted fake RolloutEngine through
batch.sample_rollouts (the batch the trainer gets), and real runs of the embedded SmolLM2 with
rollout.tools on (slow)."""

import json

import pytest

from meds_cli.core.records import Problem
from meds_cli.engine.rollout.batch import sample_rollouts
from meds_cli.engine.rollout.sampling_engine import Sample, SamplesInProcess, SamplingSettings
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


# ------------------------------------------------------------------ several training processes


class ThreadProcesses:
    """Training processes as threads: `any(flag)` is True on every thread when True on one, and
    `meet()` waits for every thread (a collective call); a thread that never comes fails the others
    after a few seconds instead of hanging the test."""

    def __init__(self, count: int):
        import threading

        self.barrier = threading.Barrier(count, timeout=10)
        self.flags = [False] * count

    def any_of(self, rank: int):
        def agree(flag: bool) -> bool:
            self.flags[rank] = flag
            self.barrier.wait()
            out = any(self.flags)
            self.barrier.wait()  # every thread has read the flags before the next call writes them
            return out
        return agree


class CollectiveEngine(ScriptedRolloutEngine):
    """The scripted engine whose every `generate` is collective (as a pipeline's agreement or
    vLLM's tensor-parallel pooling is): it waits for the other processes' call; `calls` records the
    stop strings and the number of requests of each."""

    def __init__(self, prompts, scripts, processes: ThreadProcesses):
        super().__init__(prompts, scripts)
        self.processes, self.calls = processes, []

    def generate(self, requests, settings):
        self.calls.append((settings.stop_strings, len(requests)))
        self.processes.barrier.wait()
        return super().generate(requests, settings)


TWO_BLOCKS = "Set.\n```python\nx = 6 * 7\n```\nShow.\n```python\nprint(x)\n```\nSo \\boxed{42}."


@pytest.mark.parametrize("other", ["answers-at-once", "no-prompts"])
def test_processes_whose_responses_take_different_turns_make_the_same_engine_calls(other):
    """Process 0's response runs two blocks (three turns), process 1's none (one turn) or it has no
    prompt at all: with the processes' agreement both make the same engine calls in the same order,
    process 1 asking for nothing once its responses ended, and each gets what it gets alone."""
    import threading

    processes = ThreadProcesses(2)
    plans = [([PROMPT], [TWO_BLOCKS]),
             (["Q: 1 + 1?\n"], ["It is \\boxed{2}."]) if other == "answers-at-once" else ([], [])]
    engines = [CollectiveEngine(prompts or ["unused"], scripts or ["unused"], processes) for prompts, scripts in plans]
    batches, errors = [None, None], []

    def run(rank):
        prompts = plans[rank][0]
        try:
            batches[rank] = sample_rollouts(engines[rank], BatchTokenizer(), prompts,
                                            [Problem(f"p{rank}", p, "42") for p in prompts], 1, settings(),
                                            seeds=[[5]] * len(prompts), any_process=processes.any_of(rank))
        except Exception as error:  # noqa: BLE001 (reported below, with the thread's rank)
            errors.append((rank, error))
            processes.barrier.abort()

    threads = [threading.Thread(target=run, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert [stops for stops, _ in engines[0].calls] == [stops for stops, _ in engines[1].calls]
    assert [n for _, n in engines[0].calls] == [1, 1, 1]  # three turns of process 0's response
    assert [n for _, n in engines[1].calls] == ([1, 0, 0] if other == "answers-at-once" else [0, 0, 0])
    alone = sample_rollouts(ScriptedRolloutEngine([PROMPT], [TWO_BLOCKS]), BatchTokenizer(), [PROMPT],
                            [Problem("p0", PROMPT, "42")], 1, settings(), seeds=[[5]])
    assert batches[0].response_texts == alone.response_texts and batches[0].tool_stats[0].calls == 2
    if other == "answers-at-once":
        assert batches[1].response_texts == ["It is \\boxed{2}."] and batches[1].tool_stats[0].calls == 0
    else:
        assert batches[1].size == 0


def test_turn_seeds_are_the_seed_first_then_distinct_and_fixed():
    assert turn_seed(5, 0) == 5
    seeds = {turn_seed(s, t) for s in range(50) for t in range(1, 6)}
    assert len(seeds) == 250 and all(0 <= s < 2**62 for s in seeds)
    assert turn_seed(5, 3) == turn_seed(5, 3)


# ------------------------------------------------------------------ the embedded SmolLM2, two steps

# The model rarely writes a ```python block, so the tag pair is one it writes all the time on the
# arithmetic task: "=" opens a block and "." closes it ("3 + 4 = 7." runs " 7" as Python).
# The path is the real one (stop strings, the sandbox, observations, masks); the code is trivial.
FORCING = ["rollout.tools=[python]", "rollout.code_tags=['=', '.']", "rollout.max_tool_calls=2",
           "rollout.tool_time_limit_s=5"]


def two_tool_steps(tmp_path, *overrides):
    from meds_cli.engine.config import load_config
    from meds_cli.engine.trainer import Trainer

    cfg = load_config(["configs/smollm2.yaml"], [
        "train.steps=2", "rollout.prompts_per_step=2", "rollout.group_size=4", "rollout.max_new_tokens=48",
        "algo.name=meds", "train.checkpoint_every=100", "train.log_samples_every=1", *FORCING, *overrides])
    # MEDS: with tools its logit-lens features come from the scoring pass (docs/tools.md)
    rows = Trainer(cfg, tmp_path).train()
    samples = [json.loads(line) for path in sorted((tmp_path / "samples").glob("step_*.jsonl"))
               for line in path.read_text().splitlines()]
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



@needs_embedded
@pytest.mark.slow
def test_two_steps_of_smollm2_with_tools_through_the_fake_vllm_server(tmp_path):
    """The vllm-server engine's tool turns against the fake server, which honours the stop strings
    with SmolLM2's tokenizer (its rule writes '=' and '.' among its first 53 ids)."""
    from meds_cli.engine.model_io.model import load_tokenizer, resolve_model
    from tests.fake_vllm_server import FakeVLLMServer

    fake = FakeVLLMServer(decode=load_tokenizer(resolve_model("smollm2-135m")).decode).start()
    try:
        rows, samples, metrics = two_tool_steps(tmp_path, "rollout.engine=vllm-server",
                                                f"rollout.server.url={fake.url}")
    finally:
        fake.stop()
    assert [row["step"] for row in rows] == [1, 2]
    assert sum(m["tools/calls_mean"] for m in metrics if "tools/calls_mean" in m) > 0
    assert all(body["stop"][-1] == "." and body["include_stop_str_in_output"] for body in fake.completions
               if "stop" in body)
    assert any(body["max_tokens"] < 48 for body in fake.completions)  # a later turn's own budget
    assert samples and all("tools" in s for s in samples)


@pytest.mark.slow
def test_two_training_processes_with_tools_make_the_same_engine_calls(tmp_path):
    """Two real processes (gloo, CPU) with the hf-worker engine, whose every call is collective:
    the responses of one process take more turns (pauses at the closing tag) than the other's, and
    both still make the same calls, the idle one asking for nothing (tests/tool_processes_check.py)."""
    from tests.cpu_launch import ROOT, launch_cpu

    launch_cpu(2, [str(ROOT / "tests" / "tool_processes_check.py"), str(tmp_path)])
    assert int((tmp_path / "world.txt").read_text()) == 2
    calls = [json.loads((tmp_path / f"calls{rank}.json").read_text()) for rank in (0, 1)]
    assert [stops for stops, _ in calls[0]] == [stops for stops, _ in calls[1]]
    assert any(n == 0 for rank in (0, 1) for _, n in calls[rank])  # a process asked nothing: the other went on
    rows = json.loads((tmp_path / "rows0.json").read_text())
    assert [row["step"] for row in rows] == [1, 2] and all("tools/calls_mean" in row for row in rows)

# ------------------------------------------------------------------ every algorithm trains with tools

# On the tiny model's characters: "=" opens a block and "." closes it (code_tags), so the first turn
# pauses after "print(7).", the block prints 7, and the second turn writes the boxed answer.
TINY_TURNS = ["so =print(7).", " \\boxed{7}"]


class ScriptedTinyEngine(SamplesInProcess):
    """A RolloutEngine in the trainer's process that writes TINY_TURNS in the tiny model's
    tokens, turn by turn (the second turn once the context holds the first), whatever it is asked;
    it claims to record lens values, as the hf engine does, and records none."""

    name, reads_policy_weights, records_lens = "scripted-tiny", False, True

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.turns = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in TINY_TURNS]
        self.observation_lengths: list[int] = []  # tokens between the first turn and the second, as asked

    def _after_first_turn(self, context) -> int | None:
        first = self.turns[0]
        for start in range(len(context) - len(first), -1, -1):
            if list(context[start:start + len(first)]) == first:
                return start + len(first)
        return None

    def generate(self, requests, settings):
        assert settings.lens is None  # tool turns are asked without the lens (tool_turns.turn_settings)
        out = []
        for request in requests:
            end = self._after_first_turn(request.prompt_ids)
            if end is None:
                ids, stopped, paused = self.turns[0], False, True
                assert "." in settings.stop_strings
            else:
                self.observation_lengths.append(len(request.prompt_ids) - end)
                ids, stopped, paused = self.turns[1] + [self.tokenizer.eos_token_id], True, False
            out.append([Sample(list(ids), stopped, [-0.5] * len(ids), paused=paused) for _ in request.seeds])
        return out

    # nothing to bring up to date, free or stop: it answers without the policy
    policy_updated = policy_settled = release = close = lambda self, *version: None


def test_meds_trains_with_tools_its_anchor_at_the_models_answer_after_the_observation(tmp_path, monkeypatch):
    """MEDS's features with tools come from the scoring pass (no turn records lens values), at
    y*, the model's answer token: placed after the observation, never inside it."""
    from meds_cli.engine import trainer_parts
    from meds_cli.engine.trainer import Trainer
    from tests.conftest import tiny_config

    engines = []

    def scripted(cfg, model, tokenizer, **_):
        engines.append(ScriptedTinyEngine(tokenizer))
        return engines[-1]

    monkeypatch.setattr(trainer_parts, "make_engine", scripted)
    cfg = tiny_config("algo.name=meds", "train.steps=2", "rollout.prompts_per_step=2", "rollout.group_size=4",
                      "rollout.max_new_tokens=64", "dapo.dynamic_sampling=false", "train.log_samples_every=1",
                      "rollout.tools=[python]", "rollout.code_tags=['=', '.']", "rollout.tool_time_limit_s=5")
    rows = Trainer(cfg, tmp_path).train()
    assert [row["step"] for row in rows] == [1, 2]
    assert all(row["tools/calls_mean"] == 1 for row in rows)
    [engine] = engines
    observation = set(engine.observation_lengths)
    assert len(observation) == 1 and observation.pop() > 0
    # y*: the "7" of \boxed{7}, in the second turn, after the observation
    answer_column = len(engine.turns[0]) + engine.observation_lengths[0] + len(engine.turns[1]) - 2
    samples = [json.loads(line) for path in sorted((tmp_path / "samples").glob("step_*.jsonl"))
               for line in path.read_text().splitlines()]
    assert len(samples) == 2 * 2 * 4
    assert all(s["meds_anchor"] == "boxed" and s["meds_anchor_index"] == answer_column for s in samples)
    assert all(s["response_tokens"] == len(engine.turns[0]) + len(engine.turns[1]) + 1 for s in samples)  # + EOS

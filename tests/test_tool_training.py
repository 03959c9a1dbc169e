"""Training and reporting on responses with tool observations (issue 56, docs/tools.md "Masks"):
the record's masks and lengths, the text graders and voters read, MEDS's anchor, DAPO's lengths,
the update left unchanged by anything at observation positions, the sampler's log-probs lining up
with the scoring pass after the layout, and the step metrics and eval columns of tool use.
The float64 packed == padded checks with observations are in test_padding_free.py."""

import pytest
import torch

from algorithms.dapo import overlong_penalty
from algorithms.meds_feature_builders import answer_anchors
from algorithms.rlif_multireward import read_answer
from benchmarks.eval_report import TOOL_COLUMNS, score_table, tool_cells
from benchmarks.generation import Generated
from benchmarks.harness import sample_rows, score_benchmark, tool_row, tool_scores
from benchmarks.tasks import grade_integer
from meds_cli.core.records import Problem
from meds_cli.core.rollouts import Rollouts, without_spans
from meds_cli.engine.model_io.tiny import tiny_tokenizer
from meds_cli.engine.rollout.tools.turn_loop import (
    Segment,
    ToolStats,
    response_layout,
    response_logprobs,
    response_text,
)
from meds_cli.engine.training.algorithm_setup import build_algorithm
from meds_cli.engine.training.collect import reward_rollouts
from meds_cli.engine.training.metrics import rollout_metrics, tool_metrics
from meds_cli.engine.training.packing import PADDED, Packing
from meds_cli.engine.training.scoring import policy_forward
from tests.conftest import tiny_config
from tests.float64 import assert_equal_in_float64, float64_norms
from tests.rollout_factory import make_rollouts
from tests.tiny_policy import lora_policy

# A response whose code printed a box: the observation holds "\boxed{5}", the model's own text none.
MODEL_1 = "try\n```python\nprint(5)\n```\n"
OBSERVATION = "```output\n\\boxed{5}\n```\n"
MODEL_2 = "so it is 5."


def char_ids(text):
    return [ord(c) for c in text]  # one token a character


def tool_rollouts(texts_and_spans, encode=char_ids, observation_columns=None):
    """Rollouts of one group of responses of one token a character; `observation_columns[i]`:
    (start, end) response columns of row i that are observation tokens (attended, not the policy's)."""
    texts = [t for t, _ in texts_and_spans]
    ids = [encode(t) for t in texts]
    width = max(len(i) for i in ids)
    response_ids = torch.zeros(len(ids), width, dtype=torch.long)
    attended = torch.zeros(len(ids), width)
    for i, row in enumerate(ids):
        response_ids[i, :len(row)] = torch.tensor(row)
        attended[i, :len(row)] = 1
    mask = attended.clone()
    for i, (start, end) in enumerate(observation_columns or []):
        mask[i, start:end] = 0
    prompt = torch.full((len(ids), 2), 3)
    return Rollouts(problems=[Problem(id="0", question="q", answer=5)], group_size=len(ids),
                    input_ids=torch.cat([prompt, response_ids], 1),
                    attention_mask=torch.cat([torch.ones(len(ids), 2), attended], 1).long(), prompt_width=2,
                    response_ids=response_ids, response_mask=mask, response_texts=texts,
                    truncated=torch.zeros(len(ids), dtype=torch.bool),
                    observation_spans=[spans for _, spans in texts_and_spans])


def boxed_response():
    """(text, its observation span, the observation's token columns) of MODEL_1 OBSERVATION MODEL_2."""
    start = len(MODEL_1)
    span = (start, start + len(OBSERVATION))
    return MODEL_1 + OBSERVATION + MODEL_2, [span], span  # one token a character


# ------------------------------------------------------------ the record

def test_masks_and_lengths_count_model_and_observation_tokens_apart():
    text, spans, columns = boxed_response()
    batch = tool_rollouts([(text, spans), ("\\boxed{5}", [])], observation_columns=[columns, (0, 0)])
    n_obs = len(OBSERVATION)
    assert batch.response_lengths.tolist() == [len(MODEL_1) + len(MODEL_2), 9]
    assert batch.observation_lengths.tolist() == [n_obs, 0]
    assert batch.observation_mask[0, columns[0]:columns[1]].sum() == n_obs
    assert (batch.observation_mask * batch.response_mask).sum() == 0  # padding is neither
    assert batch.observation_mask[1].sum() == 0


def test_the_text_without_observation_spans():
    assert without_spans("ab[xy]cd[z]e", [(2, 6), (8, 11)]) == "abcde"
    assert without_spans("abc", []) == "abc"
    text, spans, _ = boxed_response()
    batch = tool_rollouts([(text, spans)])
    assert batch.answer_texts == [MODEL_1 + MODEL_2]
    assert "\\boxed" not in batch.answer_texts[0] and "\\boxed{5}" in batch.response_texts[0]


def test_segments_give_the_text_and_the_exact_spans():
    segments = [Segment(char_ids(MODEL_1), True), Segment(char_ids(OBSERVATION), False),
                Segment(char_ids(MODEL_2), True)]
    text, spans = response_text(segments, lambda ids: "".join(map(chr, ids)))
    assert text == MODEL_1 + OBSERVATION + MODEL_2
    assert spans == [(len(MODEL_1), len(MODEL_1) + len(OBSERVATION))]
    assert text[spans[0][0]:spans[0][1]] == OBSERVATION


def test_concat_lines_up_spans_and_tool_stats_of_parts_with_and_without_tools():
    text, spans, columns = boxed_response()
    with_tools = tool_rollouts([(text, spans), ("x", [])], observation_columns=[columns, (0, 0)])
    with_tools.tool_stats = [ToolStats(calls=1), ToolStats()]
    without = tool_rollouts([("\\boxed{5}", []), ("y", [])])
    without.observation_spans = []
    joined = Rollouts.concat([without, with_tools], pad_id=0)
    assert joined.observation_spans == [[], [], spans, []]
    assert joined.tool_stats[:2] == [None, None] and joined.tool_stats[2].calls == 1
    assert joined.answer_texts == ["\\boxed{5}", "y", MODEL_1 + MODEL_2, "x"]
    kept = joined.select_groups(torch.tensor([False, True]))
    assert kept.observation_spans == [spans, []] and kept.tool_stats[0].calls == 1


# ------------------------------------------------------------ what graders, voters and MEDS read

class BoxedTask:
    def grade(self, pairs):
        return [grade_integer(text, problem.answer, "boxed") for problem, text in pairs]


class Correctness:
    def reward_components(self, batch):
        return {"correctness": torch.tensor([float(v.correct) for v in batch.verdicts])}


def test_an_answer_printed_by_the_tool_is_not_the_models_answer():
    text, spans, _ = boxed_response()
    error = "```output\nZeroDivisionError: division by zero\n```\n"
    after_error = "1/0\n" + error + "the answer is \\boxed{5}"
    batch = tool_rollouts([(text, spans), (after_error, [(4, 4 + len(error))]), ("\\boxed{5}", [])])
    reward_rollouts(batch, batch.problems, ["q"], 3, BoxedTask(), Correctness(), [])
    # the tool's box is no answer; a tool error is not a wrong answer when the response then answers
    assert [v.outcome for v in batch.verdicts] == ["no_answer", "correct", "correct"]
    assert batch.rewards.tolist() == [0.0, 1.0, 1.0]
    # RLIF's votes read the same text
    assert [read_answer(t, "boxed") for t in batch.answer_texts] == [None, "5", "5"]
    assert read_answer(batch.response_texts[0], "boxed") == "5"  # what reading the full text would take


def test_meds_anchor_is_the_models_answer_token_after_the_last_observation():
    tokenizer = tiny_tokenizer()  # one token a character; no backticks or newlines in its vocabulary
    observation = "output: \\boxed{9} "
    model_1, model_2 = "code: print(9) ", "so \\boxed{7}"
    text = model_1 + observation + model_2
    start = len(model_1)
    span = (start, start + len(observation))
    batch = tool_rollouts([(text, [span]), (model_1 + observation + "no box", [span])],
                          lambda t: tokenizer.encode(t, add_special_tokens=False), observation_columns=[span] * 2)
    index, kinds = answer_anchors(batch, 0, 2, tokenizer)
    assert kinds == ["boxed", "last"]  # the tool's box does not make row 1 a boxed answer
    seven = len(text) - 2  # the "7" of the model's own box, one token a character
    assert index[0].item() == seven and batch.response_ids[0, seven].item() == tokenizer.convert_tokens_to_ids("7")
    assert index[1].item() == len(model_1 + observation + "no box") - 1  # its last model token
    assert batch.response_mask[1, index[1]] == 1


# ------------------------------------------------------------ lengths algorithms read

def with_observation(rollouts, start, end):
    """`rollouts` (the hook-test factory's, which attends every column) with the attention the
    engines lay out (the response's own tokens) and row 0's columns start..end made an observation."""
    rollouts.attention_mask[:, rollouts.prompt_width:] = rollouts.response_mask.long()
    rollouts.response_mask[0, start:end] = 0
    return rollouts


def test_dapo_overlong_shaping_counts_model_tokens_only():
    # 8 model tokens and 6 observation tokens: with max 12 and a buffer of 4, 8 tokens are within
    # the limit (no penalty) where 14 would be -(14 - 8) / 4 = -1.5
    rollouts = with_observation(make_rollouts([True, True], 2, lengths=[14, 3], width=14), 2, 8)
    assert rollouts.response_lengths.tolist() == [8, 3] and rollouts.observation_lengths.tolist() == [6, 0]
    assert overlong_penalty(rollouts.response_lengths, 12, 4, 1.0).tolist() == [0.0, 0.0]
    assert overlong_penalty(torch.tensor([14]), 12, 4, 1.0).tolist() == [-1.5]


def test_dapo_reward_components_read_the_model_token_length():
    algorithm = build_algorithm(tiny_config("algo.name=dapo", "rollout.max_new_tokens=12", "dapo.overlong_buffer=4",
                                            "dapo.overlong_factor=1.0"))
    rollouts = with_observation(make_rollouts([True, False], 2, lengths=[14, 12], width=14), 2, 8)  # 8 model tokens
    assert algorithm.reward_components(rollouts)["overlong"].tolist() == [0.0, -1.0]


# ------------------------------------------------------------ step metrics and eval columns

def test_tool_metrics_by_hand():
    stats = [ToolStats(calls=2, errors=1, observation_tokens=30, tool_seconds=0.5),
             ToolStats(calls=0),
             ToolStats(calls=4, timeouts=1, over_limit=1, observation_tokens=50, tool_seconds=1.25),
             None]  # a response sampled without tools does not count
    assert tool_metrics(stats) == {
        "tools/calls_mean": 2.0, "tools/calls_max": 4.0, "tools/used_share": pytest.approx(2 / 3),
        "tools/errors_mean": pytest.approx(1 / 3), "tools/timeouts_mean": pytest.approx(1 / 3),
        "tools/over_limit_mean": pytest.approx(1 / 3), "tools/observation_tokens_mean": pytest.approx(80 / 3),
        "tools/seconds": 1.75}
    assert tool_metrics([]) == {} and tool_metrics([None, None]) == {}


def test_rollout_metrics_report_model_tokens_and_tools_apart():
    rollouts = with_observation(make_rollouts([True, False], 2, lengths=[10, 4], width=10), 2, 6)  # 6 model, 4 obs
    rollouts.rewards = torch.tensor([1.0, 0.0])
    assert "tools/calls_mean" not in rollout_metrics(rollouts)
    rollouts.tool_stats = [ToolStats(calls=1, observation_tokens=4), ToolStats()]
    metrics = rollout_metrics(rollouts)
    assert metrics["response_length_mean"] == 5.0 and metrics["response_length_max"] == 6.0
    assert metrics["tools/observation_tokens_mean"] == 2.0 and metrics["tools/used_share"] == 0.5


def test_eval_rows_and_scores_carry_the_tool_columns():
    text, spans, _ = boxed_response()
    used = ToolStats(calls=3, errors=1, timeouts=1, observation_tokens=12, tool_seconds=0.25)
    generated = Generated(texts=[text, "\\boxed{5}"], lengths=[20, 10], truncated=[False, False],
                          observation_spans=[spans, []], tool_stats=[used, ToolStats()])
    assert generated.answer_texts == [MODEL_1 + MODEL_2, "\\boxed{5}"]
    assert Generated(["a"], [1], [False]).answer_texts == ["a"]

    class Bench:
        name, kind = "toy", "math"

    verdicts = [grade_integer(t, 5, "boxed") for t in generated.answer_texts]
    rows = sample_rows(Bench(), Problem(id="0", question="q", answer=5), 0, generated, verdicts)
    assert rows[0]["tools"] == {"calls": 3, "errors": 1, "timeouts": 1, "observation_tokens": 12, "seconds": 0.25}
    assert rows[0]["response"] == text  # the samples keep what the model saw
    assert tool_row(ToolStats())["calls"] == 0
    assert tool_scores(rows) == {"calls_per_response": 1.5, "used_share": 0.5, "errors_per_response": 0.5,
                                 "timeouts_per_response": 0.5, "observation_tokens_per_response": 6.0}
    assert tool_scores([{"length": 1}]) is None
    scores = score_benchmark("math", [rows], [1, 2])
    assert scores["tools"]["calls_per_response"] == 1.5 and scores["pass@k"]["1"] == 0.5
    assert "tools" not in score_benchmark("math", [[{k: v for k, v in r.items() if k != "tools"} for r in rows]], [1])
    assert tool_cells(scores) == ["1.50", "50.0", "0.50", "0.50"] and tool_cells({}) == ["-"] * 4


def test_the_table_shows_tool_columns_only_when_tools_were_on():
    def document(tools):
        scores = {"kind": "math", "problems": 1, "n": 2, "pass@k": {"1": 0.5}, "maj@k": None,
                  "mean_response_length": 10.0, "truncated": 0, "responses": 2, "truncated_share": 0.0, "timeouts": 0}
        if tools:
            scores["tools"] = {"calls_per_response": 1.5, "used_share": 0.5, "errors_per_response": 0.5,
                               "timeouts_per_response": 0.0, "observation_tokens_per_response": 6.0}
        return {"model": "m", "config": {"n": 2}, "benchmarks": {"toy": scores}}

    headers = lambda table: [c.header for c in table.columns]  # noqa: E731
    assert not set(TOOL_COLUMNS) & set(headers(score_table(document(False))))
    table = score_table(document(True))
    assert headers(table)[-4:] == list(TOOL_COLUMNS)
    assert [list(c._cells) for c in table.columns[-4:]] == [["1.50"], ["50.0"], ["0.50"], ["0.00"]]


# ------------------------------------------------------------ the sampler's log-probs after the layout

def sampled_turn(model, context, steps, temperature):
    """Greedy tokens after `context` with the log-prob of each under the model at `temperature`,
    one forward per token (as a sampler computes them, apart from the scoring pass)."""
    ids, logprobs = [], []
    with torch.no_grad():
        for _ in range(steps):
            logits = model(torch.tensor([context + ids])).logits[0, -1].double() / temperature
            token = int(logits.argmax())
            ids.append(token)
            logprobs.append(float(torch.log_softmax(logits, -1)[token]))
    return ids, logprobs


@pytest.mark.parametrize("packing", [PADDED, Packing(on=True, masked=True)])
def test_the_samplers_logprobs_line_up_with_the_scoring_pass_after_the_layout(packing):
    temperature = 0.7
    with float64_norms():
        model, tokenizer = lora_policy(seed=3, layers=2)
        model.double()
        prompt = tokenizer.encode("12+3=", add_special_tokens=False)
        first = sampled_turn(model, prompt, 5, temperature)
        observation = tokenizer.encode("output: 15 ", add_special_tokens=False)
        second = sampled_turn(model, prompt + first[0] + observation, 4, temperature)
        segments = [Segment(first[0], True, first[1]), Segment(observation, False), Segment(second[0], True, second[1])]
        ids, mask, positions = response_layout(segments)
        sampler = torch.tensor(response_logprobs(segments), dtype=torch.float64)
        n = len(ids)
        # a second row without tools, shorter, so the batch has padding too
        short_ids, short_logp = sampled_turn(model, prompt, 3, temperature)
        response_ids = torch.zeros(2, n, dtype=torch.long)
        response_ids[0], response_ids[1, :3] = torch.tensor(ids), torch.tensor(short_ids)
        response_mask = torch.zeros(2, n, dtype=torch.float64)
        response_mask[0], response_mask[1, :3] = torch.tensor(mask, dtype=torch.float64), 1
        attention = torch.cat([torch.ones(2, len(prompt)), torch.zeros(2, n)], 1).long()
        attention[0, len(prompt):] = 1
        attention[1, len(prompt):len(prompt) + 3] = 1
        input_ids = torch.cat([torch.tensor([prompt, prompt]), response_ids], 1)
        with torch.no_grad():
            logp = policy_forward(model, input_ids, attention, len(prompt), response_ids, temperature=temperature,
                                  response_mask=response_mask, packing=packing)[0]
    assert positions == [0, 1, 2, 3, 4] + [5 + len(observation) + j for j in range(4)]
    assert_equal_in_float64(logp[0, positions], sampler[positions], "model-token log-probs")
    assert_equal_in_float64(logp[1, :3], torch.tensor(short_logp, dtype=torch.float64), "the row without tools")
    assert (logp[0, 5:5 + len(observation)] == 0).all()  # no log-prob on observation tokens
    assert (sampler[5:5 + len(observation)] == 0).all()


# ------------------------------------------------------------ the update leaves observations out

def update_after(tmp_path, name, perturb):
    """The parameters and stats after one update (2 PPO epochs, a KL term, TIS against the
    sampler's log-probs) of the varied batch with observations; `perturb` changes what sits at
    the observation positions of the per-token inputs first."""
    from meds_cli.engine.trainer import Trainer
    from meds_cli.engine.training.scoring import score_rollouts
    from tests.test_micro_batches import varied_batch
    from tests.test_padding_free import with_observations

    cfg = tiny_config("rollout.prompts_per_step=2", "rollout.group_size=4", "train.micro_batch_size=2",
                      "algo.name=grpo", "grpo.kl_coef=0.1", "grpo.loss_agg=token-mean", "optim.lr=0.05",
                      "optim.warmup_steps=0", "train.ppo_epochs=2", "train.mini_batch_size=4",
                      "rollout.is_correction=tis")
    trainer = Trainer(cfg, tmp_path / name)
    model = trainer.unwrapped
    batch = with_observations(varied_batch(trainer.tokenizer))
    score_rollouts(model, batch, 8, with_reference=True, disable_adapter=model.disable_adapter)
    batch.sampler_logp = batch.old_logp - 0.05 * batch.response_mask  # a sampler slightly off the trainer
    if perturb:
        observed = batch.observation_mask != 0
        for field in ("old_logp", "ref_logp", "sampler_logp", "entropy"):
            values = getattr(batch, field).clone()
            values[observed] = torch.linspace(-4.0, 3.0, int(observed.sum()))
            setattr(batch, field, values)
    stats = trainer.update(batch)
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}, stats


def test_what_sits_at_observation_positions_does_not_change_the_update(tmp_path):
    base, base_stats = update_after(tmp_path, "base", perturb=False)
    moved, moved_stats = update_after(tmp_path, "moved", perturb=True)
    assert base and base.keys() == moved.keys()
    for name, value in base.items():
        assert torch.equal(moved[name], value), name
    assert {k: base_stats[k] for k in base_stats if k in moved_stats} == moved_stats
    assert any(k.startswith("kl") or "kl" in k for k in base_stats)  # the KL term ran, and left them out too


def test_the_samples_log_keeps_the_tool_use_and_counts_model_tokens():
    from meds_cli.engine.run_folders.samples_log import sample_rows as logged_rows

    text, spans, columns = boxed_response()
    batch = tool_rollouts([(text, spans), ("\\boxed{5}", [])], observation_columns=[columns, (0, 0)])
    batch.tool_stats = [ToolStats(calls=1, observation_tokens=len(OBSERVATION), tool_seconds=0.5), ToolStats()]
    rows = logged_rows(batch, step=1, groups=1)
    assert rows[0]["response"] == text and rows[0]["response_tokens"] == len(MODEL_1) + len(MODEL_2)
    assert rows[0]["tools"] == {"calls": 1, "errors": 0, "timeouts": 0, "observation_tokens": len(OBSERVATION),
                                "seconds": 0.5}
    assert rows[1]["tools"]["calls"] == 0
    batch.tool_stats = []
    assert "tools" not in logged_rows(batch, step=1, groups=1)[0]

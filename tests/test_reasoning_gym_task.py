"""The reasoning-gym task (benchmarks/reasoning_gym_task.py): seeded disjoint splits, grading through
the generator's own score_answer, the plain prompt, config errors and the missing extra in one
line, and a tiny-llama train step and held-out eval end to end."""

import json
import sys

import pytest
from typer.testing import CliRunner

from benchmarks.harness import EvalSettings
from benchmarks.prompts import QWEN_BOXED_INSTRUCTION, build_prompt, problem_prompt
from benchmarks.reasoning_gym_task import ReasoningGymTask, generator_seed, score_verdict
from benchmarks.tasks import build_task
from meds_cli.app import app
from meds_cli.core.errors import UserError
from meds_cli.core.records import Problem
from meds_cli.engine.config import load_config
from tests.cli_errors import one_error_line

pytest.importorskip("reasoning_gym")

runner = CliRunner()
# Two or three terms of one or two digits: a question space of tens of thousands, drawn in milliseconds.
CHAIN_SUM = ["task.name=reasoning-gym", "task.dataset=chain_sum",
             "task.config={min_terms: 2, max_terms: 3, min_digits: 1, max_digits: 2}"]


def gym_task(*overrides: str, seed: int = 0) -> ReasoningGymTask:
    cfg = load_config(overrides=[*CHAIN_SUM, "task.train_size=300", "task.eval_size=40", *overrides])
    return build_task(cfg.task, seed)


def questions(problems) -> list[str]:
    return [p.question for p in problems]


# ---------------------------------------------------------------- splits


def test_splits_are_seeded_sized_and_disjoint():
    a, b, other = gym_task(), gym_task(), gym_task(seed=1)
    assert isinstance(a, ReasoningGymTask)
    assert len(a.train) == 300 and len(a.held_out) == 40
    assert questions(a.train) == questions(b.train) and questions(a.held_out) == questions(b.held_out)
    assert [p.answer for p in a.train] == [p.answer for p in b.train]
    # no held-out question in training, and no question twice within a split
    assert not set(questions(a.held_out)) & set(questions(a.train))
    assert len(set(questions(a.train))) == 300 and len(set(questions(a.held_out))) == 40
    # another run seed, other problems (not the same ones shifted by one index)
    assert len(set(questions(a.train)) & set(questions(other.train))) < 30
    assert questions(a.held_out) != questions(other.held_out)


def test_held_out_is_a_prefix_that_train_size_does_not_change():
    small, large = gym_task("task.eval_size=10"), gym_task("task.train_size=50")
    assert questions(small.held_out) == questions(gym_task().held_out)[:10]
    assert questions(large.held_out) == questions(gym_task().held_out)
    assert questions(large.train) == questions(gym_task().train)[:50]


def test_generator_seed_is_far_from_the_neighbouring_run_seed():
    # chain_sum draws item i from seed + i: neighbouring seeds as they are would share almost every item
    assert abs(generator_seed(0, "chain_sum") - generator_seed(1, "chain_sum")) > 10**6
    assert generator_seed(0, "chain_sum") == generator_seed(0, "chain_sum")


def test_too_few_distinct_questions_is_one_line():
    # one term of one digit: ten questions in all
    task = gym_task("task.config={min_terms: 1, max_terms: 1, min_digits: 1, max_digits: 1}",
                    "task.train_size=20", "task.eval_size=5")
    with pytest.raises(UserError, match=r"gave 10 distinct questions .* fewer than task.eval_size \+ "
                                        r"task.train_size = 5 \+ 20"):
        _ = task.train


# ---------------------------------------------------------------- grading


def grade_one(task, problem, response):
    return task.grade([(problem, response)])[0]


def test_grading_through_score_answer():
    task = gym_task()
    problem = task.held_out[0]
    gold = problem.answer
    right = grade_one(task, problem, f"the sum is \\boxed{{{gold}}}")
    assert right.correct and right.outcome == "correct" and right.extracted == gold and right.detail["score"] == 1.0
    assert "credit" not in right.detail  # partial credit off: the reward reads correct/wrong only
    # chain_sum's scorer takes a leading '+' and zeros as the same number
    assert grade_one(task, problem, f"\\boxed{{+0{gold}}}").correct
    wrong_value = str(int(gold) + 1000)  # no substring of gold: scored 0
    wrong = grade_one(task, problem, f"\\boxed{{{wrong_value}}}")
    assert not wrong.correct and wrong.outcome == "wrong" and wrong.extracted == wrong_value
    none = grade_one(task, problem, "i do not know")
    assert not none.correct and none.outcome == "no_answer" and none.extracted is None
    # the last box is the answer
    assert grade_one(task, problem, f"\\boxed{{{wrong_value}}} no, \\boxed{{{gold}}}").correct
    assert task.read_answer(f"so \\boxed{{{gold}}}") == gold


def test_partial_score_is_credit_only_when_asked():
    problem = gym_task().held_out[0]
    padded = f"9{problem.answer}"  # holds the gold answer: reasoning-gym's substring credit, len(gold)/len(answer)
    expected = len(problem.answer) / len(padded)
    off = grade_one(gym_task(), problem, f"\\boxed{{{padded}}}")
    assert not off.correct and off.outcome == "wrong" and off.detail["score"] == pytest.approx(expected)
    assert "credit" not in off.detail
    on = grade_one(gym_task("task.partial_credit=true"), problem, f"\\boxed{{{padded}}}")
    assert not on.correct and on.detail["credit"] == pytest.approx(expected)


def test_score_verdict_by_hand():
    assert score_verdict(1.0, "7", False).correct
    assert score_verdict(0.5, "17", True).detail == {"score": 0.5, "credit": 0.5}
    assert score_verdict(0.0, None, True).outcome == "no_answer"
    assert score_verdict(0.0, "x", False, "KeyError").detail["score_error"] == "KeyError"


def test_last_integer_fallback_and_answer_tags():
    problem = gym_task().held_out[0]
    unboxed = f"it is {problem.answer}"
    assert grade_one(gym_task(), problem, unboxed).correct  # default answer_format boxed_or_last_integer
    assert grade_one(gym_task("task.answer_format=boxed"), problem, unboxed).outcome == "no_answer"
    tags = gym_task("task.answer_format=answer_tags")
    assert grade_one(tags, problem, f"<answer>{problem.answer}</answer>").correct
    assert grade_one(tags, problem, f"\\boxed{{{problem.answer}}}").outcome == "no_answer"
    assert "<answer>" in tags.prompt(problem, None) and "boxed" not in tags.prompt(problem, None)


def test_a_raising_scorer_is_a_wrong_answer(monkeypatch):
    task = gym_task()
    problem = task.held_out[0]

    def broken(answer, entry):
        raise KeyError("metadata")

    monkeypatch.setattr(task.generator, "score_answer", broken)
    verdict = grade_one(task, problem, f"\\boxed{{{problem.answer}}}")
    assert not verdict.correct and verdict.detail["score_error"] == "KeyError"


# ---------------------------------------------------------------- prompts


def test_plain_prompt_is_the_question_alone():
    task = gym_task("task.prompt_style=plain")
    problem = task.held_out[0]
    assert task.prompt(problem, None) == problem.question == problem.meta["entry"]["question"]
    assert build_prompt("what is 2+2", None, "plain") == "what is 2+2"
    code = Problem(id="c", question="def f(x):\n", answer={"completes_prompt": True})
    assert problem_prompt("code", code, None, "plain") == code.question
    EvalSettings(benchmarks=["math500"], prompt="plain").validate()  # meds eval --prompt plain
    with pytest.raises(UserError, match="accepted: auto, boxed, chat, plain"):
        EvalSettings(benchmarks=["math500"], prompt="plane").validate()
    boxed = gym_task("task.prompt_style=boxed").prompt(problem, None)
    assert boxed == f"{problem.question}\n{QWEN_BOXED_INSTRUCTION}"


# ---------------------------------------------------------------- config errors


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def gym_train(tmp_path, *sets: str):
    args = ["train", "--model", "tiny-llama", "--task", "reasoning-gym", "--output", tmp_path / "run", "--dry-run"]
    for text in sets:
        args += ["--set", text]
    return invoke(*args)


@pytest.mark.parametrize("sets, words", [
    (["task.dataset=chain_su"], ["task.dataset 'chain_su'", "did you mean 'chain_sum'", "basic_arithmetic"]),
    ([], ["task.dataset is empty", "chain_sum"]),
    (["task.dataset=chain_sum", "task.config={max_term: 3}"],
     ["'max_term'", "did you mean 'max_terms'", "accepted: min_terms, max_terms, min_digits, max_digits"]),
    (["task.dataset=chain_sum", "task.config={seed: 3}"], ["task.config.seed", "train.seed"]),
    (["task.dataset=chain_sum", "task.config={min_terms: 5, max_terms: 3}"], ["max_terms must be >= min_terms"]),
])
def test_config_errors_are_one_line(tmp_path, sets, words):
    line = one_error_line(gym_train(tmp_path, *sets))
    for word in words:
        assert word in line, line
    assert not (tmp_path / "run").exists()


def test_answer_tags_only_for_reasoning_gym(tmp_path):
    line = one_error_line(invoke("train", "--model", "tiny-llama", "--task", "arithmetic", "--dry-run",
                                 "--set", "task.answer_format=answer_tags"))
    assert "answer_tags" in line and "boxed_or_last_integer" in line


def test_missing_extra_names_it_with_its_brackets(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # what `import reasoning_gym` does when absent
    line = one_error_line(gym_train(tmp_path, "task.dataset=chain_sum"))
    assert "pip install -e '.[gym]'" in line, line
    assert "reasoning-gym" in line
    assert "reasoning-gym" in invoke("list").output  # listed without the package: it is imported when chosen


def test_listed():
    result = invoke("list")
    assert result.exit_code == 0 and "reasoning-gym" in result.output and "score_answer" in result.output


# ---------------------------------------------------------------- end to end


def test_train_one_step_then_eval_the_held_out_split(tmp_path):
    run = tmp_path / "run"
    result = invoke("train", "--model", "tiny-llama", "--task", "reasoning-gym", "--steps", "1", "--output", run,
                    "-q", "--set", "task.dataset=chain_sum",
                    "--set", "task.config={min_terms: 2, max_terms: 2, max_digits: 1}", "--set", "task.train_size=20",
                    "--set", "task.eval_size=4", "--set", "task.prompt_style=plain",
                    "--set", "rollout.max_new_tokens=4", "--set", "rollout.prompts_per_step=2",
                    "--set", "rollout.group_size=4", "--set", "train.checkpoint_every=1")
    assert result.exit_code == 0, result.output
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 1 and 0.0 <= metrics[0]["accuracy"] <= 1.0
    result = invoke("eval", run, "--k", "2", "--max-new-tokens", "4", "-q", "--output", tmp_path / "eval")
    assert result.exit_code == 0, result.output
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    scores = results["benchmarks"]["heldout-reasoning-gym"]
    assert results["config"]["prompt"] == "plain"
    assert scores["problems"] == 4 and scores["responses"] == 8
    # the eval drew from the run's held-out split (its seed) and graded with the task's grader
    rows = [json.loads(line) for line in (tmp_path / "eval" / "samples.jsonl").read_text().splitlines()]
    task = gym_task("task.config={min_terms: 2, max_terms: 2, max_digits: 1}", "task.train_size=20",
                    "task.eval_size=4")
    by_id = {p.id: p for p in task.held_out}
    assert {row["problem_id"] for row in rows} == set(by_id) and len(rows) == 4 * 2
    for row in rows:
        again = grade_one(task, by_id[row["problem_id"]], row["response"])
        assert (row["correct"], row["outcome"], row["extracted"]) == (again.correct, again.outcome, again.extracted)
        assert row["gold"] == by_id[row["problem_id"]].answer

"""A researcher's additions wired into training: trackers, samples logs, the user's own reward
channels (as GRPO, DAPO's filter and RLIF's GDPO see them), prompt options and length limits."""

import json
import math
import textwrap
import warnings

import pytest
import torch
from typer.testing import CliRunner

from benchmarks.tasks import build_task
from meds_cli.app import app
from meds_cli.engine.model_io.tiny import tiny_tokenizer
from meds_cli.engine.run_folders import trackers
from meds_cli.engine.training.algorithm_setup import build_algorithm
from tests.conftest import TINY_COPY, tiny_config
from tests.rollout_factory import make_rollouts

REWARDS = '''
def starts_with_digit(prompts, completions, answer, **kwargs):
    return [1.0 if c[:1].isdigit() else 0.0 for c in completions]

def explodes(prompts, completions, problem_id, **kwargs):
    return [1.0 / (pid != "copy-3") for pid in problem_id]
'''


def _train(tmp_path, *sets):
    args = ["train", "--output", str(tmp_path / "run"), "-q"]
    for item in (*TINY_COPY, "train.steps=2", "rollout.prompts_per_step=4", "rollout.group_size=4", *sets):
        args += ["--set", item]
    return CliRunner().invoke(app, args)


@pytest.fixture
def reward_file(tmp_path):
    path = tmp_path / "my_rewards.py"
    path.write_text(textwrap.dedent(REWARDS))
    return path


def test_a_run_reports_to_tensorboard_logs_samples_and_adds_the_users_reward(tmp_path, reward_file):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    result = _train(tmp_path, "train.report_to=tensorboard", "train.log_samples_every=2", "train.log_samples_prompts=1",
                    f"reward.functions={reward_file}:starts_with_digit", "reward.function_weights=[0.5]")
    assert result.exit_code == 0, result.output
    run = tmp_path / "run"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert all("reward/starts_with_digit" in row for row in rows)
    for row in rows:  # the reward is the sum of its channels
        assert row["reward"] == pytest.approx(row["reward/correctness"] + row["reward/starts_with_digit"], abs=1e-6)

    events = EventAccumulator(str(run / trackers.TENSORBOARD_DIR / trackers.PROJECT))
    events.Reload()
    logged = [(e.step, e.value) for e in events.Scalars("reward/starts_with_digit")]
    assert logged == [(row["step"], pytest.approx(row["reward/starts_with_digit"], abs=1e-6)) for row in rows]

    assert not (run / "samples" / "step_1.jsonl").exists()
    samples = [json.loads(line) for line in (run / "samples" / "step_2.jsonl").read_text().splitlines()]
    assert len(samples) == 4  # one prompt, its 4 responses
    for sample in samples:
        assert sample["reward/starts_with_digit"] == (0.5 if sample["response"][:1].isdigit() else 0.0)
        assert sample["reward_raw"] == pytest.approx(sample["reward/correctness"] + sample["reward/starts_with_digit"])
        assert sample["advantage"] is not None and sample["step"] == 2


def test_an_error_inside_a_reward_function_stops_with_one_line(tmp_path, reward_file):
    result = _train(tmp_path, f"reward.functions={reward_file}:explodes")
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert result.exit_code == 2 and len(errors) == 1 and "Traceback" not in result.output, result.output
    assert f"reward function '{reward_file}:explodes' failed on row" in errors[0]
    assert "problem 'copy-3'" in errors[0] and "ZeroDivisionError" in errors[0]


@pytest.mark.parametrize("sets, expected", [
    (["reward.functions=nowhere/rewards.py:f"], "reward.functions: file 'nowhere/rewards.py'"),
    (["reward.functions=[a.py:f, b.py:g]", "reward.function_weights=[1.0]"], "1 weights for 2 reward.functions"),
    (["train.report_to=[tensorboard, wandbb]"], "unknown tracker 'wandbb'"),
    (["task.columns={question: problem}"], "task.columns maps 'question', which is not a task field"),
])
def test_bad_settings_are_one_line_and_leave_no_run_folder(tmp_path, sets, expected):
    result = _train(tmp_path, *sets)
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and expected in lines[0], result.output
    assert not (tmp_path / "run").exists()


def test_a_tracker_that_is_not_installed_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(trackers.TRACKERS, "mlflow", ("no_such_mlflow_module", "mlflow"))
    result = _train(tmp_path, "train.report_to=mlflow")
    assert result.exit_code == 2 and "train.report_to 'mlflow' needs the mlflow package" in result.output


# ---------------------------------------------------------------- what algorithms see of a user channel


def test_dapos_filter_reads_the_correctness_channel_not_the_users():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dapo = build_algorithm(tiny_config("algo.name=dapo"))
        by_reward = build_algorithm(tiny_config("algo.name=dapo", "dapo.filter_metric=reward"))
    batch = make_rollouts([True, True, False, False], group_size=2)
    batch.reward_components = {"correctness": torch.tensor([1.0, 1.0, 0.0, 0.0]),
                               "style": torch.tensor([0.5, 0.0, 0.0, 0.0])}  # a user channel: spread in group 0 only
    batch.rewards = sum(batch.reward_components.values())
    assert dapo.keep_groups(batch).tolist() == [False, False]  # correctness is equal within both groups
    assert by_reward.keep_groups(batch).tolist() == [True, False]  # the total reward varies in group 0


def test_rlif_normalises_a_user_channel_on_its_own_with_its_weight(tmp_path):
    rewards = tmp_path / "r.py"
    rewards.write_text("def style(prompts, completions, **kw):\n    return [1.0, 0.0]\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rlif = build_algorithm(tiny_config("algo.name=rlif-multireward", f"reward.functions={rewards}:style",
                                           "reward.function_weights=[-0.5]"))
    assert rlif.context.extra_reward_channels == (("style", -0.5),)
    batch = make_rollouts([True, False], group_size=2)
    # the two label-free channels are equal within the group (z = 0); the user channel holds w * f = -0.5 * [1, 0]
    batch.reward_components = {"cluster": torch.tensor([0.5, 0.5]), "certainty": torch.tensor([2.0, 2.0]),
                               "style": torch.tensor([-0.5, 0.0])}
    advantages = rlif.compute_advantages(batch)
    # z of f = [1, 0] with the unbiased std 1/sqrt(2) is [1/sqrt(2), -1/sqrt(2)]; times w = -0.5
    expected = -0.5 / math.sqrt(2)
    assert advantages.tolist() == pytest.approx([expected, -expected], abs=1e-5)


# ---------------------------------------------------------------- prompts


def test_the_system_prompt_and_template_arguments_reach_the_chat_template(tmp_path):
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = ("{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
                               "{% if thinking is defined and not thinking %}(no thinking){% endif %}")
    cfg = tiny_config("task.name=arithmetic", "task.prompt_style=chat", "task.system_prompt=Be brief.",
                      "task.chat_template_kwargs={thinking: false}")
    task = build_task(cfg.task, 0)
    prompt = task.prompt(task.train[0], tokenizer)
    assert prompt.startswith("[system]Be brief.[user]What is ") and prompt.endswith("(no thinking)")
    plain = build_task(tiny_config("task.name=arithmetic", "task.prompt_style=boxed",
                                   "task.system_prompt=Be brief.").task, 0)
    assert plain.prompt(plain.train[0], tokenizer).startswith("Be brief.\nWhat is ")


def test_prompts_longer_than_the_limit_are_left_out_with_a_count(tmp_path):
    data = tmp_path / "train.jsonl"
    questions = ["1+1", "2+2*2", "(3+4)*(5+6)-7", "8", "9*9", "12345678901234567890"]
    data.write_text("".join(json.dumps({"question": q, "final": "1"}) + "\n" for q in questions * 10))
    cfg = tiny_config("task.name=math", f"task.path={data}", "task.prompt_style=boxed", "task.eval_size=0",
                      "task.columns={problem: question, answer: final}", "task.max_prompt_tokens=80")
    task = build_task(cfg.task, 0)
    # the boxed prompt adds a newline and the 71-character instruction: questions of at most 8 characters fit
    skipped, total = task.drop_long_prompts(tiny_tokenizer(), cfg.task.max_prompt_tokens)
    assert (skipped, total) == (20, 60)
    assert sorted({p.question for p in task.train}) == sorted(q for q in questions if len(q) <= 8)
    with pytest.raises(Exception, match="task.max_prompt_tokens=5 leaves none of the 40 training problems"):
        task.drop_long_prompts(tiny_tokenizer(), 5)


def test_prompts_are_tokenized_once_for_leaving_out_and_for_the_longest(tmp_path):
    """Leaving out long prompts and sizing vLLM's cache (the longest prompt) read one count."""
    from meds_cli.engine.rollout.engines import longest_prompt_tokens

    data = tmp_path / "train.jsonl"
    questions = ["1+1", "2+2*2", "(3+4)*(5+6)-7", "8"]
    data.write_text("".join(json.dumps({"question": q, "final": "1"}) + "\n" for q in questions * 5))
    cfg = tiny_config("task.name=math", f"task.path={data}", "task.prompt_style=boxed", "task.eval_size=4",
                      "task.columns={problem: question, answer: final}")
    tokenizer, calls = tiny_tokenizer(), []
    counting = lambda texts, **kwargs: calls.append(len(texts)) or type(tokenizer).__call__(tokenizer, texts, **kwargs)  # noqa: E731
    task = build_task(cfg.task, 0)
    longest_all = max(len(tokenizer(task.prompt(p, tokenizer), add_special_tokens=False)["input_ids"])
                      for p in (*task.train, *task.held_out))
    task.drop_long_prompts(counting, longest_all - 1)  # leaves out the 13-character question
    assert sum(calls) == 20  # every prompt once (16 training, 4 held-out)
    longest_kept = max(len(tokenizer(task.prompt(p, tokenizer), add_special_tokens=False)["input_ids"])
                       for p in (*task.train, *task.held_out))
    assert longest_prompt_tokens(task, counting) == longest_kept < longest_all - 1
    assert sum(calls) == 20  # not tokenized again


def test_the_documented_reward_function_loads_and_scores(tmp_path):
    import re
    from pathlib import Path

    from meds_cli.core.records import Problem
    from meds_cli.engine.training.user_rewards import load_reward_functions, user_reward_channels

    # the example of docs/training.md, "Your own data, prompts and rewards" (it was the README's)
    page = (Path(__file__).resolve().parent.parent / "docs" / "training.md").read_text()
    code = re.search(r"```python\n# rewards.py\n(.*?)```", page, re.S).group(1)
    (tmp_path / "rewards.py").write_text(code)
    functions = load_reward_functions(f"{tmp_path / 'rewards.py'}:brevity")
    channels = user_reward_channels(functions, ["q", "q"], ["", "x" * 200], [Problem("p", "q", "1")] * 2)
    assert channels["brevity"].tolist() == [1.0, 0.5]

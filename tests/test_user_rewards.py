"""Reward functions from the user's own Python file: loading, calling TRL-style, and every mistake as one line."""

import textwrap

import pytest
import torch

from meds_cli.core.records import Problem
from meds_cli.engine.training.user_rewards import (add_channels, load_reward_functions, parse_spec, row_fields,
                                          user_reward_channels)
from meds_cli.core.errors import UserError

REWARDS = '''
def length_bonus(prompts, completions, **kwargs):
    return [0.1 * len(c) for c in completions]

def mentions_answer(prompts, completions, answer, level, **kwargs):
    return [1.0 if str(a) in c and lvl == "hard" else 0.0 for c, a, lvl in zip(completions, answer, level)]

def seen(prompts, completions, **kwargs):
    seen.calls.append({"prompts": prompts, "completions": completions, **kwargs})
    return [0.0] * len(completions)
seen.calls = []

def divides(prompts, completions, **kwargs):
    return [1.0 / int(c) for c in completions]

def wrong_length(prompts, completions, **kwargs):
    return [1.0]

def text_values(prompts, completions, **kwargs):
    return ["good"] * len(completions)

def not_a_list(prompts, completions, **kwargs):
    return 1.0

def numpy_values(prompts, completions, **kwargs):
    import numpy
    return numpy.ones(len(completions))

def huge_int(prompts, completions, **kwargs):
    return [10 ** 400] * len(completions)

def nan_value(prompts, completions, **kwargs):
    return [float("nan")] * len(completions)

def clears(prompts, completions, answer, **kwargs):
    completions.clear()
    answer.clear()
    return []

def rewrites(prompts, completions, answer, **kwargs):
    n = len(completions)
    completions[:] = ["changed"] * n
    answer[0] = "changed"
    return [0.0] * n

def never_returns(prompts, completions, **kwargs):
    while True:
        pass

def swallows_everything(prompts, completions, **kwargs):
    while True:
        try:
            while True:
                pass
        except Exception:
            pass

THRESHOLD = 3
'''


@pytest.fixture
def reward_file(tmp_path):
    path = tmp_path / "my_rewards.py"
    path.write_text(textwrap.dedent(REWARDS))
    return path


def _problems():
    return [Problem("p0", "What is 2 * 3?", "6", {"level": "hard"}), Problem("p1", "What is 1 + 1?", "2", {"level": "easy"})]


def test_functions_are_called_like_trl_reward_callables_and_weighted(reward_file):
    functions = load_reward_functions([f"{reward_file}:length_bonus", f"{reward_file}:mentions_answer"], [1.0, 0.5])
    problems = _problems()
    per_response = [problems[0], problems[0], problems[1], problems[1]]
    completions = ["6", "it is 6", "2", "3"]
    channels = user_reward_channels(functions, ["q0", "q0", "q1", "q1"], completions, per_response)
    assert list(channels) == ["length_bonus", "mentions_answer"]
    assert torch.allclose(channels["length_bonus"], torch.tensor([0.1, 0.7, 0.1, 0.1]))
    # 'level' comes from the row's columns; only the hard problem's responses that contain 6 score, times 0.5
    assert torch.equal(channels["mentions_answer"], torch.tensor([0.5, 0.5, 0.0, 0.0]))


def test_the_keyword_lists_hold_one_entry_per_response(reward_file):
    (function,) = load_reward_functions(f"{reward_file}:seen")
    problems = _problems()
    user_reward_channels([function], ["a", "b"], ["x", "y"], problems)
    call = function.fn.calls[-1]
    assert call == {"prompts": ["a", "b"], "completions": ["x", "y"], "problem_id": ["p0", "p1"],
                    "problem": ["What is 2 * 3?", "What is 1 + 1?"], "answer": ["6", "2"], "level": ["hard", "easy"]}


def test_row_fields_fill_missing_columns_with_none():
    problems = [Problem("a", "q", "1", {"source": "x"}), Problem("b", "q", "2")]
    assert row_fields(problems)["source"] == ["x", None]


def test_numpy_results_are_accepted(reward_file):
    (function,) = load_reward_functions(f"{reward_file}:numpy_values")
    assert torch.equal(user_reward_channels([function], ["a"], ["b"], _problems()[:1])["numpy_values"], torch.tensor([1.0]))


def test_an_error_inside_the_function_names_it_and_the_row(reward_file):
    (function,) = load_reward_functions(f"{reward_file}:divides")
    with pytest.raises(UserError) as err:
        user_reward_channels([function], ["q"] * 3, ["1", "0", "2"], _problems() + _problems()[:1])
    message = str(err.value)
    assert f"reward function '{reward_file}:divides' failed on row 1 (problem 'p1', response '0')" in message
    assert "ZeroDivisionError" in message and "\n" not in message


@pytest.mark.parametrize("name, expected", [
    ("wrong_length", "returned 1 values for 2 responses"),
    ("text_values", "returned 'good' for response 0; every value must be a finite number"),
    ("not_a_list", "returned a float; it must return a list of 2 floats"),
    ("nan_value", "returned nan for response 0; every value must be a finite number"),
    ("huge_int", r"returned 10{39}\.\.\. for response 0; every value must be a finite number"),
    ("clears", "returned 0 values for 2 responses"),
])
def test_wrong_return_values_are_one_line(reward_file, name, expected):
    (function,) = load_reward_functions(f"{reward_file}:{name}")
    with pytest.raises(UserError, match=expected):
        user_reward_channels([function], ["a", "b"], ["x", "y"], _problems())


def test_loading_mistakes_are_one_line(reward_file, tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_reward_functions(f"{tmp_path}/missing.py:f")
    with pytest.raises(UserError, match="has no function 'length_bonu'.*did you mean 'length_bonus'"):
        load_reward_functions(f"{reward_file}:length_bonu")
    with pytest.raises(UserError, match=r"'THRESHOLD' in .* is not a function \(type int\)"):
        load_reward_functions(f"{reward_file}:THRESHOLD")
    with pytest.raises(UserError, match="not of the form path/to/file.py:function_name"):
        load_reward_functions(str(reward_file))
    with pytest.raises(UserError, match="2 weights for 1 reward.functions"):
        load_reward_functions(f"{reward_file}:seen", [1.0, 2.0])
    broken = tmp_path / "broken.py"
    broken.write_text("def f(:\n")
    with pytest.raises(UserError, match="importing .*broken.py' failed: SyntaxError"):
        load_reward_functions(f"{broken}:f")


def test_spec_parsing_and_unique_channel_names(reward_file, tmp_path):
    assert parse_spec("a/b.py:f") == (parse_spec("a/b.py:f")[0], "f")
    other = tmp_path / "other.py"
    other.write_text("def length_bonus(prompts, completions, **kw):\n    return [2.0] * len(completions)\n")
    functions = load_reward_functions([f"{reward_file}:length_bonus", f"{other}:length_bonus"])
    assert [f.channel for f in functions] == ["length_bonus", "length_bonus_2"]
    assert [f.weight for f in functions] == [1.0, 1.0]
    assert load_reward_functions([]) == [] and load_reward_functions("") == []


def test_user_channels_join_the_algorithms_and_may_not_replace_one():
    base = {"correctness": torch.tensor([1.0])}
    assert list(add_channels(base, {"style": torch.tensor([0.5])})) == ["correctness", "style"]
    with pytest.raises(UserError, match="reward function 'correctness' has the name of the algorithm's reward channel"):
        add_channels(base, {"correctness": torch.tensor([0.0])})


def test_a_function_that_changes_its_inputs_changes_nothing_outside(reward_file):
    """Each call gets its own copies: the trainer's lists and the next channel's inputs stay whole."""
    functions = load_reward_functions([f"{reward_file}:rewrites", f"{reward_file}:length_bonus", f"{reward_file}:seen"])
    completions, prompts = ["ab", "abcd"], ["q0", "q1"]
    channels = user_reward_channels(functions, prompts, completions, _problems())
    assert completions == ["ab", "abcd"] and prompts == ["q0", "q1"]
    assert torch.allclose(channels["length_bonus"], torch.tensor([0.2, 0.4]))
    call = functions[2].fn.calls[-1]
    assert call["completions"] == ["ab", "abcd"] and call["answer"] == ["6", "2"]


@pytest.mark.parametrize("name", ["never_returns", "swallows_everything"])
def test_a_function_that_never_returns_is_stopped_by_its_time_limit(reward_file, name):
    (function,) = load_reward_functions(f"{reward_file}:{name}", timeout_s=0.3)
    with pytest.raises(UserError) as err:
        user_reward_channels([function], ["a", "b"], ["x", "y"], _problems())
    assert str(err.value) == (f"reward function '{reward_file}:{name}' did not return within 0.3 s on a batch of 2 "
                              f"responses; make it faster or raise reward.function_timeout_s (0: no limit)")

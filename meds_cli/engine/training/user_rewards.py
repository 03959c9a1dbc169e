"""Reward functions the user writes in a Python file: `reward.functions=path/to/file.py:name`.

Each function is called as TRL calls its reward callables: keyword arguments `prompts` and
`completions` (one entry per response, so a prompt repeats G times) plus one keyword list per
field of the problem's dataset row (`problem_id`, `problem`, `answer`, then the row's other
columns), and returns one float per response. A function should accept `**kwargs` for the
fields it does not use.

Each function becomes a reward channel beside the algorithm's own (named after the function),
weighted by `reward.function_weights` (default 1 each): the reward is the sum of the channels,
and algorithms that treat channels separately (RLIF's GDPO) see it as a channel of its own.

A function is code we do not control. Every call gets its own copies of the inputs, so one that
changes them (clears `completions`, say) changes nothing of the trainer's or another channel's;
its return is checked (a list, one value per response, each a finite number) before it is used;
and a call that runs past `reward.function_timeout_s` stops the run with one line naming it.

Loading user code from a file the user names on the command line or in a config is intended;
nothing here ever imports a file because it lies in a run folder.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import math
import numbers
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch

from meds_cli.core.errors import UserError, nearest
from meds_cli.core.time_limit import TimeLimitExceeded, call_with_time_limit


@dataclass(frozen=True)
class RewardFunction:
    channel: str  # the reward channel's name (the function's name, made unique)
    spec: str  # 'file.py:name' as the user wrote it
    fn: Callable
    weight: float
    timeout_s: float = 0.0  # limit of one call (0: none)


def as_list(value) -> list:
    """A config value that may be one item or a list of them."""
    if value is None or value == "":
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def parse_spec(text: str) -> tuple[Path, str]:
    """'path/to/file.py:name' -> (path, name)."""
    path, sep, name = str(text).strip().rpartition(":")
    if not sep or not path or not name.isidentifier():
        raise UserError(f"reward.functions entry '{text}' is not of the form path/to/file.py:function_name")
    return Path(path).expanduser(), name


def _import_file(path: Path):
    """The module in `path`, under a name of its own (two files may both be called rewards.py)."""
    module_name = "meds_user_rewards_" + hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise UserError(f"reward.functions: '{path}' cannot be imported as a Python file")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as error:  # the user's file: any error is theirs to fix, in one line
        raise UserError(f"reward.functions: importing '{path}' failed: {type(error).__name__}: {error}") from None
    sys.modules[module_name] = module
    return module


def planned_channels(functions, weights=None) -> list[tuple[str, str, float]]:
    """(channel name, spec, weight) of each entry of `reward.functions`, without importing anything:
    the channel is the function's name, made unique (f, f_2, ...) when two files share one."""
    specs = [str(s) for s in as_list(functions)]
    weights = [float(w) for w in as_list(weights)] or [1.0] * len(specs)
    if len(weights) != len(specs):
        raise UserError(f"reward.function_weights has {len(weights)} weights for {len(specs)} reward.functions; "
                        "give one weight per function (or none for weight 1 each)")
    planned: list[tuple[str, str, float]] = []
    for spec, weight in zip(specs, weights):
        _, name = parse_spec(spec)
        channel, suffix = name, 2
        while channel in {c for c, _, _ in planned}:
            channel, suffix = f"{name}_{suffix}", suffix + 1
        planned.append((channel, spec, weight))
    return planned


def load_reward_functions(functions, weights=None, timeout_s: float = 0.0) -> list[RewardFunction]:
    """The functions of `reward.functions` with their `reward.function_weights` and the time limit
    of one call; every mistake in the names, files or weights is one line."""
    loaded: list[RewardFunction] = []
    for channel, spec, weight in planned_channels(functions, weights):
        path, name = parse_spec(spec)
        if not path.is_file():
            raise UserError(f"reward.functions: file '{path}' (from '{spec}') does not exist")
        module = _import_file(path)
        fn = getattr(module, name, None)
        if fn is None:
            found = [k for k, v in vars(module).items() if callable(v) and not k.startswith("_")
                     and getattr(v, "__module__", None) == module.__name__]
            raise UserError(f"reward.functions: '{path}' has no function '{name}'{nearest(name, found)}; "
                            f"its functions: {', '.join(found) or 'none'}")
        if not callable(fn):
            raise UserError(f"reward.functions: '{name}' in '{path}' is not a function (type {type(fn).__name__})")
        loaded.append(RewardFunction(channel, spec, fn, weight, timeout_s))
    return loaded


def row_fields(problems: Sequence) -> dict[str, list]:
    """The keyword lists of the problems' dataset rows: problem_id, problem, answer and every
    column in `meta` (None where a row lacks it)."""
    keys = list(dict.fromkeys(k for p in problems for k in (p.meta or {})))
    fields = {"problem_id": [p.id for p in problems], "problem": [p.question for p in problems],
              "answer": [p.answer for p in problems]}
    for key in keys:
        if key not in fields and key not in ("prompts", "completions"):
            fields[key] = [(p.meta or {}).get(key) for p in problems]
    return fields


def _check_values(values, expected: int, where: str) -> list[float]:
    if isinstance(values, torch.Tensor):
        values = values.tolist()
    elif hasattr(values, "tolist"):  # numpy arrays
        values = values.tolist()
    if not isinstance(values, (list, tuple)):
        raise UserError(f"{where} returned a {type(values).__name__}; it must return a list of {expected} floats")
    if len(values) != expected:
        raise UserError(f"{where} returned {len(values)} values for {expected} responses; it must return one float per response")
    for i, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not _finite(value):
            shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "..."  # 10**400 has 401 digits
            raise UserError(f"{where} returned {shown} for response {i}; every value must be a finite number")
    return [float(v) for v in values]


def _finite(value: numbers.Real) -> bool:
    """Whether a number is finite as a float: an int too large for one (10**400) is not."""
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def _call(function: RewardFunction, prompts: list, completions: list, fields: dict[str, list]):
    """The function on its own copies of the inputs, within its time limit."""
    inputs = copy.deepcopy({**fields, "prompts": prompts, "completions": completions})
    return call_with_time_limit(lambda: function.fn(**inputs), function.timeout_s)


def _failing_row(function: RewardFunction, prompts, completions, fields) -> int | None:
    """The first response on which the function raises when called on it alone (None: only the batch fails)."""
    for i in range(len(completions)):
        try:
            _call(function, prompts[i:i + 1], completions[i:i + 1], {k: v[i:i + 1] for k, v in fields.items()})
        except (Exception, TimeLimitExceeded):
            return i
    return None


def evaluate_function(function: RewardFunction, prompts: list[str], completions: list[str],
                      fields: dict[str, list]) -> list[float]:
    """One float per response from a user function; an exception inside it stops the step with
    one line naming the function and the first row it fails on."""
    where = f"reward function '{function.spec}'"
    try:
        values = _call(function, prompts, completions, fields)
    except TimeLimitExceeded:
        raise UserError(f"{where} did not return within {function.timeout_s:g} s on a batch of {len(completions)} "
                        f"responses; make it faster or raise reward.function_timeout_s (0: no limit)") from None
    except Exception as error:
        row = _failing_row(function, prompts, completions, fields)
        at = (f" on row {row} (problem {fields['problem_id'][row]!r}, response {completions[row][:60]!r})"
              if row is not None else f" on a batch of {len(completions)} responses")
        raise UserError(f"{where} failed{at}: {type(error).__name__}: {error}") from None
    return _check_values(values, len(completions), where)


def user_reward_channels(functions: list[RewardFunction], prompts: list[str], completions: list[str],
                         problems: Sequence) -> dict[str, torch.Tensor]:
    """{channel: weight * values} [B] for every user function; `problems` has one entry per response."""
    if not functions:
        return {}
    fields = row_fields(problems)
    return {f.channel: f.weight * torch.tensor(evaluate_function(f, prompts, completions, fields))
            for f in functions}


def add_channels(components: dict[str, torch.Tensor], extra: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The algorithm's channels plus the user's; a user channel may not take an algorithm channel's name."""
    clash = sorted(set(components) & set(extra))
    if clash:
        raise UserError(f"reward function '{clash[0]}' has the name of the algorithm's reward channel '{clash[0]}'; "
                        f"rename the function (the algorithm's channels: {', '.join(components)})")
    return {**components, **extra}

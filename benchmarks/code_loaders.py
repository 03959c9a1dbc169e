"""Loaders of the code benchmarks: HumanEval+, MBPP+ (EvalPlus), HumanEval, LiveCodeBench.

Each reads `--data-dir` (the EvalPlus release files, OpenAI's HumanEval file, LiveCodeBench's
release files) or, without one, the dataset hub, and returns Problems whose `answer` holds what
the grader needs: the mode ('call' for EvalPlus's input lists, 'check' for a check(candidate)
test, 'script' for a test script, 'method'/'stdio' for LiveCodeBench), the entry point, the
inputs, the canonical solution, and `dataset` ('humaneval' / 'mbpp') for EvalPlus's per-task
rules. Damaged rows are skipped and counted, and the loaded count is checked against the known
one (code_rows).

LiveCodeBench is pinned: the hub revision that added release_v5, its release files
test.jsonl .. test5.jsonl, and the problems dated in [2024-08-01, 2025-02-01), the window
reported as "LiveCodeBench v5" (279 problems).
"""

import base64
import io
import json
import pickle
import zlib
from pathlib import Path
from typing import Any

from benchmarks.code_hub_layout import release_row
from benchmarks.code_rows import Rows, hub_rows, read_json_lines, to_problems
from meds_cli.core.errors import UserError
from meds_cli.core.records import Problem

_FILES = {
    "humanevalplus": "humanevalplus/HumanEvalPlus.jsonl.gz",
    "mbppplus": "mbppplus/MbppPlus.jsonl.gz",
    "humaneval": "humaneval/HumanEval.jsonl.gz",
}
_HUB = {
    "humanevalplus": "evalplus/humanevalplus",
    "mbppplus": "evalplus/mbppplus",
    "humaneval": "openai/openai_humaneval",
    "livecodebench": "livecodebench/code_generation_lite",
}
EXPECTED_ROWS = {"humanevalplus": 164, "mbppplus": 378, "humaneval": 164, "livecodebench": 279}

LCB_REVISION = "0687ab61843a90a0cc864a2b67db729861cd0ae5"  # "feat: release_v5"
LCB_RELEASE_FILES = ("test.jsonl", "test2.jsonl", "test3.jsonl", "test4.jsonl", "test5.jsonl")
LCB_WINDOW = ("2024-08-01", "2025-02-01")  # contest dates from the first, before the second
LCB_MIN_TIMEOUT_S = 4.0  # a whole LiveCodeBench program: max(this, 2 s per test)


def _hub_load_args(name: str) -> tuple[tuple, dict]:
    """load_dataset arguments per benchmark. LiveCodeBench's hub repo has a loading script,
    which datasets >= 4 no longer runs: its release files are read as plain JSON lines, at
    the pinned revision."""
    if name == "livecodebench":
        files = [f"hf://datasets/{_HUB[name]}@{LCB_REVISION}/{f}" for f in LCB_RELEASE_FILES]
        return ("json",), {"data_files": files, "split": "train"}
    return (_HUB[name],), {"split": "test"}


def _hub(name: str) -> Rows:
    """Rows of the benchmark's dataset-hub copy; any failure to get them is the user's to fix."""
    args, kwargs = _hub_load_args(name)
    try:
        import datasets

        from meds_cli.core.hub import offline_unless_reachable

        offline_unless_reachable()  # fail at once rather than after a minute of retries
        return hub_rows(_HUB[name], datasets.load_dataset(*args, **kwargs))
    except Exception as error:  # offline, unknown, gated: all end the same way for the user
        where = f"--data-dir holding {_FILES[name]}" if name in _FILES else "a local copy (--data-dir)"
        raise UserError(
            f"benchmark '{name}' needs the dataset hub ('{_HUB[name]}' failed: {type(error).__name__}) "
            f"or {where}"
        ) from None


def _rows(name: str, data_dir: Path | None) -> Rows:
    if data_dir is None:
        return _hub(name)
    path = Path(data_dir) / _FILES[name]
    if not path.is_file():
        raise UserError(f"benchmark '{name}': no file {path}; --data-dir must hold {_FILES[name]}")
    return read_json_lines([path], name)


# ----- HumanEval+ and MBPP+ ----------------------------------------------------------------------

# MBPP+ stores some tuple/set/complex arguments as JSON lists or strings; EvalPlus turns them
# back per task before calling (evalplus.data.mbpp.mbpp_deserialize_inputs). Task numbers by shape.
_MBPP_ARG_SHAPES = {
    "args_to_tuples": [2, 116, 132, 143, 222, 261, 273, 394, 399, 421, 424, 429, 470, 560, 579,
                       596, 616, 630, 726, 740, 744, 809],
    "inner_to_tuples": [63, 64, 70, 94, 120, 237, 272, 299, 400, 409, 417, 438, 473, 614, 780],
    "first_inner_to_tuples": [75, 413, 444, 753],
    "second_to_tuple": [106, 750],
    "first_to_tuple": [250, 405, 446, 617, 720, 763, 808],
    "inner_then_args_to_tuples": [259, 401, 445],
    "all_to_tuples": [580, 615, 791],
}  # fmt: skip


def _deep_tuple(value):
    return tuple(_deep_tuple(item) for item in value) if isinstance(value, (list, tuple)) else value


def mbpp_args(number: int, args: list):
    """One MBPP+ input (an argument list) with EvalPlus's types restored; idempotent, so that
    inputs already read with their types (the hub copy's) come out the same."""
    shape = next((s for s, numbers in _MBPP_ARG_SHAPES.items() if number in numbers), None)
    if shape == "args_to_tuples":
        return [tuple(arg) for arg in args]
    if shape == "inner_to_tuples":
        return [[tuple(item) for item in arg] for arg in args]
    if shape == "first_inner_to_tuples":
        return [[tuple(item) for item in args[0]], args[1]]
    if shape == "second_to_tuple":
        return [args[0], tuple(args[1])]
    if shape == "first_to_tuple":
        return [tuple(args[0])] + list(args[1:])
    if shape == "inner_then_args_to_tuples":
        return [tuple(tuple(item) for item in arg) for arg in args]
    if shape == "all_to_tuples":
        return _deep_tuple(args)
    if number == 115:  # EvalPlus turns an empty list into {} (an empty dict), a quirk kept here
        return [[item if isinstance(item, (set, dict)) else set(item) if item else {} for item in args[0]]]
    if number == 124:
        return [float(args[0]), complex(args[1])]
    if number == 252:
        return [complex(args[0])]
    if number == 278:
        return [tuple(tuple(item) if isinstance(item, list) else item for item in args[0])]
    if number == 307:
        return [tuple(args[0]), args[1], args[2]]
    if number == 722:
        return [{key: tuple(value) for key, value in args[0].items()}] + list(args[1:])
    return list(args)


def _evalplus_problem(name: str, row: dict) -> Problem:
    if name == "mbppplus":
        row = release_row(row)
    humaneval_style = name == "humanevalplus"
    base, plus = row.get("base_input"), row.get("plus_input")
    if name == "mbppplus" and base is not None:
        number = int(row["task_id"].split("/")[-1])
        base = [mbpp_args(number, args) for args in base]
        plus = [mbpp_args(number, args) for args in plus]
    answer = {
        "entry_point": row["entry_point"],
        "prompt": row["prompt"],
        "canonical_solution": row["prompt"] + row["canonical_solution"] if humaneval_style
        else row["canonical_solution"],
        "completes_prompt": humaneval_style,
        "dataset": "humaneval" if humaneval_style else "mbpp",
    }  # fmt: skip
    if base is not None:
        answer.update(mode="call", base_input=base, plus_input=plus, atol=float(row.get("atol") or 0),
                      n_base=len(base), n_plus=len(plus))  # fmt: skip
    elif "script_test" in row:
        answer.update(mode="script", test=row["script_test"])  # a hub MBPP+ row whose inputs are unreadable
    else:
        answer.update(mode="check", test=row["test"])  # the HumanEval+ hub copy: its check(candidate)
    if not isinstance(answer["entry_point"], str) or not answer["entry_point"].isidentifier():
        raise ValueError(f"entry_point {answer['entry_point']!r} is not a function name")
    meta = {"benchmark": name, "entry_point": row["entry_point"]}
    return Problem(str(row["task_id"]), str(row["prompt"]), answer, meta)


def _humaneval_problem(row: dict) -> Problem:
    answer = {"mode": "check", "entry_point": row["entry_point"], "prompt": row["prompt"],
              "test": row["test"], "canonical_solution": row["prompt"] + row["canonical_solution"],
              "completes_prompt": True}  # fmt: skip
    return Problem(row["task_id"], row["prompt"], answer, {"benchmark": "humaneval", "entry_point": row["entry_point"]})


def _limited(problems: list[Problem], limit: int | None) -> list[Problem]:
    return problems if limit is None else problems[:limit]


def load_humanevalplus(data_dir: Path | None, limit: int | None = None) -> list[Problem]:
    problems = to_problems("humanevalplus", _rows("humanevalplus", data_dir),
                           lambda row: _evalplus_problem("humanevalplus", row), EXPECTED_ROWS["humanevalplus"])
    return _limited(problems, limit)


def load_mbppplus(data_dir: Path | None, limit: int | None = None) -> list[Problem]:
    problems = to_problems("mbppplus", _rows("mbppplus", data_dir),
                           lambda row: _evalplus_problem("mbppplus", row), EXPECTED_ROWS["mbppplus"])
    return _limited(problems, limit)


def load_humaneval(data_dir: Path | None, limit: int | None = None) -> list[Problem]:
    problems = to_problems("humaneval", _rows("humaneval", data_dir), _humaneval_problem, EXPECTED_ROWS["humaneval"])
    return _limited(problems, limit)


# ----- LiveCodeBench -----------------------------------------------------------------------------


class _StringsOnly(pickle.Unpickler):
    """LiveCodeBench packs private tests as a pickled JSON string; a string needs no class,
    so refusing every class makes unpickling hub data safe."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing {module}.{name} in LiveCodeBench test data")


def _lcb_tests(field: Any) -> list[dict]:
    if isinstance(field, list):
        return field
    try:
        return json.loads(field)
    except (TypeError, ValueError):
        raw = zlib.decompress(base64.b64decode(field))
        return json.loads(_StringsOnly(io.BytesIO(raw)).load())


def in_lcb_window(contest_date: str) -> bool:
    """Whether a contest date (ISO text) falls in the pinned window."""
    day = str(contest_date)[:10]
    return LCB_WINDOW[0] <= day < LCB_WINDOW[1]


def _lcb_problem(row: dict) -> Problem | None:
    """A LiveCodeBench row as a Problem; None for a problem outside the date window."""
    if not in_lcb_window(row["contest_date"]):
        return None
    public, private = _lcb_tests(row["public_test_cases"]), _lcb_tests(row.get("private_test_cases") or "[]")
    tests = public + private
    metadata = json.loads(row.get("metadata") or "{}")
    functional = bool(tests) and tests[0].get("testtype") == "functional"
    if functional:
        inputs = [[json.loads(line) for line in test["input"].split("\n") if line.strip()] for test in tests]
        outputs = [json.loads(test["output"]) for test in tests]
    else:
        inputs, outputs = [test["input"] for test in tests], [test["output"] for test in tests]
    answer = {
        "mode": "method" if functional else "stdio",
        "entry_point": metadata.get("func_name") if functional else None,
        "plus_input": inputs[len(public):], "base_input": inputs[: len(public)], "outputs": outputs,
        "n_base": len(public), "n_plus": len(private), "starter_code": row.get("starter_code", ""),
        "timeout_s": max(LCB_MIN_TIMEOUT_S, 2.0 * len(tests)),
    }  # fmt: skip
    question = row["question_content"]
    meta = {"benchmark": "livecodebench", "platform": row.get("platform"), "difficulty": row.get("difficulty"),
            "contest_date": row.get("contest_date"), "starter_code": row.get("starter_code", "")}  # fmt: skip
    return Problem(str(row["question_id"]), question, answer, meta)


def load_livecodebench(data_dir: Path | None, limit: int | None = None) -> list[Problem]:
    """The pinned hub release (see the module docstring), or the *.jsonl release files in
    <data_dir>/livecodebench/; problems in the date window."""
    if data_dir is None:
        rows = _hub("livecodebench")
    else:
        files = sorted((Path(data_dir) / "livecodebench").glob("*.jsonl"))
        if not files:
            raise UserError(
                f"benchmark 'livecodebench' needs the dataset hub or a local copy: no *.jsonl in "
                f"{Path(data_dir) / 'livecodebench'}"
            )
        rows = read_json_lines(files, "livecodebench")
    return _limited(to_problems("livecodebench", rows, _lcb_problem, EXPECTED_ROWS["livecodebench"]), limit)

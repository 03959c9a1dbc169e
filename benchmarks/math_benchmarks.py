"""The math benchmarks (AIME 2024/2025, AMC 2023, MATH500, OlympiadBench, GSM8K, Minerva-Math)
and the loader of math training files.

Each benchmark reads `<data_dir>/<name>/test.jsonl` (the layout of /work/shared/data, copies of
the Qwen2.5-Math evaluation files) or, with no data dir, a public copy on the dataset hub. The
files disagree on field names and answer types (a string in aime24, a float in amc23, an int in
aime25, a one-element list `final_answer` in olympiadbench, the text after `####` in gsm8k, only
a boxed solution in minerva_math), so each has a small normalizer that turns a row into a
Problem whose `answer` is a string math-verify can read. Grading goes through the shared
MathGrader: last \\boxed{} of the response, strict plain-number rule.
"""

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from benchmarks.answer_extraction import last_boxed
from benchmarks.math_grading import shared_grader
from benchmarks.registry import BENCHMARKS, Benchmark
from meds_cli.core.records import Problem, Verdict
from meds_cli.core.errors import UserError

logger = logging.getLogger(__name__)


def _number_text(value) -> str:
    """27.0 -> '27', 3 -> '3', '025' -> '25' (AIME answers are 0-999 written with 3 digits)."""
    if isinstance(value, bool):
        raise ValueError(f"not a number answer: {value!r}")
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    text = str(value).strip()
    return str(int(text)) if text.isdigit() else text


def _unwrap_dollars(text: str) -> str:
    """'$\\frac{1}{2}$' -> '\\frac{1}{2}' (OlympiadBench writes its answers in math mode)."""
    return re.sub(r"(?<!\\)\$", "", text).strip()


def _question(row: dict) -> str:
    for name in ("problem", "question", "Problem"):
        if row.get(name):
            return str(row[name])
    raise ValueError(f"row has no problem text; fields: {sorted(row)}")


def _plain_answer(row: dict) -> str:
    return _number_text(row.get("answer", row.get("Answer")))


def _olympiad_answer(row: dict) -> str:
    answers = row["final_answer"]
    if isinstance(answers, str):
        answers = [answers]
    # Several parts ('$69$,$84$') become one comma-separated answer, as a model would box it.
    return ", ".join(_unwrap_dollars(a) for a in answers)


def _gsm8k_answer(row: dict) -> str:
    return row["answer"].split("####")[-1].strip().replace(",", "")


def _minerva_answer(row: dict) -> str:
    if row.get("answer"):  # the hub copy carries the answer already
        return str(row["answer"]).strip()
    answer = last_boxed(row["solution"])
    if answer is None:
        raise ValueError("minerva_math row without a \\boxed{} answer in its solution")
    return answer


@dataclass(frozen=True)
class _Source:
    name: str
    description: str
    answer: Callable[[dict], str]
    hub_id: str
    hub_split: str
    hub_config: str | None = None
    expected_rows: int | None = None


_SOURCES = [
    _Source("aime24", "AIME 2024, 30 problems, integer answers", _plain_answer,
            "HuggingFaceH4/aime_2024", "train", expected_rows=30),
    _Source("aime25", "AIME 2025, 30 problems, integer answers", _plain_answer,
            "math-ai/aime25", "test", expected_rows=30),
    _Source("amc23", "AMC 2023, 40 problems", _plain_answer,
            "math-ai/amc23", "test", expected_rows=40),
    _Source("math500", "MATH500: the 500-problem subset of the MATH test split", _plain_answer,
            "HuggingFaceH4/MATH-500", "test", expected_rows=500),
    _Source("olympiadbench", "OlympiadBench, 675 English text-only open-ended math problems",
            _olympiad_answer, "Hothan/OlympiadBench", "train", "OE_TO_maths_en_COMP", 675),
    _Source("gsm8k", "GSM8K test split, 1319 grade-school word problems", _gsm8k_answer,
            "openai/gsm8k", "test", "main", 1319),
    _Source("minerva_math", "Minerva-Math (OCWCourses), 272 STEM problems", _minerva_answer,
            "math-ai/minervamath", "test", expected_rows=272),
]


def _read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        raise UserError(f"benchmark file {path} not found; --data-dir must hold <benchmark>/test.jsonl")
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _read_hub(source: _Source) -> list[dict]:
    import datasets

    from meds_cli.core.hub import offline_unless_reachable

    offline_unless_reachable()  # fail at once rather than after a minute of retries

    try:
        data = datasets.load_dataset(source.hub_id, source.hub_config, split=source.hub_split)
    except Exception as error:  # offline, unknown id, no access: all end the same way for the user
        raise UserError(
            f"cannot load benchmark '{source.name}' from the dataset hub ({source.hub_id}: "
            f"{type(error).__name__}); pass --data-dir with a local copy (<dir>/{source.name}/test.jsonl)"
        ) from None
    return [dict(row) for row in data]


def _rows_to_problems(source: _Source, rows: list[dict]) -> list[Problem]:
    problems = []
    for index, row in enumerate(rows):
        row_id = row.get("id", row.get("idx", row.get("unique_id", index)))
        meta = {k: row[k] for k in ("subject", "level", "type", "subfield", "unit", "answer_type") if row.get(k)}
        problems.append(Problem(f"{source.name}/{row_id}", _question(row), source.answer(row), meta))
    return problems


def _loader(source: _Source) -> Callable[[Path | None, int | None], list[Problem]]:
    def load(data_dir: Path | None, limit: int | None = None) -> list[Problem]:
        if data_dir is None:
            rows = _read_hub(source)
        else:
            rows = _read_jsonl(Path(data_dir) / source.name / "test.jsonl")
        if limit is not None:
            rows = rows[:limit]
        return _rows_to_problems(source, rows)

    load.__doc__ = f"Problems of {source.name}: {source.description}."
    return load


def grade_math(pairs: Sequence[tuple[Problem, str]]) -> list[Verdict]:
    """Verdicts for (problem, response) pairs: last \\boxed{} against the gold answer, strict."""
    return shared_grader().grade_responses([(response, problem.answer) for problem, response in pairs])


for _source in _SOURCES:
    BENCHMARKS.register(_source.name, _source.description)(
        Benchmark(_source.name, _source.description, "math", _loader(_source), grade_math)
    )


def _training_problem(row, index: int, origin: str) -> Problem | None:
    """A training row -> Problem: text in 'problem' or 'question', gold in 'answer' (else the last
    \\boxed{} of 'solution'); the other fields go to meta. None for a row without a gold answer
    (MATH train has four), which no reward could score."""
    if not isinstance(row, dict) or not any(row.get(k) for k in ("problem", "question")):
        raise UserError(f"{origin}: row {index} has no 'problem' (or 'question') text")
    if row.get("answer") is not None and str(row["answer"]).strip():
        answer = _number_text(row["answer"])
    else:
        answer = last_boxed(str(row.get("solution") or ""))
        if not answer:
            return None
    meta = {k: v for k, v in row.items() if k not in ("problem", "question", "answer", "solution")}
    return Problem(f"{Path(origin).stem}/{index}", _question(row), answer, meta)


def _training_problems(rows, origin: str) -> list[Problem]:
    problems = [_training_problem(row, index, origin) for index, row in enumerate(rows)]
    kept = [p for p in problems if p is not None]
    if not kept:
        raise UserError(f"{origin}: no row has a gold answer ('answer', or a \\boxed{{}} in 'solution')")
    if len(kept) < len(problems):
        logger.warning("%s: skipped %d of %d rows without a gold answer", origin, len(problems) - len(kept), len(problems))
    return kept


def load_math_file(path: str | Path) -> list[Problem]:
    """Problems from a JSON list or JSONL file of {problem, answer} rows (e.g. the MATH train
    split of rllm, math_train_rllm/math.json), for the math training task."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"math data file {path} not found")
    text = path.read_text(encoding="utf-8")
    try:
        rows = json.loads(text) if text.lstrip().startswith("[") else [
            json.loads(line) for line in text.splitlines() if line.strip()
        ]
    except json.JSONDecodeError as error:
        raise UserError(f"math data file {path} is neither a JSON list nor JSONL: {error}") from None
    return _training_problems(rows, str(path))


def load_math_source(source: str | Path) -> list[Problem]:
    """Training problems from a JSON/JSONL file or, when `source` is not a file name, from the
    'train' split of the hub dataset of that name (rows with problem/question and answer/solution)."""
    source = str(source).strip()
    if not source:
        raise UserError("task.path is empty: give a JSON/JSONL file of {problem, answer} rows or a hub dataset name")
    path = Path(source)
    if path.is_file() or path.suffix in (".json", ".jsonl"):
        return load_math_file(path)
    import datasets

    from meds_cli.core.hub import offline_unless_reachable

    offline_unless_reachable()  # fail at once rather than after a minute of retries

    try:
        rows = datasets.load_dataset(source, split="train")
    except Exception as error:
        raise UserError(
            f"cannot load math dataset '{source}' from the dataset hub ({type(error).__name__}); "
            "give a local JSON/JSONL file instead"
        ) from None
    return _training_problems([dict(row) for row in rows], source)

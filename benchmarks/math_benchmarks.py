"""The math benchmarks (AIME 2024/2025, AMC 2023, MATH500, OlympiadBench, GSM8K, Minerva-Math)
and the loader of math training files.

Each benchmark reads `<data_dir>/<name>/test.jsonl` (copies of the Qwen2.5-Math evaluation
files) or, with no data dir, a public copy on the dataset hub at a pinned revision. The files
disagree on field names and answer types (a string in aime24, a float in amc23, an int in
aime25, a one-element list `final_answer` in olympiadbench, the text after `####` in gsm8k, only
a boxed solution in minerva_math), so each has a small normalizer that turns a row into a
Problem whose `answer` is a string math-verify can read. A row without a problem text or an
answer is skipped and counted, never graded; the number of problems is checked against the
benchmark's known size, and what was skipped or differs is a warning line and a `data` note on
the loaded ProblemSet that the eval report shows. Grading goes through the shared MathGrader:
last \\boxed{} of the response, strict plain-number rule.
"""

import logging
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from benchmarks.answer_extraction import last_boxed
from benchmarks.data_files import LAYOUT_HINT, Row, Skipped, no_usable_rows, read_rows
from benchmarks.math_grading import shared_grader
from benchmarks.registry import BENCHMARKS, Benchmark, ProblemSet
from meds_cli.core.errors import UserError
from meds_cli.core.records import Problem, Verdict

logger = logging.getLogger(__name__)


_BENCHMARK_HINT = "--data-dir must hold <benchmark>/test.jsonl, one JSON object per line"
_TRAINING_HINT = (f"rows need 'problem' (or 'question') and 'answer' (or a \\boxed{{}} answer in 'solution'); "
                  f"{LAYOUT_HINT}")


class BadRow(ValueError):
    """A row that cannot become a problem; the message is the reason a report counts it under."""


def _number_text(value) -> str:
    """27.0 -> '27', 3 -> '3', '025' -> '25' (AIME answers are 0-999 written with 3 digits).

    A missing or empty answer is a BadRow, never the text 'None'."""
    if (value is None or isinstance(value, (bool, list, dict))
            or (isinstance(value, float) and not math.isfinite(value))):
        raise BadRow("without an answer")
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    text = str(value).strip()
    if not text:
        raise BadRow("without an answer")
    return str(int(text)) if text.isdigit() else text


def _unwrap_dollars(text: str) -> str:
    """'$\\frac{1}{2}$' -> '\\frac{1}{2}' (OlympiadBench writes its answers in math mode)."""
    return re.sub(r"(?<!\\)\$", "", text).strip()


def _question(row: dict) -> str:
    for name in ("problem", "question", "Problem"):
        text = row.get(name)
        if isinstance(text, str) and text.strip():
            return text
    raise BadRow("without a problem text")


def _plain_answer(row: dict) -> str:
    return _number_text(row.get("answer", row.get("Answer")))


def _olympiad_answer(row: dict) -> str:
    answers = row.get("final_answer")
    if isinstance(answers, str):
        answers = [answers]
    if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers):
        raise BadRow("without an answer")
    # Several parts ('$69$,$84$') become one comma-separated answer, as a model would box it.
    return _number_text(", ".join(_unwrap_dollars(a) for a in answers if a.strip()))


def _gsm8k_answer(row: dict) -> str:
    solution = row.get("answer")
    if not isinstance(solution, str) or "####" not in solution:
        raise BadRow("without an answer")  # the whole solution would otherwise become the gold answer
    return _number_text(solution.split("####")[-1].replace(",", ""))


def _minerva_answer(row: dict) -> str:
    if row.get("answer"):  # the hub copy carries the answer already
        return _number_text(row["answer"])
    solution = row.get("solution")
    answer = last_boxed(solution) if isinstance(solution, str) else None
    if not answer:
        raise BadRow("without an answer")  # no \\boxed{} in the solution
    return answer


@dataclass(frozen=True)
class _Source:
    """One math benchmark: its file normalizer, its hub copy and its known size.

    hub_revision pins the dataset commit (hub ids can move); each pin is the commit of the hub
    dataset that public evaluation code pins for it. expected_rows is the problem count of the
    benchmark; hub_rows the count of the pinned hub copy where it differs."""

    name: str
    description: str
    answer: Callable[[dict], str]
    hub_id: str
    hub_split: str
    hub_config: str | None = None
    hub_revision: str | None = None
    expected_rows: int | None = None
    hub_rows: int | None = None


_SOURCES = [
    _Source("aime24", "AIME 2024, 30 problems, integer answers", _plain_answer,
            "HuggingFaceH4/aime_2024", "train", hub_revision="2fe88a2f1091d5048c0f36abc874fb997b3dd99a",
            expected_rows=30),
    _Source("aime25", "AIME 2025, 30 problems, integer answers", _plain_answer,
            "math-ai/aime25", "test", hub_revision="563bb8404243c5f09de6ec262f2db674fe5bce9b", expected_rows=30),
    _Source("amc23", "AMC 2023, 40 problems", _plain_answer,
            "math-ai/amc23", "test", hub_revision="80815d37005feb82cd7f8fbc6901d5d3eff43057", expected_rows=40),
    _Source("math500", "MATH500: the 500-problem subset of the MATH test split", _plain_answer,
            "HuggingFaceH4/MATH-500", "test", hub_revision="6e4ed1a2a79af7d8630a6b768ec859cb5af4d3be",
            expected_rows=500),
    # The hub copy of OlympiadBench's English text-only open-ended math set has one problem fewer
    # than the 675 of the Qwen2.5-Math evaluation file; its count is checked against its own size.
    _Source("olympiadbench", "OlympiadBench, 675 English text-only open-ended math problems",
            _olympiad_answer, "Hothan/OlympiadBench", "train", "OE_TO_maths_en_COMP",
            "91184b52131e7fc9455fef848035173aea8cc01a", expected_rows=675, hub_rows=674),
    _Source("gsm8k", "GSM8K test split, 1319 grade-school word problems", _gsm8k_answer,
            "openai/gsm8k", "test", "main", "740312add88f781978c0658806c59bc2815b9866", expected_rows=1319),
    _Source("minerva_math", "Minerva-Math (OCWCourses), 272 STEM problems", _minerva_answer,
            "math-ai/minervamath", "test", hub_revision="ee46ddc498933b1977577953250ca5c66be64f96",
            expected_rows=272),
]


def _read_hub(source: _Source) -> list[Row]:
    import datasets

    from meds_cli.core.hub import offline_unless_reachable

    offline_unless_reachable()  # fail at once rather than after a minute of retries

    try:
        data = datasets.load_dataset(source.hub_id, source.hub_config, split=source.hub_split,
                                     revision=source.hub_revision)
    except Exception as error:  # offline, unknown id, no access: all end the same way for the user
        raise UserError(
            f"cannot load benchmark '{source.name}' from the dataset hub ({source.hub_id}: "
            f"{type(error).__name__}); pass --data-dir with a local copy (<dir>/{source.name}/test.jsonl)"
        ) from None
    return [Row(i, f"row {i}", dict(row)) for i, row in enumerate(data)]


def _benchmark_problem(source: _Source, row: Row) -> Problem:
    """A benchmark row -> Problem; BadRow when it has no problem text or no answer."""
    if not isinstance(row.data, dict):
        raise BadRow("not a JSON object")
    data = row.data
    row_id = next((data[k] for k in ("id", "idx", "unique_id") if data.get(k) is not None), row.index)
    meta = {k: data[k] for k in ("subject", "level", "type", "subfield", "unit", "answer_type") if data.get(k)}
    return Problem(f"{source.name}/{row_id}", _question(data), source.answer(data), meta)


def _benchmark_problems(source: _Source, rows: list[Row], skipped: Skipped, expected: int | None,
                        from_file: bool) -> ProblemSet:
    """The usable problems of a benchmark's rows, with a `data` record of what was read: bad rows
    are skipped and counted, and a count that differs from the expected one is flagged (a warning
    line now, a note in the eval report). `skipped` may hold lines that could not be read."""
    unreadable = skipped.total
    problems = []
    ids = set()
    for row in rows:
        try:
            problem = _benchmark_problem(source, row)
        except BadRow as reason:
            skipped.add(str(reason), row.where)
            continue
        if problem.id in ids:  # its samples would mix with the first one's in samples.jsonl
            skipped.add("with a repeated id", row.where)
            continue
        ids.add(problem.id)
        problems.append(problem)
    if not problems:
        raise no_usable_rows(f"benchmark '{source.name}' ({skipped.origin})", skipped,
                             _BENCHMARK_HINT if from_file else "the hub copy is not what this loader reads")
    notes = []
    if expected is not None and len(problems) != expected:
        notes.append(f"{len(problems)} problems where {source.name} has {expected}")
    if skipped.total:
        notes.append(f"skipped {skipped.total} of {len(rows) + unreadable} rows: {skipped.summary()}")
    data = {"source": skipped.origin, "problems": len(problems), "expected_problems": expected,
            "count_ok": expected is None or len(problems) == expected, "skipped": dict(skipped.counts),
            "note": "; ".join(notes)}
    if notes:
        logger.warning("warning: benchmark %s (%s): %s", source.name, skipped.origin, data["note"])
    return ProblemSet(problems, data)


def _loader(source: _Source) -> Callable[[Path | None, int | None], list[Problem]]:
    def load(data_dir: Path | None, limit: int | None = None) -> list[Problem]:
        if data_dir is None:
            skipped = Skipped(f"{source.hub_id}@{source.hub_revision}" if source.hub_revision else source.hub_id)
            rows = _read_hub(source)
            expected = source.hub_rows or source.expected_rows
        else:
            path = Path(data_dir) / source.name / "test.jsonl"
            if not path.is_file():
                raise UserError(f"benchmark file {path} not found; --data-dir must hold <benchmark>/test.jsonl")
            skipped = Skipped(str(path))
            rows = read_rows(path, skipped)
            expected = source.expected_rows
        problems = _benchmark_problems(source, rows, skipped, expected, from_file=data_dir is not None)
        if limit is not None:
            problems = ProblemSet(problems[:limit], problems.data)
        return problems

    load.__doc__ = f"Problems of {source.name}: {source.description}."
    return load


def grade_math(pairs: Sequence[tuple[Problem, str]]) -> list[Verdict]:
    """Verdicts for (problem, response) pairs: last \\boxed{} against the gold answer, strict."""
    return shared_grader().grade_responses([(response, problem.answer) for problem, response in pairs])


for _source in _SOURCES:
    BENCHMARKS.register(_source.name, _source.description)(
        Benchmark(_source.name, _source.description, "math", _loader(_source), grade_math)
    )


def _training_problem(row: Row, origin: str) -> Problem:
    """A training row -> Problem: text in 'problem' or 'question', gold in 'answer' (else the last
    \\boxed{} of 'solution'); the other fields go to meta. BadRow for a row without a problem text
    or a gold answer (MATH train has four without an answer), which no reward could score."""
    if not isinstance(row.data, dict):
        raise BadRow("not a JSON object")
    data = row.data
    question = _question(data)
    if data.get("answer") is not None and str(data["answer"]).strip():
        answer = _number_text(data["answer"])
    else:
        solution = data.get("solution")
        answer = last_boxed(solution) if isinstance(solution, str) else None
        if not answer:
            raise BadRow("without an answer")
    meta = {k: v for k, v in data.items() if k not in ("problem", "question", "answer", "solution")}
    return Problem(f"{Path(origin).stem}/{row.index}", question, answer, meta)


def _training_problems(rows: list[Row], skipped: Skipped) -> list[Problem]:
    """The usable training problems; the skipped rows are counted in one warning line."""
    unreadable = skipped.total
    problems = []
    for row in rows:
        try:
            problems.append(_training_problem(row, skipped.origin))
        except BadRow as reason:
            skipped.add(str(reason), row.where)
    if not problems:
        raise no_usable_rows(f"math data {skipped.origin}", skipped, _TRAINING_HINT)
    if skipped.total:
        logger.warning("warning: math data %s: skipped %d of %d rows: %s", skipped.origin, skipped.total,
                       len(rows) + unreadable, skipped.summary())
    return problems


def load_math_file(path: str | Path) -> list[Problem]:
    """Problems from a JSON list or JSONL file of {problem, answer} rows (e.g. the MATH train
    split of rllm, math_train_rllm/math.json), for the math training task. Bad rows are skipped
    and counted; a file with none usable is a UserError."""
    skipped = Skipped(str(path))
    return _training_problems(read_rows(Path(path), skipped), skipped)


def load_math_source(source: str | Path, subset: str = "", split: str = "train", revision: str = "",
                     columns: dict | None = None) -> list[Problem]:
    """Training problems from a local file or, when `source` is not a file name, from a split of
    the hub dataset of that name (rows with problem/question and answer/solution, or the columns
    `columns` maps onto them)."""
    from benchmarks.dataset_source import map_columns, read_source

    source = str(source).strip()
    skipped = Skipped(source or "task.path")
    rows = map_columns(read_source(source, skipped, subset, split, revision), columns, source)
    return _training_problems(rows, skipped)

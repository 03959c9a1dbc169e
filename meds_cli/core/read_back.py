"""Files a command reads back from a folder it wrote earlier (tasks.json, ablation.json,
slurm_jobs.json, results.json, metrics.jsonl): they may have been edited, cut short or written by
another version, so what is read is checked, and anything wrong is one line naming the file and
the problem (never a traceback, never a value tabulated as if it were right)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from meds_cli.core.errors import UserError

RERUN = "Restore it or delete the folder's results and rerun"  # what to do, for a results folder's file


def damaged(path, problem: str, advice: str = RERUN) -> UserError:
    return UserError(f"'{path}' {problem}; was it edited or cut short? {advice}")


def read_json(path: Path, kind: type = dict, advice: str = RERUN):
    """The JSON document of `path`, refused in one line when it does not parse or is not a `kind`."""
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise damaged(path, "is not UTF-8 text", advice) from None
    except (ValueError, RecursionError) as error:
        raise damaged(path, f"is not valid JSON ({str(error).splitlines()[0][:80]})", advice) from None
    if not isinstance(document, kind):
        raise damaged(path, f"holds a {type(document).__name__}, not a JSON {'object' if kind is dict else 'list'}",
                      advice)
    return document


def require(ok: bool, path, problem: str, advice: str = RERUN) -> None:
    if not ok:
        raise damaged(path, problem, advice)


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def probability(value, path, where: str) -> float:
    """A share in [0, 1] (a pass@k); NaN, infinities, text and anything outside refused."""
    require(is_number(value) and 0.0 <= value <= 1.0, path, f"has {where} = {value!r}, not a number in [0, 1]")
    return float(value)


def numbers_of(rows: list[dict], path, keys) -> None:
    """Refuse a row of a JSON-lines file whose value of one of `keys` is not a number (NaN is one: a
    metric a step could not measure)."""
    for line, row in enumerate(rows, start=1):
        for key in keys:
            value = row.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise damaged(path, f"row {line} has {key!r} = {row[key]!r}, not a number")

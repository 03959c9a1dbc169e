"""Reading the rows of a code benchmark file, and turning them into problems, row by row.

A benchmark file can be damaged in many ways: not gzip at all (refused: one line), cut off
(the rows before the cut are kept), a line that is not UTF-8 or not JSON, a row without a field
the loader needs. Such rows are skipped and counted, with a warning naming the first; a file
without a single usable row is refused with one line (`UserError`, exit code 2), so that no
problem is ever graded against a missing test or a field read as the text "None".

Every problem a loader returns carries `meta["rows"]`: the row count the benchmark is known
to have (`expected`, None when there is none), how many rows became problems (`loaded`) and
how many were skipped. A count other than the known one is reported with the scores
(harness.py), not silently mixed into them.
"""

import gzip
import json
import logging
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from meds_cli.core.errors import UserError
from meds_cli.core.records import Problem

log = logging.getLogger(__name__)


@dataclass
class Rows:
    """The rows of one source, each with where it came from ('line N' or 'row N')."""

    origin: str  # a file name, or the hub dataset's id
    rows: list[tuple[str, dict]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # 'line N: why', one per unusable line


def _decompressed(path: Path, benchmark: str) -> tuple[bytes, bool]:
    """The bytes of path, gunzipped when its name ends in .gz; (bytes, whether cut off)."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise UserError(f"benchmark '{benchmark}': cannot read {path} ({error.strerror or error})") from None
    if path.suffix != ".gz":
        return data, False
    try:
        return gzip.decompress(data), False
    except EOFError:  # cut off: what comes before the cut is still good
        return zlib.decompressobj(wbits=31).decompress(data), True
    except (OSError, zlib.error) as error:
        raise UserError(f"benchmark '{benchmark}': {path} is not a gzip file ({error})") from None


def read_json_lines(paths: Iterable[Path], benchmark: str) -> Rows:
    """The JSON-object lines of the files (gzipped where named .gz); bad lines skipped."""
    paths = list(paths)
    found = Rows(", ".join(str(p) for p in paths))
    for path in paths:
        data, cut = _decompressed(path, benchmark)
        if cut:
            log.warning("benchmark '%s': %s is cut off; reading the rows before the cut", benchmark, path)
        where = f"{path.name} line" if len(paths) > 1 else "line"
        for number, raw in enumerate(data.split(b"\n"), start=1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError:
                found.skipped.append(f"{where} {number}: not UTF-8")
                continue
            except ValueError:
                found.skipped.append(f"{where} {number}: not JSON")
                continue
            if not isinstance(row, dict):
                found.skipped.append(f"{where} {number}: not a JSON object")
                continue
            found.rows.append((f"{where} {number}", row))
    return found


def hub_rows(origin: str, rows: Iterable[dict]) -> Rows:
    return Rows(origin, [(f"row {index}", dict(row)) for index, row in enumerate(rows)])


def _why(error: Exception) -> str:
    if isinstance(error, KeyError):
        return f"no field {error.args[0]!r}" if error.args else "a field is missing"
    return f"{type(error).__name__}: {error}"[:200]


def to_problems(benchmark: str, found: Rows, convert: Callable[[dict], Problem | None],
                expected_rows: int | None) -> list[Problem]:
    """Problems from the rows (convert(row) -> Problem, or None for a row outside the benchmark,
    such as a LiveCodeBench problem outside the date window); rows it cannot convert are
    skipped and counted; none usable is a UserError."""
    problems, skipped = [], list(found.skipped)
    for where, row in found.rows:
        try:
            problem = convert(row)
        except (KeyError, TypeError, ValueError, IndexError, AttributeError, SyntaxError) as error:
            skipped.append(f"{where}: {_why(error)}")
            continue
        if problem is not None:
            problems.append(problem)
    if not problems:
        detail = f" ({len(skipped)} unusable, first: {skipped[0]})" if skipped else ""
        raise UserError(f"benchmark '{benchmark}': no usable row in {found.origin}{detail}")
    if skipped:
        log.warning("benchmark '%s': skipped %d unusable row(s) of %s (first: %s)",
                    benchmark, len(skipped), found.origin, skipped[0])  # fmt: skip
    counts = {"expected": expected_rows, "loaded": len(problems), "skipped": len(skipped)}
    if expected_rows is not None and len(problems) != expected_rows:
        log.warning("benchmark '%s': %d problems loaded from %s, %d expected", benchmark, len(problems),
                    found.origin, expected_rows)  # fmt: skip
    for problem in problems:
        problem.meta["rows"] = counts
    return problems


def row_count_mismatch(problems: list[Problem]) -> dict | None:
    """The row counts of a benchmark whose loaded count differs from its known one, else None."""
    counts = problems[0].meta.get("rows") if problems else None
    if not counts or counts.get("expected") is None or counts["loaded"] == counts["expected"]:
        return None
    return dict(counts)

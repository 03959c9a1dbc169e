"""Reading the rows of a data file a user gives (JSON list or JSONL), counting the bad ones.

Data files come from anywhere: a JSONL line cut short, a stray byte that is not UTF-8, a row
without an answer. One bad row must not stop an eval or a training run, and must never be graded
(an answer field that is missing must not become the text "None"), so each loader skips it and
counts it in a `Skipped` tally, which says what was skipped and where in one line. A file that
cannot be read as a whole (not there, a JSON list that does not parse, no usable row at all) is a
`UserError` naming the file.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meds_cli.core.errors import UserError

LAYOUT_HINT = "a .json file holds a list of row objects, a .jsonl file one row object per line"


@dataclass
class Row:
    """One row as read: `index` counts the rows of the file (blank lines aside), `where` says
    where it is for a message ('line 12' of a JSONL file, 'row 3' of a JSON list)."""

    index: int
    where: str
    data: Any


@dataclass
class Skipped:
    """Rows left out of a data source, by reason, with where the first few of each are."""

    origin: str
    counts: Counter = field(default_factory=Counter)
    places: dict[str, list[str]] = field(default_factory=dict)

    def add(self, reason: str, where: str) -> None:
        self.counts[reason] += 1
        places = self.places.setdefault(reason, [])
        if len(places) < 3:
            places.append(where)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def summary(self) -> str:
        """'2 not valid JSON (line 3, line 9), 1 without an answer (line 12)'."""
        parts = []
        for reason, count in self.counts.most_common():
            more = ", ..." if count > len(self.places[reason]) else ""
            parts.append(f"{count} {reason} ({', '.join(self.places[reason])}{more})")
        return ", ".join(parts)


def _decode_line(raw: bytes) -> str | None:
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        return None


def _jsonl_rows(data: bytes, skipped: Skipped) -> list[Row]:
    rows: list[Row] = []
    index = 0
    for number, raw in enumerate(data.splitlines(), start=1):
        if not raw.strip():
            continue
        where = f"line {number}"
        index += 1
        text = _decode_line(raw)
        if text is None:
            skipped.add("not UTF-8 text", where)
            continue
        try:
            rows.append(Row(index - 1, where, json.loads(text)))
        except json.JSONDecodeError:
            skipped.add("not valid JSON", where)
    return rows


def _json_list_rows(path: Path, data: bytes) -> list[Row]:
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise UserError(f"{path} is not UTF-8 text (a bad byte at offset {error.start}); {LAYOUT_HINT}") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise UserError(f"{path} is not valid JSON (line {error.lineno}, column {error.colno}: {error.msg}); "
                        f"{LAYOUT_HINT}") from None
    if not isinstance(document, list):
        raise UserError(f"{path} holds a JSON {type(document).__name__}, not a list of rows; {LAYOUT_HINT}")
    return [Row(i, f"row {i}", row) for i, row in enumerate(document)]


def read_rows(path: Path, skipped: Skipped) -> list[Row]:
    """The rows of a JSON list file (the text starts with '[') or a JSONL file. JSONL lines that
    are not UTF-8 or not JSON are skipped into `skipped`; a missing or unreadable file, or a JSON
    list that does not parse, is a UserError."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"data file {path} not found")
    if not path.is_file():
        raise UserError(f"data file {path} is not a file; {LAYOUT_HINT}")
    try:
        data = path.read_bytes()
    except OSError as error:
        raise UserError(f"cannot read data file {path}: {error.strerror or error}") from None
    if not data.strip():
        raise UserError(f"data file {path} is empty; {LAYOUT_HINT}")
    if data.removeprefix(b"\xef\xbb\xbf").lstrip().startswith(b"["):
        return _json_list_rows(path, data)
    return _jsonl_rows(data, skipped)


def no_usable_rows(origin: str, skipped: Skipped, hint: str) -> UserError:
    """The error for a source none of whose rows could be used."""
    return UserError(f"{origin} has no usable row: {skipped.summary() or 'it holds no rows'}; {hint}")

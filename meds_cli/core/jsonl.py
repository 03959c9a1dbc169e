"""JSON-lines files a run appends to (metrics.jsonl, samples.jsonl), read so that a kill during
a write never breaks anything that reads them.

A row is written with one write call, so a kill can only cut the last line short. Readers skip
such a cut-off last line, and `drop_cut_off_tail` removes it before anything is appended, so the
next row starts on a line of its own. Damage anywhere else is not a kill: it is refused with one
line naming the file and the line, so a person can look at it.
"""

from __future__ import annotations

import json
from pathlib import Path

from meds_cli.core.errors import UserError
from meds_cli.core.files import replace_text


def _parse(line: bytes):
    try:
        return json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None


def split_rows(data: bytes, source: str = "file") -> tuple[list[dict], int]:
    """(rows, bytes of the file that hold whole rows) of JSON-lines `data`.

    The last line is cut off when it has no newline and does not parse; it is left out (the
    byte count ends before it). A line elsewhere that is not a JSON object is a UserError."""
    rows: list[dict] = []
    lines = data.split(b"\n")
    complete = len(data)
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        row = _parse(line)
        is_last = number == len(lines)  # no newline after it
        if row is None and is_last:
            complete = len(data) - len(line)
            break
        if not isinstance(row, dict):
            what = "is not valid JSON" if row is None else f"holds a {type(row).__name__}, not an object"
            raise UserError(f"{source} line {number} {what}; fix or delete that line (a kill only ever cuts "
                            f"the last line short)")
        rows.append(row)
    return rows, complete


def read_rows(path: Path, skipped: list[str] | None = None) -> list[dict]:
    """The rows of a JSON-lines file (none when it does not exist), a cut-off last line skipped;
    `skipped`, where given, gets a warning line for it (a report counts and shows them)."""
    path = Path(path)
    if not path.is_file():
        return []
    data = path.read_bytes()
    rows, complete = split_rows(data, str(path))
    if complete < len(data) and skipped is not None:
        skipped.append(f"{path}: its last line is cut short (a writer was killed mid-line); skipped it")
    return rows


def drop_cut_off_tail(path: Path) -> list[dict]:
    """Remove a cut-off last line from the file in place (before appending to it); returns the rows.
    A last row that parses but lacks its newline gets one."""
    path = Path(path)
    if not path.is_file():
        return []
    data = path.read_bytes()
    rows, complete = split_rows(data, str(path))
    if complete < len(data):
        with path.open("r+b") as f:
            f.truncate(complete)
    elif data and not data.endswith(b"\n"):
        with path.open("ab") as f:
            f.write(b"\n")
    return rows


def append_rows(path: Path, rows: list[dict], *, ensure_ascii: bool = True) -> None:
    """Append rows in one write (a kill cuts at most the last line)."""
    if not rows:
        return
    text = "".join(json.dumps(row, ensure_ascii=ensure_ascii) + "\n" for row in rows)
    with Path(path).open("a", encoding="utf-8") as f:
        f.write(text)
        f.flush()


def rewrite_rows(path: Path, rows: list[dict], *, ensure_ascii: bool = True) -> None:
    """Replace the file's rows atomically (a kill leaves the old file or the new one, never half).
    Rows read back from a file written with the same `ensure_ascii` are written byte for byte as
    they were."""
    replace_text(path, "".join(json.dumps(row, ensure_ascii=ensure_ascii) + "\n" for row in rows))

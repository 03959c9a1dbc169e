"""Training rows from the user's own data: a hub dataset (name, subset, split, revision) or a local
JSON / JSONL / Parquet file, with the dataset's column names mapped onto the task's.

`task.columns: {problem: question, answer: final_answer}` reads the problem text from the column
`question` and the gold answer from `final_answer`; columns not named keep their names and travel
with the problem (reward functions receive them). `task.max_prompt_tokens` leaves out problems
whose finished prompt is longer, and says how many.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Sequence

from meds_cli.core.errors import UserError

LOCAL_FORMATS = (".json", ".jsonl", ".parquet")
# What task.columns may map: the task's field -> what it holds.
FIELDS = {"problem": "the problem text", "answer": "the gold answer", "solution": "a worked solution with a \\boxed{} answer",
          "id": "a problem id"}


def is_local(path: str) -> bool:
    """A local file (it exists, or its name ends like one), as opposed to a hub dataset name."""
    candidate = Path(path).expanduser()
    return candidate.is_file() or candidate.suffix in LOCAL_FORMATS


def read_local(path: str | Path) -> list[dict]:
    """Rows of a JSON list, a JSONL file (also under a .json name) or a Parquet file."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise UserError(f"data file '{path}' not found")
    if path.suffix not in LOCAL_FORMATS:
        raise UserError(f"data file '{path}' is not {', '.join(LOCAL_FORMATS)}; convert it, or give a hub dataset name")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            return pq.read_table(path).to_pylist()
        except Exception as error:  # pyarrow's errors have many types; all mean an unreadable file
            raise UserError(f"data file '{path}' is not a readable Parquet file: {str(error).splitlines()[0] if str(error) else type(error).__name__}") from None
    text = path.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        rows = _parse_json(text, path)
    else:
        rows = [_parse_json(line, path, number - 1) for number, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not all(isinstance(row, dict) for row in rows):
        raise UserError(f"data file '{path}' must hold objects (one per problem), not bare values")
    return rows


def _parse_json(text: str, path: Path, lines_before: int = 0):
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        line = lines_before + error.lineno
        raise UserError(f"data file '{path}' is neither a JSON list nor JSONL (line {line}: {error.msg})") from None


def read_hub(name: str, subset: str = "", split: str = "train", revision: str = "") -> list[dict]:
    """Rows of one split of a hub dataset (or its local cache); offline and unknown names end in one line."""
    import datasets

    from meds_cli.core.hub import offline_unless_reachable

    offline_unless_reachable()  # fail at once rather than after a minute of retries
    try:
        data = datasets.load_dataset(name, subset or None, split=split or "train", revision=revision or None)
    except Exception as error:  # offline, unknown id or split, no access: all end the same way for the user
        detail = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
        where = name + (f" subset {subset}" if subset else "") + f" split {split or 'train'}" + (f" revision {revision}" if revision else "")
        raise UserError(f"cannot load dataset '{where}' from the dataset hub or its cache ({detail}); "
                        "give a local JSON/JSONL/Parquet file as task.path instead") from None
    return [dict(row) for row in data]


def read_rows(path: str, subset: str = "", split: str = "train", revision: str = "") -> list[dict]:
    """Rows from `path`: a local file, or else a hub dataset name."""
    path = str(path).strip()
    if not path:
        raise UserError("task.path is empty: give a JSON/JSONL/Parquet file or a hub dataset name")
    if is_local(path):
        if subset or revision:
            raise UserError(f"task.subset and task.revision choose a hub dataset's version; '{path}' is a local file")
        return read_local(path)
    return read_hub(path, subset, split, revision)


def check_columns(columns, key: str = "task.columns") -> None:
    """task.columns maps task fields to column names; anything else is one line."""
    if not isinstance(columns, dict):
        raise UserError(f"{key} must map task fields to dataset columns, e.g. {{problem: question}}; got {columns!r}")
    for field, column in columns.items():
        if field not in FIELDS:
            raise UserError(f"{key} maps '{field}', which is not a task field; accepted: "
                            + ", ".join(f"{k} ({v})" for k, v in FIELDS.items()))
        if not isinstance(column, str) or not column:
            raise UserError(f"{key}.{field} must name a column of the dataset, got {column!r}")


def map_columns(rows: list[dict], columns: dict | None, origin: str) -> list[dict]:
    """Rows with `columns` (task field -> dataset column) applied: the dataset's column is read
    under the task's name; the other columns stay as they are."""
    columns = dict(columns or {})
    check_columns(columns)
    if not columns or not rows:
        return rows
    present = list(dict.fromkeys(k for row in rows[:100] for k in row))
    for field, column in columns.items():
        if column not in present:
            raise UserError(f"task.columns.{field} is '{column}', which is not a column of {origin}; "
                            f"its columns: {', '.join(present)}")
    sources = set(columns.values())
    mapped = []
    for row in rows:
        new = {k: v for k, v in row.items() if k not in sources and k not in columns}
        new.update({field: row.get(column) for field, column in columns.items()})
        mapped.append(new)
    return mapped


def drop_long_prompts(problems: Sequence, prompt_of: Callable, tokenizer, max_tokens: int) -> tuple[list, int]:
    """(problems whose prompt has at most `max_tokens` tokens, how many were left out); 0 keeps all."""
    if max_tokens <= 0 or not problems:
        return list(problems), 0
    kept = []
    for start in range(0, len(problems), 256):
        chunk = list(problems[start:start + 256])
        ids = tokenizer([prompt_of(p) for p in chunk], add_special_tokens=False)["input_ids"]
        kept.extend(p for p, tokens in zip(chunk, ids) if len(tokens) <= max_tokens)
    return kept, len(problems) - len(kept)

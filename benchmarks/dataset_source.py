"""Training rows from the user's own data: a hub dataset (name, subset, split, revision) or a local
JSON / JSONL / Parquet file, with the dataset's column names mapped onto the task's.

`task.columns: {problem: question, answer: final_answer}` reads the problem text from the column
`question` and the gold answer from `final_answer`; columns not named keep their names and travel
with the problem (reward functions receive them). JSON and JSONL files are read by
benchmarks/data_files (bad lines skipped and counted); Parquet files and hub datasets here.
`task.max_prompt_tokens` leaves out problems whose finished prompt is longer, and says how many.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from benchmarks.data_files import Row, Skipped, read_rows
from meds_cli.core.errors import UserError

LOCAL_FORMATS = (".json", ".jsonl", ".parquet")
# What task.columns may map: the task's field -> what it holds.
FIELDS = {"problem": "the problem text", "answer": "the gold answer",
          "solution": "a worked solution with a \\boxed{} answer", "id": "a problem id"}


def is_local(path: str) -> bool:
    """A local file (it exists, or its name ends like one), as opposed to a hub dataset name."""
    candidate = Path(path).expanduser()
    return candidate.exists() or candidate.suffix in LOCAL_FORMATS


def read_parquet(path: Path) -> list[Row]:
    import pyarrow.parquet as pq

    if not path.is_file():
        raise UserError(f"data file {path} not found")
    try:
        table = pq.read_table(path)
    except Exception as error:  # pyarrow's errors have many types; all mean an unreadable file
        detail = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise UserError(f"data file {path} is not a readable Parquet file: {detail}") from None
    return [Row(i, f"row {i}", row) for i, row in enumerate(table.to_pylist())]


def read_local(path: str | Path, skipped: Skipped) -> list[Row]:
    """Rows of a Parquet file, or of a JSON list / JSONL file (bad lines counted in `skipped`)."""
    path = Path(path).expanduser()
    return read_parquet(path) if path.suffix == ".parquet" else read_rows(path, skipped)


def read_hub(name: str, subset: str = "", split: str = "train", revision: str = "") -> list[Row]:
    """Rows of one split of a hub dataset (or its local cache); offline and unknown names end in one line."""
    import datasets

    from meds_cli.core.hub import offline_unless_reachable

    offline_unless_reachable()  # fail at once rather than after a minute of retries
    try:
        data = datasets.load_dataset(name, subset or None, split=split or "train", revision=revision or None)
    except Exception as error:  # offline, unknown id or split, no access: all end the same way for the user
        detail = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
        where = (name + (f" subset {subset}" if subset else "") + f" split {split or 'train'}"
                 + (f" revision {revision}" if revision else ""))
        raise UserError(f"cannot load dataset '{where}' from the dataset hub or its cache ({detail}); "
                        "give a local JSON/JSONL/Parquet file as task.path instead") from None
    return [Row(i, f"row {i}", dict(row)) for i, row in enumerate(data)]


def read_source(path: str, skipped: Skipped, subset: str = "", split: str = "train", revision: str = "") -> list[Row]:
    """Rows from `path`: a local file, or else a hub dataset name."""
    path = str(path).strip()
    if not path:
        raise UserError("task.path is empty: give a JSON/JSONL/Parquet file or a hub dataset name")
    if is_local(path):
        if subset or revision:
            raise UserError(f"task.subset and task.revision choose a hub dataset's version; '{path}' is a local file")
        return read_local(path, skipped)
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


def map_columns(rows: list[Row], columns: dict | None, origin: str) -> list[Row]:
    """Rows with `columns` (task field -> dataset column) applied: the dataset's column is read
    under the task's name; the other columns stay as they are (rows that are not objects too,
    for the loader to count as bad)."""
    columns = dict(columns or {})
    check_columns(columns)
    if not columns or not rows:
        return rows
    present = list(dict.fromkeys(k for row in rows[:100] if isinstance(row.data, dict) for k in row.data))
    for field, column in columns.items():
        if column not in present:
            raise UserError(f"task.columns.{field} is '{column}', which is not a column of {origin}; "
                            f"its columns: {', '.join(present)}")
    sources = set(columns.values())
    mapped = []
    for row in rows:
        if isinstance(row.data, dict):
            data = {k: v for k, v in row.data.items() if k not in sources and k not in columns}
            data.update({field: row.data.get(column) for field, column in columns.items()})
            row = Row(row.index, row.where, data)
        mapped.append(row)
    return mapped


def prompt_token_counts(problems: Sequence, prompt_of: Callable, tokenizer) -> list[int]:
    """The tokens of each problem's prompt as the engines receive it (no special tokens added),
    tokenized 256 at a time."""
    counts = []
    for start in range(0, len(problems), 256):
        ids = tokenizer([prompt_of(p) for p in problems[start:start + 256]], add_special_tokens=False)["input_ids"]
        counts.extend(len(tokens) for tokens in ids)
    return counts


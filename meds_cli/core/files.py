"""Reading the user's files and writing ours so that a kill or a full disk leaves the old file or
the new one, never half."""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path

from meds_cli.core.errors import UserError, not_text


def replace_bytes(path: Path, data: bytes) -> None:
    """Write `data` to a temporary file beside `path` and rename it over `path` (atomic on one
    filesystem); the temporary file never outlives a failed write."""
    path = Path(path)
    partial = path.with_name(f".{path.name}.partial-{os.getpid()}")
    try:
        with partial.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def replace_figure(fig, path: Path, **savefig) -> None:
    """A matplotlib figure saved whole or not at all (a full disk leaves no half image); the
    format follows the file's suffix."""
    import io

    buffer = io.BytesIO()
    fig.savefig(buffer, format=Path(path).suffix.lstrip(".") or "png", **savefig)
    replace_bytes(path, buffer.getvalue())


def replace_text(path: Path, text: str) -> None:
    """replace_bytes for UTF-8 text."""
    replace_bytes(path, text.encode("utf-8"))


def read_user_text(path: Path, expected: str) -> str:
    """The UTF-8 text of a file the user named; a binary file is one line saying what to give
    instead (`expected`, e.g. 'a YAML config file')."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise not_text(error, path, expected) from None
    except IsADirectoryError:
        raise UserError(f"'{path}' is a folder; give {expected}") from None


@contextmanager
def output_folder(path: Path):
    """Create the output folder `path` (and its missing parents) for the block's writes; when the
    block fails, remove what this created, so a failed command leaves the disk as it found it.
    A folder that existed before is left alone (its new files are whole: see replace_bytes)."""
    path = Path(path)
    created = next((p for p in reversed([path, *path.parents]) if not p.exists()), None)
    path.mkdir(parents=True, exist_ok=True)
    try:
        yield path
    except BaseException:
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        raise

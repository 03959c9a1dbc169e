"""Writing a file so that a kill or a full disk leaves the old file or the new one, never half."""

from __future__ import annotations

import os
from pathlib import Path


def replace_text(path: Path, text: str) -> None:
    """Write `text` to a temporary file beside `path` and rename it over `path` (atomic on one
    filesystem); the temporary file never outlives a failed write."""
    path = Path(path)
    partial = path.with_name(f".{path.name}.partial-{os.getpid()}")
    try:
        with partial.open("w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)

"""A hostile file for security tests: a pickle that creates a marker file when unpickled."""

from __future__ import annotations

import pickle
from pathlib import Path


class _CreatesMarker:
    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        # Unpickling calls open(marker, "w"): proof that the file was executed.
        return (open, (self.marker, "w"))


def marker_pickle(marker: Path) -> bytes:
    return pickle.dumps({"state": _CreatesMarker(marker)})


def plant(path: Path, marker: Path) -> None:
    """Put the hostile pickle at `path` (replacing whatever was there)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_dir():
        raise ValueError(f"{path} is a folder")
    path.write_bytes(marker_pickle(marker))

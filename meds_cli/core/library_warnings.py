"""Warnings raised by libraries go to a log file in the run folder, not to the terminal.

A library's warning (transformers' FutureWarning that `is_gradient_checkpointing` is deprecated,
a torch note on a kernel) is addressed to that library's callers, the project: the user can do
nothing about it, and in the middle of `meds eval`'s progress it reads as if something were wrong.
meds's own warnings (raised from meds_cli/, algorithms/, benchmarks/) say what to change and still
print. `route_library_warnings()` installs the split once per process (the commands call it
first thing); until a command names its folder (`LibraryWarnings.log_to`), library warnings wait
in memory, and `flush()` writes them once the folder exists. The file is LOG_FILE, one
`warnings.formatwarning` entry per warning, appended.

Which code raised a warning is read from the stack (the first frame outside the warnings
machinery), not from the file name the warning reports: a library warning raised with a
`stacklevel` that points into meds's code is still the library's.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

LOG_FILE = "library_warnings.log"
_PROJECT_ROOT = Path(__file__).resolve().parents[2]
_PROJECT_PACKAGES = tuple(str(_PROJECT_ROOT / name) + "/" for name in ("meds_cli", "algorithms", "benchmarks"))
_MACHINERY = (warnings.__file__, __file__)


def is_project_file(filename: str) -> bool:
    """Whether a source file is meds's own code."""
    try:
        path = str(Path(filename).resolve())
    except (OSError, ValueError):
        return False
    return path.startswith(_PROJECT_PACKAGES)


def _raising_file() -> str | None:
    """The file of the code that called warnings.warn: the first frame outside the warnings
    machinery (warnings.warn itself is C code and has no frame)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename in _MACHINERY:
        frame = frame.f_back
    return frame.f_code.co_filename if frame is not None else None


class LibraryWarnings:
    """The replacement of warnings.showwarning: library warnings to the log, meds's to the terminal."""

    def __init__(self, show=None):
        self._show = show or warnings.showwarning  # what prints meds's own warnings
        self.path: Path | None = None
        self.pending: list[str] = []

    def __call__(self, message, category, filename, lineno, file=None, line=None):
        raiser = _raising_file()
        if (raiser is not None and is_project_file(raiser)) or file is not None:
            self._show(message, category, filename, lineno, file, line)  # meds's own, or asked for a file
            return
        self.pending.append(warnings.formatwarning(message, category, filename, lineno, line))
        self.flush()

    def log_to(self, folder: Path) -> None:
        """From now on, write to folder/LOG_FILE (once the folder exists), what waited first."""
        self.path = Path(folder) / LOG_FILE
        self.flush()

    def flush(self) -> None:
        if self.path is None or not self.pending or not self.path.parent.is_dir():
            return
        with open(self.path, "a", encoding="utf-8") as log:
            log.write("".join(self.pending))
        self.pending.clear()


def route_library_warnings() -> LibraryWarnings:
    """Install the split (once per process; later calls return the installed one)."""
    current = warnings.showwarning
    if isinstance(current, LibraryWarnings):
        return current
    router = LibraryWarnings(current)
    warnings.showwarning = router
    return router

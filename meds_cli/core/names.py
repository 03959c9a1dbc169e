"""Folder names made from what a user wrote (a grid's variant names, axis keys and values), and
the check that a name read back from a file stays inside its folder.

A name becomes one safe path component: letters, digits, '.', '-' and '_' only (anything else,
a '/' included, becomes '-'), no '..' and no leading '.' or '-', at most MAX_LENGTH characters
(a long one keeps its start and gets a short hash of the whole, so two long names stay apart).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from meds_cli.core.errors import UserError

MAX_LENGTH = 96


def safe_component(text: str) -> str:
    """`text` as one path component that cannot leave its folder (see the module docstring)."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", str(text))
    name = re.sub(r"\.{2,}", ".", name).lstrip(".-").rstrip("-") or "x"
    if len(name) > MAX_LENGTH:
        digest = hashlib.sha1(str(text).encode()).hexdigest()[:8]
        name = f"{name[:MAX_LENGTH - 9].rstrip('.-')}-{digest}"
    return name


def is_safe_component(name) -> bool:
    return isinstance(name, str) and bool(name) and safe_component(name) == name


def child(folder: Path, name, source: str) -> Path:
    """folder/name for a name read back from `source` (a file of the folder); a name that is not one
    safe component, or that resolves outside the folder (a link), is refused in one line."""
    path = Path(folder) / str(name)
    if not is_safe_component(name) or not path.resolve().is_relative_to(Path(folder).resolve()):
        raise UserError(f"{source} names the folder {name!r}, which is not a folder of '{folder}'; an ablation "
                        "reads and writes only inside its own folder (was the file edited?)")
    return path

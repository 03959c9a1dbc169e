"""Hostile inputs for tests: a pickle that runs code when loaded, files that are not what they
claim, and places that refuse writes.

Tests run as root, and root writes through chmod; a read-only or full place is therefore faked
(`refuse_writes_under`): every way this program creates or changes a file under a folder raises
the OSError a read-only filesystem or a full disk raises, with the same errno and message.
"""

from __future__ import annotations

import builtins
import errno
import io
import os
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


# ---------------------------------------------------------------- files that are not what they claim

# Bytes that are not UTF-8 from the first one on (a .safetensors or image file given as a config).
BINARY = bytes([0xFF, 0xFE, 0x00, 0x81]) + bytes(range(256)) * 4
# JSON and YAML that parse, but hold a number where a mapping of sections or scores belongs.
WRONG_SHAPE = "5\n"


# ---------------------------------------------------------------- places that refuse writes

_WRITE_MODES = set("wax+")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def refuse_writes_under(root: Path, code: int, monkeypatch) -> None:
    """Make every write under `root` fail with OSError(code) (errno.EROFS: a read-only place;
    errno.ENOSPC: a full disk): opening a file to write, os.open with write flags, making a folder,
    renaming into it, and safetensors' native writer (which reports the OS error in its message)."""
    root = Path(os.path.abspath(root))

    def inside(path) -> bool:
        try:
            return Path(os.path.abspath(os.fsdecode(path))).is_relative_to(root)
        except TypeError:  # a file descriptor
            return False

    def refuse(path):
        raise OSError(code, os.strerror(code), os.fsdecode(path))

    real_open, real_os_open, real_mkdir = builtins.open, os.open, os.mkdir
    real_replace, real_rename = os.replace, os.rename

    def guarded_open(file, mode="r", *args, **kwargs):
        if _WRITE_MODES & set(mode) and inside(file):
            refuse(file)
        return real_open(file, mode, *args, **kwargs)

    def guarded_os_open(path, flags, *args, **kwargs):
        if flags & _WRITE_FLAGS and inside(path):
            refuse(path)
        return real_os_open(path, flags, *args, **kwargs)

    def guarded_mkdir(path, *args, **kwargs):
        if inside(path):
            refuse(path)
        return real_mkdir(path, *args, **kwargs)

    def guarded_move(real):
        def move(src, dst, *args, **kwargs):
            if inside(dst):
                refuse(dst)
            return real(src, dst, *args, **kwargs)
        return move

    import safetensors.torch
    from safetensors import SafetensorError

    real_save_file = safetensors.torch.save_file

    def guarded_save_file(tensors, filename, *args, **kwargs):
        if inside(filename):
            raise SafetensorError(f"Error while serializing: I/O error: {os.strerror(code)} (os error {code})")
        return real_save_file(tensors, filename, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", guarded_open)
    monkeypatch.setattr(io, "open", guarded_open)
    monkeypatch.setattr(os, "open", guarded_os_open)
    monkeypatch.setattr(os, "mkdir", guarded_mkdir)
    monkeypatch.setattr(os, "replace", guarded_move(real_replace))
    monkeypatch.setattr(os, "rename", guarded_move(real_rename))
    monkeypatch.setattr(safetensors.torch, "save_file", guarded_save_file)


def disk_state(root: Path) -> dict[str, tuple]:
    """Every file and folder under `root` with its size and content, to show nothing changed."""
    root = Path(root)
    state = {}
    for path in sorted(root.rglob("*")):
        key = path.relative_to(root).as_posix()
        state[key] = ("dir",) if path.is_dir() else ("file", path.stat().st_size, path.read_bytes())
    return state

"""The one translation of storage and decode failures into a line (core/errors.py) and the file
helpers every command writes and reads with (core/files.py)."""

import errno
import os

import pytest
from safetensors import SafetensorError

from meds_cli.core.errors import UserError, is_full_disk, os_error, storage_error
from meds_cli.core.files import output_folder, read_user_text, replace_bytes


def test_an_os_error_is_found_itself_through_its_cause_and_in_a_native_message():
    read_only = OSError(errno.EROFS, os.strerror(errno.EROFS), "/x/y")
    assert storage_error(read_only) is read_only
    try:
        try:
            raise read_only
        except OSError as cause:
            raise RuntimeError("saving failed") from cause
    except RuntimeError as wrapped:
        assert storage_error(wrapped) is read_only
    native = SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
    found = storage_error(native)
    assert (found.errno, found.strerror) == (errno.ENOSPC, "No space left on device") and is_full_disk(native)


def test_other_errors_are_not_storage_errors():
    assert storage_error(ValueError("bad value")) is None
    assert storage_error(OSError(errno.ECONNREFUSED, "refused")) is None  # not the place written to
    assert storage_error(SafetensorError("Error while serializing: invalid shape (os error 999)")) is None
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            raise KeyError("a bug in an except block")
    except KeyError as bug:  # raised during, not from, the OS error: stays a bug
        assert storage_error(bug) is None


@pytest.mark.parametrize("code, advice", [
    (errno.ENOSPC, "free some space (or choose a place with room)"),
    (errno.EROFS, "choose a place you can write to"),
    (errno.EEXIST, "something is already there: choose another path"),
])
def test_the_line_says_what_why_where_and_what_to_do(code, advice):
    line = str(os_error(OSError(code, os.strerror(code), "/a/b"), "write the export"))
    assert line == f"could not write the export ({os.strerror(code)}: /a/b); {advice}"


def test_a_binary_file_is_named_with_the_offending_byte(tmp_path):
    text = tmp_path / "config.yaml"
    text.write_text("a: 1\n")
    assert read_user_text(text, "a YAML file") == "a: 1\n"
    binary = tmp_path / "weights.bin"
    binary.write_bytes(b"ok\xff\x00")
    with pytest.raises(UserError) as err:
        read_user_text(binary, "a YAML file")
    assert str(err.value) == f"'{binary}' is not a text file (byte 0xff at offset 2 is not UTF-8); give a YAML file"
    with pytest.raises(UserError, match="is a folder; give a YAML file"):
        read_user_text(tmp_path, "a YAML file")


def test_replace_bytes_leaves_the_old_file_when_the_write_fails(tmp_path, monkeypatch):
    target = tmp_path / "plot.png"
    target.write_bytes(b"old")
    real_fsync = os.fsync

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError):
        replace_bytes(target, b"new")
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["plot.png"]
    replace_bytes(target, b"new")
    assert target.read_bytes() == b"new"


def test_output_folder_removes_only_what_it_created(tmp_path):
    with pytest.raises(OSError):
        with output_folder(tmp_path / "a" / "b") as folder:
            (folder / "half.png").write_bytes(b"x")
            raise OSError(errno.ENOSPC, "No space left on device")
    assert list(tmp_path.iterdir()) == []  # a/ and a/b/ were made here, so both go
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "old.txt").write_text("old")
    with pytest.raises(RuntimeError):
        with output_folder(kept / "new"):
            raise RuntimeError("failed")
    assert [p.name for p in kept.iterdir()] == ["old.txt"]
    with output_folder(kept / "new") as folder:
        (folder / "done.txt").write_text("done")
    assert (kept / "new" / "done.txt").read_text() == "done"

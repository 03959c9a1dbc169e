"""The one exception type for mistakes a user can make.

The CLI turns it into a single red line and exit code 2; everything else is a bug and keeps
its traceback.
"""

import difflib
import errno
import os
import re


class UserError(Exception):
    """Bad input from the user: a wrong name, a missing file, a malformed value."""


def nearest(name: str, choices) -> str:
    """A ' (did you mean X?)' suffix naming the closest valid choice, or '' when none is close."""
    match = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1, cutoff=0.5)
    return f" (did you mean '{match[0]}'?)" if match else ""


# Failures of the place the user chose to write to, not of the program: a full disk or quota, a
# read-only or forbidden folder, a file where a folder should be.
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR,
                            errno.EISDIR, errno.EEXIST, errno.ENAMETOOLONG, errno.EIO})
FULL_DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
# What the user can do about each kind, said after the reason.
_ADVICE = {errno.ENOSPC: "free some space (or choose a place with room)",
           errno.EDQUOT: "free some space (or choose a place with room)",
           errno.EROFS: "choose a place you can write to", errno.EACCES: "choose a place you can write to",
           errno.EPERM: "choose a place you can write to",
           errno.ENOTDIR: "a file stands where a folder is needed: choose another path",
           errno.EEXIST: "something is already there: choose another path",
           errno.EISDIR: "a folder stands where a file is needed: choose another path",
           errno.ENAMETOOLONG: "choose a shorter path", errno.EIO: "check the disk"}
# Libraries that write from native code (safetensors) report the OS error only in their message.
_NATIVE_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def storage_error(error: BaseException | None) -> OSError | None:
    """The OSError of a failed storage operation behind `error`, or None when it is something else:
    the error itself, what it was raised from, or an OS error a native library (safetensors) only
    names in its message ('... No space left on device (os error 28)')."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError):
            return error if error.errno in STORAGE_ERRNOS else None
        match = _NATIVE_OS_ERROR.search(str(error))
        if match and int(match.group(1)) in STORAGE_ERRNOS:
            code = int(match.group(1))
            return OSError(code, os.strerror(code))
        error = error.__cause__  # raised `from` an OS error; a bug in an except block stays a bug
    return None


def is_full_disk(error: BaseException) -> bool:
    found = storage_error(error)
    return found is not None and found.errno in FULL_DISK_ERRNOS


def os_error(error: OSError, doing: str) -> UserError:
    """One line for a failed file operation: what was being done, why, on which path, and what to do."""
    reason = error.strerror or str(error) or type(error).__name__
    where = f": {error.filename}" if error.filename else ""
    advice = _ADVICE.get(error.errno)
    return UserError(f"could not {doing} ({reason}{where})" + (f"; {advice}" if advice else ""))


def not_text(error: UnicodeDecodeError, path, expected: str) -> UserError:
    """One line for a user's file that is not UTF-8 text (a binary file given as a config, say)."""
    return UserError(f"'{path}' is not a text file (byte 0x{error.object[error.start]:02x} at offset {error.start} "
                     f"is not UTF-8); give {expected}")

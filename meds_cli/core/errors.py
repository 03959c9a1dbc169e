"""The one exception type for mistakes a user can make.

The CLI turns it into a single red line and exit code 2; everything else is a bug and keeps
its traceback.
"""

import difflib
import errno


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


def is_storage_error(error: BaseException) -> bool:
    return isinstance(error, OSError) and error.errno in STORAGE_ERRNOS


def os_error(error: OSError, doing: str) -> UserError:
    """One line for a failed file operation: what was being done, why, and on which path."""
    reason = error.strerror or str(error) or type(error).__name__
    where = f": {error.filename}" if error.filename else ""
    return UserError(f"could not {doing} ({reason}{where})")

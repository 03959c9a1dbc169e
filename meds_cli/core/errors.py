"""The one exception type for mistakes a user can make.

The CLI turns it into a single red line and exit code 2; everything else is a bug and keeps
its traceback.
"""

import difflib


class UserError(Exception):
    """Bad input from the user: a wrong name, a missing file, a malformed value."""


def nearest(name: str, choices) -> str:
    """A ' (did you mean X?)' suffix naming the closest valid choice, or '' when none is close."""
    match = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1, cutoff=0.5)
    return f" (did you mean '{match[0]}'?)" if match else ""

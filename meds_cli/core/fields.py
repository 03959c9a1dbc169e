"""Config field helpers: help text, accepted choices and value checks beside each default.

A config section is a dataclass whose fields are made with `doc` or `choice`. A check is one
argument of the field (`doc(16, "LoRA rank r", at_least(1))`); checks that relate several
fields go in the section's `validate(self, prefix)` method. The config loader calls
`validate_section` on every section as it builds it, before any model loads or folder is made.
"""

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, Callable

from meds_cli.core.errors import UserError


@dataclass(frozen=True)
class Check:
    """A rule a field's value must follow; `text` completes '<key> must be ...'."""

    ok: Callable[[Any], bool]
    text: str


def at_least(low) -> Check:
    return Check(lambda value: value >= low, f"at least {low}")


def greater_than(low, why: str = "") -> Check:
    return Check(lambda value: value > low, f"greater than {low}" + (f" ({why})" if why else ""))


def choice(default: str, options: list[str], help: str = ""):
    """A string field that only accepts one of `options`."""
    return field(default=default, metadata={"choices": options, "help": help})


def doc(default: Any, help: str, check: Check | None = None):
    """A field with help text and an optional value check (mutable defaults are copied per instance)."""
    metadata = {"help": help, **({"check": check} if check else {})}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: typing.cast(Any, type(default))(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def require(ok: bool, message: str) -> None:
    """One line of a `validate` method: a UserError with `message` unless `ok`."""
    if not ok:
        raise UserError(message)


def validate_section(section, prefix: str) -> None:
    """Run the field checks of one config section, then its own `validate(prefix)` if it has one.
    `prefix` is the section's dotted name with a trailing dot ('meds.'), used in messages."""
    for f in dataclasses.fields(section):
        check = f.metadata.get("check")
        value = getattr(section, f.name)
        if check is not None and not check.ok(value):
            raise UserError(f"{prefix}{f.name} must be {check.text}, got {value}")
    own = getattr(section, "validate", None)
    if callable(own):
        own(prefix)

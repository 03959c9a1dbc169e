"""A named registry with did-you-mean lookups.

One instance each for algorithms, tasks and benchmarks. Entries register themselves at import
time with a one-line description, which `meds list` prints.
"""

from dataclasses import dataclass
from typing import Any, Callable, Generic, TypeVar

from meds_cli.core.errors import UserError, nearest

T = TypeVar("T")


@dataclass(frozen=True)
class Entry(Generic[T]):
    name: str
    obj: T
    description: str


class Registry(Generic[T]):
    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, Entry[T]] = {}

    def register(self, name: str, description: str) -> Callable[[T], T]:
        def add(obj: T) -> T:
            if name in self._entries and self._entries[name].obj is not obj:
                raise ValueError(f"{self.kind} '{name}' is registered twice")
            self._entries[name] = Entry(name, obj, description)
            return obj

        return add

    def get(self, name: str) -> T:
        if name not in self._entries:
            names = sorted(self._entries)
            raise UserError(
                f"unknown {self.kind} '{name}'{nearest(name, names)}; registered: {', '.join(names)}"
            )
        return self._entries[name].obj

    def names(self) -> list[str]:
        return sorted(self._entries)

    def entries(self) -> list[Entry[T]]:
        return [self._entries[n] for n in self.names()]

    def __contains__(self, name: Any) -> bool:
        return name in self._entries

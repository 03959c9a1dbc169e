"""Stop strings in the `hf` decode loop: which rows just wrote one of the strings a turn pauses at.

vLLM and HF's own `stop_strings` work on the text, not the ids: a string may span several tokens,
and a token may hold more than the string (```` ```\\n\\n ```` ends a block as well as
```` ```\\n ````). The loop hands this watch each step's new tokens; a row pauses at the first token
whose text completes one of the strings in the text sampled so far (never in its context), that
token kept, as vLLM's `include_stop_str_in_output=True` keeps it.

Only the tail of a row is decoded each step: the last `window` tokens, enough to hold the longest
string (every token decodes to at least one character, a piece of a multi-byte one included). A
string found there was completed by the newest token, since an earlier one would have paused the
row then.
"""

from __future__ import annotations

from typing import Callable, Sequence


class StopStringWatch:
    def __init__(self, decode: Callable[[list[int]], str], strings: Sequence[str], rows: int):
        self.decode, self.strings = decode, tuple(strings)
        self.window = max(len(s) for s in self.strings) + 1
        self.sampled: list[list[int]] = [[] for _ in range(rows)]

    def paused(self, rows: Sequence[int], tokens: Sequence[int], alive: Sequence[bool]) -> list[int]:
        """The positions (in `rows`) of the live rows whose newest token, `tokens[k]` for the row
        `rows[k]`, completes a stop string."""
        out = []
        for position, (row, token, live) in enumerate(zip(rows, tokens, alive)):
            if not live:
                continue
            sampled = self.sampled[row]
            sampled.append(int(token))
            tail = self.decode(sampled[-self.window:])
            if any(string in tail for string in self.strings):
                out.append(position)
        return out

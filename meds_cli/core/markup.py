"""Dynamic text in rich output.

rich reads `[word]` in a printed string as a style tag and drops it: the advice
`pip install -e '.[vllm]'` came out as `pip install -e '.'`, which installs nothing, and a
variant, path or value with brackets in it loses them the same way. Every piece of text a message
did not write itself (a path, a name, a value, another function's message) goes through `plain`
before it meets markup; tests/test_markup.py checks the commands' print calls for it.
"""

from __future__ import annotations

from rich.markup import escape


def plain(value: object) -> str:
    """`value` as text that rich prints exactly as it is, brackets included."""
    return escape(str(value))

"""Finding the program in a model's response to a coding problem.

Responses usually carry the code in Markdown fences (```python ... ``` or bare ```), often
more than one: a solution and a usage example, or a first try and a fix. The rule: among the
Python (or untagged) blocks, the last one that defines the entry-point function when its name
is known, else the longest (the last of equals). A response cut off inside a fence still
yields its open block. With no fence, the raw text counts only if it parses as Python.
"""

import ast
import re

# An opening fence at the start of a line, its info string, then the body up to a closing
# fence on its own line or the end of the text (a truncated response).
_FENCE = re.compile(r"^[ \t]*```[ \t]*([\w+#.-]*)[^\n]*\n(.*?)(?:^[ \t]*```[ \t]*$|\Z)", re.S | re.M)
_PYTHON_TAGS = {"", "python", "py", "python3", "py3"}


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language tag, body) of every fenced block in order; the tag lower-cased, '' if none."""
    return [(match.group(1).lower(), match.group(2)) for match in _FENCE.finditer(text)]


def defines(code: str, name: str) -> bool:
    """Whether code defines a function (or class method) called name, judged by text so that
    a block with a syntax error elsewhere still counts."""
    return re.search(rf"^[ \t]*(?:async[ \t]+)?def[ \t]+{re.escape(name)}[ \t]*\(", code, re.M) is not None


def parses(code: str) -> bool:
    try:
        ast.parse(code)
    except (SyntaxError, ValueError):  # ValueError: null bytes
        return False
    return True


def _choose(blocks: list[str], entry_point: str | None) -> str:
    if entry_point:
        defining = [block for block in blocks if defines(block, entry_point)]
        if defining:
            return defining[-1]
    longest = max(len(block) for block in blocks)
    return [block for block in blocks if len(block) == longest][-1]


def extract_code(response: str, entry_point: str | None = None) -> str | None:
    """The program in response (see the module docstring), or None when there is none."""
    blocks = fenced_blocks(response)
    python_blocks = [body for tag, body in blocks if tag in _PYTHON_TAGS and body.strip()]
    if python_blocks:
        return _choose(python_blocks, entry_point)
    other_blocks = [body for _, body in blocks if body.strip()]
    if other_blocks and entry_point:
        # A block tagged with another language still counts when it defines the function
        # (models tag Python as 'Python3 code' or 'plaintext' now and then).
        defining = [block for block in other_blocks if defines(block, entry_point)]
        if defining:
            return defining[-1]
    if response.strip() and parses(response):
        return response
    return None

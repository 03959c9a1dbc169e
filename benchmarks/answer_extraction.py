"""Finding the final answer in a response.

The convention of the Qwen-Math prompt: the final answer is the content of the last
`\\boxed{...}`. Braces nest (`\\boxed{\\frac{1}{2}}`), so the content is found by counting braces,
not with a regular expression.
"""

import re

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")


def boxed_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) character spans of the contents of every complete `\\boxed{...}` in text."""
    spans = []
    for match in _BOXED.finditer(text):
        depth, start = 1, match.end()
        for pos in range(start, len(text)):
            char = text[pos]
            if char == "{":
                depth += 1
            elif char == "}":
                depth -= 1
                if depth == 0:
                    spans.append((start, pos))
                    break
    return spans


def last_boxed(text: str) -> str | None:
    """Content of the last complete `\\boxed{...}`, stripped; None when there is none."""
    spans = boxed_spans(text)
    if not spans:
        return None
    start, end = spans[-1]
    return text[start:end].strip()


def last_boxed_start(text: str) -> int | None:
    """Character offset where the content of the last `\\boxed{` begins (even if never closed)."""
    starts = [m.end() for m in _BOXED.finditer(text)]
    return starts[-1] if starts else None

"""One spelling for LaTeX that means the same thing, before answers are read or compared.

`plain_latex` rewrites, without changing what an answer says:
- `\\cfrac`, `\\dfrac`, `\\tfrac` (continued, display and text style) to `\\frac`;
- `\\left` and `\\right` (sizing only) dropped, the delimiter they size kept: `\\left( x \\right)`
  is `( x )`, `\\left\\{ 1 \\right\\}` is `\\{ 1 \\}`; the null delimiters `\\left.` and `\\right.`
  go entirely;
- brace-less arguments braced, as TeX reads them (one token each): `\\frac13` is `\\frac{1}{3}`,
  `\\frac3{3}` is `\\frac{3}{3}`, `\\frac\\pi2` is `\\frac{\\pi}{2}`, `\\sqrt2` is `\\sqrt{2}`,
  `\\sqrt[3]2` is `\\sqrt[3]{2}`.
Everything is one pass over the text (brace pairs are matched once up front), so a long or
adversarial answer costs linear time; and each distinct text is rewritten once per process (a
cache of the latest 4096): grading meets the same text many times, a gold answer once per
sample and an answer in each reader it goes through (math_grading, answer_extraction).
"""

import re
from functools import lru_cache

_FRAC_STYLES = re.compile(r"\\[cdt]frac(?![A-Za-z])")
_NULL_DELIMITER = re.compile(r"\\(?:left|right)\s*\.")
_SIZING = re.compile(r"\\(?:left|right)(?![A-Za-z])\s*")
_TAKES_ARGUMENTS = re.compile(r"\\(frac|sqrt)(?![A-Za-z])")
_ARGUMENT_COUNT = {"frac": 2, "sqrt": 1}


def _brace_partners(text: str) -> dict[int, int]:
    """Position of each `{` -> position of the `}` that closes it (unclosed ones are left out)."""
    partners, opened = {}, []
    for pos, char in enumerate(text):
        if char == "{":
            opened.append(pos)
        elif char == "}" and opened:
            partners[opened.pop()] = pos
    return partners


def _skip_spaces(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _token_end(text: str, pos: int) -> int:
    """End of the one TeX token starting at pos: a control word (`\\pi`), a control symbol (`\\{`)
    or one character."""
    if text[pos] != "\\" or pos + 1 >= len(text):
        return pos + 1
    end = pos + 1
    while end < len(text) and text[end].isalpha():
        end += 1
    return max(end, pos + 2)


def _braced_arguments(text: str) -> str:
    """text with every brace-less argument of `\\frac` and `\\sqrt` put in braces."""
    if "\\frac" not in text and "\\sqrt" not in text:
        return text
    partners = _brace_partners(text)
    inserts: list[tuple[int, int, str]] = []  # (position, order, brace): "}" of one argument before "{" of the next
    for match in _TAKES_ARGUMENTS.finditer(text):
        pos = _skip_spaces(text, match.end())
        if match[1] == "sqrt" and text.startswith("[", pos):  # the optional index, \sqrt[3]{x}
            close = text.find("]", pos)
            if close < 0:
                continue
            pos = _skip_spaces(text, close + 1)
        for _ in range(_ARGUMENT_COUNT[match[1]]):
            if pos >= len(text) or text[pos] in "}])&^_":
                break  # no argument here: leave the malformed text as it is
            if text[pos] == "{":
                if pos not in partners:
                    break
                pos = _skip_spaces(text, partners[pos] + 1)
                continue
            end = _token_end(text, pos)
            inserts += [(pos, len(inserts), "{"), (end, len(inserts) + 1, "}")]
            pos = _skip_spaces(text, end)
    if not inserts:
        return text
    pieces, last = [], 0
    for pos, _, brace in sorted(inserts):
        pieces += [text[last:pos], brace]
        last = pos
    return "".join(pieces) + text[last:]


@lru_cache(maxsize=4096)
def plain_latex(text: str) -> str:
    """text with the equivalent spellings of the module docstring made one."""
    text = _FRAC_STYLES.sub(r"\\frac", text)
    text = _SIZING.sub("", _NULL_DELIMITER.sub("", text))
    return _braced_arguments(text)

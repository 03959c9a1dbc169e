"""Finding the final answer in a response, and reading it when it is a plain number.

The convention of the Qwen-Math prompt: the final answer is the content of the last
`\\boxed{...}`. Braces nest (`\\boxed{\\frac{1}{2}}`), so the content is found by counting braces,
not with a regular expression. Responses come from a policy under training and can be long or
adversarial, so every scan here is linear in the length of the text.

The number readers (`number_literal_value`, `integer_literal_value`) exist for reward safety: a
symbolic checker says `\\boxed{27 + 82}` equals 109, so a policy could be rewarded for boxing the
question. The grader asks these readers whether an answer is a number *literal* before it lets
the symbolic checker compare it with a numeric gold answer.
"""

import re
from fractions import Fraction

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")

EXTRACTION_MODES = ("boxed", "boxed_then_last_number")


def boxed_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) character spans of the contents of every complete `\\boxed{...}` in text,
    in order of their starts."""
    # One pass with a stack of open braces instead of a scan per `\boxed{`: the latter is
    # quadratic on a response holding thousands of unclosed `\boxed{`. A boxed brace closes when
    # the braces counted from it balance, which is exactly when the stack pops it.
    boxed_opens = {m.end() - 1 for m in _BOXED.finditer(text)}
    if not boxed_opens:
        return []
    spans, stack = [], []
    for pos, char in enumerate(text):
        if char == "{":
            stack.append(pos)
        elif char == "}" and stack:
            opened = stack.pop()
            if opened in boxed_opens:
                spans.append((opened + 1, pos))
    spans.sort()
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


# A number in running text: optional minus (not one joining two numbers, as in 3-4), digits with
# optional thousands commas, optional decimals.
_NUMBER_IN_TEXT = re.compile(r"(?<![\w.)\]])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![\d])")


def last_number(text: str) -> str | None:
    """The last number written in text (thousands commas removed), or None."""
    last = None
    for last in _NUMBER_IN_TEXT.finditer(text):
        pass
    return last.group(0).replace(",", "") if last else None


def extract_answer(text: str | None, mode: str = "boxed") -> str | None:
    """The final answer of a response, or None when there is none.

    mode 'boxed': the last complete \\boxed{} only (the training reward: the prompt asks for it).
    mode 'boxed_then_last_number': the last \\boxed{}, else the last number in the text (lenient
    eval of models not trained on the boxed convention, e.g. base models on GSM8K).
    """
    if mode not in EXTRACTION_MODES:
        raise ValueError(f"unknown extraction mode {mode!r}; accepted: {', '.join(EXTRACTION_MODES)}")
    if not text:
        return None
    boxed = last_boxed(text)
    if boxed:
        return boxed
    if mode == "boxed_then_last_number":
        return last_number(text)
    return None


# --- reading plain numbers -------------------------------------------------------------------

# Longer than this is not a number anyone writes; refusing early keeps the readers cheap.
_MAX_LITERAL_CHARS = 200

_WRAPPERS = ("\\text", "\\textbf", "\\mathrm", "\\mathbf", "\\mbox", "\\boxed")
_SPACING = re.compile(r"\\[!,;:> ]|~|\\left|\\right|\\displaystyle")
_UNIT_SUFFIX = re.compile(r"(?:\s*\\(?:text|mbox|mathrm)\s*\{[^{}\d]*\})+\s*(?:\^\s*\{?\d\}?)?$")
_DEGREE_OR_PERCENT = re.compile(r"(?:\^\s*\{?\s*\\circ\s*\}?|\\circ|°|\\degree|\\%|%)$")
_ASSIGNMENT = re.compile(r"^[A-Za-z]\s*=")

# Unsigned decimal: digits with optional thousands commas, or a leading-dot decimal.
_UDEC = r"(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?|\.\d+)"
_EXP = r"[+-]?\d{1,3}"
_LITERAL_FORMS = [
    # decimal, optionally in scientific notation: 4.5e33, 4.5\times10^{33}
    re.compile(rf"(?P<sign>[+-]?)(?P<m>{_UDEC})(?:[eE](?P<e1>{_EXP})|(?:\\times|\\cdot)10\^(?:\{{(?P<e2>{_EXP})\}}|(?P<e3>\d)))?"),
    # \frac{a}{b}, a and b decimals, the numerator possibly signed
    re.compile(rf"(?P<sign>[+-]?)\\frac\{{(?P<nsign>[+-]?)(?P<num>{_UDEC})\}}\{{(?P<den>{_UDEC})\}}"),
    # \frac12 shorthand: two single digits
    re.compile(r"(?P<sign>[+-]?)\\frac(?P<num>\d)(?P<den>\d)"),
    # a/b
    re.compile(rf"(?P<sign>[+-]?)(?P<num>{_UDEC})/(?P<den>{_UDEC})"),
]


def _unwrap(text: str) -> str:
    """Drop `$...$`, `\\(...\\)` and whole-string `\\text{...}`-like wrappers, repeatedly."""
    while True:
        text = text.strip()
        if len(text) >= 2 and text[0] == "$" and text[-1] == "$":
            text = text.strip("$")
            continue
        if text.startswith("\\(") and text.endswith("\\)"):
            text = text[2:-2]
            continue
        for wrapper in _WRAPPERS:
            if text.startswith(wrapper) and text.endswith("}"):
                inner = text[len(wrapper) :].lstrip()
                if inner.startswith("{") and _closing_brace(inner) == len(inner) - 1:
                    text = inner[1:-1]
                    break
        else:
            return text


def _closing_brace(text: str) -> int | None:
    """Index of the brace closing text[0] == '{', or None."""
    depth = 0
    for pos, char in enumerate(text):
        depth += char == "{"
        depth -= char == "}"
        if depth == 0:
            return pos
    return None


def _to_fraction(decimal: str) -> Fraction:
    return Fraction(decimal.replace(",", ""))


def number_literal_value(text: str | None) -> Fraction | None:
    """The value of text when it is a plain number literal, else None.

    Accepted: an integer or decimal (thousands commas allowed: 1,234.5), a fraction `\\frac{a}{b}`,
    `\\frac12` or `a/b`, scientific notation (4.5e33, 4.5\\times 10^{33}), each with a leading sign.
    Ignored around it: `$`, `\\text{}`-like wrappers, LaTeX spacing, `\\left`/`\\right`, a leading
    `\\$`, a single-letter assignment `x =`, a trailing unit in `\\text{}`, a degree sign or a
    percent sign (whose value is NOT divided by 100: it only decides literal-or-not; the symbolic
    checker compares percentages), a trailing full stop.
    Refused: anything with an operator between two numbers (27 + 82, 2^{10}, 3\\cdot 4, \\sqrt{4}).
    """
    if text is None or len(text) > _MAX_LITERAL_CHARS:
        return None
    text = _unwrap(text)
    text = _SPACING.sub("", text).replace("{,}", ",").replace("\u2212", "-")
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    text = _ASSIGNMENT.sub("", text.strip())
    text = text.rstrip(". ")
    text = _UNIT_SUFFIX.sub("", text)
    text = _DEGREE_OR_PERCENT.sub("", text.strip())
    text = _unwrap(text)
    if text.startswith("\\$"):
        text = text[2:]
    text = re.sub(r"\s+", "", text)
    for form in _LITERAL_FORMS:
        match = form.fullmatch(text)
        if match is None:
            continue
        groups = match.groupdict()
        sign = -1 if groups["sign"] == "-" else 1
        if "m" in groups:
            exponent = groups["e1"] or groups["e2"] or groups["e3"] or "0"
            return sign * _to_fraction(groups["m"]) * Fraction(10) ** int(exponent)
        den = _to_fraction(groups["den"])
        if den == 0:
            return None
        if groups.get("nsign") == "-":
            sign = -sign
        return sign * _to_fraction(groups["num"]) / den
    return None


_INTEGER = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)")


def integer_literal_value(text: str | None) -> int | None:
    """The value of text when it is an integer literal, else None.

    Kept deliberately simple (the arithmetic task's reward): surrounding spaces, `$...$` and
    `\\text{...}` wrappers, a leading sign and well-formed thousands separators (1,234 or 1{,}234)
    are allowed; decimals (109.0), units, expressions (27 + 82) and anything else are not.
    """
    if text is None or len(text) > _MAX_LITERAL_CHARS:
        return None
    text = _unwrap(text).replace("{,}", ",").replace("\u2212", "-")
    text = re.sub(r"(?<=[+-])\s+", "", text)
    if not _INTEGER.fullmatch(text):
        return None
    return int(text.replace(",", ""))


def answer_key(text: str | None) -> str | None:
    """A canonical key for majority voting: equal keys mean the same answer.

    Plain numbers map to their exact value (0.5 and \\frac{1}{2} share a key); anything else to
    its text without spaces, `$`, `\\left`/`\\right` and with `\\dfrac` read as `\\frac`. Cheap and
    conservative: two equivalent expressions may still get different keys.
    """
    if text is None or not text.strip():
        return None
    value = number_literal_value(text)
    if value is not None:
        return f"num:{value}"
    text = _SPACING.sub("", _unwrap(text))
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    return re.sub(r"\s+", "", text)

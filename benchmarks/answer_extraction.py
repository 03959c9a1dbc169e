"""Finding the final answer in a response, and reading it when it is a plain number.

The convention of the Qwen-Math prompt: the final answer is the content of the last
`\\boxed{...}`. Braces nest (`\\boxed{\\frac{1}{2}}`), so the content is found by counting braces,
not with a regular expression. Responses come from a policy under training and can be long or
adversarial, so every scan here is linear in the length of the text.

The number readers (`read_number_literal`, `number_literal_value`, `integer_literal_value`) exist
for reward safety: a symbolic checker says `\\boxed{27 + 82}` equals 109, so a policy could be
rewarded for boxing the question. The grader asks these readers whether an answer is a number
*literal* before it lets the symbolic checker compare it with a numeric gold answer. A separator
never joins two numbers: "2 7" and "32, 349" are not literals, only the conventional thousands
forms (32,349, 32{,}349, 32,\\!349, 32\\,349) are. `read_number_literal` also says how precisely a
decimal is written, for `number_match`'s rounding rule.
"""

import re
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

from benchmarks.latex_forms import plain_latex

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
    for match in _NUMBER_IN_TEXT.finditer(text):  # kept one at a time: no list of every number in a long text
        last = match
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

_WRAPPERS = ("\\text", "\\textbf", "\\textnormal", "\\textrm", "\\mathrm", "\\mathbf", "\\mbox", "\\boxed")
# Thousands separators in their conventional forms: 1{,}234 and 1,\!234 (MATH), and the thin space
# 1\,234 of SI style when it splits off exactly three digits. All become a plain comma, which the
# literal forms below accept only in groups of three.
_THOUSANDS_MARK = re.compile(r"\{,\}\s*|,\\!\s*")
_THIN_SPACE_GROUP = re.compile(r"(?<=\d)\\,\s*(?=\d{3}(?!\d))")
# Any other spacing is a space: it may sit around a number, never inside one.
_SPACE_COMMANDS = re.compile(r"\\[!,;:> ]|~")
_LAYOUT = re.compile(r"\\left|\\right|\\displaystyle")
_SPACING = re.compile(rf"{_SPACE_COMMANDS.pattern}|{_LAYOUT.pattern}")
# A space between two parts of a number ("2 7", "32, 349"): two numbers, never one.
SPACE_INSIDE_NUMBER = re.compile(r"(?<=[\d.,])\s+(?=[\d.,])")
_UNIT_SUFFIX = re.compile(
    r"(?:\s*\\(?:text|textnormal|textrm|textbf|textit|mbox|mathrm)\s*\{[^{}\d]*\})+\s*(?:\^\s*\{?\d\}?)?$")
_DEGREE_OR_PERCENT = re.compile(r"(?:\^\s*\{?\s*\\circ\s*\}?|\\circ|°|\\degree|\\%|%|\s*percent(?:age)?|\s*pct)$")
_ASSIGNMENT = re.compile(r"^[A-Za-z]\s*=")

# Unsigned decimal: digits with optional thousands commas, or a leading-dot decimal.
_UDEC = r"(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?|\.\d+)"
_EXP = r"[+-]?\d{1,3}"
# The decimal form: an integer or decimal, optionally in scientific notation (4.5e33, 4.5\times10^{33}).
_DECIMAL_FORM = re.compile(
    rf"(?P<sign>[+-]?)(?P<m>{_UDEC})(?:[eE](?P<e1>{_EXP})|(?:\\times|\\cdot)10\^(?:\{{(?P<e2>{_EXP})\}}|(?P<e3>\d)))?"
)
_FRACTION_FORMS = [
    # \frac{a}{b}, a and b decimals, the numerator possibly signed
    re.compile(rf"(?P<sign>[+-]?)\\frac\{{(?P<nsign>[+-]?)(?P<num>{_UDEC})\}}\{{(?P<den>{_UDEC})\}}"),
    # a/b
    re.compile(rf"(?P<sign>[+-]?)(?P<num>{_UDEC})/(?P<den>{_UDEC})"),
]


@dataclass(frozen=True)
class NumberLiteral:
    """A plain number as written. `value` is exact. A decimal (a digit after the point, or
    scientific notation) is an approximation: `unit` is the place value of its last written digit
    (0.3333 -> 1/10000, 4.5e33 -> 10**32) and `digits` its count of significant digits.
    Integers and fractions are exact claims: `unit` None, `digits` 0."""

    value: Fraction
    unit: Fraction | None = None
    digits: int = 0


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
                if inner.startswith("{") and _closing(inner, "{}") == len(inner) - 1:
                    text = inner[1:-1]
                    break
        else:
            return text


def _closing(text: str, pair: str) -> int | None:
    """Index of the delimiter closing text[0] == pair[0] (pair: '{}' or '()'), or None."""
    depth = 0
    for pos, char in enumerate(text):
        depth += (char == pair[0]) - (char == pair[1])
        if depth == 0:
            return pos
    return None


def _inside_parentheses(text: str) -> str:
    """text without parentheses around all of it, `(-2)` -> `-2`, repeatedly; kept when a comma is
    inside: `(1,234)` may be a pair, never a thousands-grouped number."""
    text = text.strip()
    while text.startswith("(") and "," not in text and _closing(text, "()") == len(text) - 1:  # not (1)(2)
        text = text[1:-1].strip()
    return text


def _to_fraction(decimal: str) -> Fraction:
    return Fraction(decimal.replace(",", ""))


def _normalize_thousands(text: str) -> str:
    return _THIN_SPACE_GROUP.sub(",", _THOUSANDS_MARK.sub(",", text))


def _bare_number_text(text: str) -> str | None:
    """text with everything around a number literal removed (wrappers, units, `x =` ...), or None
    when spacing splits it into several numbers."""
    text = plain_latex(_normalize_thousands(_unwrap(text)))  # \dfrac13 -> \frac{1}{3}, \left( -> (
    text = _LAYOUT.sub("", _SPACE_COMMANDS.sub(" ", text)).replace("\u2212", "-")
    text = _ASSIGNMENT.sub("", text.strip())
    text = text.rstrip(". ")
    text = _UNIT_SUFFIX.sub("", text)
    text = _DEGREE_OR_PERCENT.sub("", text.strip())
    text = _inside_parentheses(_unwrap(text))
    if text.startswith("\\$"):
        text = text[2:]
    if SPACE_INSIDE_NUMBER.search(text):
        return None
    return re.sub(r"\s+", "", text)


def _decimal_literal(match: re.Match) -> NumberLiteral:
    mantissa = match["m"].replace(",", "")
    exponent = int(match["e1"] or match["e2"] or match["e3"] or "0")
    sign = -1 if match["sign"] == "-" else 1
    value = sign * Fraction(mantissa) * Fraction(10) ** exponent
    whole, point, places = mantissa.partition(".")
    if not places and exponent == 0:  # an integer (a trailing '5.' counts as one): exact
        return NumberLiteral(value)
    digits = len((whole + places).lstrip("0"))
    return NumberLiteral(value, Fraction(10) ** (exponent - len(places)), digits)


def read_number_literal(text: str | None) -> NumberLiteral | None:
    """The number text is, when it is a plain number literal, else None.

    Accepted: an integer or decimal (thousands commas allowed: 1,234.5 or 1{,}234.5), a fraction
    `\\frac{a}{b}` (or `\\dfrac`, `\\tfrac`, `\\cfrac`, brace-less `\\frac12`, `\\frac3{4}`) or `a/b`,
    scientific notation (4.5e33, 4.5\\times 10^{33}), each with a
    leading sign. Ignored around it: `$`, `\\text{}`-like wrappers, LaTeX spacing, `\\left`/`\\right`,
    parentheses around the whole number (without a comma inside),
    a leading `\\$`, a single-letter assignment `x =`, a trailing unit in `\\text{}`, a degree sign
    or a percent sign (whose value is NOT divided by 100: it only decides literal-or-not; the
    symbolic checker compares percentages), a trailing full stop.
    Refused: anything with an operator between two numbers (27 + 82, 2^{10}, 3\\cdot 4, \\sqrt{4}),
    and numbers split by spacing or a comma out of three-digit groups ("2 7", "32, 349", "3,4"):
    a separator never joins two numbers into one.
    """
    if text is None or len(text) > _MAX_LITERAL_CHARS:
        return None
    return _read_short_literal(text)


# Grading reads the same text many times (a gold answer once per sample, an answer in each reader
# it goes through); NumberLiteral is immutable, so one reading per distinct text serves them all.
@lru_cache(maxsize=4096)
def _read_short_literal(text: str) -> NumberLiteral | None:
    """read_number_literal of a text within _MAX_LITERAL_CHARS."""
    text = _bare_number_text(text)
    if text is None:
        return None
    match = _DECIMAL_FORM.fullmatch(text)
    if match:
        return _decimal_literal(match)
    for form in _FRACTION_FORMS:
        match = form.fullmatch(text)
        if match is None:
            continue
        den = _to_fraction(match["den"])
        if den == 0:
            return None
        negative = (match["sign"] == "-") != (match.groupdict().get("nsign") == "-")
        value = _to_fraction(match["num"]) / den
        return NumberLiteral(-value if negative else value)
    return None


def number_literal_value(text: str | None) -> Fraction | None:
    """The exact value of text when it is a plain number literal (see `read_number_literal`), else None."""
    literal = read_number_literal(text)
    return None if literal is None else literal.value


_INTEGER = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)")


def integer_literal_value(text: str | None) -> int | None:
    """The value of text when it is an integer literal, else None.

    Kept deliberately simple (the arithmetic task's reward): surrounding spaces, `$...$` and
    `\\text{...}` wrappers, a leading sign and well-formed thousands separators (1,234, 1{,}234,
    1,\\!234) are allowed; decimals (109.0), units, expressions (27 + 82), numbers split by spacing
    ("10 9") and anything else are not.
    """
    if text is None or len(text) > _MAX_LITERAL_CHARS:
        return None
    text = _normalize_thousands(_unwrap(text)).replace("\u2212", "-")
    text = re.sub(r"(?<=[+-])\s+", "", text)
    if not _INTEGER.fullmatch(text):
        return None
    return int(text.replace(",", ""))


def answer_key(text: str | None) -> str | None:
    """A canonical key for majority voting: equal keys mean the same answer.

    Plain numbers map to their exact value (0.5 and \\frac{1}{2} share a key); anything else to
    its text without spaces, `$`, `\\left`/`\\right`, in benchmarks.latex_forms's one spelling. Cheap and
    conservative: two equivalent expressions may still get different keys.
    """
    if text is None or not text.strip():
        return None
    value = number_literal_value(text)
    if value is not None:
        return f"num:{value}"
    text = _SPACING.sub("", plain_latex(_unwrap(text)))
    return re.sub(r"\s+", "", text)

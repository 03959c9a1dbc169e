"""Where a code block ends, and what the model reads back: pure text functions.

Two formats, both always recognised:
- Qwen2.5-Math's tool-integrated reasoning (TIR): ```python ... ```; the model may go on to open
  the output block itself (```output), as the TIR-trained models do;
- a pair of tags from the config, e.g. <code> ... </code> (ReTool's form).

An engine pauses at `stop_strings`; the loop then asks `closed_block` whether the text sampled
since the last observation ends with a closed block, and runs it. The observation is always a
```output block (Qwen's form), whatever the format of the code.
"""

from __future__ import annotations

FENCE = "```"
PYTHON_OPEN = "```python"
OUTPUT_OPEN = "```output"
# "\n```\n" ends a fenced block without pausing at its opening ("```python\n"); "```output" is
# where a TIR-trained model asks for the output itself.
FENCE_STOPS = ("\n```\n", OUTPUT_OPEN)


def stop_strings(tags: tuple[str, str] | list[str]) -> list[str]:
    """The strings an engine must pause at (and keep in the text it returns: vLLM's
    include_stop_str_in_output, as HF's stop_strings do)."""
    return [*FENCE_STOPS, tags[1]]


def _fenced_block(text: str) -> str | None:
    tail = text.rstrip()
    if tail.endswith(OUTPUT_OPEN):  # the model opened the output block itself
        tail = tail[: -len(OUTPUT_OPEN)].rstrip()
    if not tail.endswith(FENCE):
        return None
    close = len(tail) - len(FENCE)
    start = tail.rfind(PYTHON_OPEN, 0, close)
    if start < 0:
        return None
    body = tail[start + len(PYTHON_OPEN) : close]
    if FENCE in body:  # the last fence closes some other block (an output block, say)
        return None
    return body.removeprefix("\n")


def _tagged_block(text: str, tags) -> str | None:
    opening, closing = tags
    tail = text.rstrip()
    if not tail.endswith(closing):
        return None
    close = len(tail) - len(closing)
    start = tail.rfind(opening, 0, close)
    if start < 0 or closing in tail[start + len(opening) : close]:
        return None
    return tail[start + len(opening) : close].removeprefix("\n")


def closed_block(text: str, tags) -> str | None:
    """The source of the code block that `text` ends with (trailing whitespace allowed), or None
    when the text does not end by closing one (an unclosed block, prose, a closed output block)."""
    source = _fenced_block(text)
    return source if source is not None else _tagged_block(text, tags)


def observation_text(text: str, output: str) -> str:
    """The ```output block appended after `text` (which ends with a closed code block). Continues
    an output block the model opened itself, and starts on a new line."""
    tail = text.rstrip(" \t")
    if tail.endswith(OUTPUT_OPEN + "\n"):
        lead = ""
    elif tail.endswith(OUTPUT_OPEN):
        lead = "\n"
    else:
        lead = ("" if text.endswith("\n") else "\n") + OUTPUT_OPEN + "\n"
    return lead + (output if output.endswith("\n") else output + "\n") + FENCE + "\n"


def limit_note(max_tool_calls: int) -> str:
    """The output shown for a block past the call limit: nothing ran, the response must finish."""
    return f"The code was not run: the limit of {max_tool_calls} code runs per answer is reached. Finish the answer."


def truncation_note(left_out: int) -> str:
    return f"\n[output truncated: {left_out} more tokens]"


def cut_to_tokens(output: str, tokenizer, limit: int) -> str:
    """`output` cut to its first `limit` tokens, with a line saying how many were left out."""
    ids = tokenizer.encode(output, add_special_tokens=False)
    if len(ids) <= limit:
        return output
    return tokenizer.decode(ids[:limit]) + truncation_note(len(ids) - limit)

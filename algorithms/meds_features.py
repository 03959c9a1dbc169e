"""MEDS logic features: layer-wise logits (logit lens) of the first token of the final answer.

Liu et al. 2026 (arXiv 2604.11297), Method, "logic feature extraction"; docs/algorithms.md MEDS
step 1: f(y) = concat(l*(n), n in the chosen layers), where l*(n) is the logit of the answer's
first token y* read from layer n's hidden state through the model's output head.

Anchor: which response token y* is (`meds.anchor` says how the box is found, ANCHOR_RULES).
- 'boxed': the response has a `\\boxed{` (the last one, closed or not) followed by at least one
  character: y* is the token that produces the first character after the brace (rule 'project',
  read from the text: found whatever the tokenizer merged the brace with); or, with rule
  'reference', the token after the brace as the reference code finds it in the token ids
  (`reference_answer_index`: no box found there for ` \\boxed{42}` after a space, `$\\boxed{7}$`,
  or a brace merged into `{\\` or `{}` by SmolLM2's tokenizer).
- 'last': no usable `\\boxed{` in a response that ended by itself: y* is its last token, the EOS
  (the model's confidence in stopping stands in for an answer).
- 'truncated': no usable `\\boxed{` in a response cut by the length limit: y* is the last token
  generated before the cut. A truncated response that did open `\\boxed{` with content is 'boxed'.
Response token j is predicted at full-sequence column prompt_width + j - 1 (prompts are left-padded
to prompt_width), so that column's hidden state at each layer is projected, for one position per
response only: a dot product with the head's row of y*, not a full vocabulary projection.

Layer numbering follows transformers' `hidden_states`: 0 is the embedding output, n = 1..N the
output of decoder layer n. transformers returns entry N after the model's final norm already
(Llama, Qwen2, SmolLM2), so layer N's value is exactly the model's own logit of y*;
`final_norm: true` applies the final norm to the other chosen layers as well (the reference code
does not). `last_half` is the last N // 2 layers (14 numbers for a 28-layer model: the paper's
MEDS-14), `last:K` the last K (all N, with a warning, when K > N: the reference code's slice), or
an explicit list (negative numbers count from N).
"""

from __future__ import annotations

import warnings

import torch

from benchmarks.answer_extraction import last_boxed_start
from meds_cli.core.errors import UserError
from meds_cli.core.forward import lens_token_logits

ANCHORS = ("boxed", "last", "truncated")


def check_layer_spec(spec, key: str = "meds.layers") -> None:
    """Fail early on a malformed layer list `key` (the layer count is known only at the first forward)."""
    if isinstance(spec, list):
        if not spec or not all(isinstance(v, int) and not isinstance(v, bool) for v in spec):
            raise UserError(f"{key} list {spec!r} must hold layer numbers (0 = embeddings, 1..N)")
        return
    if spec == "last_half":
        return
    if isinstance(spec, str) and spec.startswith("last:"):
        count = spec[5:]
        if count.isdigit() and int(count) > 0:
            return
    raise UserError(f"{key} '{spec}' is not valid; accepted: last_half, last:K (K >= 1), "
                    "or a list such as [14, 21, 28]")


def resolve_layers(spec, num_layers: int, key: str = "meds.layers") -> list[int]:
    """The hidden-state indices named by `spec` (the setting `key`) for a model with `num_layers` decoder layers."""
    check_layer_spec(spec, key)
    n = num_layers
    if spec == "last_half":
        return list(range(n - max(1, n // 2) + 1, n + 1))
    if isinstance(spec, str):
        k = int(spec[5:])
        if k > n:  # the reference code slices the last K of its per-layer logits: all of them when fewer
            warnings.warn(f"{key} 'last:{k}' asks for more layers than the model has ({n}); using all {n}",
                          UserWarning, stacklevel=2)
            k = n
        return list(range(n - k + 1, n + 1))
    layers = []
    for value in spec:
        index = n + 1 + value if value < 0 else value
        if not 0 <= index <= n:
            raise UserError(f"{key} has layer {value}; this model has layers 0..{n} "
                            "(negative counts from the end)")
        layers.append(index)
    return layers


def _decode(tokenizer, token_ids) -> str:
    return tokenizer.decode(token_ids, skip_special_tokens=True)


def char_to_token(tokenizer, token_ids: list[int], offset: int, text: str | None = None) -> int | None:
    """Index j of the token whose decoded text covers character `offset` of `text` = decode(token_ids)
    (len(decode(ids[:j])) <= offset < len(decode(ids[:j + 1]))), or None past the end.

    The answer sits near the end of a response, so j is found from suffix decodes (galloping back
    from the end: short, cheap decodes) and checked with one prefix decode: decode(ids[:j + 1])
    must be a prefix of the text that covers the offset and decode(ids[j:]) a suffix that starts
    at or before it. Only when the check fails (a decode that is not a plain concatenation of
    tokens, e.g. SentencePiece dropping a leading space) does a binary search over prefix decodes
    run. A 3,000-token response costs about two full decodes instead of twelve."""
    text = _decode(tokenizer, token_ids) if text is None else text
    if offset >= len(text) or not token_ids:
        return None
    j = _guess_from_the_end(tokenizer, token_ids, len(text) - offset)
    if j is not None:
        head, tail = _decode(tokenizer, token_ids[:j + 1]), _decode(tokenizer, token_ids[j:])
        if len(head) > offset and text.startswith(head) and text.endswith(tail) and len(text) - len(tail) <= offset:
            return j
    lo, hi = 1, len(token_ids)
    while lo < hi:  # smallest k with len(decode(ids[:k])) > offset
        mid = (lo + hi) // 2
        if len(_decode(tokenizer, token_ids[:mid])) > offset:
            hi = mid
        else:
            lo = mid + 1
    return lo - 1


def _guess_from_the_end(tokenizer, token_ids: list[int], need: int) -> int | None:
    """Largest k whose suffix decode(ids[k:]) is at least `need` characters long."""
    n = len(token_ids)
    covered, short, step = None, n, 1  # ids[short:] is known too short
    while covered is None:
        k = max(0, n - step)
        if len(_decode(tokenizer, token_ids[k:])) >= need:
            covered = k
        elif k == 0:
            return None
        else:
            short, step = k, step * 2
    while short - covered > 1:
        mid = (covered + short) // 2
        if len(_decode(tokenizer, token_ids[mid:])) >= need:
            covered = mid
        else:
            short = mid
    return covered


BOXED_OPENING = "\\boxed{"
REFERENCE_LOOKAHEAD = 10  # tokens after a "boxed" token in which the reference looks for the brace


def reference_answer_index(token_ids: list[int], opening_ids: list[int], token_texts: list[str]) -> int | None:
    """y* as the reference code finds it (Linxi000/MEDS, extract_layer_logits.py
    find_brace_positions_in_responses), or None where it skips the response: the brace is the
    last token of the last exact run of `opening_ids` (the ids of encode("\\boxed{")); failing
    that, going back from the end, a token whose text contains "boxed" (any case), with the brace
    the first of it and the REFERENCE_LOOKAHEAD - 1 tokens after it whose text contains "{".
    y* is the token after the brace (the one its position predicts); a brace that is the
    response's last token has none here (the reference would read the padding after it).
    `token_texts`: the tokenizer's own token strings (convert_ids_to_tokens), as the reference reads."""
    brace, width = None, len(opening_ids)
    if width:
        brace = next((j + width - 1 for j in range(len(token_ids) - width, -1, -1)
                      if token_ids[j:j + width] == opening_ids), None)
    if brace is None:
        for idx in range(len(token_texts) - 1, -1, -1):
            if "boxed" in (token_texts[idx] or "").lower():
                window = range(idx, min(idx + REFERENCE_LOOKAHEAD, len(token_texts)))
                brace = next((m for m in window if "{" in (token_texts[m] or "")), None)
                if brace is not None:
                    break
    return brace + 1 if brace is not None and brace + 1 < len(token_ids) else None


def _project_box(text: str, token_ids: list[int], tokenizer) -> int | None:
    start = last_boxed_start(text) if text else None
    return char_to_token(tokenizer, token_ids, start, text) if start is not None else None


def _reference_box(text: str, token_ids: list[int], tokenizer) -> int | None:
    opening = tokenizer.encode(BOXED_OPENING, add_special_tokens=False)
    return reference_answer_index(token_ids, opening, tokenizer.convert_ids_to_tokens(token_ids))


# meds.anchor: how y* of a boxed answer is found; (text, token ids, tokenizer) -> index or None.
ANCHOR_RULES = {"project": _project_box, "reference": _reference_box}


def answer_anchor(text: str, token_ids: list[int], truncated: bool, tokenizer,
                  rule: str = "project") -> tuple[int, str]:
    """(index j of y* among the response tokens, anchor kind); see the module docstring."""
    last = max(0, len(token_ids) - 1)
    if tokenizer is not None:
        j = ANCHOR_RULES[rule](text, token_ids, tokenizer)
        if j is not None:
            return j, "boxed"
    return last, "truncated" if truncated else "last"


# meds.feature_dtype: the precision the logit-lens values are kept in.
FEATURE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def rounded_features(values: torch.Tensor, dtype: str) -> torch.Tensor:
    """`values` rounded to the nearest `dtype` number (FEATURE_DTYPES), returned as float32. The
    reference code reads its lens values from an lm_head that ran under bf16 autocast, so each
    is a bf16 number: 'bfloat16' reproduces that rounding (values that differ by less than the
    bf16 spacing, 2^-7 of the value's power of two, become equal)."""
    return values.to(FEATURE_DTYPES[dtype]).float()


def lens_logits(hidden_states, layers: list[int], rows: torch.Tensor, columns: torch.Tensor, tokens: torch.Tensor,
                head, norm=None) -> torch.Tensor:
    """[b, len(layers)] logit of `tokens` read from each layer's hidden state at (rows, columns),
    one position per response (meds_cli/core/forward.lens_token_logits; `norm`, the final norm,
    on every layer but the last, which transformers returns normalised already)."""
    states = [hidden_states[n][rows, columns] for n in layers]
    return lens_token_logits(states, layers, len(hidden_states) - 1, tokens, head, norm)

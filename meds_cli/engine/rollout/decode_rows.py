"""How many rows the `hf` decode loop should hold at once, from its memory per row and the memory free.

A decode step reads every weight once whatever the number of rows, so more rows make each token
cheaper until the matmuls are compute-bound: the embedded SmolLM2-135M on 2 CPU cores samples
395 tok/s at 128 rows and 853 tok/s at 1,024 (scripts/profile_decode.py --sequences N, 48
tokens). A fixed count cannot suit both a 135M model at 48 tokens and a 7B model at 4,096, so
evaluation sizes its batches to a share of the memory that is free when it starts.

Per row the loop holds the KV cache for the whole response (engine/rollout/reserved_cache.py
reserves it up front) and a few vocabulary-wide float32 rows (the logits, their scaled and
exponentiated copies, the cumulative sum a token is drawn from). Weights and the prefill's
activations are already in memory or short-lived, so they are not counted.
"""

from __future__ import annotations

import os

import torch

MEMORY_SHARE = 0.5  # of the memory free at the start: leaves room for grading, the OS and other work
MOST_ROWS = 1024  # past this the CPU gains little per token and a batch's first result comes late
VOCAB_COPIES = 4  # float32 vocabulary-wide rows alive at once while a token is chosen


def _text_config(config):
    return getattr(config, "text_config", None) or config  # multimodal configs nest the language model's


def kv_cache_bytes_per_token(config, bytes_per_value: int) -> int:
    """Keys and values of every layer for one position of one row, for a transformers `config`."""
    text = _text_config(config)
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return text.num_hidden_layers * 2 * kv_heads * head_dim * bytes_per_value


def bytes_per_row(config, tokens: int, cache_bytes_per_value: int) -> int:
    """Memory one decode row takes at `tokens` positions (prompt + response) for a transformers
    model `config`: keys and values of every layer, and the sampler's vocabulary-wide rows."""
    sampler = VOCAB_COPIES * 4 * _text_config(config).vocab_size
    return tokens * kv_cache_bytes_per_token(config, cache_bytes_per_value) + sampler


def rows_that_fit(row_bytes: int, free_bytes: int, *, share: float = MEMORY_SHARE, most: int = MOST_ROWS) -> int:
    """Rows of `row_bytes` each in `share` of `free_bytes`, between 1 and `most`."""
    return max(1, min(most, int(free_bytes * share) // max(1, row_bytes)))


def free_memory(device: torch.device) -> int:
    """Bytes free for new tensors on `device`: the GPU's free memory, or the host's available
    memory (MemAvailable, which counts reclaimable page cache; free pages where /proc is absent)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def decode_rows(model, tokens: int) -> int:
    """Rows per decode batch for `model` with prompts and responses of up to `tokens` together."""
    parameter = next(model.parameters())
    return rows_that_fit(bytes_per_row(model.config, tokens, parameter.element_size()), free_memory(parameter.device))

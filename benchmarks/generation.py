"""What the eval harness asks of a generation backend: requests in, responses out.

The backends themselves (the `hf` engine's own decode loop, which does not call
`model.generate`, and vLLM) load models, so they live in the engine
(meds_cli/engine/rollout/eval_backends.py); the harness only knows this interface.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from meds_cli.core.rollouts import without_spans


@dataclass(frozen=True)
class GenerationSettings:
    temperature: float
    top_p: float
    max_new_tokens: int
    # rows per batch of the hf engine's decode loop, None: as many as fit in memory
    # (engine/rollout/decode_rows.py); vLLM schedules its own batches
    batch_size: int | None
    # the tools a response may call and their limits (the rollout.tools settings: ToolSettings of
    # engine/rollout/tools/settings.py, docs/tools.md); None: sampled without tools
    tools: object | None = None


@dataclass(frozen=True)
class Request:
    prompt: str
    n: int
    seed: int


@dataclass
class Generated:
    """The n responses of one request, in sample order."""

    texts: list[str]
    lengths: list[int]  # response tokens, EOS included (the model's own: observations not counted)
    truncated: list[bool]  # no EOS within max_new_tokens
    # sampled with tools (docs/tools.md): per response, the character spans of `texts` that are
    # observations, and its ToolStats (calls, errors, timeouts, observation_tokens, tool_seconds)
    observation_spans: list[list[tuple[int, int]]] | None = None
    tool_stats: list | None = None

    @property
    def answer_texts(self) -> list[str]:
        """What the benchmark grades: each text without its observations (an answer the tool
        printed is not the model's)."""
        if self.observation_spans is None:
            return list(self.texts)
        return [without_spans(text, spans) for text, spans in zip(self.texts, self.observation_spans, strict=True)]


class Backend(Protocol):
    name: str
    tokenizer: object

    def call_sizes(self, requests: list[Request]) -> list[int]:
        """How many of the consecutive `requests` each generate call takes (sums to all of them):
        the harness saves and grades after each call."""
        ...

    def generate(self, requests: list[Request]) -> list[Generated]: ...

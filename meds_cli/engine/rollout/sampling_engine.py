"""The rollout engine interface: token ids and sampling settings in, token ids (and the
sampler's own log-probs) out.

The engines that sample in the trainer's process implement it (`hf`: a decode loop over the
training model itself; `vllm`: a colocated vLLM instance that receives the policy after each
optimizer step), and so does the pipeline before an engine that runs apart (`hf-worker`,
`vllm-server`: pipeline.py). The trainer and the eval harness only see this interface, so the
engine is a config choice (`rollout.engine`), looked up in the registry of engines.py.

A request is one prompt and one seed per sample: a sample's randomness belongs to the sample,
not to the batch it happens to be drawn in, so the same (prompt, seed) gives the same response
however requests are grouped.

Tool-integrated reasoning (engine/rollout/tools/) samples a response turn by turn: the settings
then carry `stop_strings` (a sample pauses after the first of them, the string kept in its tokens:
`Sample.paused`) and each request its own token budget (`SampleRequest.max_new_tokens`: what is
left of the response's), so that one call serves every response of a round.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

from meds_cli.core.forward import LensProbe
from meds_cli.engine.rollout.tools.settings import ToolSettings


@dataclass(frozen=True)
class SamplingSettings:
    temperature: float  # 0: greedy
    top_p: float
    max_new_tokens: int
    stop_ids: tuple[int, ...]  # a response ends after the first of these (kept in the response)
    min_new_tokens: int = 0  # stop ids are refused before this many tokens (benchmarks force lengths)
    lens: LensProbe | None = None  # values to record per sampled token (engines with records_lens)
    # a sample pauses after the first of these strings in the text it sampled (kept in its tokens:
    # Sample.paused); tool-integrated reasoning's code-block ends (tools/blocks.py stop_strings)
    stop_strings: tuple[str, ...] = ()
    # rollout.tools and its limits: batch.py then samples turn by turn, running code blocks between
    # turns (tools/turn_loop.py); an engine is always asked without them (tool_turns.turn_settings)
    tools: ToolSettings | None = None


SEED_LIMIT = 2**62  # a sample's seed is below it


@dataclass(frozen=True)
class SampleRequest:
    prompt_ids: tuple[int, ...]  # the prompt as the model sees it: no BOS added by the engine
    seeds: tuple[int, ...]  # one per sample: len(seeds) responses are drawn
    max_new_tokens: int | None = None  # this request's token budget, at most the settings' (None: theirs)

    @property
    def n(self) -> int:
        return len(self.seeds)

    def budget(self, settings: SamplingSettings) -> int:
        """New tokens this request's samples may take."""
        return settings.max_new_tokens if self.max_new_tokens is None else min(self.max_new_tokens,
                                                                               settings.max_new_tokens)


def split_by_request(requests: Sequence[SampleRequest], flat: list) -> list[list]:
    """`flat`, one item per sample with the requests' samples in order, as one list per request
    (the shape engines return: the samples of requests[i] at [i], in seed order)."""
    out, start = [], 0
    for request in requests:
        out.append(flat[start:start + request.n])
        start += request.n
    return out


@dataclass
class Sample:
    token_ids: list[int]  # the response, its stop token included when it stopped
    stopped: bool  # ended on a stop id (False: cut at max_new_tokens, or paused)
    logprobs: list[float] | None = field(default=None)  # the sampler's log-prob of each token, where it has them
    lens: Any = field(default=None)  # torch.Tensor [tokens, len(layers)] of settings.lens, where recorded
    policy_version: int | None = field(default=None)  # the policy version that sampled it (engines apart: pipeline.py)
    source: str | None = field(default=None)  # who sampled it (a server, a worker): named if refused (rollout_check)
    paused: bool = field(default=False)  # ended after one of settings.stop_strings: not finished, the turn loop goes on


class RolloutEngine(Protocol):
    """Every member the trainer's rollout source (source.py) and the eval harness may ask of a
    rollout engine: one that samples in the trainer's process (hf, vllm), or the pipeline before
    one that runs apart (pipeline.RolloutPipeline, which drives the engine's jobs through
    pipeline.SeparateEngine). tests/test_engine_protocol.py checks every registered engine.

    The weights change in two calls, one pair: `policy_updated` after every optimizer step (cheap:
    it records that the weights changed; an engine with its own copy of the policy brings it up to
    date before it next generates), and `policy_settled(version)` once a step's update is over
    (the weights are version `version`, the steps whose update they hold; an engine apart is sent
    them with its next job). `release` frees what the engine holds while the trainer updates
    (vLLM's sleep mode); the next `generate` takes it back. `close` stops what the engine started
    (a worker, a server); nothing for one that lives and ends with this process."""

    name: str
    records_lens: bool  # honours SamplingSettings.lens
    # samples from the training model's own parameters (hf), so a sharded policy is gathered for it;
    # False for an engine with its own copy (vLLM), which is sent the weights instead
    reads_policy_weights: bool

    def generate(self, requests: Sequence[SampleRequest], settings: SamplingSettings) -> list[list[Sample]]: ...

    def policy_updated(self) -> None: ...

    def policy_settled(self, version: int) -> None: ...

    def release(self) -> None: ...

    def close(self) -> None: ...


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def stop_token_ids(tokenizer) -> tuple[int, ...]:
    """The ids that end a response: the tokenizer's EOS and the end-of-turn tokens of chat
    templates (SmolLM2 and Qwen: <|im_end|>; Llama 3: <|eot_id|>), which may differ from EOS."""
    ids = {tokenizer.eos_token_id}
    vocab = tokenizer.get_vocab()
    for token in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>"):
        if token in vocab:
            ids.add(vocab[token])
    return tuple(sorted(i for i in ids if i is not None))

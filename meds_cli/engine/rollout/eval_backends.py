"""Generation backends of `meds eval` (the interface is benchmarks/generation.py): the rollout
engines the trainer samples with (meds_cli/engine/rollout/sampling_engine.py), `hf` everywhere and `vllm`
where it is installed and a GPU is present, so one code path serves training and eval.

A backend turns requests (prompt, n, seed) into n responses each. The seed belongs to the
request, not to the backend's call, and each of its n samples gets its own seed from it, so a
problem's samples depend only on (--seed, benchmark, problem id, first sample index) and the
generation settings: an interrupted eval that resumes draws the same samples as one that was
never stopped. Prompts go to the engine as token ids, with the trainer's stop ids.
  - hf: as many problems per call as fill one decode batch (--batch-size rows, by default as many
    as fit in half the free memory: engine/rollout/decode_rows.py); each problem's n samples
    share one prefill. Rows beside a sample change only the float rounding of the batched
    matmuls, never its uniforms.
  - vllm: a chunk of problems per call; the checkpoint's LoRA adapter is served as a
    LoRARequest (max_lora_rank rounded up to a size vLLM accepts).

Model loading lives here too: a run's checkpoint is the run's base model (config.yaml
model.name) plus either its peft adapter (`adapter/`) or its trainable weights
(`weights.safetensors`, also written by full fine-tuning).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from benchmarks.generation import Generated, GenerationSettings, Request
from meds_cli.core.errors import UserError
from meds_cli.engine.rollout.batch import decode_responses, sample_requests, segment_decoder
from meds_cli.engine.rollout.decode_rows import decode_rows
from meds_cli.engine.rollout.hf_sampler import HFEngine
from meds_cli.engine.rollout.sampling_engine import RolloutEngine, SamplingSettings, cuda_available, stop_token_ids
from meds_cli.engine.rollout.tool_turns import sample_tool_responses
from meds_cli.engine.rollout.tools.turn_loop import ToolResponse
from meds_cli.engine.rollout.vllm_engine import VLLMConfig, VLLMEngine, check_vllm_settings
from meds_cli.engine.run_folders.state_codec import read_tensors


@dataclass(frozen=True)
class ModelSpec:
    """What to evaluate: a base model (any --model value) and optionally a run checkpoint."""

    name: str
    checkpoint: Path | None = None
    dtype: str | None = None  # None: bfloat16 on a GPU, float32 on CPU (or the run's dtype)
    lora: object | None = None  # the run's LoraConfig, to rebuild an adapter from weights.safetensors

    @property
    def label(self) -> str:
        if self.checkpoint is None:
            return self.name
        return f"{self.checkpoint.parent.parent.name}@{self.checkpoint.name}"


def _dtype(spec: ModelSpec) -> str:
    if spec.dtype:
        return spec.dtype
    return "bfloat16" if cuda_available() else "float32"


# ---------------------------------------------------------------- HF


def load_hf_policy(spec: ModelSpec):
    """(model in eval mode on the best device, tokenizer), with the checkpoint applied."""
    from meds_cli.engine.model_io.model import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(spec.name, _dtype(spec))
    if spec.checkpoint is not None:
        model = apply_checkpoint(model, spec)
    if cuda_available():
        model = model.to("cuda")
    model.eval()
    return model, tokenizer


ADAPTER_WEIGHTS = "adapter_model.safetensors"


def checkpoint_adapter(checkpoint: Path) -> Path | None:
    """The checkpoint's peft adapter folder, or None when it has none. Only safetensors weights
    are accepted: peft and vLLM would fall back to unpickling adapter_model.bin, and a run
    folder is data, never code."""
    adapter = checkpoint / "adapter"
    if not (adapter / "adapter_config.json").is_file():
        return None
    if not (adapter / ADAPTER_WEIGHTS).is_file():
        raise UserError(f"checkpoint adapter {adapter} has no {ADAPTER_WEIGHTS}; adapters in pickle files are not "
                        f"loaded, because unpickling a file can run code")
    read_tensors(adapter / ADAPTER_WEIGHTS)  # a damaged or foreign file ends here in one line
    return adapter


def apply_checkpoint(model, spec: ModelSpec, merge: bool = True):
    """The base model with the checkpoint's adapter (merged, for speed; `merge=False` keeps the
    peft model, for `meds export`) or trainable weights."""
    checkpoint = spec.checkpoint
    adapter = checkpoint_adapter(checkpoint)
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter))
        return model.merge_and_unload() if merge else model
    weights_file = checkpoint / "weights.safetensors"
    if not weights_file.is_file():
        raise UserError(f"checkpoint {checkpoint} has neither adapter/ nor weights.safetensors")
    weights = read_tensors(weights_file)
    if any(".lora_" in key for key in weights):
        # LoRA weights without the adapter folder: rebuild the adapter the run trained.
        if spec.lora is None:
            raise UserError(f"checkpoint {checkpoint} holds LoRA weights but its run config has no lora section")
        from meds_cli.engine.model_io.model import apply_lora

        model = apply_lora(model, spec.lora)
    result = model.load_state_dict(weights, strict=False)
    if result.unexpected_keys:
        raise UserError(f"checkpoint {checkpoint} does not match model '{spec.name}' "
                        f"(unexpected weights such as {result.unexpected_keys[0]})")
    return model.merge_and_unload() if merge and hasattr(model, "merge_and_unload") else model


def sample_seeds(seed: int, n: int) -> tuple[int, ...]:
    """The seeds of a request's n samples, from the request's seed."""
    return tuple((seed * 1_000_003 + j) % 2**63 for j in range(n))


def generate_with(engine: RolloutEngine, tokenizer, requests: list[Request],
                  settings: GenerationSettings) -> list[Generated]:
    """The harness's requests through a rollout engine; with tools (settings.tools), turn by turn
    as training samples them (tool_turns.py), code blocks run between turns."""
    stops = stop_token_ids(tokenizer)
    sampling = SamplingSettings(settings.temperature, settings.top_p, settings.max_new_tokens, stops,
                                tools=settings.tools)
    asked = sample_requests(tokenizer, [r.prompt for r in requests], [sample_seeds(r.seed, r.n) for r in requests])
    if sampling.tools is not None:
        responses = sample_tool_responses(engine, tokenizer, asked, sampling, len(tokenizer))
        return [generated_with_tools(tokenizer, group, stops) for group in responses]
    out = engine.generate(asked, sampling)
    return [Generated(decode_responses(tokenizer, samples, stops), [len(s.token_ids) for s in samples],
                      [not s.stopped for s in samples]) for samples in out]


def generated_with_tools(tokenizer, responses: list[ToolResponse], stop_ids) -> Generated:
    """One request's responses sampled with tools, as the harness reads them: the whole text with
    its observation spans (graded without them), the model's tokens as the length, truncated
    unless the model ended on a stop id, and each response's tool stats."""
    stop = set(stop_ids)
    texts = [response.text(segment_decoder(tokenizer, stop)) for response in responses]
    return Generated([text for text, _ in texts], [sum(r.layout()[1]) for r in responses],
                     [not r.ended_on(stop) for r in responses], [spans for _, spans in texts],
                     [r.stats for r in responses])


class HFBackend:
    """The `hf` rollout engine on the evaluated model, the problems of one decode batch per call."""

    name = "hf"

    def __init__(self, model, tokenizer, settings: GenerationSettings):
        self.model, self.tokenizer, self.settings = model, tokenizer, settings
        self.engine = HFEngine(model, tokenizer.pad_token_id, settings.batch_size or 1, tokenizer=tokenizer)

    def call_sizes(self, requests: list[Request]) -> list[int]:
        """Consecutive requests whose samples fill one decode batch; sets the batch's rows (the
        --batch-size, or what fits in memory at the longest prompt of `requests`)."""
        if not requests:
            return []
        rows = self.settings.batch_size
        if rows is None:
            longest = max(len(ids) for ids in self.tokenizer([r.prompt for r in requests],
                                                             add_special_tokens=False)["input_ids"])
            rows = decode_rows(self.model, longest + self.settings.max_new_tokens)
        self.engine.batch_size = rows
        sizes, size, samples = [], 0, 0
        for request in requests:
            if size and samples + request.n > rows:
                sizes.append(size)
                size, samples = 0, 0
            size, samples = size + 1, samples + request.n
        return sizes + [size]

    def generate(self, requests: list[Request]) -> list[Generated]:
        return generate_with(self.engine, self.tokenizer, requests, self.settings)


# ---------------------------------------------------------------- vLLM


class VLLMBackend:
    """The `vllm` rollout engine serving the evaluated model (and its checkpoint's adapter); a
    chunk of problems per call. vLLM starts when the eval's requests are first seen (call_sizes
    sees all of them, generate those it is given): it reserves KV cache for the longest prompt
    plus --max-new-tokens, not for the model's own limit (32k and more for Qwen2.5, 128k for
    Llama 3.1), which a smaller GPU may not hold even one sequence of."""

    name = "vllm"
    problems_per_call = 64  # enough to fill the GPU, few enough to save progress often

    def __init__(self, spec: ModelSpec, settings: GenerationSettings, api=None):
        from meds_cli.engine.model_io.model import TINY, load_tokenizer, resolve_model

        if spec.name == TINY:
            raise UserError("the vllm backend cannot load 'tiny-llama' (it is built in memory); use --backend hf")
        check_vllm_settings({"--temperature": settings.temperature})
        self.settings = settings
        source = resolve_model(spec.name)
        adapter, rank = None, None
        if spec.checkpoint is not None:
            adapter = checkpoint_adapter(spec.checkpoint)
            if adapter is not None:
                rank = int(json.loads((adapter / "adapter_config.json").read_text()).get("r", 16))
            else:
                # Full fine-tuning: vLLM reads weights only from a model folder, so write one.
                source = str(_merged_copy(spec))
        self.tokenizer = load_tokenizer(source)
        # Eval has the GPU alone; on a CPU, compiling would take longer than most evals.
        options = VLLMConfig(gpu_memory_utilization=0.9, sleep_level=0, dtype=_dtype(spec),
                             enforce_eager=not cuda_available())
        self.start = functools.partial(VLLMEngine, source, options=options, lora_rank=rank, adapter_path=adapter,
                                       api=api)
        self.model_limit = _position_limit(source)
        self.engine = None

    def _started(self, requests: list[Request]) -> VLLMEngine:
        if self.engine is None:
            ids = self.tokenizer([r.prompt for r in requests], add_special_tokens=False)["input_ids"]
            needed = max(map(len, ids), default=0) + self.settings.max_new_tokens
            # within the model's limit, where vLLM stops a response at the limit as it did before
            self.engine = self.start(model_len=min(needed, self.model_limit) if self.model_limit else needed)
        return self.engine

    def call_sizes(self, requests: list[Request]) -> list[int]:
        if requests:
            self._started(requests)
        whole, rest = divmod(len(requests), self.problems_per_call)
        return [self.problems_per_call] * whole + ([rest] if rest else [])

    def generate(self, requests: list[Request]) -> list[Generated]:
        return generate_with(self._started(requests), self.tokenizer, requests, self.settings)


def _position_limit(source: str) -> int:
    """The model config's max_position_embeddings (0 where it cannot be read or does not say)."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(source)
    except (OSError, ValueError):
        return 0
    return int(getattr(config.get_text_config(), "max_position_embeddings", 0) or 0)


# Each merged copy is a whole model: evaluating a run's checkpoints one after another would
# otherwise leave a model's worth of disk per checkpoint in the cache.
MERGED_COPIES_KEPT = 2


def _merged_copy(spec: ModelSpec) -> Path:
    """A model folder (in the meds cache, once per checkpoint, the two most recently used kept)
    holding the base model with the checkpoint's weights, for vLLM."""
    from meds_cli.engine.model_io.cache import cache_dir, file_digest, publish_folder, reuse
    from meds_cli.engine.model_io.model import load_model_and_tokenizer

    key = file_digest(spec.checkpoint / "weights.safetensors")[:16]
    target = cache_dir() / "eval-merged" / f"{spec.checkpoint.name}-{key}"
    if reuse(target):
        return target

    def write(folder: Path) -> None:
        model, tokenizer = load_model_and_tokenizer(spec.name, _dtype(spec))
        apply_checkpoint(model, spec).save_pretrained(str(folder))
        tokenizer.save_pretrained(str(folder))

    return publish_folder(target, write, keep=MERGED_COPIES_KEPT)

"""Generation backends of `meds eval` (the interface is benchmarks/generation.py): batched HF generate everywhere, vLLM where it is installed
and a GPU is present, behind one small interface.

A backend turns requests (prompt, n, seed) into n responses each. The seed belongs to the
request, not to the backend's call, so a problem's samples depend only on (--seed, benchmark,
problem id, first sample index) and the generation settings: an interrupted eval that resumes
draws the same samples as one that was never stopped.
  - HF: one `generate` per problem (its n samples share one prompt, so no padding and no other
    problem can change its numbers), after `torch.manual_seed(request.seed)`.
  - vLLM: every request of a chunk in one `LLM.generate`, each with its own
    `SamplingParams(seed=...)`; the checkpoint's LoRA adapter rides along as a LoRARequest.

Model loading lives here too: a run's checkpoint is the run's base model (config.yaml
model.name) plus either its peft adapter (`adapter/`) or its trainable weights
(`weights.safetensors`, also written by full fine-tuning).
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

from benchmarks.generation import Backend, GenerationSettings, Generated, Request
from meds_cli.core.errors import UserError

BACKENDS = ("auto", "hf", "vllm")


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


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def resolve_backend(name: str) -> str:
    """'hf' or 'vllm' for --backend; 'auto' picks vLLM only when it can actually run."""
    if name not in BACKENDS:
        raise UserError(f"unknown --backend '{name}'; accepted: {', '.join(BACKENDS)}")
    has_vllm = importlib.util.find_spec("vllm") is not None
    if name == "auto":
        return "vllm" if has_vllm and _cuda() else "hf"
    if name == "vllm":
        if not has_vllm:
            raise UserError("--backend vllm needs the vllm package, which is not installed (pip install vllm); "
                            "use --backend hf")
        if not _cuda():
            raise UserError("--backend vllm needs a CUDA GPU and none is visible; use --backend hf")
    return name


def _dtype(spec: ModelSpec) -> str:
    if spec.dtype:
        return spec.dtype
    return "bfloat16" if _cuda() else "float32"


# ---------------------------------------------------------------- HF


def load_hf_policy(spec: ModelSpec):
    """(model in eval mode on the best device, tokenizer), with the checkpoint applied."""
    from meds_cli.engine.model import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(spec.name, _dtype(spec))
    if spec.checkpoint is not None:
        model = apply_checkpoint(model, spec)
    if _cuda():
        model = model.to("cuda")
    model.eval()
    return model, tokenizer


def apply_checkpoint(model, spec: ModelSpec):
    """The base model with the checkpoint's adapter (merged, for speed) or trainable weights."""
    checkpoint = spec.checkpoint
    adapter = checkpoint / "adapter"
    if (adapter / "adapter_config.json").is_file():
        from peft import PeftModel

        return PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    weights_file = checkpoint / "weights.safetensors"
    if not weights_file.is_file():
        raise UserError(f"checkpoint {checkpoint} has neither adapter/ nor weights.safetensors")
    from safetensors.torch import load_file

    weights = load_file(str(weights_file))
    if any(".lora_" in key for key in weights):
        # LoRA weights without the adapter folder: rebuild the adapter the run trained.
        if spec.lora is None:
            raise UserError(f"checkpoint {checkpoint} holds LoRA weights but its run config has no lora section")
        from meds_cli.engine.model import apply_lora

        model = apply_lora(model, spec.lora)
    result = model.load_state_dict(weights, strict=False)
    if result.unexpected_keys:
        raise UserError(f"checkpoint {checkpoint} does not match model '{spec.name}' "
                        f"(unexpected weights such as {result.unexpected_keys[0]})")
    return model.merge_and_unload() if hasattr(model, "merge_and_unload") else model


class HFBackend:
    """Batched HF generate through meds_cli.engine.rollout.sample_responses, one problem per call."""

    name = "hf"
    chunk_problems = 1

    def __init__(self, model, tokenizer, settings: GenerationSettings):
        self.model, self.tokenizer, self.settings = model, tokenizer, settings

    def generate(self, requests: list[Request]) -> list[Generated]:
        import torch

        from meds_cli.engine.rollout import sample_responses

        out = []
        s = self.settings
        for request in requests:
            torch.manual_seed(request.seed)  # seeds CUDA too
            batch = sample_responses(self.model, self.tokenizer, [request.prompt], [None], request.n,
                                     temperature=s.temperature, top_p=s.top_p, max_new_tokens=s.max_new_tokens,
                                     batch_size=s.batch_size)
            out.append(Generated(list(batch.response_texts), batch.response_lengths.tolist(),
                                 [bool(t) for t in batch.truncated.tolist()]))
        return out


# ---------------------------------------------------------------- vLLM


class VLLMBackend:
    """vLLM offline generation; a chunk of problems per call, a seed per request."""

    name = "vllm"
    chunk_problems = 64  # large enough to fill the GPU, small enough to save progress often

    def __init__(self, spec: ModelSpec, settings: GenerationSettings):
        from vllm import LLM  # noqa: PLC0415 - optional dependency

        from meds_cli.engine.model import TINY, load_tokenizer, resolve_model

        if spec.name == TINY:
            raise UserError("the vllm backend cannot load 'tiny-llama' (it is built in memory); use --backend hf")
        self.settings = settings
        source = resolve_model(spec.name)
        self.lora_request = None
        kwargs: dict = {}
        if spec.checkpoint is not None:
            adapter = spec.checkpoint / "adapter"
            if (adapter / "adapter_config.json").is_file():
                from vllm.lora.request import LoRARequest

                rank = json.loads((adapter / "adapter_config.json").read_text()).get("r", 16)
                kwargs.update(enable_lora=True, max_lora_rank=max(8, int(rank)), max_loras=1)
                self.lora_request = LoRARequest("checkpoint", 1, str(adapter.resolve()))
            else:
                # Full fine-tuning: vLLM reads weights only from a model folder, so write one.
                source = str(_merged_copy(spec))
        self.tokenizer = load_tokenizer(source)
        self.llm = LLM(model=source, tokenizer=source, dtype=_dtype(spec), **kwargs)

    def generate(self, requests: list[Request]) -> list[Generated]:
        from vllm import SamplingParams

        s = self.settings
        params = [SamplingParams(n=r.n, temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_new_tokens,
                                 seed=r.seed) for r in requests]
        outputs = self.llm.generate([r.prompt for r in requests], params, lora_request=self.lora_request,
                                    use_tqdm=False)
        result = []
        for output in outputs:
            completions = sorted(output.outputs, key=lambda c: c.index)
            result.append(Generated([c.text for c in completions], [len(c.token_ids) for c in completions],
                                    [c.finish_reason == "length" for c in completions]))
        return result


def _merged_copy(spec: ModelSpec) -> Path:
    """A model folder (in the meds cache, once per checkpoint) holding the base model with the
    checkpoint's weights, for vLLM."""
    import hashlib

    from meds_cli.engine.model import cache_dir, load_model_and_tokenizer

    weights = spec.checkpoint / "weights.safetensors"
    key = hashlib.sha256(f"{weights.resolve()}:{weights.stat().st_mtime_ns}".encode()).hexdigest()[:16]
    target = cache_dir() / "eval-merged" / f"{spec.checkpoint.name}-{key}"
    if (target / "config.json").is_file():
        return target

    model, tokenizer = load_model_and_tokenizer(spec.name, _dtype(spec))
    model = apply_checkpoint(model, spec)
    model.save_pretrained(str(target))
    tokenizer.save_pretrained(str(target))
    return target


def make_backend(name: str, spec: ModelSpec, settings: GenerationSettings) -> Backend:
    """The backend of --backend, with the model loaded."""
    if resolve_backend(name) == "vllm":
        return VLLMBackend(spec, settings)
    model, tokenizer = load_hf_policy(spec)
    return HFBackend(model, tokenizer, settings)

"""The model card (README.md) of an exported run: what was trained, how, how to load it, how it scored.

A pure function of what the run folder holds: its resolved config, the checkpoint step, the last
metrics row and the results.json of each eval under RUN/eval/.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

KINDS = {
    "merged": "the LoRA adapter merged into the base weights (a plain model)",
    "adapter": "the LoRA adapter, with its base model named in adapter_config.json",
    "adapter+base": "the LoRA adapter together with its base model's weights (the base has no hub id)",
    "full": "all weights (the run trained every weight)",
}
CARD_METRICS = ("reward", "accuracy", "eval/accuracy", "response_length_mean", "entropy")


@dataclass
class CardInfo:
    run_name: str
    kind: str  # a key of KINDS
    model_name: str  # what the run was given as --model
    hub_id: str | None  # the base model's hub id, when it has one
    step: int
    config: dict  # the run's resolved config (config.yaml)
    last_metrics: dict = field(default_factory=dict)
    evals: list[tuple[str, dict]] = field(default_factory=list)  # (eval folder name, results.json)


def read_evals(run_dir: Path) -> list[tuple[str, dict]]:
    """(folder name, results document) of every RUN/eval/*/results.json, in name order; unreadable ones skipped."""
    found = []
    for path in sorted(Path(run_dir).glob("eval/*/results.json")):
        try:
            found.append((path.parent.name, json.loads(path.read_text())))
        except (OSError, json.JSONDecodeError):
            continue
    return found


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def eval_table(evals: list[tuple[str, dict]]) -> str:
    """A markdown table: one row per (eval, benchmark) with pass@1, pass@k at the largest k, maj@k."""
    if not evals:
        return "No evaluation in the run folder yet (`meds eval RUN` writes RUN/eval/step_N/results.json).\n"
    lines = ["| eval | benchmark | problems | n | pass@1 (%) | pass@k (%) | maj@k (%) |",
             "|---|---|---|---|---|---|---|"]
    for label, document in evals:
        n = (document.get("config") or {}).get("n", "?")
        for name, scores in (document.get("benchmarks") or {}).items():
            passes = scores.get("pass@k") or {}
            top = max(passes, key=int) if passes else None
            majority = scores.get("maj@k") or {}
            lines.append(f"| {label} | {name} | {scores.get('problems', '?')} | {n} | {_pct(passes.get('1'))} | "
                         f"{_pct(passes.get(top)) + (f' (k={top})' if top else '')} | "
                         f"{_pct(majority.get(top)) if top in majority else '-'} |")
    return "\n".join(lines) + "\n"


def _loading(info: CardInfo) -> str:
    transformers_code = ("```python\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
                         "model = AutoModelForCausalLM.from_pretrained(\"PATH\")\n"
                         "tokenizer = AutoTokenizer.from_pretrained(\"PATH\")\n```\n")
    if info.kind in ("merged", "full"):
        vllm = "vLLM loads the folder as it is: `vllm serve PATH` or `LLM(model=\"PATH\")`.\n"
    else:
        base = info.hub_id or "the base model"
        where = "its weights sit in this folder beside the adapter" if info.kind == "adapter+base" else f"`{base}`"
        vllm = (f"Loading needs `peft` (the adapter is applied to the base model: {where}). vLLM does not apply "
                "an adapter folder by itself: pass it as a LoRA (`LLM(model=BASE, enable_lora=True)` with "
                "`LoRARequest(\"meds\", 1, \"PATH\")`), or export again with `--merge`"
                + (" (vLLM would read this folder's config.json as the bare base model)"
                   if info.kind == "adapter+base" else "")
                + ".\n")
    return transformers_code + "\n" + vllm


def model_card(info: CardInfo) -> str:
    config = info.config
    algo = config.get("algo", {})
    algo_name = algo.get("name", "?")
    sections = [algo_name] + ([algo.get("base")] if algo.get("base") and algo.get("base") in config else [])
    algo_config = {name: config[name] for name in sections if name in config}
    library = "transformers" if info.kind in ("merged", "full") else "peft"
    # one tag per name: the algorithm may be called meds itself
    front = {"library_name": library, "tags": list(dict.fromkeys(["meds", "reinforcement-learning", algo_name]))}
    if info.hub_id:
        front["base_model"] = info.hub_id
    task = config.get("task", {})
    on_base = (f" on {algo.get('base')}"
               if algo.get("base") and algo.get("base") in config and algo.get("base") != algo_name else "")
    metrics = "".join(f"| {k} | {info.last_metrics[k]:.4g} |\n" for k in CARD_METRICS
                      if isinstance(info.last_metrics.get(k), (int, float)))
    parts = [
        "---\n" + yaml.safe_dump(front, sort_keys=False) + "---\n",
        f"# {info.run_name} (step {info.step})\n",
        f"Trained with meds by reinforcement learning with verifiable rewards: "
        f"algorithm **{algo_name}**{on_base}, base model `{info.model_name}`"
        + (f" (`{info.hub_id}`)" if info.hub_id and info.hub_id != info.model_name else "")
        + f", task `{task.get('name', '?')}`, checkpoint of step {info.step} "
        f"of {config.get('train', {}).get('steps', '?')}.\n",
        f"This folder holds {KINDS[info.kind]}, the tokenizer (with its chat template, if it has one) and this card. "
        f"Prompts were built in the `{task.get('prompt_style', '?')}` style.\n",
        "## Loading\n",
        _loading(info),
        "## Evaluation\n",
        eval_table(info.evals),
    ]
    if metrics:
        parts += [f"## Training metrics at step {info.last_metrics.get('step', info.step)}\n",
                  "| metric | value |\n|---|---|\n" + metrics]
    parts += ["## Algorithm settings\n", "```yaml\n" + yaml.safe_dump(algo_config, sort_keys=False) + "```\n",
              "## Full run config\n", "```yaml\n" + yaml.safe_dump(config, sort_keys=False) + "```\n"]
    return "\n".join(parts)

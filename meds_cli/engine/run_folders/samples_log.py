"""What the model actually wrote: a few prompts of a step with their responses, for reading.

Every `train.log_samples_every` steps the trainer turns the first groups of the step's batch into
flat rows (one per response: prompt, gold answer, response, extracted answer, verdict, each reward
channel as 'reward/<name>', the reward before and after shaping, the advantage, and every
per-response value an algorithm kept in `rollouts.extras`, such as MEDS's cluster ids; with tools,
the response's tool use as `tools`), writes
them to RUN/samples/step_N.jsonl and hands them to the trackers that have tables.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from benchmarks.harness import tool_row

SAMPLES_DIR = "samples"


def _plain(value):
    """A JSON-safe Python scalar: tensors and numpy numbers to int/float, NaN and inf to None."""
    if isinstance(value, torch.Tensor):
        value = value.item()
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()  # numpy scalars
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def _per_response_advantage(advantages: torch.Tensor | None, mask: torch.Tensor, row: int):
    """The advantage of response `row`: the scalar, or the mean over its tokens when per-token."""
    if advantages is None:
        return None
    if advantages.dim() == 1:
        return _plain(advantages[row])
    tokens = mask[row] > 0
    return _plain(advantages[row][tokens].float().mean()) if tokens.any() else None


def _per_response_extras(extras: dict, size: int) -> dict[str, list]:
    """The extras holding one scalar per response (1-D tensors, flat lists); feature matrices are left out."""
    kept = {}
    for name, value in extras.items():
        if isinstance(value, torch.Tensor) and value.dim() == 1 and value.shape[0] == size:
            kept[name] = value.tolist()
        elif isinstance(value, list) and len(value) == size and all(
                v is None or isinstance(v, (bool, int, float, str)) for v in value):
            kept[name] = value
    return kept


def sample_rows(rollouts, step: int, groups: int = 2) -> list[dict]:
    """One flat row per response of the first `groups` groups of a batch.

    'reward_raw' is the sum of the reward channels (before any shaping), 'reward_shaped' the
    reward the advantages were computed from; both None when the batch has no rewards yet."""
    g = rollouts.group_size
    count = min(groups, rollouts.num_groups) * g
    channels = {name: values.tolist() for name, values in rollouts.reward_components.items()}
    raw = [sum(values[i] for values in channels.values()) for i in range(count)] if channels else [None] * count
    shaped = rollouts.rewards.tolist() if rollouts.rewards is not None else [None] * rollouts.size
    extras = _per_response_extras(rollouts.extras, rollouts.size)
    rows = []
    for i in range(count):
        problem = rollouts.problems[i // g]
        verdict = rollouts.verdicts[i] if rollouts.verdicts else None
        row = {
            "step": step, "problem_id": problem.id, "sample": i % g, "prompt": problem.question,
            "gold": _plain(problem.answer) if not isinstance(problem.answer, dict) else None,
            "response": rollouts.response_texts[i],
            "response_tokens": int(rollouts.response_mask[i].sum()),
            "truncated": bool(rollouts.truncated[i]),
            "extracted": verdict.extracted if verdict else None,
            "correct": bool(verdict.correct) if verdict else None,
            "outcome": verdict.outcome if verdict else None,
            **{f"reward/{name}": _plain(values[i]) for name, values in channels.items()},
            "reward_raw": _plain(raw[i]),
            "reward_shaped": _plain(shaped[i]),
            "advantage": _per_response_advantage(rollouts.advantages, rollouts.response_mask, i),
        }
        row.update({name: _plain(values[i]) for name, values in extras.items()})
        if rollouts.tool_stats and rollouts.tool_stats[i] is not None:  # sampled with tools (docs/tools.md)
            row["tools"] = tool_row(rollouts.tool_stats[i])  # response_tokens above: the model's own
        rows.append(row)
    return rows


def samples_path(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / SAMPLES_DIR / f"step_{step}.jsonl"


def write_samples(run_dir: Path, step: int, rows: list[dict]) -> Path:
    """RUN/samples/step_N.jsonl, replaced whole (a resumed run that redoes a step rewrites it)."""
    path = samples_path(run_dir, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(row) + "\n" for row in rows))
    tmp.replace(path)
    return path


def should_log_samples(step: int, every: int) -> bool:
    return every > 0 and step % every == 0


def record_samples(run_dir: Path, step: int, rollouts, groups: int, tracker=None) -> Path:
    """The samples of a step to RUN/samples/step_N.jsonl and, as a table, to `tracker` (RunTracker)."""
    rows = sample_rows(rollouts, step, groups)
    if tracker is not None:
        tracker.log_table("samples", rows, step)
    return write_samples(run_dir, step, rows)

"""What a resumed run may change, and the record of what it did change.

`meds train --resume RUN` reads RUN/config.yaml and layers the command line's files, flags and
--set over it. Settings the checkpoint depends on cannot change: the model and its LoRA shape
(the saved weights have that shape), the algorithm (its saved state is that algorithm's), the
task and the seed (the run's problems and their order come from them), and any key an
algorithm declares in its config's `fixed_on_resume`. Such a change is refused with one line
naming the key and both values. Everything else (steps, learning rate and schedule, sampling,
eval settings, penalties ...) is applied from the resumed step on and logged in
RUN/resumes.jsonl, one row per resume.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from algorithms import ALGORITHMS
from meds_cli.core.errors import UserError
from meds_cli.core.jsonl import append_rows, drop_cut_off_tail
from meds_cli.engine.config import FIXED_SECTIONS, RunConfig

RESUMES_FILE = "resumes.jsonl"
# Prefixes of keys a resume cannot change, and why.
FIXED = {
    "model.": "the checkpoint holds weights of that model and adapter shape",
    "algo.": "the checkpoint holds that algorithm's state",
    "task.": "the run's problems and their order come from it",
    "train.seed": "the run's data order and sampling come from it",
}
# Model settings that shape no saved tensor.
CHANGEABLE_MODEL_KEYS = ("model.lora.dropout",)
# Where a run is written, not how it trains.
IGNORED = ("train.output_dir", "train.runs_root", "train.tag")


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """{'a.b': 1, ...} of a config (or a section); lists stay values."""
    if dataclasses.is_dataclass(value):
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        flat: dict[str, Any] = {}
        for key, item in value.items():
            flat.update(flatten(item, f"{prefix}{key}."))
        return flat
    return {prefix.rstrip("."): value}


def sections_in_use(cfg: RunConfig) -> list[str]:
    chosen = ALGORITHMS.get(cfg.algo.name)
    return [cfg.algo.name, cfg.algo.base] if chosen.composes else [cfg.algo.name]


def comparable(cfg: RunConfig) -> dict[str, Any]:
    """The settings of a run that a resume compares: fixed sections and the algorithm's own."""
    flat = flatten({name: getattr(cfg, name) for name in FIXED_SECTIONS})
    for name in sections_in_use(cfg):
        flat.update(flatten(cfg.section(name), f"{name}."))
    return {key: value for key, value in flat.items() if key not in IGNORED}


def config_changes(before: RunConfig, after: RunConfig) -> dict[str, tuple[Any, Any]]:
    """{key: (run's value, new value)} for every setting that differs."""
    old, new = comparable(before), comparable(after)
    return {key: (old.get(key), new.get(key)) for key in sorted(old.keys() | new.keys())
            if old.get(key) != new.get(key)}


def fixed_keys(cfg: RunConfig) -> dict[str, str]:
    """{key: why} of the algorithm keys that may not change (declared in `fixed_on_resume`)."""
    keys = {}
    for name in sections_in_use(cfg):
        for key in getattr(ALGORITHMS.get(name).config_class, "fixed_on_resume", ()):
            keys[f"{name}.{key}"] = "the algorithm's saved state depends on it"
    return keys


def refuse_fixed_changes(changes: dict[str, tuple[Any, Any]], before: RunConfig) -> None:
    """A UserError naming the first change a resume cannot apply."""
    declared = fixed_keys(before)
    for key, (old, new) in changes.items():
        why = declared.get(key) or next((text for prefix, text in FIXED.items()
                                         if key.startswith(prefix) and key not in CHANGEABLE_MODEL_KEYS), None)
        if why:
            raise UserError(f"a resumed run cannot change {key} ({why}): the run has {old!r}, this command gives "
                            f"{new!r}; drop that setting, or start a new run to change it")


def describe_changes(changes: dict[str, tuple[Any, Any]]) -> str:
    return ", ".join(f"{key} {old!r} -> {new!r}" for key, (old, new) in changes.items())


def record_resume(run_dir: Path, step: int, checkpoint: Path | None, changes: dict[str, tuple[Any, Any]]) -> None:
    """One row in RUN/resumes.jsonl: when, from which step and checkpoint, what changed."""
    row = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "step": step,
           "checkpoint": checkpoint.name if checkpoint else None,
           "changes": {key: {"from": old, "to": new} for key, (old, new) in changes.items()}}
    path = Path(run_dir) / RESUMES_FILE
    drop_cut_off_tail(path)
    append_rows(path, [row])

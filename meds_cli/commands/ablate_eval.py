"""The evaluation step of `meds ablate`: pass@k of a variant's final checkpoint.

Two sources of problems:
- benchmarks (`--benchmarks math500,aime24 --data-dir ...`): the eval harness, exactly as
  `meds eval RUN_DIR` runs it (RUN_DIR/eval/step_N/results.json, resumable);
- `heldout` (the default): the training task's own held-out split, prompted as in training
  (task.prompt) and graded by the task's grader. Tiny models and toy tasks (the tests' `copy`)
  cannot answer benchmark prompts, and a held-out split costs no download. `meds eval` runs it
  as a benchmark (meds_cli.commands.eval.heldout_suite) and writes to RUN_DIR/eval/heldout/, so
  the report reads both alike.
Trainer.quick_eval was not reused: it is one greedy sample per problem (accuracy, no pass@k).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from benchmarks.harness import EvalSettings
from meds_cli.commands.eval import HELDOUT, heldout_max_new_tokens
from meds_cli.core.errors import UserError


def is_heldout(settings: EvalSettings) -> bool:
    return settings.benchmarks == [HELDOUT]


def variant_settings(settings: EvalSettings, max_new_tokens: int) -> EvalSettings:
    """The eval of one variant: the command's settings at the variant's own response length,
    checked (a bad --k, --n, --benchmarks or --data-dir fails before any training)."""
    if HELDOUT in settings.benchmarks and len(settings.benchmarks) > 1:
        raise UserError(f"--benchmarks '{HELDOUT}' (the task's held-out split) cannot be mixed with benchmarks; "
                        f"got {','.join(settings.benchmarks)}")
    if settings.data_dir is not None and not Path(settings.data_dir).is_dir():
        raise UserError(f"--data-dir '{settings.data_dir}' is not a folder; it must hold <benchmark>/test.jsonl files")
    variant = dataclasses.replace(settings, max_new_tokens=max_new_tokens)
    variant.validate()
    return variant


def results_path(run_dir: Path, settings: EvalSettings, steps: int) -> Path:
    folder = "heldout" if is_heldout(settings) else f"step_{steps}"
    return Path(run_dir) / "eval" / folder / "results.json"


# the option of `meds ablate` that sets its evals' length, named in the truncation advice
LENGTH_OPTION = "meds ablate --max-new-tokens"


def evaluate_variant(run_dir: Path, eval_settings: EvalSettings, console=None,
                     max_new_tokens: int | None = None) -> dict:
    """Evaluate the run's last checkpoint with `meds eval`'s loop; returns the results document
    (also on disk, at results_path). `max_new_tokens`: `meds ablate --max-new-tokens`, the length
    of every variant's eval; None: the variant's own (below)."""
    from meds_cli.commands.eval import run_eval
    from meds_cli.engine.config import load_config

    cfg = load_config([str(Path(run_dir) / "config.yaml")])
    # The held-out split at the length `meds eval RUN` gives it (a toy task's training limit can cut
    # most answers short: every arm would then score its truncations); benchmarks at the run's own.
    length = max_new_tokens or (heldout_max_new_tokens(cfg.task.name, cfg.rollout.max_new_tokens)
                                if is_heldout(eval_settings) else cfg.rollout.max_new_tokens)
    settings = variant_settings(eval_settings, length)
    output = results_path(run_dir, settings, cfg.train.steps).parent if is_heldout(settings) else None
    return run_eval(run_dir=Path(run_dir), model=None, step=None, settings=settings, output=output, quiet=True,
                    console=console, length_option=LENGTH_OPTION)

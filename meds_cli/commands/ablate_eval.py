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

from dataclasses import dataclass
from pathlib import Path

from meds_cli.commands.eval import HELDOUT
from meds_cli.core.errors import UserError


@dataclass
class EvalOptions:
    benchmarks: list[str]
    k: int = 8
    n: int | None = None
    limit: int | None = None
    data_dir: str | None = None
    temperature: float = 0.6
    top_p: float = 0.95
    seed: int = 0
    batch_size: int = 64

    @property
    def heldout(self) -> bool:
        return self.benchmarks == [HELDOUT]

    def settings(self, max_new_tokens: int):
        """The harness's EvalSettings (validated: a bad --k or --n fails before any training)."""
        from benchmarks.harness import EvalSettings

        if HELDOUT in self.benchmarks and len(self.benchmarks) > 1:
            raise UserError(f"--benchmarks '{HELDOUT}' (the task's held-out split) cannot be mixed with benchmarks; "
                            f"got {','.join(self.benchmarks)}")
        if self.data_dir is not None and not Path(self.data_dir).is_dir():
            raise UserError(f"--data-dir '{self.data_dir}' is not a folder; it must hold <benchmark>/test.jsonl files")
        settings = EvalSettings(list(self.benchmarks), k=self.k, n=self.n, limit=self.limit, data_dir=self.data_dir,
                                temperature=self.temperature, top_p=self.top_p, max_new_tokens=max_new_tokens,
                                seed=self.seed, batch_size=self.batch_size, backend="hf" if self.heldout else "auto",
                                prompt="auto")  # each variant with the prompt style it trained with
        settings.validate()
        return settings


def results_path(run_dir: Path, options: EvalOptions, steps: int) -> Path:
    folder = "heldout" if options.heldout else f"step_{steps}"
    return Path(run_dir) / "eval" / folder / "results.json"


def evaluate_variant(run_dir: Path, options: EvalOptions, console=None) -> dict:
    """Evaluate the run's last checkpoint with `meds eval`'s loop; returns the results document
    (also on disk, at results_path)."""
    from meds_cli.commands.eval import run_eval
    from meds_cli.engine.config import load_config

    cfg = load_config([str(Path(run_dir) / "config.yaml")])
    settings = options.settings(cfg.rollout.max_new_tokens)
    output = results_path(run_dir, options, cfg.train.steps).parent if options.heldout else None
    return run_eval(run_dir=Path(run_dir), model=None, step=None, settings=settings, output=output, quiet=True,
                    console=console)

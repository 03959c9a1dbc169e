"""The evaluation step of `meds ablate`: pass@k of a variant's final checkpoint.

Two sources of problems:
- benchmarks (`--benchmarks math500,aime24 --data-dir ...`): the eval harness, exactly as
  `meds eval RUN_DIR` runs it (RUN_DIR/eval/step_N/results.json, resumable);
- `heldout` (the default): the training task's own held-out split, prompted as in training
  (task.prompt) and graded by the task's grader. Tiny models and toy tasks (the tests' `copy`)
  cannot answer benchmark prompts, and a held-out split costs no download. It reuses the
  harness's pieces (HF backend, per-problem seeds, sample rows, unbiased pass@k scoring) and
  writes the same results.json layout to RUN_DIR/eval/heldout/, so the report reads both alike.
Trainer.quick_eval was not reused: it is one greedy sample per problem (accuracy, no pass@k).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from meds_cli.engine.run_folders import run_dir as runs
from meds_cli.core.errors import UserError

HELDOUT = "heldout"


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
    """Evaluate the run's last checkpoint; returns the results document (also on disk)."""
    from meds_cli.engine.config import load_config

    cfg = load_config([str(Path(run_dir) / "config.yaml")])
    settings = options.settings(cfg.rollout.max_new_tokens)
    if not options.heldout:
        from meds_cli.commands.eval import run_eval

        return run_eval(run_dir=Path(run_dir), model=None, step=None, settings=settings, output=None, quiet=True,
                        console=console)
    return heldout_eval(Path(run_dir), cfg, settings)


def heldout_eval(run_dir: Path, cfg, settings) -> dict:
    from benchmarks.generation import GenerationSettings, Request
    from meds_cli.engine.rollout.eval_backends import HFBackend, ModelSpec, load_hf_policy
    from benchmarks.harness import average_scores, problem_seed, sample_rows, score_benchmark
    from benchmarks.registry import Benchmark
    from benchmarks.tasks import CodeTask, build_task

    task = build_task(cfg.task, cfg.train.seed)
    problems = task.held_out[: settings.limit] if settings.limit else list(task.held_out)
    if not problems:
        raise UserError(f"task '{cfg.task.name}' has no held-out problems; evaluate on --benchmarks instead")
    spec = ModelSpec(cfg.model.name, runs.find_checkpoint(run_dir), cfg.model.dtype, cfg.model.lora)
    model, tokenizer = load_hf_policy(spec)
    backend = HFBackend(model, tokenizer, GenerationSettings(settings.temperature, settings.top_p,
                                                             settings.max_new_tokens, settings.batch_size))
    kind = "code" if isinstance(task, CodeTask) else "math"
    bench = Benchmark(f"{HELDOUT}-{cfg.task.name}", "the training task's held-out split", kind, None, task.grade)
    per_problem = []
    for problem in problems:
        seed = problem_seed(settings.seed, bench.name, problem.id, 0)
        [generated] = backend.generate([Request(task.prompt(problem, tokenizer), settings.samples, seed)])
        verdicts = task.grade([(problem, text) for text in generated.texts])
        per_problem.append(sample_rows(bench, problem, 0, generated, verdicts))
    scores = {bench.name: score_benchmark(kind, per_problem, settings.ks)}
    folder = run_dir / "eval" / HELDOUT
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "samples.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for rows in per_problem for r in rows))
    document = {"model": spec.label, "checkpoint": str(spec.checkpoint), "benchmarks": scores,
                "average": average_scores(scores), "config": {"benchmarks": [bench.name], "k": settings.k,
                                                              "n": settings.samples, "limit": settings.limit,
                                                              "temperature": settings.temperature,
                                                              "top_p": settings.top_p, "seed": settings.seed,
                                                              "max_new_tokens": settings.max_new_tokens}}
    tmp = folder / "results.json.tmp"
    tmp.write_text(json.dumps(document, indent=2) + "\n")
    tmp.replace(folder / "results.json")  # a results.json on disk means the eval finished
    return document

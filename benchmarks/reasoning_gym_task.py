"""Procedural problems from reasoning-gym (`task.name: reasoning-gym`), graded by the generator's own
`score_answer`.

reasoning-gym (PyPI `reasoning-gym`, the optional extra `gym`) holds about a hundred procedural
task generators, each a dataclass of settings (difficulty, sizes) and a scorer. Here one generator
(`task.dataset`) with its settings (`task.config`) makes both pools of a run:

- Seeding: the generator's own seed is derived from the run seed and the generator's name through
  sha256 (`generator_seed`), not the run seed itself: generators draw item i from seed + i, so
  run seeds 0 and 1 used as they are would give the same problems shifted by one.
- Splits: items are drawn in index order and a question already drawn is skipped, so every
  question appears once. The first `task.eval_size` distinct questions are the held-out split
  (a prefix: a larger eval_size keeps the smaller one's problems, and train_size never changes
  it), the next `task.train_size` the training split; no held-out question text is in training.
  A generator whose settings allow fewer distinct questions than both splits need (after
  `DRAWS_PER_PROBLEM` draws per problem asked) is refused with one line naming how many it gave.
- Grading: the answer is the last \\boxed{} (`task.answer_format` boxed, or boxed_or_last_integer:
  else the last number of the response, for models that do not box), or reasoning-gym's native
  `<answer>...</answer>` (answer_tags, read by reasoning-gym's own reader). `score_answer(answer,
  entry)` scores it; a score of 1.0 is correct. A lower score is kept in `Verdict.detail['score']`
  and, with `task.partial_credit`, is the reward's credit (`detail['credit']`, as the code tasks'
  pass_rate): docs/training.md says which algorithms read it.

The package is imported only when the task is chosen, so the task is always registered (`meds
list` shows it) and choosing it without the package installed is one line naming the extra.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from typing import Any

from benchmarks.answer_extraction import extract_answer
from benchmarks.prompts import answer_tags_prompt
from benchmarks.registry import TASKS
from benchmarks.tasks import Task
from meds_cli.core.errors import UserError, nearest
from meds_cli.core.records import Problem, Verdict

TASK_NAME = "reasoning-gym"
INSTALL = "pip install -e '.[gym]'"
# The generator settings the run sets itself: the seed from train.seed, the count from the split sizes.
RUN_OWNED_SETTINGS = ("seed", "size")
# Draws per problem asked before a generator counts as unable to give more distinct questions:
# a generator whose question space is close to the size asked finds nearly all of it long before
# (coupon collecting a space of n questions takes about n ln n draws), and one with a space of a
# tenth of it is told so after a few seconds (chain_sum draws an item in 0.1 ms).
DRAWS_PER_PROBLEM = 10
# task.answer_format -> the extraction mode of benchmarks.answer_extraction (answer_tags: reasoning-gym's reader)
_EXTRACTION_MODES = {"boxed": "boxed", "boxed_or_last_integer": "boxed_then_last_number"}


def reasoning_gym():
    """The reasoning_gym package, or one line naming the extra that installs it."""
    try:
        import reasoning_gym
    except ImportError:
        raise UserError(f"task '{TASK_NAME}' needs the reasoning-gym package, which is not installed: "
                        f"{INSTALL}") from None
    return reasoning_gym


def generators() -> dict[str, tuple[type, type]]:
    """reasoning-gym's registry: generator name -> (dataset class, config dataclass)."""
    return reasoning_gym().factory.DATASETS


def check_settings(dataset: str, settings: dict, prefix: str) -> None:
    """task.dataset and task.config against reasoning-gym's registry and the generator's config
    dataclass, at config time: one line for an unknown name (with did-you-mean), an unknown or
    run-owned setting (with the accepted ones), or values the generator's own validate refuses."""
    known = generators()
    names = sorted(known)
    if not dataset:
        raise UserError(f"{prefix}dataset is empty: name a reasoning-gym generator, e.g. chain_sum, basic_arithmetic "
                        f"or countdown (all {len(names)}: {', '.join(names)})")
    if dataset not in known:
        raise UserError(f"unknown {prefix}dataset '{dataset}'{nearest(dataset, names)}; reasoning-gym's "
                        f"{len(names)} generators: {', '.join(names)}")
    config_class = known[dataset][1]
    accepted = [f.name for f in dataclasses.fields(config_class) if f.name not in RUN_OWNED_SETTINGS]
    for key in settings:
        if key in RUN_OWNED_SETTINGS:
            raise UserError(f"{prefix}config.{key} is set by the run (seed: train.seed; size: task.train_size and "
                            f"task.eval_size); leave it out. {dataset} accepts: {', '.join(accepted)}")
        if key not in accepted:
            raise UserError(f"unknown {prefix}config key '{key}'{nearest(str(key), accepted)} for {dataset}; "
                            f"accepted: {', '.join(accepted)}")
    generator_config(dataset, settings, seed=0, size=1, prefix=prefix)


def generator_config(dataset: str, settings: dict, seed: int, size: int, prefix: str = "task."):
    """The generator's config dataclass with the user's settings, the seed and the size, checked by
    the generator's own validate (its assertions become one line)."""
    config_class = generators()[dataset][1]
    try:
        config = config_class(**settings, seed=seed, size=size)
        if callable(getattr(config, "validate", None)):
            config.validate()
    except (AssertionError, ValueError, TypeError) as err:
        raise UserError(f"{prefix}config {settings} is refused by reasoning-gym's {dataset}: "
                        f"{err or type(err).__name__}") from None
    return config


def generator_seed(run_seed: int, dataset: str) -> int:
    """A 32-bit generator seed for the run seed (sha256: far apart for neighbouring run seeds)."""
    digest = hashlib.sha256(f"{TASK_NAME}/{dataset}/{run_seed}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def distinct_items(dataset, wanted: int, max_draws: int) -> list[dict]:
    """Up to `wanted` items of `dataset` with distinct question texts, in index order, drawing at
    most `max_draws` items."""
    seen, items = set(), []
    for index in range(max_draws):
        if len(items) == wanted:
            break
        item = dataset[index]
        if item["question"] in seen:
            continue
        seen.add(item["question"])
        items.append(item)
    return items


def answer_text(response: str, answer_format: str) -> str | None:
    """The answer of a response in `answer_format`, or None when it gives none."""
    if not response:
        return None
    if answer_format == "answer_tags":
        return reasoning_gym().utils.extract_answer(response)
    return extract_answer(response, _EXTRACTION_MODES[answer_format])


def score_verdict(score: float, extracted: str | None, partial_credit: bool, error: str = "") -> Verdict:
    """A verdict from the generator's score: correct at 1.0; the score kept in detail, and as the
    reward's credit when partial credit is on; `error`: the exception the scorer raised, if any."""
    if extracted is None:
        return Verdict(False, None, "no_answer", {"score": 0.0})
    correct = score >= 1.0
    detail: dict[str, Any] = {"score": score, **({"score_error": error} if error else {})}
    if partial_credit:
        detail["credit"] = min(max(score, 0.0), 1.0)
    return Verdict(correct, extracted, "correct" if correct else "wrong", detail)


@TASKS.register(TASK_NAME, "procedural problems of a reasoning-gym generator (task.dataset, task.config), disjoint "
                           "seeded splits, graded by the generator's score_answer; needs the gym extra")
class ReasoningGymTask(Task):
    @functools.cached_property
    def generator(self):
        """The generator with the run's settings, seeded from the run seed."""
        cfg = self.config
        wanted = cfg.train_size + cfg.eval_size
        config = generator_config(cfg.dataset, cfg.config, generator_seed(self.seed, cfg.dataset),
                                  DRAWS_PER_PROBLEM * wanted)
        return generators()[cfg.dataset][0](config=config)

    def make_splits(self):
        cfg = self.config
        wanted = cfg.train_size + cfg.eval_size
        items = distinct_items(self.generator, wanted, DRAWS_PER_PROBLEM * wanted)
        if len(items) < wanted:
            raise UserError(f"reasoning-gym's {cfg.dataset} with task.config {cfg.config} gave {len(items)} distinct "
                            f"questions in {DRAWS_PER_PROBLEM * wanted} draws, fewer than task.eval_size + "
                            f"task.train_size = {cfg.eval_size} + {cfg.train_size}; lower the sizes or widen "
                            f"task.config")
        problems = [Problem(id=f"{cfg.dataset}-{i}", question=item["question"], answer=item["answer"],
                            meta={"dataset": cfg.dataset, "entry": item}) for i, item in enumerate(items)]
        return problems[cfg.eval_size:], problems[:cfg.eval_size]

    def prompt(self, problem, tokenizer):
        if self.config.answer_format == "answer_tags":
            return answer_tags_prompt(problem.question, tokenizer, self.config.prompt_style, **self.prompt_options)
        return super().prompt(problem, tokenizer)

    @property
    def answer_mode(self):
        return self.config.answer_format

    def read_answer(self, response):
        return answer_text(response or "", self.config.answer_format)

    def grade(self, pairs):
        verdicts = []
        for problem, response in pairs:
            extracted = self.read_answer(response)
            score, error = self.score(extracted, problem) if extracted is not None else (0.0, "")
            verdicts.append(score_verdict(score, extracted, self.config.partial_credit, error))
        return verdicts

    def score(self, answer: str, problem: Problem) -> tuple[float, str]:
        """(the generator's score_answer of `answer`, the name of the exception it raised or '').
        A scorer that raises on an answer the policy made up (scorers are written for well-formed
        answers) scores it 0, the exception kept in the verdict, rather than stopping the run."""
        try:
            return float(self.generator.score_answer(answer, problem.meta["entry"])), ""
        except Exception as err:  # noqa: BLE001 - a third-party scorer failing on a policy's text: a wrong answer
            return 0.0, type(err).__name__

"""Training tasks: where prompts and gold answers come from, and how responses are graded.

A task is built from the `task:` config section and the run seed. It exposes a training pool,
a held-out pool for evaluation, a prompt for each problem, a batched grader, and the reading of
a response's final answer without the gold answer (what label-free algorithms vote on). The
pools are made on first use, so building a task for its answer reader costs nothing.
"""

from __future__ import annotations

import functools
import random
from typing import Sequence

from benchmarks.answer_extraction import extract_answer, integer_literal_value
from benchmarks.prompts import STYLES as PROMPT_STYLES  # noqa: F401  (the config reads them here: task.prompt_style)
from benchmarks.prompts import build_prompt, problem_prompt
from benchmarks.registry import TASKS
from meds_cli.core.errors import UserError
from meds_cli.core.records import Problem, Verdict


class Task:
    def __init__(self, config, seed: int):
        self.config = config
        self.seed = seed

    @functools.cached_property
    def _splits(self) -> tuple[list[Problem], list[Problem]]:
        return self.make_splits()

    @property
    def train(self) -> list[Problem]:
        return self._splits[0]

    @property
    def held_out(self) -> list[Problem]:
        return self._splits[1]

    def make_splits(self) -> tuple[list[Problem], list[Problem]]:
        raise NotImplementedError

    def prompt_token_counts(self, tokenizer) -> tuple[list[int], list[int]]:
        """The tokens of every prompt of the two pools (training, held-out), counted once per
        tokenizer: leaving out long prompts and sizing vLLM's cache both read them (leaving out
        keeps the counts of the prompts it keeps)."""
        from benchmarks.dataset_source import prompt_token_counts

        if getattr(self, "_prompt_counts", (None,))[0] != id(tokenizer):
            prompt_of = functools.partial(self.prompt, tokenizer=tokenizer)
            self._prompt_counts = (id(tokenizer), (prompt_token_counts(self.train, prompt_of, tokenizer),
                                                   prompt_token_counts(self.held_out, prompt_of, tokenizer)))
        return self._prompt_counts[1]

    def drop_long_prompts(self, tokenizer, max_tokens: int) -> tuple[int, int]:
        """Leave out of both pools the problems whose prompt has more than `max_tokens` tokens
        (0: keep all); (training problems left out, training problems there were)."""
        before = len(self.train)
        if max_tokens <= 0:
            return 0, before
        counts = self.prompt_token_counts(tokenizer)
        train, held_out = ([p for p, n in zip(pool, pool_counts) if n <= max_tokens]
                           for pool, pool_counts in zip(self._splits, counts))
        if not train:
            raise UserError(f"task.max_prompt_tokens={max_tokens} leaves none of the {before} training problems; "
                            "raise it")
        self._splits = (train, held_out)
        kept = tuple([n for n in pool_counts if n <= max_tokens] for pool_counts in counts)
        self._prompt_counts = (id(tokenizer), kept)
        return before - len(train), before

    def longest_prompt_tokens(self, tokenizer) -> int:
        """Tokens of the longest prompt of the two pools (0 for none)."""
        return max((n for pool_counts in self.prompt_token_counts(tokenizer) for n in pool_counts), default=0)

    # The name of read_answer's reading (an extraction mode of algorithms that read answers).
    answer_mode = "boxed"

    def read_answer(self, response: str) -> str | None:
        """The final answer of a response as this task's grader reads it, without the gold answer.
        Default: the last \\boxed{}."""
        return extract_answer(response, "boxed")

    def prompt(self, problem: Problem, tokenizer) -> str:
        return build_prompt(problem.question, tokenizer, self.config.prompt_style, **self.prompt_options)

    @property
    def prompt_options(self) -> dict:
        """The system prompt and chat-template arguments of task: (apply_style's options)."""
        return {"system_prompt": self.config.system_prompt, "template_kwargs": self.config.chat_template_kwargs}

    def grade(self, pairs: Sequence[tuple[Problem, str]]) -> list[Verdict]:
        raise NotImplementedError


# ---------------------------------------------------------------- integer answers

# task.answer_format -> the extraction mode of benchmarks.answer_extraction.extract_answer
_EXTRACTION_MODES = {"boxed": "boxed", "boxed_or_last_integer": "boxed_then_last_number"}


def integer_answer(response: str, answer_format: str) -> str | None:
    """The answer text: the last \\boxed{}, or with 'boxed_or_last_integer' the last number in
    the response when nothing is boxed (small models rarely box)."""
    return extract_answer(response, _EXTRACTION_MODES[answer_format])


def grade_integer(response: str, gold: int, answer_format: str) -> Verdict:
    extracted = integer_answer(response, answer_format)
    if extracted is None:
        return Verdict(False, None, "no_answer")
    # An integer literal only: '27 + 82' is not 109 here, whatever a symbolic checker says.
    value = integer_literal_value(extracted)
    correct = value is not None and value == gold
    return Verdict(correct, extracted, "correct" if correct else "wrong")


# ---------------------------------------------------------------- tasks

OPERATIONS = {"add": ("+", lambda a, b: a + b), "sub": ("-", lambda a, b: a - b), "mul": ("*", lambda a, b: a * b)}


@TASKS.register("arithmetic",
                "synthetic integer arithmetic from a seed (task.operations, task.digits); integer-exact reward")
class ArithmeticTask(Task):
    def make_splits(self):
        cfg = self.config  # operations and digits are checked when the config loads (TaskConfig.validate)
        rng = random.Random(self.seed)
        low, high = (0 if cfg.digits == 1 else 10 ** (cfg.digits - 1)), 10 ** cfg.digits - 1
        seen, problems = set(), []
        target = cfg.train_size + cfg.eval_size
        attempts = 0
        # Distinct questions, so the held-out split never repeats a training question.
        while len(problems) < target and attempts < 50 * target:
            attempts += 1
            op = rng.choice(cfg.operations)
            a, b = rng.randint(low, high), rng.randint(low, high)
            symbol, fn = OPERATIONS[op]
            question = f"What is {a} {symbol} {b}?"
            if question in seen:
                continue
            seen.add(question)
            problems.append(Problem(id=f"arith-{len(problems)}", question=question, answer=fn(a, b), meta={"op": op}))
        held_out = problems[: min(cfg.eval_size, len(problems) // 5)]
        return problems[len(held_out):], held_out

    def grade(self, pairs):
        return [grade_integer(response, problem.answer, self.config.answer_format) for problem, response in pairs]

    @property
    def answer_mode(self):
        return self.config.answer_format

    def read_answer(self, response):
        return integer_answer(response or "", self.config.answer_format)


@TASKS.register("copy",
                "toy task for tiny models: repeat the digit of the prompt 'd='; reward if the response starts with it")
class CopyTask(Task):
    def make_splits(self):
        problems = [Problem(id=f"copy-{d}", question=f"{d}=", answer=str(d)) for d in range(10)]
        return problems, problems

    def prompt(self, problem, tokenizer):
        return problem.question  # tiny models have no chat template and no instruction following

    def grade(self, pairs):
        verdicts = []
        for problem, response in pairs:
            first = self.read_answer(response)
            correct = first == problem.answer
            outcome = "correct" if correct else ("no_answer" if first is None else "wrong")
            verdicts.append(Verdict(correct, first, outcome))
        return verdicts

    answer_mode = "first_char"

    def read_answer(self, response):
        return response[:1] if response else None


@TASKS.register("math", "math word problems from a JSON/JSONL/Parquet file or hub dataset (task.path, task.columns); "
                        "graded by math-verify, strict")
class MathTask(Task):
    def make_splits(self):
        from benchmarks.math_benchmarks import load_math_source

        cfg = self.config
        problems = load_math_source(cfg.path, cfg.subset, cfg.split, cfg.revision, cfg.columns)
        rng = random.Random(self.seed)
        order = list(range(len(problems)))
        rng.shuffle(order)
        held = min(self.config.eval_size, len(problems) // 10)
        return [problems[i] for i in order[held:]], [problems[i] for i in order[:held]]

    def grade(self, pairs):
        from benchmarks.math_grading import grade_responses

        return grade_responses([response for _, response in pairs], [problem.answer for problem, _ in pairs])


class CodeTask(Task):
    """Programming problems from a code benchmark; responses run in the sandbox against the
    problem's tests. Reward: all tests pass (task.code_reward all_pass) or the share passed."""

    benchmark = ""

    def make_splits(self):
        from pathlib import Path

        import benchmarks.code_benchmarks  # noqa: F401  (registers the code benchmarks)
        from benchmarks.registry import BENCHMARKS

        data_dir = Path(self.config.path) if self.config.path else None
        problems = BENCHMARKS.get(self.benchmark).load(data_dir, None)
        order = list(range(len(problems)))
        random.Random(self.seed).shuffle(order)
        held = min(self.config.eval_size, len(problems) // 5)
        return [problems[i] for i in order[held:]], [problems[i] for i in order[:held]]

    def prompt(self, problem, tokenizer):
        return problem_prompt("code", problem, tokenizer, self.config.prompt_style, **self.prompt_options)

    def grade(self, pairs):
        from benchmarks.registry import BENCHMARKS

        verdicts = BENCHMARKS.get(self.benchmark).grade(pairs)
        if self.config.code_reward == "pass_rate":
            for verdict in verdicts:
                d = verdict.detail
                total = d.get("base_total", 0) + d.get("plus_total", 0)
                d["credit"] = (d.get("base_ok", 0) + d.get("plus_ok", 0)) / total if total else float(verdict.correct)
        return verdicts


@TASKS.register("mbppplus",
                "MBPP+ programming problems (task.path: data folder, or the hub); sandboxed unit-test reward")
class MbppPlusTask(CodeTask):
    benchmark = "mbppplus"


@TASKS.register("humanevalplus",
                "HumanEval+ programming problems (task.path: data folder, or the hub); sandboxed unit-test reward")
class HumanEvalPlusTask(CodeTask):
    benchmark = "humanevalplus"


def build_task(config, seed: int) -> Task:
    from benchmarks import load_all

    load_all()  # tasks registered outside this module (reasoning-gym's)
    return TASKS.get(config.name)(config, seed)


class PromptSampler:
    """Deterministic, resumable order over a problem pool: a fresh permutation per epoch,
    derived from (seed, epoch), and a position that a checkpoint stores."""

    def __init__(self, size: int, seed: int, position: int = 0):
        self.size, self.seed, self.position = size, seed, position
        self._epoch, self._order = -1, []

    def take(self, count: int) -> list[int]:
        out = []
        for _ in range(count):
            epoch, offset = divmod(self.position, self.size)
            if epoch != self._epoch:
                self._epoch, self._order = epoch, list(range(self.size))
                random.Random(f"{self.seed}:{epoch}").shuffle(self._order)
            out.append(self._order[offset])
            self.position += 1
        return out

"""The evaluation loop of `meds eval`: n samples per problem, graded, scored, resumable.

For every benchmark: load the problems, draw n samples per problem with a generation backend
(the interface of benchmarks/generation.py), grade them with the benchmark's own grade function, append every
sample to `samples.jsonl`, and score with the unbiased pass@k and maj@k of benchmarks.passk
(Chen et al. 2021; Wang et al. 2022) for k = 1, 2, 4, ... up to --k.

Why it is shaped this way:
  - Resume: each problem's samples are appended (one write, flushed) as soon as they are
    graded; a rerun reads the file and draws only what is missing. Seeds are per problem and
    first sample index (`problem_seed`), so the samples of a resumed eval equal those of an
    uninterrupted one. `eval_state.json` holds the settings that shape the samples (model,
    temperature, ...): resuming with different ones is refused instead of mixing samples.
  - Overlap: grading runs in one background thread while the next problem generates, so
    math-verify's workers and the code sandbox cost wall time only when they are slower than
    generation.
  - Time is measured (`timing`): generation vs everything else, the harness's own overhead.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

from benchmarks.answer_extraction import answer_key
from benchmarks.code_rows import row_count_mismatch
from benchmarks.generation import Backend, Generated, Request
from benchmarks.paired_stats import mean_interval, per_problem_pass_at_k
from benchmarks.passk import ks_to_report, mean_maj_at_k, mean_pass_at_k
from benchmarks.prompts import STYLES, problem_prompt
from benchmarks.registry import Benchmark
from meds_cli.core.errors import UserError
from meds_cli.core.files import replace_text
from meds_cli.core.jsonl import append_rows, drop_cut_off_tail, rewrite_rows
from meds_cli.core.records import Problem

SAMPLES_FILE = "samples.jsonl"
STATE_FILE = "eval_state.json"
# Settings that change what a sample is; any other setting (n, k, limit, benchmarks) may change on resume.
SAMPLE_SHAPING = ("model", "backend", "prompt", "system_prompt", "chat_template_kwargs", "temperature", "top_p",
                  "max_new_tokens", "seed", "tools", "max_tool_calls", "tool_output_tokens", "code_tags",
                  "tool_time_limit_s")
# What a state file written before a setting existed means by its absence (no tools: their limits unset).
_SHAPING_DEFAULTS = {"system_prompt": "", "chat_template_kwargs": {}, "tools": []}
SHORT_RESPONSE_TOKENS = 2  # a response this short is almost never an answer to a benchmark problem
CI_RESAMPLES = 2000  # enough for a 95% interval to two decimals; 8 ks x 500 problems stay well under a second
_MAX_PENDING_GRADING = 4  # problems generated but not yet graded; bounds memory if grading lags


@dataclass
class EvalSettings:
    benchmarks: list[str]
    k: int = 128
    n: int | None = None  # samples per problem; None: k
    limit: int | None = None
    data_dir: str | None = None
    prompt: str = "boxed"  # boxed | chat | plain; the command line's 'auto' is resolved before the harness runs
    system_prompt: str = ""  # a run's task.system_prompt
    chat_template_kwargs: dict = field(default_factory=dict)  # a run's task.chat_template_kwargs
    temperature: float = 0.6
    top_p: float = 0.95
    max_new_tokens: int = 4096
    seed: int = 0
    batch_size: int | None = None  # rows per hf decode batch; None: as many as fit in memory
    backend: str = "hf"
    model: str = ""  # label of the model (and checkpoint) being evaluated
    # Tool-integrated reasoning (docs/tools.md): the tools a response may call ([]: none; None until
    # `meds eval` decides: a run trained with tools keeps its rollout.tools) and, with tools, their
    # limits (the rollout.* fields of the same names); None without tools.
    tools: list[str] | None = None
    max_tool_calls: int | None = None
    tool_output_tokens: int | None = None
    code_tags: list[str] | None = None
    tool_time_limit_s: float | None = None

    @property
    def samples(self) -> int:
        return self.n if self.n is not None else self.k

    @property
    def ks(self) -> list[int]:
        return ks_to_report(self.k)

    def validate(self) -> None:
        checks = [
            (self.k >= 1, f"--k must be >= 1, got {self.k}"),
            (self.n is None or self.n >= self.k,
             f"--n ({self.n}) must be at least --k ({self.k}): pass@k needs n >= k samples"),
            (self.limit is None or self.limit >= 1, f"--limit must be >= 1, got {self.limit}"),
            (self.prompt in ("auto", *STYLES),
             f"unknown --prompt '{self.prompt}'; accepted: auto, {', '.join(STYLES)}"),
            (self.temperature >= 0, f"--temperature must be >= 0, got {self.temperature}"),
            (0 < self.top_p <= 1, f"--top-p must be in (0, 1], got {self.top_p}"),
            (self.max_new_tokens >= 1, f"--max-new-tokens must be >= 1, got {self.max_new_tokens}"),
            (self.batch_size is None or self.batch_size >= 1, f"--batch-size must be >= 1, got {self.batch_size}"),
            (bool(self.benchmarks), "--benchmarks is empty; give names such as aime24,math500 (see `meds list`)"),
            (self.max_tool_calls is None or self.max_tool_calls >= 1,
             f"--max-tool-calls must be >= 1, got {self.max_tool_calls}"),
            (self.tool_output_tokens is None or self.tool_output_tokens >= 1,
             f"--tool-output-tokens must be >= 1, got {self.tool_output_tokens}"),
        ]
        for ok, message in checks:
            if not ok:
                raise UserError(message)


class ProgressSink(Protocol):
    """Where the loop reports progress (the CLI's rich bar; None in library use)."""

    def start(self, total: int, done: int) -> None: ...

    def advance(self, samples: int, label: str) -> None: ...


# ---------------------------------------------------------------- prompts and seeds

def problem_seed(seed: int, benchmark: str, problem_id: str, first_sample: int) -> int:
    """A stable 63-bit seed for the samples of one problem from index `first_sample` on
    (sha256, not hash(): Python salts string hashes per process)."""
    digest = hashlib.sha256(f"{seed}/{benchmark}/{problem_id}/{first_sample}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def prompt_for(benchmark: Benchmark, problem: Problem, tokenizer, settings: EvalSettings) -> str:
    """The benchmark's own prompt where it has one (a training task's held-out split is prompted
    as in training), else the settings' style around the problem."""
    if benchmark.prompt is not None:
        return benchmark.prompt(problem, tokenizer)
    return problem_prompt(benchmark.kind, problem, tokenizer, settings.prompt, system_prompt=settings.system_prompt,
                          template_kwargs=settings.chat_template_kwargs)


# ---------------------------------------------------------------- the samples file


class SampleStore:
    """samples.jsonl: one row per sample; read on start (resume), appended per problem.

    The rows of one request ("a draw": samples first .. first+size-1, drawn from one seed) are
    appended in one write, so a kill can cut at most the last draw short. Its surviving rows are
    dropped on reading: the resumed eval draws them again from the same seed and gets the very
    samples an uninterrupted eval would have drawn."""

    def __init__(self, folder: Path):
        self.path = Path(folder) / SAMPLES_FILE
        self.rows: dict[tuple[str, str], dict[int, dict]] = {}
        if self.path.is_file():
            self._read()

    def _read(self) -> None:
        rows = drop_cut_off_tail(self.path)  # a partial last line goes, so the next append starts a line
        whole = whole_draws(rows)
        if len(whole) < len(rows):
            rewrite_rows(self.path, whole, ensure_ascii=False)
        for row in whole:
            self.rows.setdefault((row["benchmark"], row["problem_id"]), {}).setdefault(row["sample"], row)

    def existing(self, benchmark: str, problem_id: str) -> list[dict]:
        """The leading run of samples 0, 1, 2, ... already drawn for a problem."""
        have = self.rows.get((benchmark, problem_id), {})
        rows, index = [], 0
        while index in have:
            rows.append(have[index])
            index += 1
        return rows

    def append(self, rows: list[dict]) -> None:
        append_rows(self.path, rows, ensure_ascii=False)
        for row in rows:
            self.rows.setdefault((row["benchmark"], row["problem_id"]), {}).setdefault(row["sample"], row)


def whole_draws(rows: list[dict]) -> list[dict]:
    """The rows whose draw is complete (rows written before draws were recorded count as whole)."""
    present: dict[tuple, set[int]] = {}
    for row in rows:
        if "draw" in row:
            present.setdefault((row["benchmark"], row["problem_id"], row["draw"]), set()).add(row["sample"])

    def whole(row: dict) -> bool:
        if "draw" not in row:
            return True
        first, size = row["draw"], row.get("draw_size", 0)
        return present[(row["benchmark"], row["problem_id"], first)] >= set(range(first, first + size))

    return [row for row in rows if whole(row)]


def check_state(folder: Path, settings: EvalSettings) -> None:
    """Refuse to add samples to a folder whose samples were drawn with other settings; record
    the settings otherwise."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    path = Path(folder) / STATE_FILE
    mine = {key: getattr(settings, key) for key in SAMPLE_SHAPING}
    mine["tools"] = list(settings.tools or [])  # None (left to `meds eval`, which did not run): no tools
    if path.is_file() and (Path(folder) / SAMPLES_FILE).is_file():
        theirs = json.loads(path.read_text())
        for key in SAMPLE_SHAPING:
            if theirs.get(key, _SHAPING_DEFAULTS.get(key)) != mine[key]:
                raise UserError(
                    f"{folder} holds samples drawn with {key}={theirs.get(key)!r}, not {mine[key]!r}; "
                    f"pass another --output, or delete {folder / SAMPLES_FILE} to start over"
                )
    replace_text(path, json.dumps(mine, indent=2) + "\n")  # a full disk never leaves half of it


# ---------------------------------------------------------------- scoring


def _gold_text(problem: Problem):
    return problem.answer if isinstance(problem.answer, (str, int, float)) else None


def sample_rows(benchmark: Benchmark, problem: Problem, first: int, generated: Generated, verdicts) -> list[dict]:
    rows = []
    for offset, (text, length, truncated, verdict) in enumerate(
            zip(generated.texts, generated.lengths, generated.truncated, verdicts)):
        rows.append({
            "benchmark": benchmark.name, "problem_id": problem.id, "sample": first + offset,
            "draw": first, "draw_size": len(generated.texts),
            "response": text, "extracted": verdict.extracted if benchmark.kind != "code" else None,
            "correct": bool(verdict.correct), "outcome": verdict.outcome, "gold": _gold_text(problem),
            "length": int(length), "truncated": bool(truncated), "time": round(time.time(), 3),
        })
        if generated.tool_stats is not None:
            rows[-1]["tools"] = tool_row(generated.tool_stats[offset])
    if rows:  # the question once per draw, not n times: a reader of samples.jsonl sees what was asked
        rows[0] = {"benchmark": rows[0]["benchmark"], "problem_id": problem.id, "question": problem.question,
                   **rows[0]}
    return rows


def tool_row(stats) -> dict:
    """A response's use of tools as its sample row keeps it (from engine/rollout/tools ToolStats)."""
    return {"calls": int(stats.calls), "errors": int(stats.errors), "timeouts": int(stats.timeouts),
            "observation_tokens": int(stats.observation_tokens), "seconds": round(float(stats.tool_seconds), 3)}


def tool_scores(rows: list[dict]) -> dict | None:
    """The tool columns of a benchmark's scores from its sample rows: calls per response, the share
    of responses that ran a block, tool errors and time-outs per response (a tool error is context
    for the model: the answer is graded as usual). None when no response was sampled with tools."""
    used = [r["tools"] for r in rows if "tools" in r]
    if not used:
        return None
    n = len(used)
    return {"calls_per_response": sum(t["calls"] for t in used) / n,
            "used_share": sum(t["calls"] > 0 for t in used) / n,
            "errors_per_response": sum(t["errors"] for t in used) / n,
            "timeouts_per_response": sum(t["timeouts"] for t in used) / n,
            "observation_tokens_per_response": sum(t["observation_tokens"] for t in used) / n}


def score_benchmark(kind: str, per_problem: list[list[dict]], ks: list[int]) -> dict:
    """Scores of one benchmark from its sample rows (a list of n rows per problem)."""
    counts = [(len(rows), sum(r["correct"] for r in rows)) for rows in per_problem]
    every = [r for rows in per_problem for r in rows]
    outcomes = Counter(r["outcome"] for r in every)
    scores = {
        "kind": kind,
        "problems": len(per_problem),
        "n": min(n for n, _ in counts),
        "pass@k": {str(k): v for k, v in mean_pass_at_k(counts, ks).items()},
        # 95% bootstrap interval over problems of the per-problem unbiased values (exact 0/1 only when k = n)
        "pass@k_ci": {str(k): list(mean_interval([per_problem_pass_at_k(counts, k)], resamples=CI_RESAMPLES))
                      for k in ks},
        "maj@k": None,
        "mean_response_length": sum(r["length"] for r in every) / len(every),
        "truncated": sum(r["truncated"] for r in every),  # responses that hit max_new_tokens
        "responses": len(every),
        "truncated_share": sum(r["truncated"] for r in every) / len(every),
        "short_response_share": sum(r["length"] <= SHORT_RESPONSE_TOKENS for r in every) / len(every),
        "outcomes": dict(sorted(outcomes.items())),
        "timeouts": outcomes.get("timeout", 0) + outcomes.get("Timeout", 0),
    }
    if kind != "code":  # a vote over programs means nothing; over final answers it is self-consistency
        votes = [([r["extracted"] for r in rows], [r["correct"] for r in rows]) for rows in per_problem]
        scores["maj@k"] = {str(k): v for k, v in mean_maj_at_k(votes, ks, key=answer_key).items()}
    tools = tool_scores(every)
    if tools is not None:
        scores["tools"] = tools
    return scores


def average_scores(per_benchmark: dict[str, dict]) -> dict:
    """The unweighted mean over benchmarks (each benchmark counts once, whatever its size)."""
    scored = list(per_benchmark.values())
    if not scored:
        return {}

    def mean_of(metric: str) -> dict[str, float] | None:
        tables = [s[metric] for s in scored if s[metric] is not None]
        if not tables:
            return None
        common = [k for k in tables[0] if all(k in t for t in tables)]
        return {k: sum(t[k] for t in tables) / len(tables) for k in common}

    return {
        "benchmarks": len(scored),
        "pass@k": mean_of("pass@k"),
        "maj@k": mean_of("maj@k"),
        "mean_response_length": sum(s["mean_response_length"] for s in scored) / len(scored),
        "truncated_share": sum(s["truncated_share"] for s in scored) / len(scored),
        "truncated": sum(s.get("truncated", 0) for s in scored),
        "responses": sum(s.get("responses", 0) for s in scored),
        "timeouts": sum(s["timeouts"] for s in scored),
    }


# ---------------------------------------------------------------- the loop


@dataclass
class _Timing:
    load_s: float = 0.0
    generate_s: float = 0.0
    grade_s: float = 0.0
    write_s: float = 0.0
    wait_for_grading_s: float = 0.0  # main thread idle, waiting for the grading thread
    total_s: float = 0.0
    generated_samples: int = 0
    reused_samples: int = 0
    graded_samples: int = 0


@dataclass
class _Job:
    benchmark: Benchmark
    problem: Problem
    first: int
    generated: Generated


@dataclass
class EvalOutcome:
    scores: dict[str, dict]
    average: dict
    timing: dict
    samples_path: Path
    problems: dict[str, int] = field(default_factory=dict)


def load_benchmarks(names: list[str], data_dir: Path | None,
                    limit: int | None) -> list[tuple[Benchmark, list[Problem]]]:
    """Each named benchmark with its (first `limit`) problems; unknown names fail with did-you-mean."""
    from benchmarks import load_all
    from benchmarks.registry import BENCHMARKS

    load_all()
    chosen = [BENCHMARKS.get(name) for name in dict.fromkeys(names)]  # all names checked before any loading
    loaded = []
    for benchmark in chosen:
        problems = benchmark.load(data_dir, limit)
        if not problems:
            raise UserError(f"benchmark '{benchmark.name}' has no problems in {data_dir or 'the dataset hub'}")
        loaded.append((benchmark, problems))
    return loaded


def evaluate(backend: Backend, settings: EvalSettings, folder: Path, progress: ProgressSink | None = None,
             suites: list[tuple[Benchmark, list[Problem]]] | None = None) -> EvalOutcome:
    """Draw, grade and score settings.samples samples per problem of every benchmark; samples
    already in `folder/samples.jsonl` are reused. `suites`: the benchmarks already loaded
    (load_benchmarks), e.g. to fail on a bad name before the model is loaded."""
    settings.validate()
    start = time.perf_counter()
    timing = _Timing()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    check_state(folder, settings)
    store = SampleStore(folder)
    if suites is None:
        data_dir = Path(settings.data_dir) if settings.data_dir else None
        suites = load_benchmarks(settings.benchmarks, data_dir, settings.limit)
    n = settings.samples

    todo: list[tuple[Benchmark, Problem, int]] = []  # (benchmark, problem, first missing sample)
    for benchmark, problems in suites:
        for problem in problems:
            have = len(store.existing(benchmark.name, problem.id))
            timing.reused_samples += min(have, n)
            if have < n:
                todo.append((benchmark, problem, have))
    timing.load_s = time.perf_counter() - start
    if progress is not None:
        progress.start(total=n * sum(len(p) for _, p in suites), done=timing.reused_samples)

    def grade(job: _Job) -> None:
        t0 = time.perf_counter()
        verdicts = job.benchmark.grade([(job.problem, text) for text in job.generated.answer_texts])
        t1 = time.perf_counter()
        store.append(sample_rows(job.benchmark, job.problem, job.first, job.generated, verdicts))
        timing.grade_s += t1 - t0
        timing.write_s += time.perf_counter() - t1
        timing.graded_samples += len(verdicts)
        if progress is not None:
            progress.advance(len(verdicts), job.benchmark.name)

    pending: list[Future] = []
    # On Ctrl-C the executor still grades and saves what was generated before it stops.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="eval-grading") as grader:
        every_request = [Request(prompt_for(b, p, backend.tokenizer, settings), n - first,
                                 problem_seed(settings.seed, b.name, p.id, first)) for b, p, first in todo]
        offset = 0
        for size in backend.call_sizes(every_request):
            chunk, requests = todo[offset:offset + size], every_request[offset:offset + size]
            offset += size
            t0 = time.perf_counter()
            outputs = backend.generate(requests)
            timing.generate_s += time.perf_counter() - t0
            timing.generated_samples += sum(len(o.texts) for o in outputs)
            for (benchmark, problem, first), generated in zip(chunk, outputs):
                pending.append(grader.submit(grade, _Job(benchmark, problem, first, generated)))
            t0 = time.perf_counter()
            while len(pending) > max(_MAX_PENDING_GRADING, size):  # one call's problems grade during the next
                pending.pop(0).result()
            timing.wait_for_grading_s += time.perf_counter() - t0
            for future in [f for f in pending if f.done()]:
                future.result()  # a grading error surfaces here, not at the very end
                pending.remove(future)
        t0 = time.perf_counter()
        for future in pending:
            future.result()
        timing.wait_for_grading_s += time.perf_counter() - t0

    scores = {}
    for benchmark, problems in suites:
        per_problem = [store.existing(benchmark.name, p.id)[:n] for p in problems]
        scores[benchmark.name] = score_benchmark(benchmark.kind, per_problem, settings.ks)
        if getattr(problems, "data", None):  # what the loader found in the data: skipped rows, a row count off
            scores[benchmark.name]["data"] = problems.data
        if mismatch := row_count_mismatch(problems):  # reported with the scores, not mixed in silently
            scores[benchmark.name]["rows"] = mismatch
    timing.total_s = time.perf_counter() - start
    return EvalOutcome(scores, average_scores(scores), asdict(timing), store.path,
                       {b.name: len(p) for b, p in suites})

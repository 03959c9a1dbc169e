"""Paired comparisons of evaluated arms, for `meds eval --compare` and `meds ablate`: from the
samples each eval left beside its results.json to a verdict per benchmark, the per-problem
differences (which problems one arm solved and the other never did) and a plot of the
differences with their intervals. The statistics are benchmarks/paired_stats.py's.

An arm is a label and one eval per seed; two arms are paired seed by seed (position by position)
and, within a seed, problem by problem (by benchmark and problem id). Problems that only one arm
answered are left out and counted. pass@k is compared at k = 1 and at the largest k every
problem of both arms has samples for.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from benchmarks import paired_stats
from benchmarks.passk import pass_at_k
from meds_cli.core.errors import UserError
from meds_cli.core.jsonl import read_rows
from meds_cli.core.read_back import read_json, require

SAMPLES_FILE = "samples.jsonl"
DELTAS_FILE = "problem_deltas.csv"
PLOT_FILE = "paired_differences.png"


@dataclass
class Arm:
    label: str
    evals: list[Path]  # one results.json per seed


def problem_counts(results_file: Path, skipped: list[str] | None = None) -> dict[str, dict[str, tuple[int, int]]]:
    """{benchmark: {problem id: (samples, correct)}} of one eval, from the samples.jsonl beside its
    results.json (the first n samples of each problem, n as the eval's config says). A row that
    is not a sample, or a sample id (benchmark, problem, sample) seen twice (two evals wrote the
    folder at once), is one line; a cut-off last line (a killed eval) is skipped and said in `skipped`."""
    results_file = Path(results_file)
    samples = results_file.parent / SAMPLES_FILE
    if not samples.is_file():
        raise UserError(f"'{results_file.parent}' has no {SAMPLES_FILE}: a paired comparison needs each eval's "
                        "samples, not only its scores")
    config = read_json(results_file).get("config")
    n = config.get("n") if isinstance(config, dict) else None
    require(n is None or (isinstance(n, int) and not isinstance(n, bool) and n > 0), results_file,
            f"has config.n = {n!r}, not a positive integer")
    tally: dict[str, dict[str, list[int]]] = {}
    seen = set()
    for line, row in enumerate(read_rows(samples, skipped if skipped is not None else []), start=1):
        key = (row.get("benchmark"), row.get("problem_id"), row.get("sample"))
        require(isinstance(key[0], str) and isinstance(key[1], (str, int)) and isinstance(key[2], int)
                and not isinstance(key[2], bool) and key[2] >= 0 and isinstance(row.get("correct"), bool),
                samples, f"row {line} is not a sample (benchmark, problem_id, sample and a boolean correct)")
        require(key not in seen, samples, f"row {line} repeats sample {key[2]} of problem {key[1]!r} of {key[0]} "
                "(two evals wrote this folder at once?): its scores would count it twice")
        seen.add(key)
        if n is not None and row["sample"] >= n:
            continue
        counts = tally.setdefault(row["benchmark"], {}).setdefault(str(row["problem_id"]), [0, 0])
        counts[0] += 1
        counts[1] += row["correct"]
    return {bench: {pid: (c[0], c[1]) for pid, c in problems.items()} for bench, problems in tally.items()}


def _change(a: tuple[int, int], b: tuple[int, int], label_a: str, label_b: str) -> str:
    """Which arm solved a problem (in any sample) that the other never did."""
    if a[1] and not b[1]:
        return f"{label_a} only"
    if b[1] and not a[1]:
        return f"{label_b} only"
    return ""


def compare_arms(a: Arm, b: Arm, *, confidence: float = paired_stats.CONFIDENCE,
                 resamples: int = paired_stats.RESAMPLES, seed: int = 0) -> dict:
    """Per benchmark both arms have: the paired difference of pass@1 and pass@k (a - b), its
    verdict line, and one row per problem pair."""
    if len(a.evals) != len(b.evals):
        raise UserError(f"'{a.label}' has {len(a.evals)} evals (seeds) and '{b.label}' {len(b.evals)}; "
                        "a paired comparison needs the same seeds in both")
    seeds = [(problem_counts(x), problem_counts(y)) for x, y in zip(a.evals, b.evals)]
    names = [name for name in seeds[0][0] if all(name in x and name in y for x, y in seeds)]
    benchmarks, rows = {}, []
    for name in names:
        pairs = [[(pid, x[name][pid], y[name][pid]) for pid in x[name] if pid in y[name]] for x, y in seeds]
        left_out = sum(len(x[name]) + len(y[name]) - 2 * len(p) for (x, y), p in zip(seeds, pairs))
        if not all(pairs):
            continue  # a seed with no problem in common: nothing to pair
        top = min(min(ca[0], cb[0]) for p in pairs for _, ca, cb in p)
        entry = {"k": top, "left_out": left_out}
        for k in sorted({1, top}):
            groups_a = [[pass_at_k(*ca, k) for _, ca, _ in p] for p in pairs]
            groups_b = [[pass_at_k(*cb, k) for _, _, cb in p] for p in pairs]
            result = paired_stats.paired_difference(groups_a, groups_b, confidence=confidence, resamples=resamples,
                                                    seed=seed)
            result["verdict"] = paired_stats.verdict_line(a.label, b.label, f"{name} pass@{k}", result)
            entry[f"pass@{k}"] = result
        benchmarks[name] = entry
        for index, p in enumerate(pairs):
            for pid, ca, cb in p:
                rows.append({"a": a.label, "b": b.label, "benchmark": name, "seed": index, "problem_id": pid,
                             "n_a": ca[0], "correct_a": ca[1], "n_b": cb[0], "correct_b": cb[1],
                             "pass@1_delta": round(ca[1] / ca[0] - cb[1] / cb[0], 6),
                             "change": _change(ca, cb, a.label, b.label)})
    if not benchmarks:
        raise UserError(f"'{a.label}' and '{b.label}' share no benchmark problems: nothing to compare")
    return {"a": a.label, "b": b.label, "benchmarks": benchmarks, "problems": rows}


def verdict_lines(comparisons: list[dict]) -> list[str]:
    return [result["verdict"] for c in comparisons for entry in c["benchmarks"].values()
            for key, result in entry.items() if key.startswith("pass@")]


def flipped_summary(comparison: dict) -> str:
    """'3 problems solved by MEDS only, 1 by DAPO only' (solved: in any sample)."""
    a_only = sum(r["change"] == f"{comparison['a']} only" for r in comparison["problems"])
    b_only = sum(r["change"] == f"{comparison['b']} only" for r in comparison["problems"])
    noun = "problem" if a_only == 1 else "problems"
    return f"{a_only} {noun} solved by {comparison['a']} only, {b_only} by {comparison['b']} only (in any sample)"


def markdown(comparisons: list[dict]) -> str:
    """The paired section of a summary.md: one verdict per line, then the flips."""
    lines = ["## Paired differences", "",
             "Problems are the unit (the same problems in both arms, seed by seed); the interval is a "
             "bootstrap over seeds, then problems; p: paired sign-flip test; 'could detect': the smallest "
             "difference this comparison detects with 80% power at the 5% level.", ""]
    lines += [f"- {line}" for line in verdict_lines(comparisons)]
    lines += [""] + [f"- {flipped_summary(c)}" for c in comparisons]
    return "\n".join(lines) + "\n"


def write_problem_deltas(comparisons: list[dict], path: Path) -> Path:
    rows = [row for c in comparisons for row in c["problems"]]
    with Path(path).open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["a", "b"])
        writer.writeheader()
        writer.writerows(rows)
    return Path(path)


def plot_differences(comparisons: list[dict], path: Path) -> Path:
    """One row per (pair, benchmark, k): the paired difference with its interval, a line at 0."""
    import matplotlib

    matplotlib.use("Agg")  # files only; no display on servers
    import matplotlib.pyplot as plt

    entries = [(f"{c['a']} - {c['b']}\n{name} {key}", result) for c in comparisons
               for name, entry in c["benchmarks"].items() for key, result in entry.items() if key.startswith("pass@")]
    fig, ax = plt.subplots(figsize=(7, 0.9 + 0.7 * len(entries)))
    for row, (_, result) in enumerate(entries):
        low, high = result["ci"]
        ax.errorbar(result["delta"], row, xerr=[[result["delta"] - low], [high - result["delta"]]], fmt="o",
                    capsize=4, color="tab:blue")
    ax.axvline(0.0, color="grey", linestyle="--", linewidth=1)
    ax.set_yticks(range(len(entries)), [label for label, _ in entries], fontsize=8)
    ax.invert_yaxis()
    confidence = entries[0][1]["confidence"] if entries else paired_stats.CONFIDENCE
    ax.set_xlabel(f"paired difference of pass@k (bars: {100 * confidence:.0f}% bootstrap interval)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def write_paired(comparisons: list[dict], folder: Path) -> list[Path]:
    """The per-problem deltas and the plot in `folder`; the caller puts the comparisons in its JSON."""
    return [write_problem_deltas(comparisons, Path(folder) / DELTAS_FILE),
            plot_differences(comparisons, Path(folder) / PLOT_FILE)]

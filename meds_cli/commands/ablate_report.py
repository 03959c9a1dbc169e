"""The comparison of `meds ablate`: one row per variant (mean and std over seeds), as a rich table
in the terminal and as summary.md, summary.csv and summary.json, plus reward_curves.png,
pass_at_k.png, and diagnostics.png (reward, distinct wrong answers, one-error groups, entropy,
eigen ratio and MEDS's clusters per step, every arm on one panel each) in the ablation folder.
Each variant is also compared with the baseline problem by problem (benchmarks/paired_compare.py):
a verdict per benchmark in the terminal, summary.md and summary.json, per-problem differences in
problem_deltas.csv, paired_differences.png. Where the grid has the base-model arm (an arm of
train.steps 0: the base model evaluated as is, `base_model: true`), every trained arm is compared
with it too (did training raise pass@1, did it lower pass@k at the largest k), and it is not
compared with the baseline a second time (baseline vs base model is among those). A grid's
`compare:` pairs (e.g. MEDS with random clusters against MEDS) are compared last. The same pairs
of trained arms are compared on the training diagnostics too (distinct wrong answers, one-error
groups, entropy, eigen ratio: each run's last-quarter mean, paired seed by seed, a Student-t
interval over the seeds), since the exploration methods' claims are about those as much as pass@k.

Per run: pass@1 and pass@k from its results.json (k = the largest reported); from metrics.jsonl
the diversity diagnostics every algorithm logs (engine/training/diversity.py: distinct wrong
answers per group, the share of groups with one repeated error, the policy's entropy over the
trained responses' tokens, the top-1 eigen ratio of the logit-lens features), distinct correct
answers per group, the final reward and MEDS's wrong-answer clusters per prompt, each the mean
over the last quarter of the steps (less noisy than the last step alone), and the mean time per
step; and the agreement of MEDS's clusters with the final answers (adjusted Rand index, as
`meds cluster-inspect` computes it, over the memory of the last checkpoint, with the run's own
clusterer). An algorithm other than MEDS has no memory: its clusters and ARI are empty. Runs
logged before the `diversity/` keys existed are read from the older keys (STEP_KEYS).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from benchmarks.paired_compare import Arm, compare_arms, flipped_summary, verdict_lines, write_paired
from benchmarks.paired_compare import markdown as paired_markdown
from benchmarks.paired_stats import seed_paired_difference, verdict_word
from benchmarks.passk import mean_pass_at_k
from meds_cli.commands.plotting import pyplot as _pyplot
from meds_cli.core.jsonl import read_rows
from meds_cli.core.markup import plain
from meds_cli.core.read_back import numbers_of, probability, read_json, require
from meds_cli.core.report_console import print_table
from meds_cli.engine.run_folders import run_dir as runs

METRICS = [  # (key, column header)
    ("pass@1", "pass@1"), ("pass@k", "pass@k"), ("final_reward", "reward"),
    ("distinct_wrong", "distinct wrong"), ("distinct_correct", "distinct correct"),
    ("one_error", "one-error groups"), ("entropy", "entropy"), ("clusters", "clusters"),
    ("eigen_ratio", "eigen ratio"), ("ari", "ARI"),
    ("time_per_step_s", "s/step"),
]


# Per reported value, the metrics.jsonl keys it is read from: the first a run logged (the older
# key of the same quantity for runs from before the diversity/ keys; MEDS runs logged its own
# eigen ratio, over the trained groups' MEDS features, before every arm logged one).
STEP_KEYS = {
    "reward": ("reward",),
    "distinct_wrong": ("diversity/distinct_wrong_per_group", "distinct_wrong_answers_per_group"),
    "distinct_correct": ("distinct_correct_answers_per_group",),
    "one_error": ("diversity/one_error_group_share",),
    "entropy": ("diversity/entropy", "entropy"),
    "eigen_ratio": ("diversity/eigen_ratio_top1", "meds/eigen_ratio_top1"),
    "clusters": ("meds/clusters_per_prompt",),
}

# (curve name in the results, STEP_KEYS entry, axis label): what diagnostics.png plots per step.
STEP_CURVES = [
    ("reward_curve", "reward", "reward (unshaped, sampled batch)"),
    ("distinct_wrong_curve", "distinct_wrong", "distinct wrong answers per group"),
    ("one_error_curve", "one_error", "share of erring groups with one repeated error"),
    ("entropy_curve", "entropy", "entropy (trained tokens)"),
    ("eigen_ratio_curve", "eigen_ratio", "eigen ratio, top-1 (logit-lens features)"),
    ("clusters_curve", "clusters", "wrong-answer clusters per prompt (MEDS)"),
]


def logged_key(rows: list[dict], value: str) -> str:
    """The metrics.jsonl key `value` is read from in these rows (STEP_KEYS: the first logged)."""
    keys = STEP_KEYS[value]
    return next((key for key in keys if any(key in r for r in rows)), keys[0])


def _tail_mean(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if key in r]
    if not values:
        return None
    tail = values[-max(1, len(values) // 4):]
    return float(np.mean(tail))


def memory_ari(run_dir: Path) -> float | None:
    """Mean ARI of clusters vs final answers over the prompts of the last checkpoint's memory,
    clustered as training clusters (the run's own settings, the random control's shuffle included)."""
    from meds_cli.commands.cluster_inspect import analyse_prompt, load_memory, run_settings
    from meds_cli.engine.config import load_config

    cfg = load_config([str(run_dir / "config.yaml")])
    if cfg.algo.name != "meds" or not runs.list_checkpoints(run_dir):
        return None
    settings = run_settings(run_dir)
    _, memory, _ = load_memory(run_dir, None)
    aris = [analyse_prompt(pid, kinds, settings)["ari_answers"] for pid, kinds in sorted(memory.items())]
    aris = [a for a in aris if a is not None]
    return float(np.mean(aris)) if aris else None


def results_pass_at_k(results_file: Path) -> dict[int, float]:
    """{k: pass@k} of a results.json's average, checked: a malformed file, a k that is not a
    positive integer, or a value outside [0, 1] (NaN included) is one line naming the file."""
    document = read_json(results_file)
    average = document.get("average")
    passk = average.get("pass@k") if isinstance(average, dict) else None
    require(isinstance(passk, dict) and bool(passk), results_file, "has no average pass@k")
    require(all(isinstance(k, str) and k.isdigit() and int(k) >= 1 for k in passk), results_file,
            f"has pass@k at ks {sorted(passk)}, not positive integers")
    benchmarks = document.get("benchmarks")
    require(isinstance(benchmarks, dict), results_file, "has no scores per benchmark")
    for name, scores in benchmarks.items():
        inner = scores.get("pass@k") if isinstance(scores, dict) else None
        require(isinstance(inner, dict), results_file, f"has no pass@k for benchmark {name!r}")
        for k, value in inner.items():
            probability(value, results_file, f"benchmarks.{name}.pass@k[{k}]")
    return {int(k): probability(value, results_file, f"average pass@k[{k}]") for k, value in passk.items()}


def sample_pass_at_k(results_file: Path, ks: list[int], skipped: list[str]) -> dict[int, float]:
    """{k: pass@k} recomputed from the samples.jsonl beside results.json (the source of truth),
    the unweighted mean over benchmarks as the eval's average; ks above a problem's samples left out."""
    from benchmarks.paired_compare import problem_counts

    per_benchmark = problem_counts(results_file, skipped)
    require(bool(per_benchmark), results_file.parent / "samples.jsonl", "holds no samples")
    fewest = min(n for problems in per_benchmark.values() for n, _ in problems.values())
    ks = [k for k in ks if k <= fewest]
    means = [mean_pass_at_k(list(problems.values()), ks) for problems in per_benchmark.values()]
    return {k: float(np.mean([m[k] for m in means])) for k in ks}


def checked_pass_at_k(results_file: Path, warnings: list[str]) -> dict[int, float]:
    """pass@k from the samples; a results.json whose values disagree with them is said in `warnings`
    (the report keeps the samples' values)."""
    written = results_pass_at_k(results_file)
    found = sample_pass_at_k(results_file, sorted(written), warnings)
    differ = [k for k in found if abs(found[k] - written[k]) > 1e-6]
    if differ:
        k = differ[0]
        warnings.append(f"{results_file} says pass@{k} = {written[k]:.4f}, its samples give {found[k]:.4f}: the "
                        "report uses the samples (was results.json edited, or written by another eval?)")
    return found


def variant_result(run_dir: Path, results_file: Path, warnings: list[str] | None = None) -> dict:
    """The metrics of one trained and evaluated run: pass@k from its samples, the rest from its
    metrics.jsonl (checked: a value that is not a number is one line naming the file)."""
    warnings = warnings if warnings is not None else []
    metrics = Path(run_dir) / runs.METRICS_FILE
    rows = read_rows(metrics, warnings)
    numbers_of(rows, metrics, ["time_step_s", "step", *(key for keys in STEP_KEYS.values() for key in keys)])
    key = {value: logged_key(rows, value) for value in STEP_KEYS}
    passk = checked_pass_at_k(results_file, warnings) if results_file.is_file() else {}
    ks = sorted(passk)
    times = [r["time_step_s"] for r in rows if "time_step_s" in r]
    return {
        "pass@1": passk.get(1), "pass@k": passk.get(ks[-1]) if ks else None, "k": ks[-1] if ks else None,
        "final_reward": _tail_mean(rows, key["reward"]),
        **{value: _tail_mean(rows, key[value]) for value in STEP_KEYS if value != "reward"},
        "ari": memory_ari(run_dir),
        "time_per_step_s": float(np.mean(times)) if times else None,
        **{curve: [[r["step"], r[key[value]]] for r in rows if key[value] in r] for curve, value, _ in STEP_CURVES},
        "pass_at_k_curve": {k: passk[k] for k in ks},
    }


def mean_std(values: list) -> tuple[float | None, float | None]:
    """Mean and sample std (ddof 1) of the values that exist; std None with fewer than two."""
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    return float(np.mean(values)), (float(np.std(values, ddof=1)) if len(values) > 1 else None)


def aggregate(variants, results: dict[str, dict]) -> list[dict]:
    """One row per group (variant without its seed), in the variants' order."""
    groups: dict[str, list] = {}
    for v in variants:
        groups.setdefault(v.group, []).append(results[v.name])
    rows = []
    for group, members in groups.items():
        row = {"variant": group, "seeds": len(members)}
        for key, _ in METRICS:
            row[key], row[f"{key}_std"] = mean_std([m[key] for m in members])
        rows.append(row)
    return rows


def _cell(mean, std, digits: int = 3) -> str:
    if mean is None:
        return "-"
    return f"{mean:.{digits}f}" + (f"±{std:.{digits}f}" if std is not None else "")


def arm_setup(run_dir: Path, overrides: dict) -> str:
    """What an arm runs, from its config.yaml (setup_text); '-' before the folder has one."""
    from meds_cli.engine.config import load_config

    if not (run_dir / "config.yaml").is_file():
        return "-"
    return setup_text(load_config([str(run_dir / "config.yaml")]), overrides)


def setup_text(cfg, overrides: dict) -> str:
    """What an arm runs: the algorithm, the base it sits on when it composes (`outcome-ucb on
    grpo`), its key settings (the class's `key_settings`) and the variant's own overrides, so that
    a table (the report's, the dry run's) shows an arm on GRPO beside one on DAPO."""
    from algorithms import ALGORITHMS

    if cfg.train.steps == 0:
        return f"{cfg.model.name}, untrained (train.steps=0)"
    cls = ALGORITHMS.get(cfg.algo.name)
    own = cls.key_settings(cfg.algorithms[cfg.algo.name])
    settings = {f"{cfg.algo.name}.{key}": value for key, value in own.items()}
    settings.update({k: v for k, v in overrides.items() if k not in ("algo.name", "train.seed")})
    head = f"{cfg.algo.name} on {cfg.algo.base}" if cls.composes else cfg.algo.name
    return "; ".join([head] + [f"{k}={v}" for k, v in settings.items()])


def markdown_table(rows: list[dict], k: int | None) -> str:
    headers = ["variant", "seeds", "setup"] + [h.replace("pass@k", f"pass@{k}" if k else "pass@k") for _, h in METRICS]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(["---", "---:", "---"] + ["---:"] * (len(headers) - 3))
             + "|"]
    for row in rows:
        cells = [row["variant"], str(row["seeds"]), row.get("setup", "-")] + [
            _cell(row[key], row[f"{key}_std"]) for key, _ in METRICS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def rich_table(rows: list[dict], k: int | None, title: str):
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    table.add_column("variant", no_wrap=True)
    table.add_column("seeds", justify="right")
    table.add_column("setup")
    for _, header in METRICS:
        table.add_column(header.replace("pass@k", f"pass@{k}" if k else "pass@k"), justify="right")
    for row in rows:
        table.add_row(row["variant"], str(row["seeds"]), row.get("setup", "-"),
                      *(_cell(row[key], row[f"{key}_std"]) for key, _ in METRICS))
    return table


def write_csv(rows: list[dict], path: Path) -> None:
    columns = ["variant", "seeds"] + [c for key, _ in METRICS for c in (key, f"{key}_std")]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({c: "" if row[c] is None else row[c] for c in columns})


# ---------------------------------------------------------------- plots


def curves_over_seeds(variants, results: dict[str, dict], key: str) -> dict[str, tuple[list, np.ndarray, np.ndarray]]:
    """Per variant group: (x values, mean over seeds, std over seeds; 0 with one seed) of the
    {x: y} curve results[variant][key]; an x missing from some seeds averages the others."""
    groups: dict[str, list[dict]] = {}
    for v in variants:
        groups.setdefault(v.group, []).append(dict(results[v.name][key]))
    out = {}
    for group, curves in groups.items():
        xs = sorted(set().union(*curves))
        values = [[c[x] for c in curves if x in c] for x in xs]
        mean = np.array([np.mean(v) for v in values])
        std = np.array([np.std(v, ddof=1) if len(v) > 1 else 0.0 for v in values])
        out[group] = (xs, mean, std)
    return out


def _save(fig, ax, path: Path, xlabel: str, ylabel: str, title: str) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)


def arm_colours(variants) -> dict[str, str]:
    """One colour per variant group, the same in every panel and plot: a group that did not log a
    curve (the baseline's clusters) must not shift the others' colours."""
    return {group: f"C{i % 10}" for i, group in enumerate(dict.fromkeys(v.group for v in variants))}


def integer_steps(ax) -> None:
    """Steps are whole numbers: no 1.5 on the x axis of a short run."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def trailing_mean(values: np.ndarray, window: int) -> np.ndarray:
    """Each value replaced by the mean of the last `window` values up to it (fewer at the start)."""
    sums = np.cumsum(np.concatenate([[0.0], np.asarray(values, dtype=float)]))
    ends = np.arange(1, len(values) + 1)
    starts = np.maximum(0, ends - window)
    return (sums[ends] - sums[starts]) / (ends - starts)


# Per-step values of a long run are noisy (one batch of 16 groups a step): past this many steps the
# curves are drawn as trailing means over a thirtieth of the run, so arms a few hundredths apart
# can be told apart by eye. The report's numbers never read the smoothed curves.
SMOOTH_FROM_STEPS = 60


def smoothing_window(steps: int) -> int:
    return max(1, steps // 30) if steps >= SMOOTH_FROM_STEPS else 1


def _draw_step_curves(ax, variants, results: dict[str, dict], curve: str) -> None:
    """The curve of every variant group on `ax`: mean over seeds, a band of one std (both trailing
    means on a long run: smoothing_window); a group that did not log it (the baseline's clusters)
    is left out."""
    colours = arm_colours(variants)
    for group, (steps, mean, std) in curves_over_seeds(variants, results, curve).items():
        if not steps:
            continue
        window = smoothing_window(len(steps))
        mean, std = trailing_mean(mean, window), trailing_mean(std, window)
        label = group if window == 1 else f"{group} (mean of {window} steps)"
        ax.plot(steps, mean, marker="o" if window == 1 else None, markersize=2, label=label, color=colours[group])
        if std.any():
            ax.fill_between(steps, mean - std, mean + std, alpha=0.2, color=colours[group])
    integer_steps(ax)


def plot_reward_curves(variants, results: dict[str, dict], path: Path) -> None:
    """Reward per step, mean over seeds with a band of one std."""
    fig, ax = _pyplot().subplots(figsize=(7, 4.5))
    _draw_step_curves(ax, variants, results, "reward_curve")
    _save(fig, ax, path, "step", "reward (unshaped, sampled batch)", "reward per step (mean over seeds, band: one std)")


def plot_step_diagnostics(variants, results: dict[str, dict], path: Path) -> None:
    """One panel per STEP_CURVES entry: its value per step, mean over seeds with a band of one std."""
    fig, axes = _pyplot().subplots(3, 2, figsize=(11, 11))
    for ax, (curve, _, label) in zip(axes.flat, STEP_CURVES):
        _draw_step_curves(ax, variants, results, curve)
        ax.set_xlabel("step")
        ax.set_ylabel(label)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle("training diagnostics per step (mean over seeds, band: one std)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)


def plot_pass_at_k(variants, results: dict[str, dict], path: Path) -> None:
    """pass@k against k (log scale), mean over seeds with error bars of one std; the base-model
    arm, where there is one, a black dashed line: the curve every trained arm reads against."""
    fig, ax = _pyplot().subplots(figsize=(7, 4.5))
    colours, untrained = arm_colours(variants), untrained_groups(variants)
    for group, (ks, mean, std) in curves_over_seeds(variants, results, "pass_at_k_curve").items():
        if ks:
            style = {"color": "black", "linestyle": "--"} if group in untrained else {"color": colours[group]}
            ax.errorbar(ks, mean, yerr=std, marker="o", markersize=3, capsize=3, label=group, **style)
    ax.set_xscale("log", base=2)
    _save(fig, ax, path, "k", "pass@k", "pass@k per variant (mean over seeds, bars: one std)")


# ---------------------------------------------------------------- the report


def untrained_groups(variants) -> list[str]:
    """The groups of the base-model arm (train.steps 0): the model the others started from."""
    from meds_cli.commands.ablate_grid import trains

    return list(dict.fromkeys(v.group for v in variants if not trains(v.overrides)))


def baseline_group(variants) -> str:
    """The group every other is compared with: the baseline run of the base algorithm, else the
    first trained group (the base-model arm is compared with in its own right)."""
    untrained = untrained_groups(variants)
    groups = [g for g in dict.fromkeys(v.group for v in variants) if g not in untrained] or untrained
    return next((g for g in groups if g.startswith("baseline-")), groups[0])


def comparison_pairs(variants, compare=()) -> list[tuple[str, str]]:
    """(group, other) pairs the report compares: each trained group against the baseline group,
    then against the base-model arm where the grid has one, then the grid's `compare` pairs."""
    base, untrained = baseline_group(variants), untrained_groups(variants)
    groups = list(dict.fromkeys(v.group for v in variants))
    pairs = [(group, base) for group in groups if group != base and group not in untrained]
    pairs += [(group, start) for start in untrained for group in groups if group not in untrained]
    pairs += [tuple(pair) for pair in compare if set(pair) <= set(groups) and tuple(pair) not in pairs]
    return pairs


def seeds_by_group(variants, values: dict[str, object]) -> dict[str, dict[int, object]]:
    """{group: {seed: values[variant name]}}."""
    by_group: dict[str, dict] = {}
    for v in variants:
        by_group.setdefault(v.group, {})[v.seed] = values[v.name]
    return by_group


def paired_against_baseline(variants, paths: dict[str, Path], compare=()) -> list[dict]:
    """comparison_pairs (arms that finished), paired seed by seed (the seeds both ran) and problem
    by problem: benchmarks/paired_compare.py's comparisons."""
    by_group = seeds_by_group(variants, paths)
    comparisons = []
    for group, other in comparison_pairs(variants, compare):
        seeds = [s for s in by_group[group] if s in by_group[other]]
        comparisons.append(compare_arms(Arm(group, [by_group[group][s] for s in seeds]),
                                        Arm(other, [by_group[other][s] for s in seeds])))
    return comparisons


# The training diagnostics compared seed by seed (the last quarter's mean of each run): whether an
# arm keeps its wrong answers more diverse than another is a claim about training, not pass@k.
DIAGNOSTICS_COMPARED = [("distinct_wrong", "distinct wrong"), ("one_error", "one-error groups"),
                        ("entropy", "entropy"), ("eigen_ratio", "eigen ratio")]


def diagnostic_comparisons(variants, results: dict[str, dict], compare=()) -> list[dict]:
    """Per trained pair of comparison_pairs and per DIAGNOSTICS_COMPARED value both arms logged on
    at least two shared seeds: paired_stats.seed_paired_difference of their last-quarter means."""
    by_group = seeds_by_group(variants, results)
    comparisons = []
    for group, other in comparison_pairs(variants, compare):
        for key, label in DIAGNOSTICS_COMPARED:
            seeds = [s for s in by_group[group] if s in by_group[other]
                     and by_group[group][s].get(key) is not None and by_group[other][s].get(key) is not None]
            if len(seeds) < 2:
                continue
            result = seed_paired_difference([by_group[group][s][key] for s in seeds],
                                            [by_group[other][s][key] for s in seeds])
            comparisons.append({"a_label": group, "b_label": other, "metric": label, **result})
    return comparisons


def diagnostic_line(c: dict) -> str:
    """'meds - dapo distinct wrong +0.41, 95% CI [+0.12, +0.70] over 5 seeds (5 of 5 the same sign): meds higher'."""
    low, high = c["ci"]
    return (f"{c['a_label']} - {c['b_label']} {c['metric']} {c['delta']:+.3f}, {100 * c['confidence']:.0f}% CI "
            f"[{low:+.3f}, {high:+.3f}] over {c['seeds']} seeds ({c['same_sign']} of {c['seeds']} the same sign): "
            f"{verdict_word(low, high, c['a_label'], c['b_label'])}")


def diagnostics_markdown(comparisons: list[dict]) -> str:
    return ("## Training diagnostics, seed by seed\n\nEach arm's mean over the last quarter of its steps, "
            "paired seed by seed; a Student-t interval over the seeds.\n\n" +
            "".join(f"- {diagnostic_line(c)}\n" for c in comparisons))


def unfinished_lines(unfinished: dict[str, dict]) -> list[str]:
    """One line per task that did not finish: its state and the last line of its error or log."""
    return [f"{name}: {item['state']}" + (f": {item['last_line']}" if item.get("last_line") else "")
            for name, item in unfinished.items()]


def write_report(folder: Path, variants, paths: dict[str, Path], console,
                 unfinished: dict[str, dict] | None = None, compare=()) -> dict:
    """The report of the finished `variants`, `paths` their results files by name; `unfinished`
    {name: {state, last_line}} names the tasks that failed or have not finished (summary.md,
    summary.json and the terminal)."""
    unfinished = unfinished or {}
    missing = unfinished_lines(unfinished)
    if missing:
        console.print(f"[yellow]{len(missing)} of {plain(len(variants) + len(missing))} tasks not finished[/]:")
        for line in missing:
            console.print(f"  {line}", markup=False, highlight=False, soft_wrap=True)
    if not variants:
        console.print("no task has finished yet: no report")
        return {"folder": str(folder), "rows": [], "unfinished": unfinished}

    warnings: list[str] = []
    results = {v.name: variant_result(folder / v.name, paths[v.name], warnings) for v in variants}
    for line in warnings:
        console.print(f"[yellow]warning:[/] {plain(line)}", highlight=False, soft_wrap=True)
    rows = aggregate(variants, results)
    setups = {v.group: arm_setup(folder / v.name, v.overrides) for v in variants}
    for row in rows:
        row["setup"] = setups[row["variant"]]
    k = max((r["k"] for r in results.values() if r["k"]), default=None)
    comparisons = paired_against_baseline(variants, paths, compare)
    diagnostics = diagnostic_comparisons(variants, results, compare)
    (folder / "summary.md").write_text(f"# Ablation: {folder.name}\n\n" + markdown_table(rows, k) +
                                       "\nmean ± std over seeds; reward, distinct wrong / correct answers per group, "
                                       "one-error groups (share of the groups with two or more wrong answers whose "
                                       "wrong answers are all one), entropy, clusters and eigen ratio (top-1, of the "
                                       "logit-lens features at the answer, every arm): mean of the last quarter of "
                                       "the steps; clusters, ARI (clusters vs final answers in the memory): MEDS "
                                       "only.\n" +
                                       (f"\n{paired_markdown(comparisons)}" if comparisons else "") +
                                       (f"\n{diagnostics_markdown(diagnostics)}" if diagnostics else "") +
                                       ("\n## Warnings\n\n" + "".join(f"- {line}\n" for line in warnings)
                                        if warnings else "") +
                                       ("\n## Not finished\n\n" + "".join(f"- {line}\n" for line in missing)
                                        if missing else ""))
    write_csv(rows, folder / "summary.csv")
    summary = {"folder": str(folder), "k": k, "rows": rows, "paired": comparisons, "diagnostics_paired": diagnostics,
               "runs": {name: {key: value for key, value in r.items()} for name, r in results.items()},
               "variants": [{"name": v.name, "group": v.group, "seed": v.seed, "overrides": v.overrides}
                            for v in variants],
               "unfinished": unfinished, "warnings": warnings,
               "skipped_lines": sum("cut short" in line for line in warnings)}
    (folder / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if comparisons:
        write_paired(comparisons, folder)
    plot_reward_curves(variants, results, folder / "reward_curves.png")
    plot_pass_at_k(variants, results, folder / "pass_at_k.png")
    plot_step_diagnostics(variants, results, folder / "diagnostics.png")
    from rich.console import Console

    out = Console()  # the result goes to stdout, progress to stderr
    print_table(rich_table(rows, k, f"ablation {plain(folder)}"), console=out)
    lines = verdict_lines(comparisons) + [flipped_summary(c) for c in comparisons]
    for line in lines + [diagnostic_line(c) for c in diagnostics]:
        out.print(line, markup=False, highlight=False, soft_wrap=True)
    console.print(f"report: {folder / 'summary.md'}  {folder / 'summary.csv'}  {folder / 'summary.json'}  "
                  f"plots: {folder / 'reward_curves.png'}  {folder / 'pass_at_k.png'}  {folder / 'diagnostics.png'}",
                  markup=False, highlight=False, soft_wrap=True)
    return summary

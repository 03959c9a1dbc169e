"""What `meds eval` leaves behind and shows: results.json, the score table, the pass@k plot,
and the comparison of several evals (`meds eval --compare`: the table, the curves, and the
paired difference of each eval against the first, problem by problem, from their samples).

results.json is the one source for reports: the table, the plot and --compare all read the
same document, so a comparison of old evals needs no model and no generation.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from benchmarks.paired_compare import Arm, compare_arms, flipped_summary, verdict_lines, write_paired
from benchmarks.paired_compare import markdown as paired_markdown
from meds_cli.core.errors import UserError
from meds_cli.core.files import output_folder, replace_figure, replace_text
from meds_cli.core.markup import plain
from meds_cli.core.report_console import print_table

RESULTS_FILE = "results.json"
PLOT_FILE = "pass_at_k.png"
# Above this share of responses cut at the length limit, an eval's scores measure the limit more than
# the model (a cut response has no final answer), and every report says so.
TRUNCATION_WARN_SHARE = 0.10


def write_results(folder: Path, document: dict) -> Path:
    path = Path(folder) / RESULTS_FILE
    replace_text(path, json.dumps(document, indent=2) + "\n")  # never half a file, even on a full disk
    return path


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def _shown_ks(ks: list[str], limit: int = 6) -> list[str]:
    """At most `limit` k columns: the first ones and the last (k = 1, 2, 4, 8, ..., 128)."""
    return ks if len(ks) <= limit else ks[: limit - 1] + ks[-1:]


def _truncated_cell(scores: dict) -> str:
    """Responses that hit the length limit: 'count (share %)' (the share alone, or '-', for older results)."""
    share = _pct(scores.get("truncated_share"))
    return f"{scores['truncated']} ({share}%)" if "truncated" in scores else share


def truncation_line(document: dict) -> str:
    """'truncated at the L-token limit: <benchmark> N of M (x%), ...': every report prints it."""
    limit = document["config"].get("max_new_tokens")
    parts = [f"{name} {scores['truncated']} of {scores['responses']} ({_pct(scores.get('truncated_share'))}%)"
             if "truncated" in scores and "responses" in scores else f"{name} {_pct(scores.get('truncated_share'))}%"
             for name, scores in document["benchmarks"].items()]
    return f"truncated at the {limit}-token limit: {', '.join(parts)}"


def truncation_warning(document: dict, lever: str = "--max-new-tokens") -> str | None:
    """A line naming the benchmarks where more than TRUNCATION_WARN_SHARE of the responses hit the
    length limit, and the setting that raises it in the command that is running (`lever`: meds
    eval's option by default; `meds ablate --max-new-tokens` inside an ablation); None when none did."""
    share = TRUNCATION_WARN_SHARE
    limit = document["config"].get("max_new_tokens")
    hit = [f"{name} {_pct(scores['truncated_share'])}%" for name, scores in document["benchmarks"].items()
           if scores.get("truncated_share", 0) > share]
    if not hit:
        return None
    example = f" (e.g. {lever} {2 * limit})" if limit else ""
    return (f"more than {100 * share:.0f}% of the responses hit the {limit}-token limit ({', '.join(hit)}): they are "
            f"cut off before their answer, so the scores measure the limit more than the model; raise it with "
            f"{lever}{example}")


def _problems_cell(scores: dict) -> str:
    """The problem count, and the known row count where the data had another one."""
    rows = scores.get("rows")
    return f"{scores['problems']} [red](expected {rows['expected']})[/]" if rows else str(scores["problems"])


TOOL_COLUMNS = ("tool calls", "used tool", "tool errors", "tool time-outs")


def tool_cells(scores: dict) -> list[str]:
    """The tool columns of one row (TOOL_COLUMNS): calls per response, the share of responses that
    ran a block (%), errors and time-outs per response; '-' where the row has no tool scores."""
    tools = scores.get("tools")
    if not tools:
        return ["-"] * len(TOOL_COLUMNS)
    return [f"{tools['calls_per_response']:.2f}", _pct(tools["used_share"]), f"{tools['errors_per_response']:.2f}",
            f"{tools['timeouts_per_response']:.2f}"]


def score_table(document: dict, title: str | None = None) -> Table:
    """One row per benchmark plus the average: pass@k (%), maj@k at the largest k, length, truncation;
    the tool columns (tool_cells) beside them when the eval ran with tools."""
    rows = list(document["benchmarks"].items())
    ks = _shown_ks(list(rows[0][1]["pass@k"])) if rows else []
    top = ks[-1] if ks else "1"
    table = Table(title=title or f"{plain(document.get('model', '?'))}  (n={plain(document['config'].get('n'))})",
                  title_justify="left")
    table.add_column("benchmark")
    table.add_column("problems", justify="right")
    for k in ks:
        table.add_column(f"pass@{k}", justify="right")
    table.add_column(f"maj@{top}", justify="right")
    table.add_column("length", justify="right")
    table.add_column("truncated", justify="right")
    table.add_column("time-outs", justify="right")
    with_tools = any(scores.get("tools") for _, scores in rows)
    for column in TOOL_COLUMNS if with_tools else ():
        table.add_column(column, justify="right")
    average = document.get("average") or {}
    entries = rows + ([("average", {**average, "problems": sum(s["problems"] for _, s in rows)})]
                      if len(rows) > 1 else [])
    for name, scores in entries:
        maj = (scores.get("maj@k") or {}).get(top)
        table.add_row(
            f"[bold]{name}[/]" if name == "average" else name, _problems_cell(scores),
            *[_pct(scores["pass@k"].get(k)) for k in ks], _pct(maj),
            f"{scores['mean_response_length']:.0f}", _truncated_cell(scores), str(scores["timeouts"]),
            *(tool_cells(scores) if with_tools else []),
        )
    notes = [f"{name}: {scores['data']['note']}" for name, scores in rows if (scores.get("data") or {}).get("note")]
    if notes:  # the data was not what the benchmark should be: say so under the scores
        table.caption, table.caption_justify = "\n".join(f"warning: {note}" for note in notes), "left"
    return table


def plot_pass_at_k(curves: list[tuple[str, dict]], path: Path) -> Path:
    """pass@k against k (log2 axis), one panel per benchmark, one line per labelled results document,
    with its 95% interval over problems as a band where the results have one."""
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and in tests
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(name for _, doc in curves for name in doc["benchmarks"]))
    cols = min(3, len(names))
    rows = -(-len(names) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names):
        for label, doc in curves:
            scores = doc["benchmarks"].get(name)
            if scores is None:
                continue
            ks = [int(k) for k in scores["pass@k"]]
            [line] = ax.plot(ks, [100 * v for v in scores["pass@k"].values()], marker="o", label=label)
            intervals = scores.get("pass@k_ci") or {}
            if all(str(k) in intervals for k in ks):  # the 95% bootstrap interval over problems
                ax.fill_between(ks, [100 * intervals[str(k)][0] for k in ks], [100 * intervals[str(k)][1] for k in ks],
                                color=line.get_color(), alpha=0.15)
        ax.set_xscale("log", base=2)
        banded = any(all(str(k) in (s.get("pass@k_ci") or {}) for k in s["pass@k"])
                     for s in (doc["benchmarks"].get(name) for _, doc in curves) if s)
        ax.set_title(f"{name}\n(band: 95% interval over problems)" if banded else name)
        ax.set_xlabel("k")
        ax.set_ylabel("pass@k (%)")
        ax.grid(True, alpha=0.3)
    for ax in list(axes.flat)[len(names):]:
        ax.set_visible(False)
    axes.flat[0].legend(fontsize="small")
    fig.tight_layout()
    replace_figure(fig, path, dpi=110)
    plt.close(fig)
    return path


# ---------------------------------------------------------------- --compare


def find_results(target: Path) -> Path:
    """results.json of a file, an eval folder, or a run folder (its latest eval)."""
    target = Path(target)
    if target.is_file():
        return target
    if (target / RESULTS_FILE).is_file():
        return target / RESULTS_FILE
    found = sorted((target / "eval").glob(f"**/{RESULTS_FILE}"), key=lambda p: p.stat().st_mtime) \
        if (target / "eval").is_dir() else []
    if found:
        return found[-1]
    raise UserError(f"no {RESULTS_FILE} in '{target}' (give a results.json, an eval folder, or a run folder "
                    "with eval/ results)")


def load_results(target: Path) -> tuple[str, dict]:
    """(label, results document) of one --compare argument."""
    path = find_results(target)
    try:
        document = json.loads(path.read_text())
        if not all(isinstance(s["pass@k"], dict) and "problems" in s for s in document["benchmarks"].values()):
            raise TypeError("not a benchmark's scores")  # valid JSON of another shape
    except (ValueError, KeyError, TypeError, AttributeError):
        raise UserError(f"'{path}' is not a results.json written by meds eval") from None
    return document.get("model") or path.parent.name, document


def _unique_labels(labelled: list[tuple[str, dict]]) -> list[tuple[str, dict]]:
    seen: dict[str, int] = {}
    out = []
    for label, doc in labelled:
        seen[label] = seen.get(label, 0) + 1
        out.append((label if seen[label] == 1 else f"{label} ({seen[label]})", doc))
    return out


def setting_differences(labelled: list[tuple[str, dict]]) -> list[str]:
    """Where the compared evals were not run alike, one line each: k, the samples per problem n,
    and per benchmark the number of problems (a --limit, another data folder). The table shows
    the pass@k all of them have; the paired lines compare the problems they share."""
    notes = []
    for key, what in (("k", "k (the largest pass@k)"), ("n", "samples per problem n")):
        values = [(label, doc.get("config", {}).get(key)) for label, doc in labelled]
        if len({value for _, value in values if value is not None}) > 1:
            listed = ", ".join(f"{label} {value}" for label, value in values)
            notes.append(f"the evals differ in {what} ({listed})" +
                         (": the table shows the pass@k they all have" if key == "k" else
                          ": pass@k from fewer samples is noisier"))
    names = list(dict.fromkeys(name for _, doc in labelled for name in doc["benchmarks"]))
    for name in names:
        counts = [(label, doc["benchmarks"][name]["problems"]) for label, doc in labelled if name in doc["benchmarks"]]
        if len(counts) < len(labelled):
            missing = [label for label, doc in labelled if name not in doc["benchmarks"]]
            notes.append(f"{name}: not in {', '.join(missing)}'s eval; it is compared only among the others")
        if len({count for _, count in counts}) > 1:
            listed = ", ".join(f"{label} {count}" for label, count in counts)
            notes.append(f"{name}: the evals scored different problems ({listed} problems): the table's rows are "
                         f"not over the same problems; the paired lines compare the problems they share")
    return notes


def comparison_table(labelled: list[tuple[str, dict]]) -> Table:
    """Rows: benchmark x eval; columns: the pass@k values all of them share, and maj@k at the top k."""
    table = Table(title="comparison", title_justify="left")
    table.add_column("benchmark")
    table.add_column("eval")
    key_sets = [list(s["pass@k"]) for _, d in labelled for s in d["benchmarks"].values()]
    common = [k for k in key_sets[0] if all(k in ks for ks in key_sets)] if key_sets else []
    ks = _shown_ks(common)
    for k in ks:
        table.add_column(f"pass@{k}", justify="right")
    top = ks[-1] if ks else None
    table.add_column(f"maj@{top}", justify="right")
    table.add_column("problems", justify="right")
    table.add_column("truncated", justify="right")
    names = list(dict.fromkeys(name for _, doc in labelled for name in doc["benchmarks"]))
    for name in names:
        for label, doc in labelled:
            scores = doc["benchmarks"].get(name)
            if scores is None:
                continue
            table.add_row(name, label, *[_pct(scores["pass@k"].get(k)) for k in ks],
                          _pct((scores.get("maj@k") or {}).get(top)), str(scores["problems"]),
                          _truncated_cell(scores))
        table.add_section()
    notes = setting_differences(labelled)
    if notes:  # under the table, where its numbers are read
        table.caption, table.caption_justify = "\n".join(f"note: {note}" for note in notes), "left"
    return table


def compare(targets: list[Path], output: Path | None, console: Console) -> Path:
    """Draw several evals on one plot and print a comparison table; writes compare.json too."""
    if len(targets) < 2:
        raise UserError(f"--compare needs at least two evals (runs, eval folders or results.json files), "
                        f"got {len(targets)}")
    labelled = _unique_labels([load_results(t) for t in targets])
    folder = Path(output) if output else Path("runs") / f"compare-{time.strftime('%Y%m%d-%H%M%S')}"
    print_table(comparison_table(labelled), console=console)
    for label, doc in labelled:
        warning = truncation_warning(doc, "a new eval with meds eval --max-new-tokens")
        if warning:
            console.print(f"[yellow]warning:[/] {plain(label)}: {plain(warning)}")
    # a write that fails (full disk, read-only place) removes the folder this command created
    with output_folder(folder):
        plot = plot_pass_at_k(labelled, folder / PLOT_FILE)
        summary = {"evals": [{"label": label, "source": str(find_results(t)), "benchmarks": doc["benchmarks"]}
                             for (label, doc), t in zip(labelled, targets)],
                   "notes": setting_differences(labelled)}
        paired = paired_against_first(labelled, targets, console)
        if paired:
            summary["paired"] = paired
            written = write_paired(paired, folder)
            replace_text(folder / "summary.md", f"# Comparison: {', '.join(label for label, _ in labelled)}\n\n"
                         + paired_markdown(paired))
            console.print(f"per-problem differences: {plain(written[0])}  paired plot: {plain(written[1])}  "
                          f"summary: {plain(folder / 'summary.md')}")
        replace_text(folder / "compare.json", json.dumps(summary, indent=2) + "\n")
    console.print(f"plot: {plain(plot)}")
    return folder


def paired_against_first(labelled: list[tuple[str, dict]], targets: list[Path], console: Console) -> list[dict]:
    """Each eval after the first against the first, problem by problem; printed as verdict lines.
    Evals without their samples (an old results.json alone) get a note instead."""
    baseline = Arm(labelled[0][0], [find_results(targets[0])])
    comparisons = []
    for (label, _), target in zip(labelled[1:], targets[1:]):
        try:
            comparisons.append(compare_arms(Arm(label, [find_results(target)]), baseline))
        except UserError as error:
            console.print(f"[yellow]note:[/] no paired statistics for {plain(label)} against "
                          f"{plain(baseline.label)}: {plain(error)}", soft_wrap=True)
    for line in verdict_lines(comparisons):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    for comparison in comparisons:
        console.print(flipped_summary(comparison), markup=False, highlight=False, soft_wrap=True)
    return comparisons

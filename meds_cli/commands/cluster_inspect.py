"""`meds cluster-inspect RUN_DIR`: what the MEDS memory of a run holds, cluster by cluster.

Reads the MEDS memory saved in a checkpoint (checkpoints/step_N/algorithm_<rank>.json; ranks are
merged) and, per prompt, refits the run's own clustering (read from its config.yaml by the
function training reads it with, `algorithms.meds_clusterers.cluster_settings`: clusterer,
noise and one-mode rules, the random control's shuffle) over all its remembered responses,
wrong and correct together, so that a cluster's share of wrong answers means
something (training clusters wrong and correct responses apart; the table also shows the
training's own count of wrong clusters). Writes three PNGs (a PCA projection of one prompt's
memory coloured by cluster, a heatmap of its layer-logit trajectories grouped by cluster, and
the eigen ratio and cluster count over steps from metrics.jsonl) and prints a table, or with
--json the same data as one JSON object.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np

from meds_cli.commands.plotting import pyplot as _pyplot
from meds_cli.core.errors import UserError, nearest
from meds_cli.core.files import output_folder, replace_figure
from meds_cli.core.markup import plain
from meds_cli.engine.run_folders import run_dir as runs
from meds_cli.engine.run_folders.checkpoints import refuse_pickled
from meds_cli.engine.run_folders.state_codec import load_state

SAMPLES = 2  # sample responses shown per cluster
TOP_ANSWERS = 3


def load_memory(run_dir: Path, step: int | None) -> tuple[int, dict, list[int]]:
    """(checkpoint step, {prompt_id: {kind: bank state}}, feature layer numbers) of a MEDS run."""
    checkpoint = runs.find_checkpoint(run_dir, step)
    refuse_pickled(checkpoint)
    files = sorted(checkpoint.glob("algorithm_*.json"))
    if not files:
        raise UserError(f"checkpoint {checkpoint} has no algorithm state (algorithm_<rank>.json)")
    merged: dict = {}
    layers: list[int] = []
    for path in files:
        state = load_state(checkpoint, path.stem)  # data only: nothing in a run folder is unpickled
        if "memory" not in state:
            algo = json.loads((checkpoint / "state.json").read_text()).get("algorithm", "?")
            raise UserError(f"run '{run_dir}' was trained with '{algo}', not meds: it has no MEDS memory to inspect")
        layers = layers or list(state.get("layers", []))
        for pid, kinds in state["memory"].items():
            for kind, bank in kinds.items():
                into = merged.setdefault(pid, {}).setdefault(kind, {"features": [], "answers": [], "snippets": [],
                                                                     "steps": [], "labels": []})
                into["features"].append(bank["features"].numpy())
                for key in ("answers", "snippets", "steps", "labels"):
                    into[key] += list(bank[key])
    for kinds in merged.values():
        for bank in kinds.values():
            bank["features"] = np.concatenate(bank["features"]) if bank["features"] else np.zeros((0, 0))
    return int(checkpoint.name.split("_")[1]), merged, layers


def run_settings(run_dir: Path):
    """The clustering the run trained with: its `meds:` section read by the same function that
    training reads it with (meds_clusterers.cluster_settings: clusterer, parameters, noise and
    one-mode rules, the random control's shuffle)."""
    from algorithms.meds_clusterers import cluster_settings
    from meds_cli.engine.config import load_config

    cfg = load_config([str(run_dir / "config.yaml")])
    return cluster_settings(cfg.section("meds"))


def prompt_entries(kinds: dict) -> dict:
    """One prompt's wrong and correct entries as parallel arrays (wrong first)."""
    parts = [(kind, kinds[kind]) for kind in ("wrong", "correct") if kind in kinds and len(kinds[kind]["answers"])]
    if not parts:
        return {"features": np.zeros((0, 1)), "wrong": np.zeros(0, bool), "answers": [], "snippets": [], "steps": []}
    return {
        "features": np.concatenate([b["features"] for _, b in parts]),
        "wrong": np.concatenate([np.full(len(b["answers"]), kind == "wrong") for kind, b in parts]),
        "answers": [a for _, b in parts for a in b["answers"]],
        "snippets": [s for _, b in parts for s in b["snippets"]],
        "steps": [s for _, b in parts for s in b["steps"]],
    }


def answer_ari(labels: np.ndarray, answers: list) -> float | None:
    """Adjusted Rand index of the clusters vs the final-answer classes (no answer is a class of its
    own); each noise point is its own cluster, not one shared 'noise' cluster."""
    from sklearn.metrics import adjusted_rand_score

    if len(labels) < 2:
        return None
    clusters = [f"c{v}" if v >= 0 else f"n{i}" for i, v in enumerate(labels.tolist())]
    classes = ["<none>" if a is None else str(a) for a in answers]
    return float(adjusted_rand_score(classes, clusters))


def analyse_prompt(pid: str, kinds: dict, settings) -> dict:
    entries = prompt_entries(kinds)
    labels = settings.labels(entries["features"]) if len(entries["answers"]) else np.zeros(0, np.int64)
    wrong = entries["wrong"]
    clusters = []
    for label in sorted(set(labels.tolist()), key=lambda v: (v < 0, v)):  # noise last
        idx = np.flatnonzero(labels == label)
        answers = Counter("<none>" if entries["answers"][i] is None else entries["answers"][i] for i in idx)
        newest = sorted(idx, key=lambda i: entries["steps"][i], reverse=True)[:SAMPLES]
        clusters.append({
            "label": int(label), "size": int(len(idx)), "share_wrong": float(wrong[idx].mean()),
            "top_answers": [[a, n] for a, n in answers.most_common(TOP_ANSWERS)],
            "samples": [entries["snippets"][i] for i in newest],
        })
    real = [c for c in clusters if c["label"] >= 0]
    wrong_sizes = [int(np.sum(wrong[labels == c["label"]])) for c in real]
    training = kinds.get("wrong", {}).get("labels", [])
    return {
        "prompt": pid, "entries": int(len(labels)), "wrong": int(wrong.sum()), "correct": int((~wrong).sum()),
        "clusters": len(real), "largest_wrong_cluster": max(wrong_sizes, default=0),
        "noise": int(np.sum(labels < 0)), "training_wrong_clusters": len(set(training) - {-1}),
        "ari_answers": answer_ari(labels, entries["answers"]),
        "clusters_detail": clusters, "_labels": labels, "_entries": entries,
    }


# ---------------------------------------------------------------- plots


def _colours(labels: np.ndarray):
    plt = _pyplot()
    cmap = plt.get_cmap("tab10")
    return [(0.6, 0.6, 0.6, 1.0) if v < 0 else cmap(v % 10) for v in labels.tolist()]


def plot_projection(analysis: dict, path: Path) -> None:
    """PCA to 2-D of the L2-normalised features (the space HDBSCAN sees), coloured by cluster."""
    from algorithms.diversity import l2_normalize

    plt = _pyplot()
    x = l2_normalize(analysis["_entries"]["features"])
    labels, wrong = analysis["_labels"], analysis["_entries"]["wrong"]
    centred = x - x.mean(axis=0, keepdims=True)
    if len(x) >= 2 and x.shape[1] >= 2:
        _, _, vt = np.linalg.svd(centred, full_matrices=False)
        xy = centred @ vt[:2].T
    else:
        xy = np.column_stack([centred[:, 0] if x.shape[1] else np.zeros(len(x)), np.zeros(len(x))])
    colours = np.array(_colours(labels)).reshape(-1, 4)
    fig, ax = plt.subplots(figsize=(6, 5))
    for mask, marker, name in [(wrong, "x", "wrong"), (~wrong, "o", "correct")]:
        if mask.any():
            ax.scatter(xy[mask, 0], xy[mask, 1], c=colours[mask], marker=marker, label=name, s=28)
    ax.set_title(f"{analysis['prompt']}: memory, PCA of normalised layer logits\n"
                 f"{analysis['clusters']} clusters (grey = noise), x wrong, o correct")
    ax.set_xlabel("PC 1")
    ax.set_ylabel("PC 2")
    legend = ax.legend(loc="upper left", title="marker", fontsize="small")
    for handle in legend.legend_handles:  # the marker, not a cluster's colour, tells wrong from correct
        handle.set_color("black")
    ax.add_artist(legend)
    from matplotlib.lines import Line2D

    # a second legend for the colours: which cluster each is (grey: noise)
    shown = sorted(set(labels.tolist()), key=lambda v: (v < 0, v))
    clusters = [Line2D([], [], linestyle="", marker="s", color=colour, label="noise" if value < 0 else f"C{value}")
                for value, colour in zip(shown, _colours(np.array(shown, dtype=int)))]
    if clusters:
        ax.legend(handles=clusters, loc="lower right", title="cluster", fontsize="small")
    fig.tight_layout()
    save_figure(fig, path)


def plot_heatmap(analysis: dict, layers: list[int], path: Path) -> None:
    """Layer-logit trajectories (rows: responses grouped by cluster, noise last; columns: layers)."""
    plt = _pyplot()
    labels = analysis["_labels"]
    feats = analysis["_entries"]["features"]
    order = sorted(range(len(labels)), key=lambda i: (labels[i] < 0, labels[i], i))
    fig, ax = plt.subplots(figsize=(7, max(3.0, min(12.0, 0.12 * len(order) + 2))))
    if len(order):
        image = ax.imshow(feats[order], aspect="auto", cmap="viridis", interpolation="nearest")
        fig.colorbar(image, ax=ax, label="logit of the answer token")
        sorted_labels = labels[order]
        for row in np.flatnonzero(np.diff(sorted_labels)) + 0.5:
            ax.axhline(row, color="white", linewidth=1.2)
        starts = [0] + list(np.flatnonzero(np.diff(sorted_labels)) + 1)
        ax.set_yticks(starts, [("noise" if sorted_labels[s] < 0 else f"C{sorted_labels[s]}") for s in starts])
        names = layers if len(layers) == feats.shape[1] else list(range(feats.shape[1]))
        ax.set_xticks(range(feats.shape[1]), [str(n) for n in names])
    ax.set_xlabel("layer")
    ax.set_title(f"{analysis['prompt']}: layer-logit trajectories by cluster")
    fig.tight_layout()
    save_figure(fig, path)


STEP_KEYS = ("meds/eigen_ratio_top1", "meds/clusters_per_prompt")


def step_series(run_dir: Path) -> dict[str, list]:
    rows = runs.metrics_rows(run_dir)
    return {key: [[r["step"], r[key]] for r in rows if key in r] for key in STEP_KEYS}


def plot_steps(series: dict, path: Path) -> None:
    plt = _pyplot()
    fig, axes = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
    titles = ["top-1 eigen ratio (lower = more diverse)", "clusters per prompt (wrong)"]
    for ax, key, title in zip(axes, STEP_KEYS, titles):
        points = series.get(key, [])
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3)
        ax.set_ylabel(key.split("/")[-1])
        ax.set_title(title, fontsize=10)
    from matplotlib.ticker import MaxNLocator

    axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    axes[-1].set_xlabel("step")
    fig.tight_layout()
    save_figure(fig, path)


def save_figure(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    replace_figure(fig, path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------- the command


def prompt_problem(run_dir: Path, prompt_id: str) -> dict:
    """The question and gold answer of a remembered prompt: from the run's logged samples
    (RUN/samples/step_N.jsonl) where one shows it, else from the run's task built as training built
    it; None for each where neither can say (the task's data not at hand here)."""
    from meds_cli.core.jsonl import read_rows

    for path in sorted((run_dir / "samples").glob("step_*.jsonl"), reverse=True):
        for row in read_rows(path, []):
            if str(row.get("problem_id")) == prompt_id:
                return {"question": row.get("prompt"), "gold": row.get("gold")}
    try:
        from benchmarks import load_all
        from benchmarks.tasks import build_task
        from meds_cli.engine.config import load_config

        load_all()
        cfg = load_config([str(run_dir / "config.yaml")])
        found = next((p for p in build_task(cfg.task, cfg.train.seed).train if str(p.id) == prompt_id), None)
    except (UserError, OSError, ValueError):  # data on the hub while offline, a moved file: say nothing
        found = None
    if found is None:
        return {"question": None, "gold": None}
    return {"question": found.question, "gold": found.answer if isinstance(found.answer, (str, int, float)) else None}


def inspect_run(run_path: str | Path, *, step: int | None = None, prompt: str | None = None,
                output: str | Path | None = None) -> dict:
    """Everything the command shows, as plain data; writes the PNGs under `output`."""
    run_dir = runs.resolve_run_dir(str(run_path))
    checkpoint_step, memory, layers = load_memory(run_dir, step)
    if not memory:
        raise UserError(f"the MEDS memory at step {checkpoint_step} of '{run_dir}' is empty "
                        "(no responses remembered yet)")
    if prompt is not None and prompt not in memory:
        raise UserError(f"prompt '{prompt}' is not in the memory{nearest(prompt, memory)}; "
                        f"{len(memory)} prompts, e.g. {', '.join(sorted(memory)[:5])}")
    from algorithms.meds_clusterers import ShuffledLabels

    settings = run_settings(run_dir)
    analyses = {pid: analyse_prompt(pid, kinds, settings) for pid, kinds in sorted(memory.items())}
    if prompt is None:  # the most repeated error is the most telling one
        prompt = max(analyses.values(), key=lambda a: (a["largest_wrong_cluster"], a["entries"]))["prompt"]
    chosen = analyses[prompt]
    out_dir = Path(output) if output else run_dir / "inspect"
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in prompt)
    plots = {"projection": out_dir / f"projection_{safe}.png", "heatmap": out_dir / f"heatmap_{safe}.png",
             "steps": out_dir / "steps.png"}
    series = step_series(run_dir)
    with output_folder(out_dir):
        plot_projection(chosen, plots["projection"])
        plot_heatmap(chosen, layers, plots["heatmap"])
        plot_steps(series, plots["steps"])
    aris = [a["ari_answers"] for a in analyses.values() if a["ari_answers"] is not None]
    public = lambda a: {k: v for k, v in a.items() if not k.startswith("_") and k != "clusters_detail"}  # noqa: E731
    return {
        "run": str(run_dir), "checkpoint_step": checkpoint_step, "layers": layers,
        "settings": {"min_cluster_size": settings.min_cluster_size, "min_samples": settings.min_samples,
                     "allow_single_cluster": settings.allow_single_cluster, "one_mode": settings.one_mode,
                     "shuffled": isinstance(settings.clusterer, ShuffledLabels)},
        "prompts": [public(a) for a in analyses.values()],
        "ari_answers_mean": float(np.mean(aris)) if aris else None,
        "prompt": {**public(chosen), **prompt_problem(run_dir, prompt), "clusters_detail": chosen["clusters_detail"]},
        "steps": series,
        "plots": {k: str(v) for k, v in plots.items()},
    }


def print_report(report: dict, console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    table = Table(title=f"MEDS memory of {plain(report['run'])} at step {plain(report['checkpoint_step'])}",
                  title_justify="left")
    # short headers: the table has to fit a terminal; the JSON keys spell them out
    for name in ["prompt", "entries", "wrong", "correct", "clusters", "max wrong C", "noise", "train C", "ARI"]:
        table.add_column(name, justify="left" if name == "prompt" else "right")
    for row in report["prompts"]:
        ari = "-" if row["ari_answers"] is None else f"{row['ari_answers']:.2f}"
        columns = ["entries", "wrong", "correct", "clusters", "largest_wrong_cluster", "noise",
                   "training_wrong_clusters"]
        table.add_row(row["prompt"], *(str(row[k]) for k in columns), ari)
    console.print(table)
    mean = report["ari_answers_mean"]
    console.print("max wrong C: wrong members of the largest cluster; train C: wrong clusters as training saw them; "
                  "ARI: adjusted Rand index of clusters vs final answers")
    console.print(f"mean ARI of clusters vs final answers: {plain('-' if mean is None else f'{mean:.3f}')}")
    chosen = report["prompt"]
    if chosen.get("question") is not None:  # what the clusters answered, and what was right
        console.print(f"prompt {chosen['prompt']}: {chosen['question']}\ngold answer: {chosen.get('gold')}",
                      markup=False, highlight=False, soft_wrap=True)
    detail = Table(title=f"prompt {plain(chosen['prompt'])}: clusters", title_justify="left")
    for name in ["cluster", "size", "share wrong", "most common answers", "samples"]:
        detail.add_column(name, overflow="fold")
    for c in chosen["clusters_detail"]:
        answers = ", ".join(f"{a} ({n})" for a, n in c["top_answers"])
        samples = "\n".join(repr(s) for s in c["samples"])
        detail.add_row("noise" if c["label"] < 0 else f"C{c['label']}", str(c["size"]), f"{c['share_wrong']:.2f}",
                       answers, samples)
    console.print(detail)
    for name, path in report["plots"].items():
        console.print(f"{plain(name)}: {plain(path)}")


def cluster_inspect(run_path, *, step=None, prompt=None, output=None, as_json=False) -> None:
    report = inspect_run(run_path, step=step, prompt=prompt, output=output)
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        print_report(report)

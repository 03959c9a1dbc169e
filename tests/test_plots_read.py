"""The plots say what they show (issue 54): whole-number steps, one colour per arm in every panel,
a legend for the cluster colours, and the pass@k band labelled."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from meds_cli.commands.ablate import Variant  # noqa: E402
from meds_cli.commands.ablate_report import STEP_CURVES, plot_step_diagnostics  # noqa: E402


def _captured(monkeypatch, module, name):
    """The figure `module.name(fig, path, ...)` was given, kept open instead of saved."""
    kept = []
    monkeypatch.setattr(module, name, lambda fig, *args, **kwargs: kept.append(fig))
    return kept


def test_diagnostics_keep_one_colour_per_arm_and_whole_steps(monkeypatch, tmp_path):
    variants = [Variant("baseline-dapo", "baseline-dapo", {}), Variant("meds", "meds", {})]
    curve = [[1, 0.1], [2, 0.2], [3, 0.3]]
    results = {"baseline-dapo": {key: curve if i < 2 else [] for i, (key, _, _) in enumerate(STEP_CURVES)},  # no MEDS
               "meds": {key: curve for key, _, _ in STEP_CURVES}}
    kept = []
    monkeypatch.setattr(plt.Figure, "savefig", lambda fig, *a, **k: kept.append(fig))
    monkeypatch.setattr(plt, "close", lambda fig=None: None)
    plot_step_diagnostics(variants, results, tmp_path / "diagnostics.png")
    [fig] = kept
    colours = {}
    for ax in fig.axes:
        assert isinstance(ax.xaxis.get_major_locator(), MaxNLocator)
        assert all(float(t).is_integer() for t in ax.get_xticks()), ax.get_xticks()
        for line in ax.get_lines():
            colours.setdefault(line.get_label(), set()).add(line.get_color())
    # before: MEDS was C1 where the baseline had a curve and C0 where it had none
    assert colours["meds"] == {"C1"} and colours["baseline-dapo"] == {"C0"}


def test_cluster_projection_has_a_legend_for_the_cluster_colours(monkeypatch, tmp_path):
    from meds_cli.commands import cluster_inspect

    kept = _captured(monkeypatch, cluster_inspect, "save_figure")
    rng = np.random.default_rng(0)
    analysis = {"_entries": {"features": rng.normal(size=(6, 4)), "wrong": np.array([True] * 4 + [False] * 2)},
                "_labels": np.array([0, 0, 1, 1, -1, 0]), "prompt": "p0", "clusters": 2}
    cluster_inspect.plot_projection(analysis, tmp_path / "projection.png")
    [fig] = kept
    ax = fig.axes[0]
    titles = {legend.get_title().get_text(): [t.get_text() for t in legend.get_texts()]
              for legend in [ax.get_legend(), *[a for a in ax.artists if hasattr(a, "get_texts")]]}
    assert titles["cluster"] == ["C0", "C1", "noise"] and titles["marker"] == ["wrong", "correct"]


def test_steps_plot_has_whole_steps(monkeypatch, tmp_path):
    from meds_cli.commands import cluster_inspect

    kept = _captured(monkeypatch, cluster_inspect, "save_figure")
    cluster_inspect.plot_steps({"meds/eigen_ratio_top1": [[1, 0.5], [2, 0.4]],
                                "meds/clusters_per_prompt": [[1, 2.0], [2, 3.0]]}, tmp_path / "steps.png")
    [fig] = kept
    assert all(float(t).is_integer() for t in fig.axes[-1].get_xticks())


def test_pass_at_k_band_is_labelled(monkeypatch, tmp_path):
    from benchmarks import eval_report

    kept = _captured(monkeypatch, eval_report, "replace_figure")
    doc = {"benchmarks": {"math500": {"pass@k": {"1": 0.2, "2": 0.3},
                                      "pass@k_ci": {"1": [0.1, 0.3], "2": [0.2, 0.4]}}}}
    eval_report.plot_pass_at_k([("a", doc)], tmp_path / "p.png")
    assert "band: 95% interval over problems" in kept[0].axes[0].get_title()

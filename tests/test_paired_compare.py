"""benchmarks/paired_compare.py and `meds eval --compare`'s paired section, on hand-made evals
(samples.jsonl + results.json, no model): values computed by hand."""

import csv
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from benchmarks.paired_compare import Arm, compare_arms, flipped_summary, markdown, problem_counts, write_paired
from meds_cli.app import app


def make_eval(folder: Path, model: str, correct: list[int], n: int = 4, extra_samples: int = 0,
              benchmark: str = "math500") -> Path:
    """An eval folder whose problem i has correct[i] correct samples of n (the first ones)."""
    folder.mkdir(parents=True)
    rows = [{"benchmark": benchmark, "problem_id": f"p{i}", "sample": j, "correct": j < c, "length": 5,
             "truncated": False} for i, c in enumerate(correct) for j in range(n + extra_samples)]
    (folder / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    document = {"model": model, "config": {"n": n, "k": n}, "benchmarks": {benchmark: {"problems": len(correct),
                "pass@k": {"1": sum(correct) / n / len(correct)}}}}
    (folder / "results.json").write_text(json.dumps(document))
    return folder / "results.json"


def test_problem_counts_read_the_first_n_samples(tmp_path):
    path = make_eval(tmp_path / "e", "m", [3, 0], n=4, extra_samples=2)  # samples 4, 5 are past n: left out
    assert problem_counts(path) == {"math500": {"p0": (4, 3), "p1": (4, 0)}}


def test_compare_arms_by_hand(tmp_path):
    a = make_eval(tmp_path / "a", "MEDS", [4] * 8 + [0, 2])
    b = make_eval(tmp_path / "b", "DAPO", [0] * 8 + [0, 2])
    result = compare_arms(Arm("MEDS", [a]), Arm("DAPO", [b]), resamples=2000)
    entry = result["benchmarks"]["math500"]
    assert entry["k"] == 4 and entry["left_out"] == 0
    one = entry["pass@1"]
    assert one["delta"] == pytest.approx(0.8) and one["a"] == pytest.approx(0.85) and one["b"] == pytest.approx(0.05)
    assert one["p_value"] == pytest.approx(2 / 2 ** 8)  # 8 non-zero differences, all of one sign
    assert one["verdict"].endswith("MEDS higher") and "math500 pass@1 +0.800" in one["verdict"]
    assert entry["pass@4"]["delta"] == pytest.approx(0.8)
    changes = [r["change"] for r in result["problems"]]
    assert changes == ["MEDS only"] * 8 + ["", ""]
    assert flipped_summary(result) == "8 problems solved by MEDS only, 0 by DAPO only (in any sample)"
    assert "- MEDS - DAPO math500 pass@1 +0.800" in markdown([result])


def test_seeds_pair_seed_by_seed_and_unmatched_problems_are_left_out(tmp_path):
    a = [make_eval(tmp_path / "a0", "A", [4, 4, 0]), make_eval(tmp_path / "a1", "A", [2, 2])]
    b = [make_eval(tmp_path / "b0", "B", [0, 4, 0, 1]), make_eval(tmp_path / "b1", "B", [2, 0])]
    entry = compare_arms(Arm("A", a), Arm("B", b), resamples=2000)["benchmarks"]["math500"]
    one = entry["pass@1"]
    # seed 0: deltas 1, 0, 0 (p3 only in B: left out); seed 1: 0, 0.5; mean of seed means (1/3 + 1/4) / 2
    assert one["delta"] == pytest.approx((1 / 3 + 0.25) / 2)
    assert one["seeds"] == 2 and one["problems"] == 5 and entry["left_out"] == 1


def test_different_seed_counts_are_refused(tmp_path):
    from meds_cli.core.errors import UserError

    a = make_eval(tmp_path / "a", "A", [1])
    with pytest.raises(UserError, match="same seeds"):
        compare_arms(Arm("A", [a, a]), Arm("B", [a]))


def test_written_deltas_and_plot(tmp_path):
    a = make_eval(tmp_path / "a", "A", [4, 0, 1])
    b = make_eval(tmp_path / "b", "B", [0, 4, 1])
    deltas, plot = write_paired([compare_arms(Arm("A", [a]), Arm("B", [b]), resamples=500)], tmp_path)
    rows = list(csv.DictReader(deltas.open()))
    assert [(r["problem_id"], r["change"], float(r["pass@1_delta"])) for r in rows] == \
        [("p0", "A only", 1.0), ("p1", "B only", -1.0), ("p2", "", 0.0)]
    assert plot.stat().st_size > 1000


def test_eval_compare_writes_the_paired_section(tmp_path):
    first = make_eval(tmp_path / "dapo", "DAPO", [0] * 6 + [1, 1])
    second = make_eval(tmp_path / "meds", "MEDS", [4] * 6 + [1, 1])
    result = CliRunner().invoke(app, ["eval", "--compare", str(first), str(second), "--output", str(tmp_path / "cmp")])
    assert result.exit_code == 0, result.output
    assert "MEDS - DAPO math500 pass@1 +0.750" in result.output and "MEDS higher" in result.output
    summary = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert summary["paired"][0]["benchmarks"]["math500"]["pass@1"]["p_value"] == pytest.approx(2 / 2 ** 6)
    assert "MEDS higher" in (tmp_path / "cmp" / "summary.md").read_text()
    for name in ("problem_deltas.csv", "paired_differences.png"):
        assert (tmp_path / "cmp" / name).is_file(), name


def test_eval_compare_without_samples_notes_it(tmp_path):
    first = make_eval(tmp_path / "x", "X", [1, 2])
    second = make_eval(tmp_path / "y", "Y", [2, 2])
    (tmp_path / "y" / "samples.jsonl").unlink()
    result = CliRunner().invoke(app, ["eval", "--compare", str(first), str(second), "--output", str(tmp_path / "cmp")])
    assert result.exit_code == 0, result.output
    assert "no paired statistics" in result.output and "samples.jsonl" in result.output


def test_score_benchmark_interval_uses_per_problem_values():
    from benchmarks.harness import score_benchmark

    rows = [[{"correct": j < c, "length": 3, "truncated": j == 0, "outcome": "x", "extracted": None}
             for j in range(4)] for c in (4, 0, 2, 1)]
    scores = score_benchmark("code", rows, [1, 4])
    # k = n = 4: per-problem values 1, 0, 1, 1. A resample of the 4 means is 1 with probability
    # (3/4)^4 = 0.32, at most 0.25 with 0.051 and 0 with 0.004: the 2.5% and 97.5% points are 0.25 and 1.
    assert scores["pass@k_ci"]["4"] == pytest.approx([0.25, 1.0])
    low, high = scores["pass@k_ci"]["1"]  # per-problem 1, 0, 0.5, 0.25: mean 0.4375
    assert 0.0 <= low < 0.4375 < high <= 1.0
    assert scores["truncated"] == 4 and scores["responses"] == 16


def test_ablation_pairs_each_group_with_the_baseline_seed_by_seed(tmp_path):
    from meds_cli.commands.ablate import Variant
    from meds_cli.commands.ablate_report import baseline_group, paired_against_baseline

    variants = [Variant(f"{group}_seed-{seed}", group, {}, seed) for group in ("meds", "baseline-dapo")
                for seed in (0, 1)]
    correct = {("meds", 0): [4, 4, 0], ("meds", 1): [4, 0], ("baseline-dapo", 0): [0, 4, 0],
               ("baseline-dapo", 1): [0, 0]}
    paths = {v.name: make_eval(tmp_path / v.name, v.group, correct[(v.group, v.seed)]) for v in variants}
    assert baseline_group(variants) == "baseline-dapo"
    [comparison] = paired_against_baseline(variants, paths)
    one = comparison["benchmarks"]["math500"]["pass@1"]
    # seed 0: deltas 1, 0, 0 -> 1/3; seed 1: 1, 0 -> 1/2; the seeds weigh the same
    assert (comparison["a"], comparison["b"]) == ("meds", "baseline-dapo")
    assert one["delta"] == pytest.approx((1 / 3 + 1 / 2) / 2) and one["seeds"] == 2 and one["problems"] == 5
    assert "over 2 seeds" in one["verdict"]
    assert baseline_group(variants[:2]) == "meds"  # no baseline run: the first group

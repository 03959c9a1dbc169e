"""outcome-ucb under 2 real processes (accelerate launch, CPU, gloo): the count table is one per
question over all processes (engine/training/collectives.py `gather`, through AlgorithmContext)."""

import json
from collections import Counter

import pytest

from tests.cpu_launch import ROOT, launch_cpu


@pytest.mark.slow
def test_two_processes_keep_one_count_table(tmp_path):
    launch_cpu(2, [str(ROOT / "tests" / "outcome_counts_check.py"), str(tmp_path)])
    ranks = [json.loads((tmp_path / f"rank{k}.json").read_text()) for k in range(2)]
    assert [r["world"] for r in ranks] == [2, 2]  # really two processes
    assert ranks[0]["counts"] == ranks[1]["counts"]
    both = Counter((q, a) for r in ranks for q, a in r["own"])
    table = Counter({(q, a): n for q, answers in ranks[0]["counts"].items() for a, n in answers.items()})
    assert table == both and both  # every pair of both processes, each once
    for r in ranks:  # each process's table holds more than what it sampled itself
        assert sum(table.values()) > len(r["own"]) > 0

"""The example algorithm of docs/extending.md ("Adding an algorithm"; it was the README's) is complete:
written as one file, it registers and works."""

import re
import sys
from pathlib import Path

from algorithms import ALGORITHMS
from meds_cli.engine.training.algorithm_setup import build_algorithm
from tests.conftest import tiny_config
from tests.rollout_factory import make_rollouts

EXTENDING = Path(__file__).resolve().parent.parent / "docs" / "extending.md"


def test_readme_algorithm_example(tmp_path, monkeypatch):
    code = re.search(r"```python\n# algorithms/length_bonus.py\n(.*?)```", EXTENDING.read_text(), re.S).group(1)
    (tmp_path / "length_bonus_example.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        import length_bonus_example  # noqa: F401  (registers 'length-bonus')

        cfg = tiny_config("algo.name=length-bonus", "algo.base=dapo", "length-bonus.bonus=0.5")
        algo = build_algorithm(cfg)
        assert algo.base.name == "dapo" and algo.config.bonus == 0.5
        batch = make_rollouts([True, True, False, True], 4, lengths=[2, 4, 1, 4])
        batch.reward_components = algo.reward_components(batch)
        batch.rewards = sum(batch.reward_components.values())
        algo.shape_rewards(batch)
        # median length of [2, 4, 1, 4] is 2 (torch takes the lower middle): only length 1 is shorter,
        # and that response is wrong, so no bonus; with lengths [2, 4, 3, 4] the median is 3 and response 0 gets it
        assert batch.rewards.tolist() == [1.0, 1.0, 0.0, 1.0]
        batch = make_rollouts([True, True, False, True], 4, lengths=[2, 4, 3, 4])
        batch.reward_components = algo.reward_components(batch)
        batch.rewards = sum(batch.reward_components.values())
        algo.shape_rewards(batch)
        assert batch.rewards.tolist() == [1.5, 1.0, 0.0, 1.0]
    finally:
        ALGORITHMS._entries.pop("length-bonus", None)
        sys.modules.pop("length_bonus_example", None)

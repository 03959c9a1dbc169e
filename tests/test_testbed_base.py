"""The testbed's base model: the bugs of its traces on hand-computed cases, and its builder at a
reduced size (seconds): deterministic, cached, rebuilt when the recipe changes, reached by its alias."""

import dataclasses
import json
import random
from pathlib import Path

import pytest
import yaml

from meds_cli.engine.model_io import testbed_base
from meds_cli.engine.model_io.testbed_traces import (
    BUGS,
    add_without_carry,
    draw_student,
    parse_chain,
    read_ops,
    worked_trace,
)

pytest.importorskip("reasoning_gym")

SMALL = testbed_base.Recipe(examples=64, layers=1, hidden=16, heads=2, steps=3, batch_size=8, warmup_steps=1,
                            threads=1, eval_problems=2, eval_samples=8, max_new_tokens=8)
REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- the traces' bugs, by hand


def test_carry_drop_by_hand():
    assert add_without_carry(58, 67) == 115  # 8+7 = 15: write 5, the 1 dropped; 5+6 = 11 leads
    assert add_without_carry(18, 5) == 13    # 8+5 = 13: write 3, the 1 dropped; the tens stay 1
    assert add_without_carry(7, 5) == 12     # one column: nothing to carry into
    assert add_without_carry(23, 14) == 37   # no carry needed: the right sum
    assert worked_trace([58, 67], ["+"], {"carry_drop"}) == (" 58+67=115. \\boxed{115}", 115)


def test_correct_trace_by_hand():
    assert worked_trace([4, 1, 7, 5], ["-", "-", "+"]) == (" 4-1=3, 3-7=-4, -4+5=1. \\boxed{1}", 1)


def test_each_bug_by_hand():
    terms, ops = [4, 1, 7, 5], ["-", "-", "+"]
    # 3-7 written without its sign: 4; then 4+5 = 9
    assert worked_trace(terms, ops, {"sign_drop"}) == (" 4-1=3, 3-7=4, 4+5=9. \\boxed{9}", 9)
    # -4+5 as -(4+5)
    assert worked_trace(terms, ops, {"sticky_sign"})[1] == -9
    assert worked_trace([2, 5, 3], ["-", "-"], {"sticky_sign"})[1] == -(3 - 3)
    # after the first minus every plus is a minus: 4-1-7-5
    assert read_ops(ops, frozenset({"precedence"})) == ["-", "-", "-"]
    assert worked_trace(terms, ops, {"precedence"}) == (" 4-1=3, 3-7=-4, -4-5=-9. \\boxed{-9}", -9)
    assert worked_trace(terms, ops, {"minus_as_plus"})[1] == 17
    assert worked_trace(terms, ops, {"skip_last"}) == (" 4-1=3, 3-7=-4. \\boxed{-4}", -4)
    # two misconceptions at once: 4+1+7 (minus read as plus), last term forgotten
    assert worked_trace(terms, ops, {"minus_as_plus", "skip_last"})[1] == 12


def test_unknown_bug_and_bad_chain_are_refused():
    with pytest.raises(ValueError, match="unknown bug 'typo'"):
        worked_trace([1, 2], ["+"], {"typo"})
    with pytest.raises(ValueError, match="not a chain"):
        parse_chain("4 * 2")
    assert parse_chain("4 - 1 + 17") == ([4, 1, 17], ["-", "+"])


def test_students_draw_each_bug_at_its_rate():
    rng = random.Random(0)
    students = [draw_student(rng, {"sign_drop": 0.3, "skip_last": 0.0, "precedence": 1.0}) for _ in range(4000)]
    share = sum("sign_drop" in s for s in students) / len(students)
    assert abs(share - 0.3) < 0.03
    assert all("precedence" in s and "skip_last" not in s for s in students)


# ---------------------------------------------------------------- the builder


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MEDS_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def test_builder_is_deterministic(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    testbed_base.build(SMALL, first)
    testbed_base.build(SMALL, second)
    a, b = weights(first), weights(second)
    assert a.keys() == b.keys() and a
    assert all(a[name].equal(b[name]) for name in a)
    other = tmp_path / "c"
    testbed_base.build(dataclasses.replace(SMALL, seed=1), other)
    assert not all(a[name].equal(weights(other)[name]) for name in a)


def test_cache_reused_and_invalidated(cache, monkeypatch):
    lines = []
    folder = testbed_base.base_folder(SMALL, say=lines.append)
    assert folder.parent == cache / "testbed" and (folder / "config.json").is_file()
    record = json.loads((folder / testbed_base.FIGURES_FILE).read_text())
    assert record["recipe_key"] == SMALL.key() and 0 <= record["figures"]["pass@1"] <= 1
    assert "building into" in lines[0] and str(folder) in lines[-1]

    def no_training(*args, **kwargs):
        raise AssertionError("a cached base was trained again")

    monkeypatch.setattr(testbed_base, "train_base", no_training)
    assert testbed_base.base_folder(SMALL, say=lines.append) == folder
    assert "cached in" in lines[-1]
    with pytest.raises(AssertionError, match="trained again"):  # another recipe: another folder, built
        testbed_base.base_folder(dataclasses.replace(SMALL, bug_rates=(("sign_drop", 0.5),)), say=lines.append)
    assert SMALL.key() != dataclasses.replace(SMALL, steps=4).key()


def test_alias_resolves_and_loads(cache, monkeypatch):
    from meds_cli.engine.model_io.model import TESTBED, load_model_and_tokenizer, resolve_model

    monkeypatch.setattr(testbed_base, "TESTBED_RECIPE", SMALL)
    assert resolve_model(TESTBED) == str(SMALL.folder())
    model, tokenizer = load_model_and_tokenizer(TESTBED)
    question = "State the final answer to the following arithmetic problem: 4 - 1 - 7 ="
    ids = tokenizer(question, return_tensors="pt", add_special_tokens=False)
    assert tokenizer.decode(ids["input_ids"][0]) == question  # every character is a token
    assert model.config.num_hidden_layers == SMALL.layers


def test_testbed_config_trains_the_base_recipe_task():
    config = yaml.safe_load((REPO / "configs" / "testbed.yaml").read_text())
    recipe = testbed_base.TESTBED_RECIPE
    assert config["model"]["name"] == "testbed-base"
    assert config["task"]["dataset"] == recipe.dataset
    assert config["task"]["config"] == dict(recipe.task_config)
    assert config["rollout"]["temperature"] == recipe.temperature  # the base's figures hold at the RL sampling
    assert {name for name, _ in recipe.bug_rates} <= set(BUGS)


@pytest.mark.slow
def test_testbed_learns_in_40_steps(tmp_path):
    """The testbed's defaults (DAPO): training accuracy of steps 31-40 above steps 1-10. The target
    of +0.05 is measured by scripts/bench_testbed.py (seed 0 here: +0.078; seeds 1-3: +0.068,
    +0.064, +0.044, docs/testbed.md); the test asks for a clear rise, +0.02, because a base built
    on another CPU's kernels has other weights and so another run than the one measured here."""
    from meds_cli.engine.config import load_config
    from meds_cli.engine.trainer import Trainer

    cfg = load_config([str(REPO / "configs" / "testbed.yaml")],
                      ["train.steps=40", "train.checkpoint_every=0", f"train.output_dir={tmp_path}"])
    trainer = Trainer(cfg, tmp_path)
    accuracy = [trainer.train_step()["accuracy"] for _ in range(40)]
    assert sum(accuracy[-10:]) / 10 >= sum(accuracy[:10]) / 10 + 0.02, accuracy

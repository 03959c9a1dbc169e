"""The config system: files, overrides, precedence, validation and the written snapshot."""

import pytest

from meds_cli.core.errors import UserError
from meds_cli.engine.config import dump_yaml, load_config, parse_override, read_yaml
from tests.config_errors import assert_refused_in_one_line


def write(path, text):
    path.write_text(text)
    return str(path)


def test_defaults_and_algorithm_sections():
    cfg = load_config()
    assert cfg.model.name == "smollm2-135m" and cfg.task.name == "arithmetic"
    assert cfg.section("dapo").clip_high == 0.28 and cfg.section("grpo").clip_high == 0.2


def test_precedence_files_then_shortcuts_then_set(tmp_path):
    a = write(tmp_path / "a.yaml", "train: {steps: 5, seed: 1}\nrollout: {group_size: 4}\n")
    b = write(tmp_path / "b.yaml", "train: {steps: 7}\n")
    cfg = load_config([a, b], ["train.seed=9"], {"train.steps": 11, "algo.name": None})
    assert cfg.train.steps == 11 and cfg.train.seed == 9 and cfg.rollout.group_size == 4
    assert load_config([a, b]).train.steps == 7  # later file wins


def test_set_values_are_typed():
    assert parse_override("a.b=3") == {"a": {"b": 3}}
    cfg = load_config(overrides=["optim.lr=1e-6", "optim.betas=[0.9, 0.95]", "model.lora.enabled=false"])
    assert cfg.optim.lr == 1e-6 and cfg.optim.betas == [0.9, 0.95] and cfg.model.lora.enabled is False
    assert load_config(overrides=["optim.lr=1"]).optim.lr == 1.0  # an int is accepted for a float


@pytest.mark.parametrize("override, words", [
    (["train.stpes=3"], ["train.stpes", "did you mean 'steps'"]),
    (["trian.steps=3"], ["trian", "did you mean 'train'"]),
    (["train.steps=three"], ["train.steps", "expected int"]),
    (["train.steps=true"], ["train.steps", "expected int"]),
    (["model.lora.rank=1.5"], ["model.lora.rank", "expected int"]),
    (["grpo.scale_rewards=grp"], ["grpo.scale_rewards", "accepted: group, batch, none"]),
    (["model=3"], ["model", "mapping"]),
    (["=3"], ["empty part"]),
])
def test_bad_values_are_named(override, words):
    assert_refused_in_one_line(override, words)


def test_extends(tmp_path):
    write(tmp_path / "base.yaml", "train: {steps: 5, seed: 1}\n")
    child = write(tmp_path / "child.yaml", "extends: base.yaml\ntrain: {seed: 2}\n")
    cfg = load_config([child])
    assert cfg.train.steps == 5 and cfg.train.seed == 2
    loop = write(tmp_path / "loop.yaml", "extends: loop.yaml\n")
    with pytest.raises(UserError, match="extends itself"):
        read_yaml(loop)


def test_snapshot_round_trip(tmp_path):
    cfg = load_config(overrides=["algo.name=dapo", "dapo.clip_high=0.3", "train.steps=3"])
    dump_yaml(cfg, tmp_path / "config.yaml", sections=["dapo"])
    again = load_config([str(tmp_path / "config.yaml")])
    assert again.section("dapo").clip_high == 0.3 and again.train.steps == 3 and again.algo.name == "dapo"
    assert "grpo:" not in (tmp_path / "config.yaml").read_text()


def test_paper_configs_load():
    dapo = load_config(["configs/dapo_paper.yaml"])
    assert dapo.algo.name == "dapo" and dapo.rollout.group_size == 16 and dapo.optim.lr == 1e-6
    assert dapo.optim.weight_decay == 0.1 and dapo.optim.grad_clip == 1.0
    meds = load_config(["configs/meds_paper.yaml"])
    assert meds.algo.name == "meds" and meds.algo.base == "dapo"
    # the baseline and MEDS differ only in the algorithm
    for section in ["model", "task", "rollout", "optim", "train", "eval"]:
        assert getattr(meds, section) == getattr(dapo, section), section
    assert meds.section("dapo") == dapo.section("dapo")


def test_smollm2_configs_share_one_base():
    base = load_config(["configs/smollm2.yaml"])
    for name, algo in [("meds_smollm2", "meds"), ("edas_smollm2", "edas"), ("rlif_smollm2", "rlif-multireward")]:
        cfg = load_config([f"configs/{name}.yaml"])
        assert cfg.algo.name == algo and cfg.model == base.model and cfg.optim == base.optim


def test_value_checks_run_when_the_config_loads():
    # field checks (core.fields.at_least / greater_than) and a section's own validate(), named by key
    with pytest.raises(UserError, match="train.ppo_epochs must be at least 1, got 0"):
        load_config(overrides=["train.ppo_epochs=0"])
    with pytest.raises(UserError, match="rollout.group_size must be at least 1, got 0"):
        load_config(overrides=["rollout.group_size=0"])
    with pytest.raises(UserError,
                       match=r"edas.kappa must be greater than 1 \(else the clip can flip a sign\), got 1.0"):
        load_config(overrides=["edas.kappa=1.0"])
    with pytest.raises(UserError, match="meds.min_cluster_size must be at least 2, got 1"):
        load_config(overrides=["meds.min_cluster_size=1"])
    with pytest.raises(UserError, match="task.digits must be at least 1, got 0"):
        load_config(overrides=["task.digits=0"])
    load_config(overrides=["edas.kappa=1.5", "meds.min_cluster_size=2"])  # the boundaries pass


def test_the_tool_settings_are_fields_of_the_rollout_section():
    cfg = load_config(overrides=["rollout.tools=[python]", "rollout.max_tool_calls=2", "rollout.tool_output_tokens=64",
                                 "rollout.code_tags=[<run>, </run>]", "rollout.tool_time_limit_s=3"])
    assert cfg.rollout.enabled and cfg.rollout.tools == ["python"] and cfg.rollout.max_tool_calls == 2
    assert cfg.rollout.tool_output_tokens == 64 and cfg.rollout.code_tags == ["<run>", "</run>"]
    assert cfg.rollout.tool_time_limit_s == 3.0
    assert not load_config().rollout.enabled  # off by default


@pytest.mark.parametrize("override, message", [
    ("rollout.tools=[ruby]", "rollout.tools has 'ruby'; accepted: python"),
    ("rollout.tools=[python, python]", "rollout.tools names a tool twice: ['python', 'python']"),
    ("rollout.tools=python", "config key 'rollout.tools' has value 'python'; expected a list of str"),
    ("rollout.max_tool_calls=0", "rollout.max_tool_calls must be at least 1, got 0"),
    ("rollout.tool_output_tokens=0", "rollout.tool_output_tokens must be at least 1, got 0"),
    ("rollout.tool_time_limit_s=0", "rollout.tool_time_limit_s must be greater than 0, got 0"),
    ("rollout.code_tags=[<code>]", "rollout.code_tags must be two non-empty tags [opening, closing], got ['<code>']"),
    ("rollout.code_tags=[<c>, <c>]", "rollout.code_tags must differ"),
    ("rollout.code_tags=['```', </c>]", "rollout.code_tags must not contain ```"),
])
def test_bad_tool_settings_are_refused_in_one_line(override, message):
    with pytest.raises(UserError) as error:
        load_config(overrides=[override])
    assert str(error.value).startswith(message) and "\n" not in str(error.value), str(error.value)

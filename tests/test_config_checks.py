"""Every config value is checked when the config loads, before any model loads or folder is made:
one line naming the key, the value and what is accepted, exit 2."""

import pytest
from typer.testing import CliRunner

from meds_cli.app import app
from meds_cli.core.errors import UserError
from meds_cli.engine.config import load_config
from meds_cli.engine.model_io.model import check_lora_rank
from tests.conftest import TINY_COPY


@pytest.mark.parametrize("override, expected", [
    ("rollout.group_size=0", "rollout.group_size must be at least 1, got 0"),
    ("rollout.group_size=1", "rollout.group_size must be at least 2 for grpo"),
    ("rollout.prompts_per_step=0", "rollout.prompts_per_step must be at least 1, got 0"),
    ("rollout.max_new_tokens=0", "rollout.max_new_tokens must be at least 1, got 0"),
    ("rollout.hf.generation_batch_size=0", "rollout.hf.generation_batch_size must be at least 1"),
    ("rollout.temperature=0", "rollout.temperature must be greater than 0"),
    ("rollout.temperature=-1", "rollout.temperature must be greater than 0"),
    ("rollout.top_p=0", "rollout.top_p must be in (0, 1], got 0.0"),
    ("rollout.top_p=1.5", "rollout.top_p must be in (0, 1], got 1.5"),
    ("optim.lr=0", "optim.lr must be a finite number greater than 0, got 0.0"),
    ("optim.lr=-1e-5", "optim.lr must be a finite number greater than 0"),
    ("optim.lr=.nan", "optim.lr must be a finite number greater than 0, got nan"),
    ("optim.lr=.inf", "optim.lr must be a finite number greater than 0, got inf"),
    ("optim.betas=[0.9]", "optim.betas must be two numbers in [0, 1), got [0.9]"),
    ("optim.betas=[0.9, 1.0]", "optim.betas must be two numbers in [0, 1), got [0.9, 1.0]"),
    ("optim.betas=[-0.1, 0.9]", "optim.betas must be two numbers in [0, 1)"),
    ("optim.weight_decay=-0.1", "optim.weight_decay must be a finite number at least 0"),
    ("optim.grad_clip=-1", "optim.grad_clip must be a finite number at least 0"),
    ("optim.warmup_steps=-1", "optim.warmup_steps must be at least 0"),
    ("train.steps=-1", "train.steps must be at least 0, got -1"),
    ("train.micro_batch_size=0", "train.micro_batch_size must be at least 1"),
    ("train.ppo_epochs=0", "train.ppo_epochs must be at least 1"),
    ("train.mini_batch_size=-4", "train.mini_batch_size must be at least 0"),
    ("train.checkpoint_every=-1", "train.checkpoint_every must be at least 0"),
    ("train.keep_checkpoints=-1", "train.keep_checkpoints must be at least 0"),
    ("train.seed=-1", "train.seed must be between 0 and 4294967295, got -1"),
    ("train.seed=4294967296", "train.seed must be between 0 and 4294967295"),
    ("eval.problems=0", "eval.problems must be at least 1"),
    ("eval.every=-1", "eval.every must be at least 0"),
    ("eval.temperature=-0.5", "eval.temperature must be a finite number at least 0"),
    ("task.train_size=0", "task.train_size must be at least 1"),
    ("task.eval_size=-1", "task.eval_size must be at least 0"),
    ("model.lora.rank=0", "model.lora.rank must be at least 1, got 0"),
    ("model.lora.alpha=0", "model.lora.alpha must be greater than 0"),
    ("model.lora.dropout=1", "model.lora.dropout must be in [0, 1)"),
    ("model.lora.target_modules=[]", "model.lora.target_modules must be a non-empty list of module names"),
    ("reward.correct=.nan", "reward.correct must be a finite number"),
    ("reward.wrong=1", "reward.correct (1.0) must be greater than reward.wrong (1.0)"),
    ("grpo.clip_low=1", "grpo.clip_low must be in [0, 1)"),
    ("grpo.clip_high=-0.1", "grpo.clip_high must be at least 0"),
    ("grpo.clip_ratio_c=1", "grpo.clip_ratio_c must be greater than 1"),
    ("grpo.kl_coef=-0.1", "grpo.kl_coef must be at least 0"),
    ("grpo.adv_eps=0", "grpo.adv_eps must be greater than 0"),
    ("grpo.kl_cov_ratio=2", "grpo.kl_cov_ratio must be in [0, 1]"),
    ("dapo.max_gen_batches=0", "dapo.max_gen_batches must be at least 1"),
    ("dapo.overlong_buffer=-1", "dapo.overlong_buffer must be at least 0"),
    ("dapo.overlong_factor=-1", "dapo.overlong_factor must be at least 0"),
    ("edas.alpha=-0.1", "edas.alpha must be at least 0"),
    ("edas.beta=-0.1", "edas.beta must be at least 0"),
    ("edas.kappa=0.5", "edas.kappa must be greater than 1"),
    ("edas.warmup_steps=-1", "edas.warmup_steps must be at least 0"),
    ("rlif-multireward.cluster_weight=-1", "rlif-multireward.cluster_weight must be at least 0"),
])
def test_bad_values_are_refused_when_the_config_loads(override, expected):
    with pytest.raises(UserError) as error:
        load_config(overrides=[*TINY_COPY, override])
    assert expected in str(error.value)


def test_group_size_rule_follows_the_base_of_a_shaping_method():
    with pytest.raises(UserError, match="rollout.group_size must be at least 2 for meds"):
        load_config(overrides=[*TINY_COPY, "algo.name=meds", "algo.base=grpo", "rollout.group_size=1"])
    load_config(overrides=[*TINY_COPY, "algo.name=meds", "rollout.group_size=2"])


def test_eval_may_decode_greedily_but_training_may_not():
    load_config(overrides=[*TINY_COPY, "eval.temperature=0"])
    with pytest.raises(UserError, match="rollout.temperature"):
        load_config(overrides=[*TINY_COPY, "rollout.temperature=0"])


@pytest.mark.parametrize("text, section", [("train: []\n", "train"), ("train: 5\n", "train"),
                                           ("rollout: on\n", "rollout"), ("meds: [1]\n", "meds"),
                                           ("model:\n  lora: 3\n", "model.lora")])
def test_a_section_that_is_not_a_mapping(tmp_path, text, section):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(UserError, match=f"config section '{section}' must be a mapping"):
        load_config([str(path)])


def test_an_empty_section_takes_the_defaults(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("train:\nmeds:\n")
    assert load_config([str(path)]).train.steps == 20


def test_lora_rank_within_the_model_width():
    cfg = load_config(overrides=[*TINY_COPY, "model.lora.rank=64"])
    check_lora_rank(cfg.model.lora, 64, "m")
    with pytest.raises(UserError, match=r"model.lora.rank must be at most the hidden size of 'm' \(32\), got 64"):
        check_lora_rank(cfg.model.lora, 32, "m")
    disabled = load_config(overrides=[*TINY_COPY, "model.lora.rank=64", "model.lora.enabled=false"]).model.lora
    check_lora_rank(disabled, 32, "m")


@pytest.mark.parametrize("args", [
    ["--set", "optim.lr=-1"], ["--set", "rollout.top_p=2"], ["--seed", "-5"], ["--steps", "0"],
    ["--set", "model.lora.rank=100000"],  # checked against the tiny model's width before its run folder stays
])
def test_cli_refuses_in_one_line_and_makes_no_folder(tmp_path, args):
    result = CliRunner().invoke(app, ["train", "--model", "tiny-llama", "--task", "copy", "--algo", "grpo",
                                      "--output", str(tmp_path / "run"), *args])
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error:"), result.output
    assert not (tmp_path / "run").exists()


def test_the_old_generation_batch_size_key_is_still_read_with_a_note(capsys):
    cfg = load_config(overrides=["rollout.generation_batch_size=12"])
    assert cfg.rollout.hf.generation_batch_size == 12
    assert "rollout.generation_batch_size is now rollout.hf.generation_batch_size" in capsys.readouterr().err
    both = load_config(overrides=["rollout.generation_batch_size=12", "rollout.hf.generation_batch_size=7"])
    assert both.rollout.hf.generation_batch_size == 7  # the new place wins


def test_engine_sections_are_registered_with_their_engines():
    from meds_cli.engine.rollout.engines import ROLLOUT_ENGINES, engine_sections

    assert set(engine_sections()) == {"hf", "worker", "vllm", "server"}
    assert set(ROLLOUT_ENGINES.get("hf-worker").settings) == {"hf", "worker"}
    cfg = load_config(overrides=["rollout.server.port=8200", "rollout.worker.cores=1"])
    assert cfg.rollout.server.port == 8200 and cfg.rollout.worker.cores == 1

"""The command line: version, help, and bad input answered with one line and exit code 2."""

import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from meds_cli.app import app
from tests.cli_errors import one_error_line

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, list(args))


def test_version():
    result = invoke("--version")
    assert result.exit_code == 0 and result.output.startswith("meds ")


def test_train_help_documents_every_option():
    result = invoke("train", "--help")
    assert result.exit_code == 0
    for option in ["--config", "--set", "--algo", "--base", "--model", "--task", "--steps", "--seed", "--output",
                   "--resume"]:
        assert option in result.output


def test_unknown_key(tmp_path):
    line = one_error_line(invoke("train", "--set", "train.stpes=3", "--output", str(tmp_path / "r")))
    assert "train.stpes" in line and "steps" in line
    assert not (tmp_path / "r").exists()


def test_wrong_type(tmp_path):
    line = one_error_line(invoke("train", "--set", "rollout.group_size=many", "--output", str(tmp_path / "r")))
    assert "rollout.group_size" in line and "int" in line


def test_unknown_algorithm(tmp_path):
    line = one_error_line(invoke("train", "--algo", "dapoo", "--output", str(tmp_path / "r")))
    assert "dapoo" in line and "did you mean 'dapo'" in line and "grpo" in line
    assert not (tmp_path / "r").exists()


def test_missing_config_file(tmp_path):
    line = one_error_line(invoke("train", "--config", str(tmp_path / "nope.yaml")))
    assert "nope.yaml" in line and "does not exist" in line


def test_malformed_yaml(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  steps: [1, 2\n")
    line = one_error_line(invoke("train", "--config", str(bad)))
    assert "bad.yaml" in line and "not valid YAML" in line


def test_existing_run_folder_is_not_overwritten(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("precious\n")
    line = one_error_line(invoke("train", "--model", "tiny-llama", "--task", "copy", "--output", str(run)))
    assert "--resume" in line
    assert (run / "metrics.jsonl").read_text() == "precious\n"


def test_offline_unknown_hub_model(tmp_path):
    line = one_error_line(invoke("train", "--model", "nobody/no-such-model-xyz", "--task", "copy", "--steps", "1",
                                 "--output", str(tmp_path / "r")))
    assert "nobody/no-such-model-xyz" in line and "--model /path/to/model" in line
    assert not (tmp_path / "r").exists()  # no empty run folder left behind


def test_list_shows_registries():
    result = invoke("list")
    assert result.exit_code == 0
    for name in ["grpo", "dapo", "rloo", "dual-clip", "arithmetic", "copy", "smollm2-135m", "Qwen2.5-Math-1.5B"]:
        assert name in result.output


def test_train_then_resume_then_config_repeat(tmp_path):
    run = tmp_path / "run"
    args = ["train", "--model", "tiny-llama", "--task", "copy", "--steps", "2", "--output", str(run), "-q",
            "--set", "rollout.max_new_tokens=2", "--set", "rollout.prompts_per_step=2", "--set", "rollout.group_size=4"]
    assert invoke(*args).exit_code == 0
    assert (run / "config.yaml").is_file() and (run / "checkpoints" / "step_2").is_dir()
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2
    result = invoke("train", "--resume", str(run), "--steps", "3", "-q")
    assert result.exit_code == 0, result.output
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 3
    # the written config repeats the run
    again = tmp_path / "again"
    result = invoke("train", "--config", str(run / "config.yaml"), "--output", str(again), "-q")
    assert result.exit_code == 0, result.output
    assert (again / "config.yaml").read_text() == (run / "config.yaml").read_text()


@pytest.mark.slow
def test_console_script_runs():
    out = subprocess.run([sys.executable, "-m", "meds_cli", "--version"], capture_output=True, text=True,
                         env={**os.environ})
    assert out.returncode == 0 and "meds" in out.stdout

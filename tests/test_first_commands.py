"""The first commands a user types do the obvious thing: `meds eval` with nothing named evaluates the
newest run (and says so), the prompt follows the model, and a prompt the model does not understand
is called out."""

import json
import os
import time

import pytest
import torch
from typer.testing import CliRunner

from benchmarks.generation import Generated
from meds_cli.app import app
from meds_cli.commands.eval import choose_prompt, prompt_warning
from meds_cli.core.errors import UserError
from meds_cli.engine.config import dump_yaml
from meds_cli.engine.rollout import eval_backends
from meds_cli.engine.run_folders.run_dir import newest_run
from meds_cli.engine.trainer import Trainer
from tests.conftest import tiny_config

runner = CliRunner()
ROWS = [{"problem": "compute 1+1", "answer": "2"}, {"problem": "compute 2*3", "answer": "6"}]
EVAL = ["--benchmarks", "math500", "--k", "2", "--n", "2", "--max-new-tokens", "6", "--temperature", "1.0",
        "--top-p", "1.0", "-q"]


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture
def data_dir(tmp_path):
    (tmp_path / "data" / "math500").mkdir(parents=True)
    (tmp_path / "data" / "math500" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return tmp_path / "data"


def _touch(path, seconds_ago):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    stamp = time.time() - seconds_ago
    os.utime(path, (stamp, stamp))


def test_the_newest_run_is_the_one_written_to_last(tmp_path):
    _touch(tmp_path / "runs" / "20260101-000000-meds" / "config.yaml", 300)
    _touch(tmp_path / "runs" / "20260102-000000-dapo" / "config.yaml", 200)
    _touch(tmp_path / "runs" / "eval-20260103-x" / "results.json", 10)  # not a run: no config.yaml
    assert newest_run(tmp_path / "runs").name == "20260102-000000-dapo"
    _touch(tmp_path / "runs" / "20260101-000000-meds" / "metrics.jsonl", 100)  # resumed and trained since
    assert newest_run(tmp_path / "runs").name == "20260101-000000-meds"
    with pytest.raises(UserError, match="no run folder under"):
        newest_run(tmp_path / "elsewhere")


def test_prompt_choice():
    assert choose_prompt("boxed", "chat", True) == ("boxed", "--prompt")
    assert choose_prompt("auto", "boxed", True) == ("boxed", "the run's task.prompt_style")
    assert choose_prompt("auto", None, True) == ("chat", "the model has a chat template")
    assert choose_prompt("auto", None, False) == ("boxed", "the model has no chat template")


def test_prompt_warning_names_the_benchmarks_with_mostly_empty_answers():
    document = {"config": {"prompt": "boxed"},
                "benchmarks": {"math500": {"short_response_share": 0.9}, "aime24": {"short_response_share": 0.5}}}
    warning = prompt_warning(document)
    assert "math500 90%" in warning and "aime24" not in warning and "try --prompt chat" in warning
    document["benchmarks"]["math500"]["short_response_share"] = 0.2
    assert prompt_warning(document) is None


def test_eval_with_nothing_named_evaluates_the_newest_run_with_its_own_prompt(tmp_path, data_dir, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke("eval", *EVAL, "--data-dir", data_dir)
    assert result.exit_code == 2 and "nothing to evaluate: no run folder under 'runs'" in result.output

    cfg = tiny_config("train.steps=1", "rollout.prompts_per_step=2", "rollout.group_size=2", "task.prompt_style=boxed",
                      "task.system_prompt=be brief")
    run = tmp_path / "runs" / "20260101-000000-grpo"
    trainer = Trainer(cfg, run)
    trainer.train()
    dump_yaml(cfg, run / "config.yaml", sections=trainer.algorithm.config_sections)
    result = invoke("eval", *EVAL, "--data-dir", data_dir)
    assert result.exit_code == 0, result.output
    assert f"evaluating the newest run, {os.path.join('runs', run.name)}" in result.output
    assert "prompt: boxed (the run's task.prompt_style)" in result.output
    settings = json.loads((run / "eval" / "step_1" / "results.json").read_text())["config"]
    assert settings["prompt"] == "boxed" and settings["system_prompt"] == "be brief"


def test_a_bare_model_with_a_chat_template_is_prompted_through_it(tmp_path, data_dir, monkeypatch):
    from meds_cli.engine.model_io.tiny import tiny_model_and_tokenizer

    model, tokenizer = tiny_model_and_tokenizer()
    tokenizer.chat_template = "{% for m in messages %}user: {{ m['content'] }}{% endfor %} answer:"
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    prompts = []
    real = eval_backends.HFBackend.generate

    def recording(self, requests):
        prompts.extend(r.prompt for r in requests)
        return real(self, requests)

    monkeypatch.setattr(eval_backends.HFBackend, "generate", recording)
    result = invoke("eval", "--model", tmp_path / "model", *EVAL, "--data-dir", data_dir, "--output", tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert "prompt: chat (the model has a chat template)" in result.output
    assert prompts and all(p.startswith("user: compute") and p.endswith(" answer:") for p in prompts)


def test_mostly_one_token_answers_are_reported_as_a_prompt_problem(tmp_path, data_dir, monkeypatch):
    def empty_answers(self, requests):
        return [Generated([""] * r.n, [1] * r.n, [False] * r.n) for r in requests]

    monkeypatch.setattr(eval_backends.HFBackend, "generate", empty_answers)
    result = invoke("eval", "--model", "tiny-llama", *EVAL, "--data-dir", data_dir, "--output", tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert ("the prompt is probably wrong for this model (it was given the boxed prompt; try --prompt chat)"
            in result.output)
    document = json.loads((tmp_path / "out" / "results.json").read_text())
    assert document["benchmarks"]["math500"]["short_response_share"] == 1.0
    assert "math500 100%" in document["warnings"][0]
    torch.manual_seed(0)  # leave no trace in the global RNG for later tests


# ---------------------------------------------------------------- an eval of a run: what it trained for


def test_run_defaults_follow_the_run():
    from meds_cli.commands.eval import run_defaults

    assert run_defaults("copy", 2, None, None)[:2] == (["heldout"], 2)  # a toy task: its split, its length
    # the arithmetic task's chat answers need more than the demo's training limit of 48 tokens
    # (HELDOUT_MIN_NEW_TOKENS): at least 256, or the run's own limit where that is longer
    assert run_defaults("arithmetic", 48, None, None)[:2] == (["heldout"], 256)
    assert run_defaults("arithmetic", 512, None, None)[:2] == (["heldout"], 512)
    assert run_defaults("math", 1024, None, None)[:2] == (["math500"], 4096)  # a math run: math500
    assert run_defaults(None, None, None, None)[:2] == (["math500"], 4096)  # a model
    assert run_defaults("arithmetic", 48, ["aime24"], None)[:2] == (["aime24"], 4096)  # what is asked wins
    assert run_defaults("arithmetic", 48, None, 16)[:2] == (["heldout"], 16)
    why = run_defaults("arithmetic", 48, None, None)[2]
    assert "task 'arithmetic'" in why and "rollout.max_new_tokens 48 is shorter" in why


def test_truncation_warning_above_ten_percent_names_the_option():
    from benchmarks.eval_report import truncation_line, truncation_warning

    document = {"config": {"max_new_tokens": 256}, "benchmarks": {
        "math500": {"truncated": 3, "responses": 20, "truncated_share": 0.15},
        "aime24": {"truncated": 2, "responses": 20, "truncated_share": 0.10}}}
    line = truncation_warning(document)
    # 15% > 10% warns; exactly 10% does not
    assert "256-token limit" in line and "math500 15.0%" in line and "aime24" not in line
    assert "--max-new-tokens (e.g. --max-new-tokens 512)" in line
    assert truncation_line(document) == ("truncated at the 256-token limit: math500 3 of 20 (15.0%), "
                                         "aime24 2 of 20 (10.0%)")
    document["benchmarks"]["math500"]["truncated_share"] = 0.1
    assert truncation_warning(document) is None


def test_eval_of_a_run_defaults_to_its_held_out_split(tmp_path):
    run_dir = tmp_path / "run"
    cfg = tiny_config("train.steps=1", output_dir=run_dir)  # the copy task, 2-token responses
    Trainer(cfg, run_dir).train()
    dump_yaml(cfg, run_dir / "config.yaml")
    result = invoke("eval", run_dir, "--k", "2", "--n", "2", "-q")
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "benchmarks: heldout at up to 2 tokens (what the run was trained for (task 'copy')" in text
    # every report says how many responses were cut, and warns above 10% (copy answers fill their 2 tokens)
    assert "truncated at the 2-token limit: heldout-copy" in text
    assert "work: 10 problems x 2 samples x up to 2 tokens = up to 40 tokens" in text
    results = json.loads((run_dir / "eval" / "step_1" / "results.json").read_text())
    assert list(results["benchmarks"]) == ["heldout-copy"] and results["config"]["max_new_tokens"] == 2
    scores = results["benchmarks"]["heldout-copy"]
    assert scores["problems"] == 10 and scores["responses"] == 20 and 0 <= scores["truncated"] <= 20
    samples = [json.loads(line) for line in (run_dir / "eval" / "step_1" / "samples.jsonl").read_text().splitlines()]
    assert {s["problem_id"] for s in samples} == {f"copy-{d}" for d in range(10)}


def test_held_out_split_needs_a_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke("eval", "--model", "tiny-llama", "--benchmarks", "heldout", "--k", "1", "-q")
    assert result.exit_code == 2 and "held-out split: give a run folder" in result.output


# ---------------------------------------------------------------- meds train: the task, --dry-run


def test_real_model_without_a_task_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke("train", "--algo", "meds", "--model", "Qwen2.5-Math-1.5B")
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert "-c configs/meds_paper.yaml" in lines[0] and "--task" in lines[0] and "toy task" in lines[0]
    assert not (tmp_path / "runs").exists()


def test_task_was_chosen_reads_files_their_parents_sets_and_flags(tmp_path):
    from meds_cli.commands.train import task_was_chosen

    parent = tmp_path / "parent.yaml"
    parent.write_text("task: {name: math}\n")
    child = tmp_path / "child.yaml"
    child.write_text("extends: parent.yaml\nrollout: {group_size: 4}\n")
    plain = tmp_path / "plain.yaml"
    plain.write_text("rollout: {group_size: 4}\n")
    assert task_was_chosen([child], [], {})
    assert not task_was_chosen([plain], ["task.digits=2"], {"task.name": None})
    assert task_was_chosen([plain], ["task.name=copy"], {})
    assert task_was_chosen([], [], {"task.name": "math"})


def test_train_dry_run_shows_the_plan_and_creates_nothing(tmp_path, monkeypatch):
    import meds_cli.engine.trainer as trainer_module

    def no_trainer(*args, **kwargs):
        raise AssertionError("a dry run must not build the trainer")

    monkeypatch.setattr(trainer_module, "Trainer", no_trainer)
    monkeypatch.chdir(tmp_path)
    result = invoke("train", "--dry-run", "--algo", "meds", "--model", "Qwen2.5-Math-1.5B", "--task", "math",
                    "--set", "rollout.prompts_per_step=4", "--set", "rollout.group_size=8",
                    "--set", "rollout.max_new_tokens=64", "--set", "dapo.max_gen_batches=3")
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "algo:" in result.output and "name: meds" in result.output  # the resolved config as YAML
    assert "run folder: would create runs/" in text
    assert "about 1.5B parameters (from its name Qwen/Qwen2.5-Math-1.5B; not downloaded)" in text
    assert "4 prompts x 8 responses = 32 responses a step, up to 64 new tokens each" in text
    assert "up to 2,048 generated tokens a step (6,144 if all 3 sampling rounds" in text
    assert not (tmp_path / "runs").exists()


def test_eta_from_the_pace_of_this_eval():
    from meds_cli.commands.eval import eta_seconds

    assert eta_seconds(100, 10, 10, 5.0) is None  # only reused samples so far: no pace yet
    assert eta_seconds(100, 0, 0, None) is None
    # 20 samples drawn in 40 s (10 reused): 70 left at 2 s each
    assert eta_seconds(100, 30, 10, 40.0) == pytest.approx(140.0)

"""A researcher's first hour (issue 54): the messages say what to do, without loading a model.
Each test fails on the code before the issue and asserts the message itself."""

from typer.testing import CliRunner

from meds_cli.app import app
from tests.cli_errors import one_error_line

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, list(args))


def dry_run_lines(*args) -> list[str]:
    result = invoke("train", *args, "--dry-run")
    assert result.exit_code == 0, result.output
    return [line for line in result.output.splitlines() if line.startswith(("note:", "warning:", "model:"))]


# ---------------------------------------------------------------- item 2: model names


def test_model_typo_gets_did_you_mean_before_any_loading(tmp_path):
    line = one_error_line(invoke("train", "--model", "smollm2-136m", "--task", "copy", "--dry-run"))
    assert "unknown model 'smollm2-136m'" in line and "did you mean 'smollm2-135m'" in line and "meds list" in line
    line = one_error_line(invoke("eval", "--model", "Qwen2.5-Math-1.5C", "--limit", "1",
                                 "--output", str(tmp_path / "e")))
    assert "did you mean 'Qwen2.5-Math-1.5B'" in line
    assert not (tmp_path / "e").exists()


def test_alias_in_another_case_is_taken_and_said():
    lines = dry_run_lines("--model", "qwen2.5-math-1.5b", "--task", "math", "--set", "task.path=x.jsonl")
    assert "note: --model 'qwen2.5-math-1.5b' taken as 'Qwen2.5-Math-1.5B' (model names are matched ignoring case)" \
        in lines
    assert any(line.startswith("model: Qwen2.5-Math-1.5B, about 1.5B parameters") for line in lines)


def test_a_hub_name_is_said_to_be_looked_up_on_the_model_hub():
    lines = dry_run_lines("--model", "someone/some-model", "--task", "copy")
    assert any("'someone/some-model' is neither a name from `meds list` nor a local folder: it will be looked up on "
               "the model hub" in line for line in lines), lines


def test_offline_hub_miss_says_model_hub(tmp_path):
    line = one_error_line(invoke("train", "--model", "nobody/no-such-model-xyz", "--task", "copy", "--steps", "1",
                                 "--output", str(tmp_path / "r")))
    assert "from the model hub" in line and "dataset hub" not in line


# ---------------------------------------------------------------- item 3: a real model at the demo's settings


def test_real_model_with_the_demo_sampling_settings_is_warned():
    lines = dry_run_lines("--model", "Qwen2.5-Math-1.5B", "--task", "math", "--set", "task.path=x.jsonl")
    warning = next(line for line in lines if line.startswith("warning:"))
    assert "rollout.prompts_per_step=4, rollout.group_size=8, rollout.max_new_tokens=64" in warning
    assert "configs/meds_paper.yaml" in warning
    # the paper's config, or any of the three set: no warning; the demo model on its toy task: none
    assert not [line for line in dry_run_lines("-c", "configs/meds_paper.yaml") if line.startswith("warning:")]
    assert not [line for line in dry_run_lines("--model", "Qwen2.5-Math-1.5B", "--task", "math", "--set",
                                               "task.path=x.jsonl", "--set", "rollout.max_new_tokens=1024")
                if line.startswith("warning:")]
    assert not [line for line in dry_run_lines("--task", "arithmetic") if line.startswith("warning:")]


# ---------------------------------------------------------------- item 9: the list-field message


def test_a_list_field_names_the_bad_item_and_what_the_key_takes():
    line = one_error_line(invoke("train", "--set", "meds.layers=[last]", "--dry-run"))
    assert "config key 'meds.layers' has value ['last']: item 0 ('last') is not int" in line
    assert "expected str or a list of int" in line and "last_half" in line and "last:K" in line


# ---------------------------------------------------------------- item 5: meds eval on an ablation folder


def test_eval_of_an_ablation_folder_says_what_it_is_and_how_to_evaluate_its_runs(tmp_path):
    folder = tmp_path / "ablate-x"
    for name in ("features-logits", "features-random"):
        (folder / name).mkdir(parents=True)
        (folder / name / "config.yaml").write_text("algo: {name: meds}\n")
    (folder / "tasks.json").write_text("{}\n")
    line = one_error_line(invoke("eval", str(folder), "--limit", "1"))
    assert f"'{folder}' is an ablation folder (meds ablate), not a run folder" in line
    assert "features-logits, features-random" in line and str(folder / "features-logits") in line
    assert f"meds ablate --collect {folder}" in line and "start it again with --output" not in line


# ---------------------------------------------------------------- item 8: --compare of unlike evals


def _doc(k, n, problems):
    ks = [str(2 ** i) for i in range(k.bit_length()) if 2 ** i <= k]
    return {"config": {"k": k, "n": n}, "benchmarks": {name: {"pass@k": {x: 0.5 for x in ks}, "problems": count}
                                                       for name, count in problems.items()}}


def test_compare_notes_evals_that_differ_in_k_n_and_problems():
    from rich.console import Console

    from benchmarks.eval_report import comparison_table, setting_differences

    labelled = [("A", _doc(128, 128, {"math500": 500, "aime24": 30})), ("B", _doc(8, 16, {"math500": 50}))]
    notes = setting_differences(labelled)
    assert notes == [
        "the evals differ in k (the largest pass@k) (A 128, B 8): the table shows the pass@k they all have",
        "the evals differ in samples per problem n (A 128, B 16): pass@k from fewer samples is noisier",
        "math500: the evals scored different problems (A 500, B 50 problems): the table's rows are not over the "
        "same problems; the paired lines compare the problems they share",
        "aime24: not in B's eval; it is compared only among the others",
    ]
    console = Console(record=True, width=200)
    console.print(comparison_table(labelled))
    text = console.export_text()
    assert "note: the evals differ in k" in text and "pass@8" in text and "pass@16" not in text
    assert setting_differences([("A", _doc(8, 8, {"math500": 50})), ("B", _doc(8, 8, {"math500": 50}))]) == []


# ---------------------------------------------------------------- item 16: the ablation plan shows each arm's base


def test_ablate_dry_run_shows_each_arms_base_and_key_settings(tmp_path):
    result = invoke("ablate", "--algos", "dapo,outcome-ucb,w-reinforce", "--steps", "2", "--dry-run",
                    "--output", str(tmp_path / "abl"))
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.replace("│", " ").split())
    assert "outcome-ucb on grpo; outcome-ucb.variant=ucb" in text
    assert "w-reinforce on dapo; w-reinforce.mode=weighted" in text
    assert not (tmp_path / "abl").exists()


# ---------------------------------------------------------------- item 12: the engine in the header and table


def test_the_run_says_its_engine_and_staleness_in_the_header_and_the_final_table(tmp_path):
    import io

    from rich.console import Console

    from meds_cli.commands.train import engine_text, print_summary
    from meds_cli.engine.config import load_config

    apart = load_config([], ["rollout.engine=hf-worker", "rollout.max_staleness=1"])
    assert engine_text(apart) == "engine: hf-worker, staleness k=1"
    assert engine_text(load_config([], [])) == "engine: hf"
    out = io.StringIO()
    rows = [{"step": 1, "reward": 0.1}, {"step": 2, "reward": 0.5}]
    print_summary(Console(file=out, width=80), tmp_path / "run", rows, engine_text(apart))
    assert "run: step 1 -> 2 (engine: hf-worker, staleness k=1)" in out.getvalue()


def test_the_hf_worker_leaves_no_empty_scratch_folder(tmp_path):
    import queue
    from types import SimpleNamespace

    from meds_cli.engine.rollout.hf_worker import HFWorkerEngine

    def empty_get(timeout=None):
        raise queue.Empty

    stopped = SimpleNamespace(is_alive=lambda: False)
    drained = SimpleNamespace(get=empty_get, cancel_join_thread=lambda: None)  # the worker's queues, emptied
    for keep in (False, True):
        scratch = tmp_path / f"scratch-{keep}"
        scratch.mkdir()
        if keep:  # another engine's file: the folder stays
            (scratch / "adapter.safetensors").write_text("x")
        engine = HFWorkerEngine.__new__(HFWorkerEngine)
        engine.process, engine.scratch_dir = stopped, scratch
        engine.jobs = engine.results = drained
        engine.close()
        assert scratch.exists() == keep


# ---------------------------------------------------------------- item 10: the README's first eval fits a CPU


def test_the_readmes_first_eval_example_is_limited():
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    first = next(line for line in readme.splitlines() if line.startswith("meds eval"))
    assert "--limit" in first and "--k 128" not in first, first

"""Issue 43: nothing a config, a grid or a run folder holds runs as code, escapes its folder, or
changes a verdict silently. One test per finding; each asserts the exit code, the one line, and
what did not happen (no file outside, no extra line in the script, no verdict written).

The ablation folders read back here are made by hand (tasks.json from a real plan, samples and
results written as an eval writes them), so no model trains; the scripts are read, run through
`bash -n`, and, with the local Slurm of `make test-slurm`, through `sbatch --test-only`
(tests/test_untrusted_inputs_slurm.py)."""

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from benchmarks.harness import EvalSettings
from meds_cli.app import app
from meds_cli.commands.ablate import claim_folder, make_plan, read_grid, variant_sets
from meds_cli.commands.ablate_task import write_tasks
from meds_cli.core.errors import UserError
from meds_cli.engine.launchers.local import ProcessLauncher
from meds_cli.engine.launchers.slurm_settings import SlurmSettings, settings_from_mapping
from meds_cli.engine.launchers.slurm_train import render_train_script
from meds_cli.engine.launchers.tasks import Task
from tests.test_ablate import TINY_SETS

runner = CliRunner()
SETS = sum((["--set", s] for s in TINY_SETS), [])


def one_line(result, code: int = 2) -> str:
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert result.exit_code == code and len(lines) == 1, result.output
    assert "Traceback" not in result.output
    return lines[0]


def ablate(*options):
    return runner.invoke(app, ["ablate", *SETS, "--steps", "2", "--features", "logits", "--no-baseline",
                               "--k", "2", "-q", *options])


def train(*options):
    return runner.invoke(app, ["train", *SETS, "--steps", "2", *options])


# ---------------------------------------------------------------- shell lines in generated scripts


@pytest.mark.parametrize("value", ["lab\ntouch {marker}", "acct\n#SBATCH --chdir=/", "lab\rx"])
def test_a_control_character_in_slurm_account_is_one_line_and_nothing_is_written(tmp_path, value):
    marker = tmp_path / "x"
    value = value.format(marker=marker)
    for extra in ([], ["--dry-run"]):
        result = ablate("--output", str(tmp_path / "abl"), "--launcher", "slurm", "--no-wait",
                        "--slurm-account", value, *extra)
        line = one_line(result)
        assert f"--slurm-account {value!r} holds a control character" in line
        assert "#SBATCH" not in result.stdout  # no script printed
    assert not (tmp_path / "abl").exists() and not marker.exists()


def test_a_grid_files_slurm_account_with_a_newline_is_one_line(tmp_path):
    grid = tmp_path / "grid.yaml"
    grid.write_text('axes:\n  meds.features: [logits]\nslurm: {account: "lab\\ntouch /tmp/x"}\n')
    line = one_line(ablate("--grid", str(grid), "--output", str(tmp_path / "abl"), "--launcher", "slurm", "--dry-run"))
    assert "--slurm-account 'lab\\ntouch /tmp/x' holds a control character" in line
    assert not (tmp_path / "abl").exists()


@pytest.mark.parametrize("where, value", [
    ("tag", "x\ntouch /tmp/y #"), ("output_dir", "{tmp}/dir\ncmd #"), ("runs_root", "{tmp}/root\ncmd #"),
    ("--output", "{tmp}/dir\ncmd #"),
])
def test_a_newline_in_the_run_folder_of_a_slurm_train_is_one_line(tmp_path, where, value):
    value = value.replace("{tmp}", str(tmp_path))
    config = tmp_path.parent / f"{tmp_path.name}-config.yaml"  # a config file: YAML keeps a quoted newline
    config.write_text(json.dumps({"train": {where: value}} if not where.startswith("--") else {}))
    options = ["--output", value] if where == "--output" else []
    result = train("--launcher", "slurm", "--dry-run", "-c", str(config), *options)
    line = one_line(result)
    assert "the run folder (--output, train.output_dir, or train.runs_root and train.tag)" in line
    assert "holds a control character ('\\n')" in line
    assert "#SBATCH" not in result.stdout
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("options", [
    ["--output", "{tmp}/dir\ncmd #"],
    ["--set", 'train.runs_root="{tmp}/root\\ncmd #"'],  # YAML's double quotes: \\n is a newline
])
def test_a_newline_in_the_ablation_folder_is_one_line_before_the_plan(tmp_path, options):
    options = [o.replace("{tmp}", str(tmp_path)) for o in options]
    result = ablate("--launcher", "slurm", "--dry-run", *options)
    line = one_line(result)
    assert "the ablation folder (--output) " in line and "holds a control character ('\\n')" in line
    assert list(tmp_path.iterdir()) == []


def test_the_slurm_train_script_of_a_folder_and_python_with_spaces_and_quotes(tmp_path):
    run = tmp_path / "my run's \"x\""
    script = render_train_script(run, nodes=2, gpus_per_node=0, processes_per_node=2, settings=SlurmSettings(),
                                 python="/opt/my py/bin/python", workdir=tmp_path / "work dir")
    # Slurm's quoting on #SBATCH lines: in double quotes, a backslash before a quote
    assert f'#SBATCH --output="{tmp_path}/my run\'s \\"x\\"/slurm-%j.out"' in script
    srun = next(line for line in script.splitlines() if line.startswith("srun "))
    words = shlex.split(srun)  # srun --kill-on-bad-exit=1 bash -c LAUNCH meds "${ARGS[@]}"
    assert words[:3] == ["srun", "--kill-on-bad-exit=1", "bash"] and words[3] == "-c"
    assert shlex.split(words[4])[0] == "/opt/my py/bin/python"  # was: bash -c "/path/my"
    assert f"cd {shlex.quote(str(tmp_path / 'work dir'))}" in script
    (tmp_path / "train.sbatch").write_text(script)
    assert subprocess.run(["bash", "-n", str(tmp_path / "train.sbatch")]).returncode == 0


def test_a_percent_in_the_folder_is_refused(tmp_path):
    with pytest.raises(UserError, match="holds a '%', which Slurm reads as a file name pattern"):
        render_train_script(tmp_path / "100%", nodes=1, gpus_per_node=0, processes_per_node=1,
                            settings=SlurmSettings(), python="python", workdir=tmp_path)


@pytest.mark.parametrize("item, owner", [
    ("array=0-99", "--array is written by the launcher's script; it is set by the launcher"),
    ("output=/tmp/o", "--output is written by the launcher's script"),
    ("arr=1", "--arr (sbatch reads it as --array)"),
    ("job-name=x", "--job-name is written by the launcher's script"),
    ("time=1", "it is set by --slurm-time"),
])
def test_slurm_extra_cannot_set_the_launchers_own_options(tmp_path, item, owner):
    from meds_cli.engine.launchers.script_text import check_extra

    with pytest.raises(UserError, match="written by the launcher"):
        check_extra(item)
    line = one_line(ablate("--output", str(tmp_path / "abl"), "--launcher", "slurm", "--dry-run",
                           "--slurm-extra", item))
    assert f"--slurm-extra '{item}'" in line and owner in line
    assert not (tmp_path / "abl").exists()
    assert check_extra("qos=high") == ("qos", "high") and check_extra("gpus=2") == ("gpus", "2")


def test_a_failed_sbatch_leaves_no_half_made_run_folder(tmp_path, monkeypatch):
    from meds_cli.commands import train_slurm

    def refuses(script):
        raise UserError(f"sbatch refused {script}: sbatch: error: Invalid directive found in batch script")

    monkeypatch.setattr(train_slurm, "check_before_submit", lambda *a, **k: None)
    monkeypatch.setattr(train_slurm, "sbatch_submit", refuses)
    run = tmp_path / "a run"
    assert "Invalid directive" in one_line(train("--launcher", "slurm", "--output", str(run)))
    assert not run.exists()  # was: left behind, and the rerun said "continue it with --resume"
    assert "Invalid directive" in one_line(train("--launcher", "slurm", "--output", str(run)))


# ---------------------------------------------------------------- names that stay inside


def test_folder_names_are_one_safe_component():
    from meds_cli.core.names import child, safe_component

    assert safe_component("..") == "x" and safe_component("/abs/path-1") == "abs-path-1"
    assert safe_component("../../other/run") == "other-run" and safe_component(".hidden") == "hidden"
    long = safe_component("a" * 300)
    assert len(long) <= 96 and long != safe_component("a" * 299)  # bounded, still apart
    with pytest.raises(UserError, match="names the folder '../x', which is not a folder of"):
        child(Path("/tmp"), "../x", "tasks.json")


def test_a_grid_key_or_a_variant_name_cannot_leave_the_ablation_folder(tmp_path):
    grid = tmp_path / "grid.yaml"
    grid.write_text("axes:\n  task.chat_template_kwargs./abs/path: [1]\n"
                    "variants:\n  - {name: '..', set: {meds.alpha: 0.2}}\nbaseline: false\n")
    result = runner.invoke(app, ["ablate", *SETS, "--steps", "2", "--grid", str(grid), "--dry-run",
                                 "--output", str(tmp_path / "abl")])
    assert result.exit_code == 0, result.output
    assert "runs in the folder" in result.output
    plan = make_plan(config_files=[], sets=TINY_SETS, grid_file=grid, features=None, clusterer=None, layers=None,
                     seeds=None, steps=2, baseline=False, output=tmp_path / "abl")
    names = [v.name for v in plan.variants]
    assert all("/" not in n and not n.startswith(".") for n in names), names
    assert any("note" for _ in plan.notes) and len(plan.notes) == 2
    claim_folder(plan)
    write_tasks(plan, EvalSettings(["heldout"], k=2), variant_sets)
    outside = sorted(p.name for p in tmp_path.iterdir())
    assert outside == ["abl", "grid.yaml"]  # no config.yaml, no /abs, nothing beside the folder


# ---------------------------------------------------------------- a finished ablation, by hand


def write_eval(folder: Path, correct: list[list[bool]], results=None, extra_rows=()) -> None:
    """eval/heldout/{samples.jsonl, results.json} as meds eval writes them: problems x samples."""
    out = folder / "eval" / "heldout"
    out.mkdir(parents=True, exist_ok=True)
    rows = [{"benchmark": "heldout-copy", "problem_id": f"p{i}", "sample": j, "correct": c}
            for i, draws in enumerate(correct) for j, c in enumerate(draws)]
    (out / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [*rows, *extra_rows]))
    n = len(correct[0])
    # pass@1 = mean correct share; pass@2 with n=2: a problem counts when either sample is right
    p1 = sum(map(sum, correct)) / (len(correct) * n)
    p2 = sum(any(d) for d in correct) / len(correct)
    passk = results if results is not None else {"1": p1, "2": p2}
    (out / "results.json").write_text(json.dumps({"config": {"n": n}, "average": {"pass@k": passk},
                                                  "benchmarks": {"heldout-copy": {"pass@k": passk}}}))
    (folder / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward": 0.5, "time_step_s": 1.0}) + "\n"
                                                  for s in (1, 2)))


CORRECT = {"dapo": [[True, False], [False, False], [True, True], [False, True]],
           "grpo": [[True, True], [False, True], [True, True], [False, True]]}


@pytest.fixture
def finished(tmp_path):
    """An ablation folder of dapo and grpo, both trained and evaluated (by hand)."""
    folder = tmp_path / "abl"
    plan = make_plan(config_files=[], sets=TINY_SETS, grid_file=None, features=None, clusterer=None, layers=None,
                     seeds=None, steps=2, baseline=True, output=folder, algos="dapo,grpo")
    claim_folder(plan)
    write_tasks(plan, EvalSettings(["heldout"], k=2, n=2), variant_sets)
    for variant in plan.variants:
        write_eval(folder / variant.name, CORRECT[variant.name])
    return folder


def collect(folder):
    return runner.invoke(app, ["ablate", "--collect", str(folder)])


def test_the_hand_made_ablation_reports(finished):
    result = collect(finished)
    assert result.exit_code == 0, result.output
    rows = {r["variant"]: r for r in json.loads((finished / "summary.json").read_text())["rows"]}
    # dapo: 4 right of 8 = 0.5; grpo: 6 of 8 = 0.75
    assert rows["dapo"]["pass@1"] == pytest.approx(0.5) and rows["grpo"]["pass@1"] == pytest.approx(0.75)


@pytest.mark.parametrize("value", [97, float("nan"), -5])
def test_a_pass_at_k_out_of_range_is_refused_not_tabulated(finished, value):
    path = finished / "grpo" / "eval" / "heldout" / "results.json"
    document = json.loads(path.read_text())
    document["average"]["pass@k"]["1"] = value
    path.write_text(json.dumps(document))
    line = one_line(collect(finished))
    assert f"'{path}' has average pass@k[1] = {value!r}, not a number in [0, 1]" in line
    assert not (finished / "summary.md").exists()


def test_results_that_disagree_with_their_samples_are_said_and_the_samples_win(finished):
    path = finished / "grpo" / "eval" / "heldout" / "results.json"
    document = json.loads(path.read_text())
    document["average"]["pass@k"]["1"] = 0.9
    path.write_text(json.dumps(document))
    result = collect(finished)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "says pass@1 = 0.9000, its samples give 0.7500: the report uses the samples" in text
    rows = {r["variant"]: r for r in json.loads((finished / "summary.json").read_text())["rows"]}
    assert rows["grpo"]["pass@1"] == pytest.approx(0.75)
    assert "## Warnings" in (finished / "summary.md").read_text()


def test_duplicated_samples_from_two_evals_at_once_are_an_error(finished):
    samples = finished / "dapo" / "eval" / "heldout" / "samples.jsonl"
    samples.write_text(samples.read_text() * 2)  # two evals appended the same draws
    line = one_line(collect(finished))
    assert f"'{samples}' row 9 repeats sample 0 of problem 'p0'" in line
    assert not (finished / "summary.md").exists() and not (finished / "paired.md").exists()


def test_a_cut_off_last_sample_line_is_skipped_and_counted(finished):
    samples = finished / "dapo" / "eval" / "heldout" / "samples.jsonl"
    samples.write_text(samples.read_text() + '{"benchmark": "heldout-copy", "problem_id": "p9", "sam')
    result = collect(finished)
    assert result.exit_code == 0, result.output
    summary = json.loads((finished / "summary.json").read_text())
    assert summary["skipped_lines"] == 1 and "cut short" in " ".join(result.output.split())
    rows = {r["variant"]: r for r in summary["rows"]}
    assert rows["dapo"]["pass@1"] == pytest.approx(0.5)  # the verdict unchanged


def test_an_edited_config_is_not_reported_under_its_label(finished):
    config = finished / "dapo" / "config.yaml"
    config.write_text(config.read_text().replace("name: dapo", "name: grpo", 1))
    result = collect(finished)
    text = " ".join(result.output.split())
    assert "sets algo.name = 'grpo', but variant 'dapo' is algo.name = 'dapo'" in text
    rows = json.loads((finished / "summary.json").read_text())["rows"]
    assert "dapo" not in [r["variant"] for r in rows]


@pytest.mark.parametrize("name", ["../../other/run", "/etc", "..", "a/b"])
def test_a_tasks_json_naming_a_folder_outside_is_refused(finished, name):
    path = finished / "tasks.json"
    record = json.loads(path.read_text())
    record["variants"][1]["name"] = name
    path.write_text(json.dumps(record))
    line = one_line(collect(finished))
    assert f"names the folder {name!r}, which is not a folder of '{finished}'" in line
    assert not (finished / "summary.md").exists()


@pytest.mark.parametrize("file, content, problem", [
    ("tasks.json", "{not json", "is not valid JSON"),
    ("tasks.json", "[1, 2]", "holds a list, not a JSON object"),
    ("tasks.json", '{"steps": "two", "eval": {}, "variants": []}', "has steps = 'two'"),
    ("grpo/eval/heldout/results.json", '{"average": 3}', "has no average pass@k"),
    ("grpo/eval/heldout/results.json", "", "is not valid JSON"),
    ("slurm_jobs.json", '{"12": "grpo"}', "is not a mapping of Slurm job ids"),
    ("slurm_jobs.json", "[]", "holds a list"),
    ("grpo/metrics.jsonl", '{"step": 1, "reward": "high"}\n', "row 1 has 'reward' = 'high', not a number"),
    ("grpo/eval/heldout/samples.jsonl", '{"benchmark": 1}\n', "row 1 is not a sample"),
])
def test_a_malformed_file_read_back_is_one_line_naming_it(finished, file, content, problem):
    (finished / file).write_text(content)
    line = one_line(collect(finished))
    assert str(finished / file) in line and problem in line


def test_a_malformed_ablation_json_is_one_line(finished):
    (finished / "ablation.json").write_text('{"variants": [1]}')
    plan = make_plan(config_files=[], sets=TINY_SETS, grid_file=None, features=None, clusterer=None, layers=None,
                     seeds=None, steps=2, baseline=True, output=finished, algos="dapo,grpo")
    with pytest.raises(UserError, match="ablation.json' has no mapping of variants"):
        claim_folder(plan)


def test_a_second_ablation_of_another_grid_into_the_folder_is_refused(finished):
    before = (finished / "tasks.json").read_text()
    other = make_plan(config_files=[], sets=TINY_SETS, grid_file=None, features=None, clusterer=None, layers=None,
                      seeds=None, steps=2, baseline=True, output=finished, algos="dapo,meds")
    with pytest.raises(UserError, match="holds another grid .2 variants; it holds grpo.; rerun that grid's own"):
        claim_folder(other)
    assert (finished / "tasks.json").read_text() == before  # --collect keeps every variant
    same = make_plan(config_files=[], sets=TINY_SETS, grid_file=None, features=None, clusterer=None, layers=None,
                     seeds=None, steps=2, baseline=True, output=finished, algos="dapo,grpo")
    claim_folder(same)  # the same grid: continued


def test_collect_refuses_options_it_would_ignore(finished):
    line = one_line(runner.invoke(app, ["ablate", "--collect", str(finished), "--k", "4", "--seeds", "1"]))
    assert "it takes no other option (--seeds, --k given)" in line
    assert not (finished / "summary.md").exists()


# ---------------------------------------------------------------- typed grid and slurm sections


@pytest.mark.parametrize("seeds, message", [
    ("0,0", "--seeds names seed 0 twice"),
    ("0,1.5", "--seeds: seed '1.5' is not an integer"),
])
def test_repeated_or_fractional_seeds_are_refused(tmp_path, seeds, message):
    line = one_line(ablate("--seeds", seeds, "--dry-run", "--output", str(tmp_path / "abl")))
    assert message in line


@pytest.mark.parametrize("seeds, message", [("[1.7, true]", "seed 1.7 is not an integer"),
                                            ("[1, 1]", "seeds names seed 1 twice"),
                                            ("[true]", "seed True is not an integer")])
def test_a_grids_seeds_are_typed(tmp_path, seeds, message):
    grid = tmp_path / "grid.yaml"
    grid.write_text(f"axes:\n  meds.features: [logits]\nseeds: {seeds}\n")
    with pytest.raises(UserError, match=message):
        read_grid(grid)


@pytest.mark.parametrize("section, message", [
    ("time: 4:00:00", 'slurm time: 14400 is an integer, not a Slurm time: YAML reads an unquoted 4:00:00 as the '
                      'number 14400 (base 60); quote it: time: "4:00:00"'),
    ('requeue: "false"', "slurm requeue: 'false' is str; give true or false"),
    ("gpus-per-task: true", "slurm gpus-per-task: True is bool; give an integer"),
    ('gpus-per-task: "2"', "slurm gpus-per-task: '2' is str; give an integer"),
    ("account: 12", 'slurm account: 12 is int; give a string (quote it: account: "12")'),
    ("extra: [1]", "slurm extra: [1]; give KEY=VALUE strings"),
])
def test_a_grids_slurm_section_is_typed(tmp_path, section, message):
    grid = tmp_path / "grid.yaml"
    grid.write_text(f"axes:\n  meds.features: [logits]\nslurm:\n  {section}\n")
    line = one_line(ablate("--grid", str(grid), "--launcher", "slurm", "--dry-run", "--output", str(tmp_path / "a")))
    assert message in line
    assert not (tmp_path / "a").exists()
    assert settings_from_mapping({"time": "4:00:00", "requeue": True}, "g").time == "4:00:00"


# ---------------------------------------------------------------- locks and --jobs


def test_an_eval_takes_a_lock_on_its_output_folder(tmp_path):
    from tests.test_eval_resume import ROWS

    data = tmp_path / "data" / "math500"
    data.mkdir(parents=True)
    (data / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c",
                               "import sys, time; from pathlib import Path\n"
                               "from meds_cli.engine.run_folders.run_lock import FolderLock\n"
                               f"lock = FolderLock(Path({str(out)!r}), 'eval output folder', 'x').acquire()\n"
                               "print('held', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        result = runner.invoke(app, ["eval", "--model", "tiny-llama", "--benchmarks", "math500", "--k", "2",
                                     "--max-new-tokens", "4", "--backend", "hf", "--data-dir", str(tmp_path / "data"),
                                     "-q", "--output", str(out)])
    finally:
        holder.kill()
        holder.wait()
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert result.exit_code == 2, result.output
    assert f"eval output folder '{out}' is in use by process {holder.pid}" in lines[-1]
    assert not (out / "samples.jsonl").exists() and not (out / "results.json").exists()


def test_jobs_above_the_tasks_runs_that_many(tmp_path):
    launcher = ProcessLauncher(10_000_000_000)
    task = Task("t", tmp_path, [sys.executable, "-c", "pass"])
    start = time.perf_counter()
    message = launcher.submit([task])
    while launcher.running:
        launcher.poll()
    assert time.perf_counter() - start < 30  # was: a loop over range(10**10)
    assert launcher.jobs == 1 and "running 1 tasks, 1 at once" in message

"""One task of a grid, wherever a launcher runs it: its folder, its command, its outcome.

Before anything runs, the grid's folder gets tasks.json (the variants, steps and eval settings)
and every task folder the fully resolved config.yaml of its variant; a task then needs nothing
but its folder: `meds ablate-task <grid>/<variant>` trains it (fresh from that config.yaml, or
resumed from its last checkpoint, as `meds train --resume` does, e.g. after a Slurm requeue) and
evaluates it. A task that fails writes the last line of its error to task_error.txt; the report
names it with that line (or, for a task killed from outside, the last line of its log).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from benchmarks.harness import EvalSettings
from meds_cli.core.errors import UserError
from meds_cli.core.files import replace_text
from meds_cli.core.markup import plain
from meds_cli.core.names import child
from meds_cli.core.read_back import damaged, read_json, require
from meds_cli.engine.config import dump_yaml, load_config
from meds_cli.engine.launchers.tasks import Task
from meds_cli.engine.run_folders import run_dir as runs

TASKS_FILE = runs.ABLATION_FILE
ERROR_FILE = "task_error.txt"
LOGS = ("slurm-*.out", "task.log")
PREPARED = ("config.yaml", ERROR_FILE, *LOGS)  # what a task folder holds before its run starts
DONE, FAILED, UNFINISHED = "done", "failed", "unfinished"


def task_command(folder: Path) -> list[str]:
    """The process that runs one task: this Python, this meds."""
    return [sys.executable, "-m", "meds_cli", "ablate-task", str(Path(folder).resolve())]


def write_tasks(plan, eval_settings: EvalSettings, variant_sets, eval_length: int | None = None) -> None:
    """tasks.json, and the resolved config of every task not started yet (a started one keeps its
    own); variant_sets(variant): the variant's overrides as --set strings; eval_length: `meds
    ablate --max-new-tokens` (None: each variant's own length)."""
    from meds_cli.engine.training.algorithm_setup import build_algorithm

    record = {"steps": plan.steps, "eval": dataclasses.asdict(eval_settings), "eval_max_new_tokens": eval_length,
              "variants": [dataclasses.asdict(v) for v in plan.variants], "compare": plan.compare}
    replace_text(plan.folder / TASKS_FILE, json.dumps(record, indent=2) + "\n")
    for variant in plan.variants:
        config = plan.folder / variant.name / "config.yaml"
        if config.is_file():
            continue
        cfg = load_config(plan.config_files, plan.base_sets + variant_sets(variant))
        config.parent.mkdir(parents=True, exist_ok=True)
        dump_yaml(cfg, config, sections=build_algorithm(cfg).config_sections)


def read_tasks(folder: Path) -> dict:
    """tasks.json of an ablation folder, checked: a malformed or wrong-typed one, or a variant
    naming a folder outside the ablation folder, is one line naming the file."""
    path = Path(folder) / TASKS_FILE
    if not path.is_file():
        raise UserError(f"'{folder}' is not an ablation folder (no {TASKS_FILE} in it); give the folder "
                        "`meds ablate` printed")
    record = read_json(path)
    steps, settings, variants = record.get("steps"), record.get("eval"), record.get("variants")
    require(isinstance(steps, int) and not isinstance(steps, bool) and steps >= 0, path,
            f"has steps = {steps!r}, not a number of steps")
    require(isinstance(settings, dict), path, f"has eval = {settings!r}, not the eval settings")
    length = record.get("eval_max_new_tokens")
    require(length is None or (isinstance(length, int) and not isinstance(length, bool) and length >= 1), path,
            f"has eval_max_new_tokens = {length!r}, not a number of tokens")
    require(isinstance(variants, list) and bool(variants), path, "has no list of variants")
    for item in variants:
        seed = item.get("seed") if isinstance(item, dict) else None
        require(isinstance(item, dict) and isinstance(item.get("name"), str) and isinstance(item.get("group"), str)
                and isinstance(item.get("overrides"), dict)
                and (seed is None or (isinstance(seed, int) and not isinstance(seed, bool))),
                path, f"has the variant {item!r}, not a name, group, overrides and seed")
        child(folder, item["name"], f"'{path}'")
    names = [item["name"] for item in variants]
    require(len(set(names)) == len(names), path, "names a variant twice")
    compare = record.get("compare", [])
    groups = {item["group"] for item in variants}
    require(isinstance(compare, list) and all(isinstance(pair, list) and len(pair) == 2 and set(pair) <= groups
                                              for pair in compare), path,
            f"has compare = {compare!r}, not pairs of its arms")
    eval_settings_of(record, path)
    return record


def eval_settings_of(record: dict, source="tasks.json") -> EvalSettings:
    from meds_cli.commands.ablate_eval import variant_settings

    try:
        settings = EvalSettings(**record["eval"])
        variant_settings(settings, 1)  # its values' types and ranges
    except TypeError as error:
        raise damaged(source, f"has eval settings that are not meds eval's ({error})") from None
    return settings


def check_config(folder: Path, name: str, overrides: dict) -> None:
    """The task's config.yaml still sets what its variant is (tasks.json's overrides): an edited
    config.yaml would train one algorithm under another's label, so it is refused in one line."""
    config = Path(folder) / "config.yaml"
    if not config.is_file():
        return
    ours = dataclasses.asdict(load_config([str(config)]))
    sets = [f"{key}={json.dumps(value)}" for key, value in overrides.items()]
    theirs = dataclasses.asdict(load_config([str(config)], sets))
    if ours == theirs:
        return
    for key, value in overrides.items():
        found = ours
        for part in key.split("."):
            found = found.get(part) if isinstance(found, dict) else None
        wanted = theirs
        for part in key.split("."):
            wanted = wanted.get(part) if isinstance(wanted, dict) else None
        if found != wanted:
            raise UserError(f"'{config}' sets {key} = {found!r}, but variant '{name}' is {key} = {value!r} "
                            f"({TASKS_FILE}): the task's config was edited; restore it, or delete the task folder "
                            "to start the task over")
    raise UserError(f"'{config}' does not set what variant '{name}' is ({', '.join(sets)}, {TASKS_FILE}): the task's "
                    "config was edited; restore it, or delete the task folder to start the task over")


def make_task(folder: Path) -> Task:
    return Task(folder.name, folder, task_command(folder))


def clear_error(folder: Path) -> None:
    (Path(folder) / ERROR_FILE).unlink(missing_ok=True)


def last_line(text: str) -> str | None:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else None


def task_outcome(folder: Path, results_file: Path) -> tuple[str, str | None]:
    """DONE; FAILED with the last line of its error; or UNFINISHED with the last line of its
    newest log (None when it never started)."""
    if results_file.is_file():
        return DONE, None
    error = folder / ERROR_FILE
    if error.is_file():
        return FAILED, last_line(error.read_text(errors="replace"))
    logs = sorted((p for pattern in LOGS for p in folder.glob(pattern)), key=lambda p: p.stat().st_mtime)
    return UNFINISHED, last_line(logs[-1].read_text(errors="replace")) if logs else None


def train_task(folder: Path, steps: int, console, quiet: bool, argv) -> None:
    """Train to `steps`: fresh from the folder's config.yaml, resumed, or not at all when done."""
    from meds_cli.commands.train import run_training

    done = runs.list_checkpoints(folder)
    if done and done[-1] >= steps:
        return
    if done or (folder / "command.txt").is_file():  # started before: resume (a run with no checkpoint restarts)
        if done:
            console.print(f"[bold]{plain(folder.name)}[/]: resuming from step {plain(done[-1])}")
        code = run_training([], [], {}, resume=folder, argv=argv, quiet=quiet)
    else:
        code = run_training([str(folder / "config.yaml")], [f"train.output_dir={json.dumps(str(folder))}"], {},
                            argv=argv, quiet=quiet, prepared=PREPARED)
    if code != 0:
        raise KeyboardInterrupt


def run_task(folder: Path, console, *, quiet: bool = True, argv=()) -> None:
    """Train and evaluate one task; an error leaves its last line in the folder, then goes on up."""
    from meds_cli.commands.ablate_eval import evaluate_variant
    from meds_cli.commands.ablate_grid import trains

    folder = Path(folder)
    record = read_tasks(folder.parent)
    variant = next((item for item in record["variants"] if item["name"] == folder.name), None)
    if variant is None:
        raise UserError(f"'{folder}' is not a task of the ablation in '{folder.parent}' ({TASKS_FILE} does not "
                        "name it)")
    clear_error(folder)
    try:
        check_config(folder, variant["name"], variant["overrides"])
        if trains(variant["overrides"]):  # the base-model arm (train.steps 0) is evaluated as is
            train_task(folder, record["steps"], console, quiet, list(argv))
        evaluate_variant(folder, eval_settings_of(record), console, record.get("eval_max_new_tokens"))
    except Exception as error:
        text = str(error) if isinstance(error, UserError) else f"{type(error).__name__}: {error}"
        replace_text(folder / ERROR_FILE, (last_line(text) or type(error).__name__) + "\n")
        raise

"""`meds ablate`: ablations as one command: variants -> train -> evaluate -> compare.

Algorithms side by side: `--algos dapo,meds,passk` (or `algos:` in a grid) makes each algorithm
or preset a variant on the same base config and seeds, the first (or `--baseline NAME`) the
baseline (meds_cli.commands.ablate_grid). MEDS's own settings: variants come from flags
(`--features logits,semantic --clusterer hdbscan,kmeans --layers last_half,last:4 --seeds 0,1,2`:
the cartesian product) and/or a YAML grid (configs/ablate/*.yaml, format below). Each variant is
the base config (`--config`, `--set`, algorithm meds) plus its own overrides only; without
--algos a baseline of MEDS's base algorithm (DAPO unless `algo.base` says otherwise) runs beside
them unless `--no-baseline`. Every variant trains through the real Trainer
(meds_cli.commands.train.run_training) in ABLATION_DIR/<variant>/, is evaluated
(meds_cli.commands.ablate_eval), and the report (meds_cli.commands.ablate_report) compares them,
mean and std over seeds. Rerunning the same command with `--output ABLATION_DIR` skips finished
variants and resumes an interrupted one from its last checkpoint.

Grid file:
    config: [../meds_paper.yaml]      # optional base config files (relative to the grid file)
    set: [train.steps=50]             # optional base overrides
    axes:                             # dotted key -> values; every combination is a variant
      meds.features: [logits, semantic]
    variants:                         # optional named variants with their own overrides
      - {name: knn-vote, set: {meds.assign: knn}}
    seeds: [0, 1]                     # optional; every variant once per seed
    baseline: true                    # optional (default true); with algos: the baseline's name
    base_model: true                  # optional (default false): the base model itself, untrained, as an arm
    compare: [[meds-random, meds]]    # optional: pairs of arms (groups) compared too, besides the baseline
    algos: [dapo, meds, passk]        # optional: algorithms / presets as variants (then no MEDS default)
    slurm: {partition: gpu, time: "4:00:00", gpus-per-task: 1}   # optional: --launcher slurm's settings
"""

from __future__ import annotations

import itertools
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from meds_cli.commands.ablate_grid import BASE_MODEL_ARM, algorithm_variants, read_algos, trains
from meds_cli.core.errors import UserError, nearest
from meds_cli.core.files import replace_text
from meds_cli.core.markup import plain
from meds_cli.core.names import safe_component
from meds_cli.core.read_back import read_json, require
from meds_cli.engine.config import load_config, read_yaml

FLAG_AXES = {"features": "meds.features", "clusterer": "meds.clusterer", "layers": "meds.layers"}
SHORT_NAMES = {"meds.features": "features", "meds.clusterer": "clusterer", "meds.layers": "layers",
               "train.seed": "seed"}
GRID_KEYS = ("config", "set", "axes", "variants", "seeds", "baseline", "algos", "base_model", "compare",
             "slurm")  # slurm: ablate_launch.py
STATE_FILE = "ablation.json"


@dataclass
class Variant:
    name: str  # folder name, unique in the ablation
    group: str  # the name without the seed: the report averages a group over seeds
    overrides: dict  # dotted config key -> value, applied after the base config
    seed: int | None = None


@dataclass
class Grid:
    axes: dict = field(default_factory=dict)
    variants: list = field(default_factory=list)  # [(name, overrides)]
    seeds: list = field(default_factory=list)
    baseline: bool = True
    config: list = field(default_factory=list)
    set: list = field(default_factory=list)
    algos: list = field(default_factory=list)  # algorithm / preset names, each a variant (ablate_grid.py)
    baseline_name: str | None = None  # with algos: the variant the others are compared with
    base_model: bool = False  # the untrained base model as an arm (BASE_MODEL_ARM)
    compare: list = field(default_factory=list)  # [[arm, other arm]]: paired comparisons besides the baseline


# ---------------------------------------------------------------- the grid


def split_list(text: str | None, flag: str) -> list[str]:
    values = [v.strip() for v in (text or "").split(",") if v.strip()]
    if text is not None and not values:
        raise UserError(f"--{flag} is empty; give comma-separated values")
    return values


def parse_seeds(values, where: str = "--seeds") -> list[int]:
    """Seeds as integers: a number written as text (from --seeds) or a YAML integer; a float, a
    boolean or a repeated seed is refused (it would run one seed twice and show it as two)."""
    if not isinstance(values, list):
        raise UserError(f"{where}: give a list of integer seeds, e.g. [0, 1, 2]; got {values!r}")
    seeds = []
    for value in values:
        if isinstance(value, bool) or not isinstance(value, (int, str)) or \
                (isinstance(value, str) and not re.fullmatch(r"\s*-?\d+\s*", value)):
            raise UserError(f"{where}: seed {value!r} is not an integer; give integer seeds, e.g. 0,1,2")
        seeds.append(int(value))
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise UserError(f"{where} names seed {repeated[0]} twice; give each seed once (a repeated seed is the same "
                        "run, and would count as two in the mean and std)")
    return seeds


def read_grid(path: Path) -> Grid:
    """A Grid from a YAML file (see the module docstring)."""
    data = read_yaml(path)
    for key in data:
        if key not in GRID_KEYS:
            raise UserError(f"unknown key '{key}' in grid '{path}'{nearest(key, GRID_KEYS)}; "
                            f"valid: {', '.join(GRID_KEYS)}")
    axes = data.get("axes") or {}
    if not isinstance(axes, dict) or not all(isinstance(v, list) and v for v in axes.values()):
        raise UserError(f"grid '{path}': axes must map config keys to non-empty lists, "
                        f"e.g. meds.features: [logits, semantic]")
    variants = []
    for item in data.get("variants") or []:
        if not isinstance(item, dict) or "name" not in item or not isinstance(item.get("set", {}), dict):
            raise UserError(f"grid '{path}': each variant needs a name and a set mapping, got {item!r}")
        variants.append((str(item["name"]), dict(item.get("set") or {})))
    files = data.get("config") or []
    files = [files] if isinstance(files, str) else files
    sets = data.get("set") or []
    baseline = data.get("baseline", True)
    base_model = data.get("base_model", False)
    if not isinstance(base_model, bool):
        raise UserError(f"grid '{path}': base_model must be true or false (the untrained base model as an arm); "
                        f"got {base_model!r}")
    compare = data.get("compare") or []
    if not isinstance(compare, list) or not all(isinstance(pair, list) and len(pair) == 2
                                                and all(isinstance(n, str) for n in pair) for pair in compare):
        raise UserError(f"grid '{path}': compare must be a list of pairs of arm names, e.g. [[meds-random, meds]]; "
                        f"got {compare!r}")
    return Grid(axes=dict(axes), variants=variants, seeds=parse_seeds(data.get("seeds") or [], f"grid '{path}': seeds"),
                compare=[list(pair) for pair in compare],
                baseline=bool(baseline), config=[str(path.parent / f) for f in files],
                set=[str(s) for s in ([sets] if isinstance(sets, str) else sets)],
                algos=read_algos(data["algos"], f"grid '{path}'") if data.get("algos") is not None else [],
                baseline_name=baseline if isinstance(baseline, str) else None, base_model=base_model)


def grid_from_flags(grid: Grid, *, features=None, clusterer=None, layers=None, seeds=None, algos=None,
                    baseline_name=None, base_model: bool = False) -> Grid:
    """The grid with the flags' axes added (a flag replaces the grid's axis for the same key, and
    --algos / --baseline the grid's algos and baseline; --base-model adds the base-model arm)."""
    for flag, value in (("features", features), ("clusterer", clusterer), ("layers", layers)):
        values = split_list(value, flag)
        if values:
            grid.axes[FLAG_AXES[flag]] = values
    if seeds is not None:
        grid.seeds = parse_seeds(split_list(seeds, "seeds"))
    if algos is not None:
        grid.algos = split_list(algos, "algos")
    if baseline_name is not None:
        grid.baseline_name = baseline_name
    grid.base_model = grid.base_model or base_model
    if grid.baseline_name is not None and not grid.algos:
        raise UserError(f"--baseline {grid.baseline_name} names the baseline among --algos; give --algos too "
                        "(MEDS variants are compared with their base algorithm)")
    return grid


def slug(value) -> str:
    text = "-".join(map(str, value)) if isinstance(value, list) else str(value)
    return re.sub(r"[^A-Za-z0-9.-]+", "", text.replace("_", "-")) or "x"


def folder_names(groups: list[tuple[str, dict]], notes: list[str]) -> list[tuple[str, dict]]:
    """The groups with their names made safe folder names (core/names.safe_component: one path
    component, never '..' or '/'), unique in the grid; what had to change is said in `notes`."""
    names = [n for n, _ in groups]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise UserError(f"two variants are both named '{duplicated[0]}'; give the grid's variants distinct names")
    taken, safe = set(), []
    for name, overrides in groups:
        folder = base = safe_component(name)
        number = 1
        while folder in taken:
            number += 1
            folder = f"{base}-{number}"
        taken.add(folder)
        if folder != name:
            notes.append(f"variant {name!r} runs in the folder '{folder}' (a folder name is letters, digits, "
                         "'.', '-' and '_', unique in the grid)")
        safe.append((folder, overrides))
    return safe


def expand(grid: Grid, baseline_algo: str | None, notes: list[str] | None = None) -> list[Variant]:
    """All variants: the algorithms (baseline first) when the grid names any, the axes' product and
    the named variants (MEDS), else MEDS as configured and the baseline; times the seeds. Names
    changed to make safe folder names are said in `notes`. The base-model arm, when the grid has
    one, comes first: the model every other arm started from."""
    meds = []
    if grid.axes:
        keys = list(grid.axes)
        for combo in itertools.product(*(grid.axes[k] for k in keys)):
            name = "_".join(f"{SHORT_NAMES.get(k, k.split('.')[-1])}-{slug(v)}" for k, v in zip(keys, combo))
            meds.append((name, {"algo.name": "meds", **dict(zip(keys, combo))}))
    meds += [(slug(name), {"algo.name": "meds", **sets}) for name, sets in grid.variants]
    if grid.algos:  # the first algorithm (or the named one) is the baseline: no extra run
        groups = algorithm_variants(grid.algos, grid.baseline_name) + meds
    else:
        meds = meds or [("meds", {"algo.name": "meds"})]
        groups = meds + ([(f"baseline-{baseline_algo}", {"algo.name": baseline_algo})] if baseline_algo else [])
    if grid.base_model:
        groups = [(BASE_MODEL_ARM[0], dict(BASE_MODEL_ARM[1]))] + groups
    groups = folder_names(groups, notes if notes is not None else [])
    if not grid.seeds:
        return [Variant(name, name, overrides) for name, overrides in groups]
    return [Variant(f"{name}_seed-{s}", name, {**overrides, "train.seed": s}, s) for name, overrides in groups
            for s in grid.seeds]


def variant_sets(variant: Variant) -> list[str]:
    """The variant's overrides as `--set` strings (JSON values are YAML, so types survive)."""
    return [f"{key}={json.dumps(value)}" for key, value in variant.overrides.items()]


# ---------------------------------------------------------------- running


@dataclass
class Plan:
    folder: Path
    config_files: list[str]
    base_sets: list[str]
    variants: list[Variant]
    steps: int
    notes: list[str] = field(default_factory=list)  # folder names that had to change (folder_names)
    compare: list = field(default_factory=list)  # the grid's extra pairs of arms (groups) to compare


def make_plan(*, config_files, sets, grid_file, features, clusterer, layers, seeds, steps, baseline, output,
              algos=None, baseline_name=None, base_model: bool = False) -> Plan:
    grid = read_grid(Path(grid_file)) if grid_file else Grid()
    grid = grid_from_flags(grid, features=features, clusterer=clusterer, layers=layers, seeds=seeds, algos=algos,
                           baseline_name=baseline_name, base_model=base_model)
    files = [*grid.config, *map(str, config_files)]
    base_sets = [*grid.set, *sets] + ([f"train.steps={steps}"] if steps is not None else [])
    base = load_config(files, base_sets + ["algo.name=meds"])
    notes: list[str] = []
    variants = expand(grid, base.algo.base if baseline and grid.baseline else None, notes)
    from meds_cli.engine.training.algorithm_setup import build_algorithm

    for variant in variants:  # every variant's config and algorithm settings are checked before anything trains
        build_algorithm(load_config(files, base_sets + variant_sets(variant)))
    folder = Path(output) if output else Path(base.train.runs_root) / f"ablate-{time.strftime('%Y%m%d-%H%M%S')}"
    groups = list(dict.fromkeys(v.group for v in variants))
    for pair in grid.compare:
        for name in pair:
            if name not in groups:
                raise UserError(f"compare: no arm named '{name}' in the grid{nearest(name, groups)}; its arms: "
                                f"{', '.join(groups)}")
    return Plan(folder, files, base_sets, variants, base.train.steps, notes, grid.compare)


def read_state(path: Path) -> dict:
    """ablation.json: {"variants": {name: overrides}, "base": {"config": [...], "set": [...]}}, checked."""
    state = read_json(path)
    require(isinstance(state.get("variants"), dict) and all(isinstance(v, dict) for v in state["variants"].values()),
            path, "has no mapping of variants to their overrides")
    require(isinstance(state.get("base"), dict), path, "has no base config")
    return state


def claim_folder(plan: Plan) -> None:
    """Create the ablation folder, or check that an existing one holds this very grid (then the
    command continues it); another grid, or another base config, is refused: its tasks.json and
    report would lose the variants the folder already holds."""
    plan.folder.mkdir(parents=True, exist_ok=True)
    path = plan.folder / STATE_FILE
    mine = json.loads(json.dumps({v.name: v.overrides for v in plan.variants}))
    base = {"config": plan.config_files, "set": plan.base_sets}
    if path.is_file():
        state = read_state(path)
        if state["base"] != base:
            raise UserError(f"'{plan.folder}' holds an ablation of another base config ({state['base']}); "
                            "choose another --output")
        theirs = state["variants"]
        changed = next((name for name in mine if name in theirs and theirs[name] != mine[name]), None)
        if changed is not None:
            raise UserError(f"'{plan.folder}' already holds variant '{changed}' with other settings "
                            f"({theirs[changed]}); choose another --output")
        if set(theirs) != set(mine):
            extra = sorted(set(theirs) - set(mine)) or sorted(set(mine) - set(theirs))
            which = "holds" if set(theirs) - set(mine) else "does not hold"
            raise UserError(f"'{plan.folder}' holds another grid ({len(theirs)} variants; it {which} "
                            f"{', '.join(extra[:3])}{' ...' if len(extra) > 3 else ''}); rerun that grid's own command "
                            "to continue it, or choose another --output")
    replace_text(path, json.dumps({"variants": mine, "base": base}, indent=2) + "\n")  # whole or not at all


def run_ablation(plan: Plan, eval_settings, *, console, quiet: bool = False, argv=(), launch=None,
                 eval_length: int | None = None) -> dict:
    """Train and evaluate every variant not finished yet, where `launch` says (this process by
    default; N processes; a Slurm job array), then write the report from the task folders.
    `eval_length`: --max-new-tokens of the evals (None: each variant's own)."""
    from meds_cli.commands.ablate_eval import variant_settings
    from meds_cli.commands.ablate_launch import LaunchOptions, array_script
    from meds_cli.engine.run_folders.run_lock import FolderLock

    launch = launch or LaunchOptions()
    variant_settings(eval_settings, eval_length or 1)  # a bad --k / --benchmarks fails before the first variant trains
    launch.check()  # a bad launcher setting too, before anything is written or submitted
    if launch.launcher == "slurm":
        array_script(plan, launch.slurm)  # every value of the script checked before anything is written
    for note in plan.notes:
        console.print(f"[yellow]note:[/] {plain(note)}", highlight=False, soft_wrap=True)
    plan.folder.mkdir(parents=True, exist_ok=True)
    with FolderLock(plan.folder, "ablation folder", "two ablations in one folder would train and evaluate its "
                    "tasks twice at once"):
        return _run_claimed(plan, eval_settings, launch, console=console, quiet=quiet, argv=argv,
                            eval_length=eval_length)


def _run_claimed(plan: Plan, eval_settings, launch, *, console, quiet: bool, argv, eval_length=None) -> dict:
    from meds_cli.commands.ablate_eval import results_path
    from meds_cli.commands.ablate_launch import make_launcher, report, wait_with_progress
    from meds_cli.commands.ablate_task import clear_error, make_task, run_task, write_tasks

    claim_folder(plan)
    write_tasks(plan, eval_settings, variant_sets, eval_length)
    console.print(f"ablation folder: [bold]{plain(plan.folder)}[/]  variants: {len(plan.variants)}  "
                  f"steps: {plan.steps}", soft_wrap=True)
    pending, headers = [], {}
    for i, variant in enumerate(plan.variants, 1):
        run_dir = plan.folder / variant.name
        if results_path(run_dir, eval_settings, plan.steps if trains(variant.overrides) else 0).is_file():
            console.print(f"[{i}/{len(plan.variants)}] {plain(variant.name)}: finished, skipped")
            continue
        clear_error(run_dir)
        pending.append(make_task(run_dir))
        headers[variant.name] = (f"[{i}/{len(plan.variants)}] [bold]{variant.name}[/]: "
                                 f"{', '.join(variant_sets(variant))}")

    def run_here(task):
        console.print(headers[task.name])
        run_task(task.folder, console, quiet=quiet, argv=argv)

    launcher = make_launcher(launch, plan.folder, run_here)
    try:
        if pending:
            console.print(launcher.submit(pending), highlight=False, soft_wrap=True)
        if not launch.wait:
            console.print(f"not waiting; the report, once they end (or now, of what has ended): "
                          f"meds ablate --collect {plain(plan.folder)}", highlight=False, soft_wrap=True)
            return {"folder": str(plan.folder), "submitted": [t.name for t in pending]}
        wait_with_progress(launcher, console, quiet)
    except KeyboardInterrupt:
        launcher.stop()
        console.print(f"[yellow]stopped[/]; run the same command with --output {plain(plan.folder)} to continue",
                      soft_wrap=True)
        raise
    return report(plan.folder, plan.variants, eval_settings, console, compare=plan.compare)


def collect_report(folder: Path, console) -> dict:
    """`meds ablate --collect DIR`: the report of whatever has finished, naming what has not."""
    from meds_cli.commands.ablate_launch import report, slurm_activity
    from meds_cli.commands.ablate_task import eval_settings_of, read_tasks

    record = read_tasks(folder)  # checked: every variant a folder inside DIR
    variants = [Variant(item["name"], item["group"], item["overrides"], item.get("seed"))
                for item in record["variants"]]
    return report(Path(folder), variants, eval_settings_of(record), console, active=slurm_activity(Path(folder)),
                  compare=record.get("compare", []))


# ---------------------------------------------------------------- dry run


def probe_step_seconds(plan: Plan) -> float:
    """Seconds of one training step of the base config (MEDS), model loading excluded."""
    import tempfile

    from meds_cli.engine.trainer import Trainer

    cfg = load_config(plan.config_files, plan.base_sets + ["algo.name=meds", "train.steps=1", "eval.every=0"])
    with tempfile.TemporaryDirectory() as folder:
        cfg.train.output_dir = folder
        trainer = Trainer(cfg, Path(folder))
        t0 = time.perf_counter()
        trainer.train_step()
        return time.perf_counter() - t0


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def dry_run(plan: Plan, console, probe: bool = False) -> dict:
    """List the variants at once; with `probe`, then time one training step of the base config
    (loading its model first) and estimate the training time."""
    from rich.table import Table

    for note in plan.notes:
        console.print(f"[yellow]note:[/] {plain(note)}", highlight=False, soft_wrap=True)
    table = Table(title=f"meds ablate --dry-run: {len(plan.variants)} variants, {plan.steps} steps each "
                        f"-> {plain(plan.folder)}",
                  title_justify="left")
    from meds_cli.commands.ablate_report import setup_text
    from meds_cli.engine.config import load_config

    table.add_column("variant", no_wrap=True)
    table.add_column("setup (base and key settings)")
    for v in plan.variants:  # each arm's resolved config: what the report's setup column will say
        cfg = load_config(plan.config_files, plan.base_sets + variant_sets(v))
        table.add_row(plain(v.name), plain(setup_text(cfg, v.overrides)))
    console.print(table)
    seconds = total = None
    if not probe:
        console.print("add --estimate to time one training step of the base config and estimate the total")
    else:
        with console.status("timing one training step of the base config (loading its model first) ..."):
            seconds = probe_step_seconds(plan)
        trained = sum(trains(v.overrides) for v in plan.variants)  # the base-model arm trains nothing
        total = seconds * plan.steps * trained
        console.print(f"one step of the base config took {seconds:.2f} s; training estimate: {seconds:.2f} s x "
                      f"{plan.steps} steps x {trained:d} trained variants = {plain(_duration(total))} "
                      "(plus model loading and evaluation; semantic features add an embedding model)")
    return {"variants": [v.name for v in plan.variants], "step_seconds": seconds, "estimate_seconds": total}

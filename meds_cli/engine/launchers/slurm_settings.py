"""What a grid asks of Slurm (--slurm-* options), and the checks that turn a setting Slurm would
refuse, or queue forever, into one line before anything is submitted: no sbatch here, a
partition sinfo does not know, a time limit in a form Slurm does not read or longer than the
partition allows, GPUs on a partition without any, more CPUs per task than its nodes have."""

from __future__ import annotations

import dataclasses
import math
import re
import shutil
import subprocess
from dataclasses import dataclass, field

from meds_cli.core.errors import UserError, nearest
from meds_cli.engine.launchers.script_text import check_extra, checked, directive


@dataclass
class SlurmSettings:
    partition: str | None = None
    time: str | None = None  # Slurm's forms: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS
    gpus_per_task: int | None = None
    cpus_per_task: int | None = None
    mem: str | None = None  # per node: 16G, 4000M, ...
    account: str | None = None
    max_parallel: int | None = None  # the array's %N: at most N tasks at once
    extra: list[str] = field(default_factory=list)  # KEY=VALUE -> #SBATCH --KEY=VALUE
    requeue: bool = False


# A grid file's `slurm:` keys -> the type each takes (as the config's own fields are checked).
_TYPES = {"partition": str, "time": str, "gpus_per_task": int, "cpus_per_task": int, "mem": (str, int),
          "account": str, "max_parallel": int, "extra": (list, dict, str), "requeue": bool}


def _typed(key: str, name: str, value, where: str):
    """`value` of the `slurm:` key, refused in one line when YAML made it another type than the key takes."""
    expected = _TYPES[name]
    if value is None:
        return None
    if name == "time" and isinstance(value, int) and not isinstance(value, bool):
        raise UserError(f"{where}: slurm {key}: {value!r} is an integer, not a Slurm time: YAML reads an unquoted "
                        f"4:00:00 as the number 14400 (base 60); quote it: {key}: \"4:00:00\"")
    if isinstance(value, bool) != (expected is bool) or not isinstance(value, expected):
        kinds = {str: "a string", int: "an integer", bool: "true or false", (str, int): "a string or an integer",
                 (list, dict, str): "a list of KEY=VALUE strings"}[expected]
        hint = f' (quote it: {key}: "{value}")' if expected is str else ""
        raise UserError(f"{where}: slurm {key}: {value!r} is {type(value).__name__}; give {kinds}{hint}")
    return value


def settings_from_mapping(data, where: str) -> SlurmSettings:
    """A grid file's `slurm:` section ({partition: gpu, time: "4:00:00", extra: [qos=high], ...};
    keys as the --slurm-* options without the prefix), each value type-checked."""
    if not isinstance(data, dict):
        raise UserError(f'{where}: the slurm section must be a mapping, '
                        'e.g. slurm: {partition: gpu, time: "4:00:00"}')
    names = [f.name for f in dataclasses.fields(SlurmSettings)]
    values = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name not in names:
            raise UserError(f"{where}: unknown slurm key '{key}'{nearest(name, names)}; valid: {', '.join(names)}")
        values[name] = _typed(str(key), name, value, where)
    extra = values.get("extra") or []
    if isinstance(extra, dict):
        extra = [f"{k}={v}" for k, v in extra.items()]
    extra = [extra] if isinstance(extra, str) else extra
    if not all(isinstance(item, str) for item in extra):
        raise UserError(f"{where}: slurm extra: {extra!r}; give KEY=VALUE strings, e.g. extra: [qos=high]")
    values["extra"] = extra
    if values.get("mem") is not None:
        values["mem"] = str(values["mem"])  # a number: megabytes, as Slurm reads it
    if values.get("requeue") is None:
        values.pop("requeue", None)
    return SlurmSettings(**values)


def merged(grid: SlurmSettings, flags: SlurmSettings) -> SlurmSettings:
    """The grid file's settings with the flags given on the command line winning (extras add up)."""
    values = {f.name: getattr(flags, f.name) if getattr(flags, f.name) is not None else getattr(grid, f.name)
              for f in dataclasses.fields(SlurmSettings)}
    values["extra"] = [*grid.extra, *flags.extra]
    values["requeue"] = grid.requeue or flags.requeue
    return SlurmSettings(**values)


@dataclass
class Partition:
    name: str
    default: bool
    time_limit_min: float  # math.inf when the partition has none
    has_gpus: bool
    cpus: int  # the most CPUs of one of its nodes


def time_minutes(text: str) -> float:
    """Minutes of a Slurm time limit (sbatch --time's forms; infinite/unlimited -> inf).
    ValueError on any other text."""
    text = text.strip().lower()
    if text in ("infinite", "unlimited"):
        return math.inf
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text)
    if not match:
        raise ValueError(text)
    days, first, second, third = match.groups()
    numbers = [int(first)] + [int(x) for x in (second, third) if x is not None]
    if days is not None:  # D-HH, D-HH:MM, D-HH:MM:SS
        hours, minutes, seconds = (numbers + [0, 0])[:3]
        return int(days) * 1440 + hours * 60 + minutes + seconds / 60
    if len(numbers) == 3:  # HH:MM:SS
        return numbers[0] * 60 + numbers[1] + numbers[2] / 60
    return numbers[0] + (numbers[1] / 60 if len(numbers) == 2 else 0)  # MM or MM:SS


def check_settings(settings: SlurmSettings) -> None:
    """The checks that need no cluster: forms and ranges."""
    if settings.time is not None:
        checked("--slurm-time", settings.time)
        try:
            time_minutes(settings.time)
        except ValueError:
            raise UserError(f"--slurm-time '{settings.time}' is not a Slurm time limit; give MM, HH:MM:SS, "
                            "D-HH or D-HH:MM:SS (e.g. 30, 4:00:00, 1-12)") from None
    if settings.mem is not None and checked("--slurm-mem", settings.mem) and \
            not re.fullmatch(r"\d+[KMGT]?", settings.mem.strip(), re.IGNORECASE):
        raise UserError(f"--slurm-mem '{settings.mem}' is not a Slurm memory size; give a number with K, M, G "
                        "or T (e.g. 64G)")
    for flag, value, least in (("--slurm-gpus-per-task", settings.gpus_per_task, 0),
                               ("--slurm-cpus-per-task", settings.cpus_per_task, 1),
                               ("--slurm-max-parallel", settings.max_parallel, 1)):
        if value is not None and value < least:
            raise UserError(f"{flag} {value}: give {least} or more")
    for option, value in (("--slurm-partition", settings.partition), ("--slurm-account", settings.account)):
        if value is not None:
            checked(option, value)
    for item in settings.extra:
        check_extra(item)


def sbatch_or_error() -> str:
    path = shutil.which("sbatch")
    if path is None:
        raise UserError("--launcher slurm needs sbatch, which is not on PATH here: run on a Slurm login node, or "
                        "here with --launcher local (--jobs N runs N tasks at once); a one-node test cluster: "
                        "sudo bash scripts/slurm_local.sh start")
    return path


def error_line(done: subprocess.CompletedProcess) -> str:
    """The last line a failed Slurm command wrote to stderr: what it says went wrong."""
    return (done.stderr.strip().splitlines() or ["no output"])[-1]


def parse_partitions(sinfo_output: str) -> dict[str, Partition]:
    """Partitions from `sinfo -h -o '%P|%l|%G|%c'` (one line per partition and node kind)."""
    found: dict[str, Partition] = {}
    for line in sinfo_output.splitlines():
        if line.count("|") != 3:
            continue
        name, limit, gres, cpus = (part.strip() for part in line.split("|"))
        default = name.endswith("*")
        name = name.rstrip("*")
        minutes = time_minutes(limit) if limit not in ("", "n/a") else math.inf
        has_gpus = "gpu" in gres.lower()
        count = int(re.match(r"\d*", cpus).group() or 0)
        before = found.get(name)
        if before is not None:
            has_gpus, count = has_gpus or before.has_gpus, max(count, before.cpus)
        found[name] = Partition(name, default, minutes, has_gpus, count)
    return found


def read_partitions() -> dict[str, Partition]:
    done = subprocess.run(["sinfo", "-h", "-o", "%P|%l|%G|%c"], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise UserError(f"sinfo could not reach the Slurm controller ({error_line(done)}); is the cluster up? "
                        "(a one-node test cluster: sudo bash scripts/slurm_local.sh start)")
    return parse_partitions(done.stdout)


def check_against_cluster(settings: SlurmSettings, partitions: dict[str, Partition]) -> Partition:
    """A partition sinfo does not know, a time over its limit, GPUs where it has none, more CPUs
    per task than its nodes have: each one line. Returns the partition the job would go to."""
    if settings.partition is not None:
        partition = partitions.get(settings.partition)
        if partition is None:
            raise UserError(f"--slurm-partition '{settings.partition}' is not a partition of this cluster"
                            f"{nearest(settings.partition, partitions)}; sinfo knows: {', '.join(partitions)}")
    else:
        partition = next((p for p in partitions.values() if p.default), None)
        if partition is None:
            raise UserError(f"this cluster has no default partition; choose one with --slurm-partition "
                            f"({', '.join(partitions)})")
    if settings.time is not None and time_minutes(settings.time) > partition.time_limit_min:
        raise UserError(f"--slurm-time {settings.time} is longer than partition '{partition.name}' allows "
                        f"({partition.time_limit_min:g} minutes); Slurm would leave the tasks queued for ever: "
                        "give a shorter --slurm-time or another --slurm-partition")
    if settings.gpus_per_task and not partition.has_gpus:
        raise UserError(f"--slurm-gpus-per-task {settings.gpus_per_task}: partition '{partition.name}' has no GPUs "
                        "(sinfo lists no gpu GRES on its nodes); choose a GPU partition with --slurm-partition")
    if settings.cpus_per_task and partition.cpus and settings.cpus_per_task > partition.cpus:
        raise UserError(f"--slurm-cpus-per-task {settings.cpus_per_task}: the nodes of partition "
                        f"'{partition.name}' have at most {partition.cpus} CPUs")
    return partition


def check_before_submit(settings: SlurmSettings, gpus_per_node: int = 0) -> None:
    """Every check, against the cluster sinfo reaches; `gpus_per_node`: a multi-node run's GPUs."""
    check_settings(settings)
    sbatch_or_error()
    partition = check_against_cluster(settings, read_partitions())
    if gpus_per_node and not partition.has_gpus:
        raise UserError(f"--gpus-per-node {gpus_per_node}: partition '{partition.name}' has no GPUs (sinfo lists no "
                        "gpu GRES on its nodes); choose a GPU partition with --slurm-partition, or on CPUs give "
                        "--processes-per-node")


def sbatch_submit(script) -> str:
    """Submit an sbatch script; its job id."""
    done = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise UserError(f"sbatch refused {script}: {error_line(done)}")
    return done.stdout.strip().split(";")[0]


def sbatch_lines(settings: SlurmSettings) -> list[str]:
    """The #SBATCH lines of the settings (the array and output lines are the launcher's), each
    through script_text.directive: checked and quoted."""
    options = [("partition", settings.partition), ("time", settings.time), ("account", settings.account),
               ("gpus-per-task", settings.gpus_per_task), ("cpus-per-task", settings.cpus_per_task),
               ("mem", settings.mem)]
    lines = [directive(key, value, f"--slurm-{key}") for key, value in options if value is not None]
    lines += [directive(*check_extra(item), "--slurm-extra") for item in settings.extra]
    lines.append(directive("requeue" if settings.requeue else "no-requeue"))
    return lines

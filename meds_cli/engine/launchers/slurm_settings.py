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


def settings_from_mapping(data, where: str) -> SlurmSettings:
    """A grid file's `slurm:` section ({partition: gpu, time: "4:00:00", extra: [qos=high], ...};
    keys as the --slurm-* options without the prefix)."""
    if not isinstance(data, dict):
        raise UserError(f"{where}: the slurm section must be a mapping, e.g. slurm: {{partition: gpu, time: 4:00:00}}")
    names = [f.name for f in dataclasses.fields(SlurmSettings)]
    values = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name not in names:
            raise UserError(f"{where}: unknown slurm key '{key}'{nearest(name, names)}; valid: {', '.join(names)}")
        values[name] = value
    extra = values.get("extra") or []
    if isinstance(extra, dict):
        extra = [f"{k}={v}" for k, v in extra.items()]
    values["extra"] = [str(item) for item in ([extra] if isinstance(extra, str) else extra)]
    for name in ("partition", "time", "mem", "account"):
        if values.get(name) is not None:
            values[name] = str(values[name])
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
        try:
            time_minutes(settings.time)
        except ValueError:
            raise UserError(f"--slurm-time '{settings.time}' is not a Slurm time limit; give MM, HH:MM:SS, "
                            "D-HH or D-HH:MM:SS (e.g. 30, 4:00:00, 1-12)") from None
    if settings.mem is not None and not re.fullmatch(r"\d+[KMGT]?", settings.mem.strip(), re.IGNORECASE):
        raise UserError(f"--slurm-mem '{settings.mem}' is not a Slurm memory size; give a number with K, M, G "
                        "or T (e.g. 64G)")
    for flag, value, least in (("--slurm-gpus-per-task", settings.gpus_per_task, 0),
                               ("--slurm-cpus-per-task", settings.cpus_per_task, 1),
                               ("--slurm-max-parallel", settings.max_parallel, 1)):
        if value is not None and value < least:
            raise UserError(f"{flag} {value}: give {least} or more")
    for item in settings.extra:
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9-]*=\S.*", item):
            raise UserError(f"--slurm-extra '{item}' is not KEY=VALUE (an sbatch option without its dashes, "
                            "e.g. qos=high or constraint=a100)")


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
    """The #SBATCH lines of the settings (the array and output lines are the launcher's)."""
    options = [("partition", settings.partition), ("time", settings.time), ("account", settings.account),
               ("gpus-per-task", settings.gpus_per_task), ("cpus-per-task", settings.cpus_per_task),
               ("mem", settings.mem)]
    lines = [f"#SBATCH --{key}={value}" for key, value in options if value is not None]
    lines += [f"#SBATCH --{item.split('=', 1)[0]}={item.split('=', 1)[1]}" for item in settings.extra]
    lines.append("#SBATCH --requeue" if settings.requeue else "#SBATCH --no-requeue")
    return lines

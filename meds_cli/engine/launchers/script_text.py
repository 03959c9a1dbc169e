"""The one place where a value becomes text of a generated Slurm script (an sbatch script's
#SBATCH lines, its shell lines, the srun line of a multi-node run). Every value and path passes
through here, so that nothing a config, a grid file or a folder name holds can end a line and
start a command or a directive of its own:

- a control character (CR, LF, tab, ...) is refused, with one line naming the option or key and
  the value (repr), before anything is written or submitted;
- a value on an #SBATCH line is written in double quotes (Slurm's own quoting: it reads an
  argument up to the first blank outside double quotes, a backslash taking the next character as
  it is) where it holds a blank, a quote, a backslash or a #; a '%' in an --output path, which
  Slurm would read as a file name pattern, is refused;
- a word of a shell line is shlex.quote'd;
- --slurm-extra (a grid's `slurm: extra:`) cannot set an option the launcher writes itself
  (LAUNCHER_OPTIONS): refused, naming what sets it.
"""

from __future__ import annotations

import re
import shlex

from meds_cli.core.errors import UserError

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_NEEDS_QUOTES = re.compile(r'[\s"\\#\']|^$')

# sbatch options the launchers write themselves -> what sets them instead of --slurm-extra.
LAUNCHER_OPTIONS = {
    "array": "the launcher (one array task per task of the grid; --slurm-max-parallel caps them)",
    "output": "the launcher (each task logs into its own folder)",
    "error": "the launcher (each task logs into its own folder)",
    "open-mode": "the launcher (a requeued task appends to its log)",
    "job-name": "the launcher (named after the folder)",
    "ntasks": "the launcher", "nodes": "--nodes", "ntasks-per-node": "the launcher",
    "gpus-per-node": "--gpus-per-node", "partition": "--slurm-partition", "time": "--slurm-time",
    "account": "--slurm-account", "gpus-per-task": "--slurm-gpus-per-task", "cpus-per-task": "--slurm-cpus-per-task",
    "mem": "--slurm-mem", "requeue": "--requeue", "no-requeue": "--requeue",
}
# Real sbatch options that are also the start of a launcher's option (sbatch takes an unambiguous
# abbreviation of a long option, so `arr=...` would set --array: every other prefix is refused).
_OWN_OPTIONS_PREFIXES_ALLOWED = {"gpus"}


def checked(where: str, value) -> str:
    """`value` as text, refused when it holds a control character (it would end its line)."""
    text = str(value)
    found = _CONTROL.search(text)
    if found:
        raise UserError(f"{where} {text!r} holds a control character ({found.group()!r}); it would end its line of "
                        "the generated Slurm script and start a command of its own: give it without")
    return text


def shell_word(where: str, value) -> str:
    """A word of a shell line: checked, then shlex.quote'd."""
    return shlex.quote(checked(where, value))


def directive(option: str, value=None, where: str | None = None) -> str:
    """One '#SBATCH --option[=value]' line, the value checked and quoted as Slurm reads it."""
    if value is None:
        return f"#SBATCH --{option}"
    text = checked(where or f"--{option}", value)
    if _NEEDS_QUOTES.search(text):
        text = '"' + re.sub(r'(["\\])', r"\\\1", text) + '"'
    return f"#SBATCH --{option}={text}"


def output_directive(where: str, folder, pattern: str) -> str:
    """'#SBATCH --output=<folder>/<pattern>': a % in the folder would be read as one of Slurm's
    file name patterns (%j, %A, ...), so it is refused."""
    text = checked(where, folder)
    if "%" in text:
        raise UserError(f"{where} {text!r} holds a '%', which Slurm reads as a file name pattern (%j, %A, ...) in "
                        "the job's --output: choose a folder without one")
    return directive("output", f"{text}/{pattern}", where)


def comment(text: str) -> str:
    """A comment line; its values were checked by `checked` (no control character ends it)."""
    return "# " + checked("a comment of the script", text)


def check_extra(item: str) -> tuple[str, str]:
    """(option, value) of one --slurm-extra KEY=VALUE; an option the launcher writes is refused."""
    checked("--slurm-extra", item)
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9-]*=\S.*", item):
        raise UserError(f"--slurm-extra '{item}' is not KEY=VALUE (an sbatch option without its dashes, "
                        "e.g. qos=high or constraint=a100)")
    key, value = item.split("=", 1)
    option = key.lower()
    owner = LAUNCHER_OPTIONS.get(option)
    if owner is None and option not in _OWN_OPTIONS_PREFIXES_ALLOWED:
        full = sorted(name for name in LAUNCHER_OPTIONS if name.startswith(option))
        owner = LAUNCHER_OPTIONS[full[0]] if full else None
        key = f"{key} (sbatch reads it as --{full[0]})" if full else key
    if owner is not None:
        raise UserError(f"--slurm-extra '{item}': --{key} is written by the launcher's script; it is set by {owner}, "
                        "not --slurm-extra")
    return key, value

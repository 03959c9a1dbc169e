"""Experiment trackers (`train.report_to`) through Accelerate's trackers.

`train.report_to` names none, one or several of tensorboard, wandb, trackio, mlflow. The trainer
hands Accelerate the names (`Accelerator(log_with=...)`), then this module starts the trackers
with the run config as flat hyper-parameters, logs every metrics row as one step, logs sample
tables to the trackers that have tables, and ends the trackers. Accelerate runs all of this on the
main process only.

Accelerate quietly drops a tracker whose package is missing; here a missing package is one
clear line instead, before anything trains. TensorBoard files go to RUN/tensorboard/.
"""

from __future__ import annotations

import importlib.util
import numbers
from pathlib import Path

from meds_cli.core.errors import UserError, nearest

# tracker name -> (module it needs, pip package to install)
TRACKERS = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
    "trackio": ("trackio", "trackio"),
    "mlflow": ("mlflow", "mlflow"),
}
PROJECT = "meds"
TENSORBOARD_DIR = "tensorboard"


def parse_report_to(value: str | list[str] | None) -> list[str]:
    """The tracker names of `train.report_to`: 'none', a name, 'a,b', or a list of names."""
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else list(value)
    names = [str(item).strip() for item in items if str(item).strip()]
    if names == ["none"]:
        return []
    accepted = ["none", *TRACKERS]
    for name in names:
        if name not in TRACKERS:
            if name == "none":
                raise UserError(f"train.report_to {value!r} mixes 'none' with trackers; give 'none' alone")
            raise UserError(f"train.report_to has unknown tracker '{name}'{nearest(name, accepted)}; "
                            f"accepted: {', '.join(accepted)} (or a list of them)")
    return list(dict.fromkeys(names))


def check_installed(names: list[str]) -> None:
    """One line per missing tracker package (Accelerate itself would skip the tracker silently)."""
    for name in names:
        module, package = TRACKERS[name]
        if importlib.util.find_spec(module) is None:
            raise UserError(f"train.report_to '{name}' needs the {package} package, which is not installed: "
                            f"pip install {package} (or drop '{name}' from train.report_to)")


def accelerator_kwargs(report_to, run_dir: Path) -> dict:
    """Keyword arguments for `Accelerator(...)`: the trackers to log with and where local ones write."""
    names = parse_report_to(report_to)
    if not names:
        return {}
    check_installed(names)
    from accelerate.utils import ProjectConfiguration

    run_dir = Path(run_dir)
    config = ProjectConfiguration(project_dir=str(run_dir), logging_dir=str(run_dir / TENSORBOARD_DIR))
    return {"log_with": names, "project_config": config}


def flat_hyperparameters(data: dict, prefix: str = "") -> dict:
    """{'optim': {'lr': 1e-5}} -> {'optim.lr': 1e-5}; lists become their text (trackers such as
    TensorBoard accept only bool, str, int and float hyper-parameters); None stays None."""
    flat: dict = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flat_hyperparameters(value, name + "."))
        elif value is None or isinstance(value, (bool, int, float, str)):
            flat[name] = value
        else:
            flat[name] = str(value)
    return flat


def numeric_values(row: dict) -> dict[str, float]:
    """The numbers of a metrics row, without its step (which is the tracker's step)."""
    return {k: v for k, v in row.items()
            if k != "step" and isinstance(v, numbers.Real) and not isinstance(v, bool)}


class RunTracker:
    """The trackers of one run, started through an Accelerator created with accelerator_kwargs()."""

    def __init__(self, accelerator):
        self.accelerator = accelerator
        self.active = bool(getattr(accelerator, "log_with", None))

    def start(self, config: dict, run_name: str) -> None:
        if not self.active:
            return
        # Each remote tracker names the run after its folder; TensorBoard's folder is already the run's.
        named = {"wandb": {"name": run_name}, "trackio": {"name": run_name}, "mlflow": {"run_name": run_name}}
        self.accelerator.init_trackers(PROJECT, config=flat_hyperparameters(config), init_kwargs=named)

    def log(self, row: dict, step: int) -> None:
        if self.active:
            self.accelerator.log(numeric_values(row), step=step)

    def log_table(self, name: str, rows: list[dict], step: int) -> None:
        """Rows of flat dicts as one table, on the trackers that have tables (wandb); others skip it."""
        if not self.active or not rows or not self.accelerator.is_main_process:
            return
        columns = list(dict.fromkeys(key for row in rows for key in row))
        data = [[_cell(row.get(column)) for column in columns] for row in rows]
        for tracker in self.accelerator.trackers:
            if hasattr(tracker, "log_table"):
                tracker.log_table(name, columns=columns, data=data, step=step)

    def end(self) -> None:
        if self.active:
            self.accelerator.end_training()


def _cell(value):
    """Tables hold scalars and text: anything else (a dict of reward channels) becomes its text."""
    return value if value is None or isinstance(value, (bool, int, float, str)) else str(value)

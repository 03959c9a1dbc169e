"""train.report_to: tracker names, flat hyper-parameters, and TensorBoard event files read back."""

import importlib.util

import pytest
import yaml

from meds_cli.core.errors import UserError
from meds_cli.engine.run_folders import trackers
from meds_cli.engine.run_folders.trackers import (
    RunTracker,
    accelerator_kwargs,
    flat_hyperparameters,
    numeric_values,
    parse_report_to,
)

needs_tensorboard = pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None,
                                       reason="needs the tensorboard package (test extra)")


def test_report_to_accepts_none_one_a_comma_list_and_a_list():
    assert parse_report_to("none") == []
    assert parse_report_to(None) == []
    assert parse_report_to([]) == []
    assert parse_report_to("tensorboard") == ["tensorboard"]
    assert parse_report_to("tensorboard, wandb") == ["tensorboard", "wandb"]
    assert parse_report_to(["mlflow", "trackio", "mlflow"]) == ["mlflow", "trackio"]


def test_report_to_refuses_unknown_names_with_the_nearest_one():
    with pytest.raises(UserError, match="unknown tracker 'tensorbord'.*did you mean 'tensorboard'"):
        parse_report_to("tensorbord")
    with pytest.raises(UserError, match="'none' alone"):
        parse_report_to(["none", "wandb"])


def test_a_missing_tracker_package_is_one_line(monkeypatch):
    monkeypatch.setitem(trackers.TRACKERS, "wandb", ("a_module_that_is_not_installed", "wandb"))
    with pytest.raises(UserError, match="train.report_to 'wandb' needs the wandb package.*pip install wandb"):
        accelerator_kwargs("wandb", "runs/x")


def test_no_tracker_means_no_accelerator_arguments(tmp_path):
    assert accelerator_kwargs("none", tmp_path) == {}


def test_flat_hyperparameters():
    nested = {"optim": {"lr": 1e-5, "betas": [0.9, 0.99]}, "model": {"lora": {"rank": 8, "enabled": True}},
              "train": {"tag": "", "report_to": None}}
    assert flat_hyperparameters(nested) == {"optim.lr": 1e-5, "optim.betas": "[0.9, 0.99]", "model.lora.rank": 8,
                                            "model.lora.enabled": True, "train.tag": "", "train.report_to": None}


def test_numeric_values_drop_the_step_text_and_flags():
    row = {"step": 3, "reward": 0.5, "groups_kept": 4, "note": "x", "skipped": True}
    assert numeric_values(row) == {"reward": 0.5, "groups_kept": 4}


@needs_tensorboard
def test_tensorboard_events_are_written_and_read_back(tmp_path):
    from accelerate import Accelerator
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accelerator = Accelerator(**accelerator_kwargs("tensorboard", tmp_path))
    tracker = RunTracker(accelerator)
    tracker.start({"optim": {"lr": 0.001, "betas": [0.9, 0.99]}, "algo": {"name": "grpo"}}, "run-1")
    tracker.log({"step": 1, "reward": 0.25, "loss": 1.5}, step=1)
    tracker.log({"step": 2, "reward": 0.75, "loss": 1.0}, step=2)
    tracker.log_table("samples", [{"response": "4", "reward": 1.0}], step=2)  # TensorBoard has no tables: skipped
    tracker.end()

    folder = tmp_path / trackers.TENSORBOARD_DIR / trackers.PROJECT
    events = EventAccumulator(str(folder))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("reward")] == [(1, 0.25), (2, 0.75)]
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(1, 1.5), (2, 1.0)]
    hparams = list(folder.glob("*/hparams.yml"))
    assert len(hparams) == 1
    assert yaml.safe_load(hparams[0].read_text()) == {"optim.lr": 0.001, "optim.betas": "[0.9, 0.99]",
                                                      "algo.name": "grpo"}


class _TableTracker:
    """Stands in for a tracker with tables (wandb) without the wandb package."""

    def __init__(self):
        self.tables = []

    def log_table(self, name, columns, data, step):
        self.tables.append((name, columns, data, step))


class _FakeAccelerator:
    log_with = ["wandb"]
    is_main_process = True

    def __init__(self):
        self.trackers = [_TableTracker(), object()]  # the second one has no tables


def test_tables_go_to_trackers_that_have_them():
    accelerator = _FakeAccelerator()
    RunTracker(accelerator).log_table("samples", [{"a": 1, "b": {"x": 1.0}}, {"a": 2, "c": None}], step=5)
    assert accelerator.trackers[0].tables == [
        ("samples", ["a", "b", "c"], [[1, "{'x': 1.0}", None], [2, None, None]], 5)]

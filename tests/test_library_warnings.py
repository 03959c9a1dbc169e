"""Library warnings go to the run folder's log, not the terminal (meds_cli/core/library_warnings.py):
the router on its own, then `meds eval` and `meds train` with a library that raises a FutureWarning
while they run (as transformers' `is_gradient_checkpointing` deprecation did in the demo eval)."""

import importlib.util
import json
import sys
import warnings

import pytest
from typer.testing import CliRunner

from meds_cli.app import app
from meds_cli.core.library_warnings import LOG_FILE, LibraryWarnings, is_project_file

runner = CliRunner()
NOISE = "noisylib: `old_option` is deprecated and will be removed in v9"


@pytest.fixture
def noisy_library(tmp_path):
    """A module outside the project (as site-packages is) whose function raises a FutureWarning."""
    path = tmp_path / "lib" / "noisylib.py"
    path.parent.mkdir()
    path.write_text("import warnings\n\n\ndef configure():\n"
                    f"    warnings.warn({NOISE!r}, FutureWarning, stacklevel=2)\n")
    spec = importlib.util.spec_from_file_location("noisylib", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def terminal(monkeypatch):
    """Warnings shown as a plain terminal shows them (pytest records them instead): Python's own
    showwarning, writing to sys.stderr, every time."""
    def to_stderr(msg):
        sys.stderr.write(warnings.formatwarning(msg.message, msg.category, msg.filename, msg.lineno, msg.line))

    monkeypatch.setattr(warnings, "_showwarnmsg_impl", to_stderr)
    monkeypatch.setattr(warnings, "showwarning", warnings._showwarning_orig)
    warnings.simplefilter("always")  # pytest's catch_warnings restores the filters after the test


def test_project_files_are_told_apart():
    import algorithms.edas
    import meds_cli.app

    assert is_project_file(meds_cli.app.__file__) and is_project_file(algorithms.edas.__file__)
    assert not is_project_file(warnings.__file__) and not is_project_file(json.__file__)


def test_router_logs_library_warnings_and_shows_meds_own(tmp_path, noisy_library, terminal, capsys, monkeypatch):
    router = LibraryWarnings()
    monkeypatch.setattr(warnings, "showwarning", router)
    noisy_library.configure()  # before the folder is known: it waits
    assert router.pending and not (tmp_path / "run" / LOG_FILE).exists()
    router.log_to(tmp_path / "run")  # the folder does not exist yet: still waiting
    (tmp_path / "run").mkdir()
    noisy_library.configure()
    log = (tmp_path / "run" / LOG_FILE).read_text()
    assert log.count(NOISE) == 2 and "FutureWarning" in log and not router.pending
    # meds's own warning (KL-Cov cannot act with one PPO epoch) asks the user to act: it prints
    from meds_cli.engine.training.algorithm_setup import build_algorithm
    from tests.conftest import tiny_config

    build_algorithm(tiny_config("algo.name=rlif-multireward"))
    err = capsys.readouterr().err
    assert "train.ppo_epochs>1" in err and NOISE not in err
    assert "ppo_epochs" not in (tmp_path / "run" / LOG_FILE).read_text()


def test_eval_keeps_library_warnings_off_the_terminal(tmp_path, noisy_library, terminal, monkeypatch):
    from meds_cli.commands import eval as eval_command

    real = eval_command.make_backend

    def noisy_backend(*args, **kwargs):
        noisy_library.configure()  # a library warning while the model loads, as transformers' did
        return real(*args, **kwargs)

    monkeypatch.setattr(eval_command, "make_backend", noisy_backend)
    data = tmp_path / "data" / "math500"
    data.mkdir(parents=True)
    (data / "test.jsonl").write_text(json.dumps({"problem": "compute 1+1", "answer": "2"}) + "\n")
    out = tmp_path / "out"
    result = runner.invoke(app, ["eval", "--model", "tiny-llama", "--benchmarks", "math500", "--k", "1",
                                 "--max-new-tokens", "4", "--data-dir", str(tmp_path / "data"), "--output", str(out),
                                 "-q"])
    assert result.exit_code == 0, result.output
    assert NOISE not in result.output  # stdout and stderr of the command
    assert NOISE in (out / LOG_FILE).read_text()


def test_train_keeps_library_warnings_off_the_terminal(tmp_path, noisy_library, terminal, monkeypatch):
    from meds_cli.engine import trainer

    real = trainer.Trainer.__init__

    def noisy_init(self, *args, **kwargs):
        noisy_library.configure()
        real(self, *args, **kwargs)

    monkeypatch.setattr(trainer.Trainer, "__init__", noisy_init)
    run = tmp_path / "run"
    result = runner.invoke(app, ["train", "--model", "tiny-llama", "--task", "copy", "--steps", "1", "--output",
                                 str(run), "-q", "--set", "rollout.max_new_tokens=2", "--set",
                                 "rollout.prompts_per_step=2", "--set", "rollout.group_size=4"])
    assert result.exit_code == 0, result.output
    assert NOISE not in result.output
    assert NOISE in (run / LOG_FILE).read_text()

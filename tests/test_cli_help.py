"""`meds train --help` names what the registries hold (every algorithm, task and built-in model),
and builds it only when the help is shown: a command run without --help imports no torch for it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from typer.testing import CliRunner

from meds_cli.app import app
from meds_cli.commands.listing import registries
from meds_cli.engine.model_io.model import BUILT_IN

ROOT = Path(__file__).resolve().parents[1]


def collapsed(text: str) -> str:
    """The help's text without its box, spaces and line breaks (a name the table wrapped is whole again)."""
    return "".join(ch for ch in text if not ch.isspace() and ch not in "│╭╮╰╯─")


def test_train_help_names_every_registered_algorithm_task_and_built_in_model():
    out = CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "100"})
    assert out.exit_code == 0, out.output
    text = collapsed(out.output)
    filled = registries()
    names = filled["algorithms"].names() + filled["tasks"].names() + list(BUILT_IN)
    assert len(filled["algorithms"].names()) >= 8 and "math" in filled["tasks"]
    assert [name for name in names if name not in text] == []
    # each list sits in its option's own help: the algorithms are not named under --task
    assert f"Algorithm:{','.join(filled['algorithms'].names())}" in text
    assert f"Trainingtask:{','.join(filled['tasks'].names())}" in text


def imports_torch(argv: list[str]) -> bool:
    """Whether `meds ARGV`, run in a fresh interpreter, imported torch."""
    script = textwrap.dedent(f"""
        import sys
        from typer.testing import CliRunner
        from meds_cli.app import app
        CliRunner().invoke(app, {argv!r})
        print("torch" in sys.modules)
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1] == "True"


def test_a_command_without_help_imports_no_torch_for_the_help():
    assert not imports_torch(["--version"])
    assert not imports_torch(["train", "--no-such-option"])  # a usage error shows no option help
    assert imports_torch(["train", "--help"])  # the check can fail: the help itself reads the registries

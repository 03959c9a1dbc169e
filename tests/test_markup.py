"""Dynamic text printed through rich keeps its brackets (issue 54): `pip install -e '.[vllm]'` used to
come out as `pip install -e '.'`. meds_cli/core/markup.py's `plain` escapes it; this file checks that
the commands use it, and renders errors with brackets in them."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from meds_cli.core.errors import UserError
from meds_cli.core.markup import plain

ROOT = Path(__file__).resolve().parent.parent
# Calls whose text rich reads as markup: console.print / .status, Table titles, the trainer's
# say(acc, text) and self._say(text), and any call whose f-string uses a markup tag itself. The
# `say` callbacks of lower layers (checkpoint_store, vllm_engine) take plain text and their printers
# escape it; app.fail escapes its whole message.
CONSOLE_METHODS = {"print", "status"}
PACKAGES = ("meds_cli", "benchmarks", "algorithms")


def _is_markup_call(call: ast.Call) -> bool:
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if isinstance(func, ast.Attribute) and name in CONSOLE_METHODS or name == "Table" or name == "_say":
        return True
    if name == "say" and len(call.args) >= 2:
        return True
    return any(isinstance(part, ast.Constant) and "[/" in str(part.value)
               for arg in call.args if isinstance(arg, ast.JoinedStr) for part in arg.values)


# values the code itself makes as numbers: nothing in them for rich to read
NUMBERS = {"step", "steps", "k", "i", "samples", "job", "candidate", "groups", "quota", "max_new_tokens",
           "sleep_level", "generation_rounds", "len", "seconds", "max_prompt_tokens", "skipped", "total"}


def _last_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        return _last_name(node.func)
    if isinstance(node, ast.Subscript):
        key = node.slice
        return key.value if isinstance(key, ast.Constant) and isinstance(key.value, str) else _last_name(node.value)
    return getattr(node, "attr", getattr(node, "id", None))


def _escaped(part: ast.FormattedValue) -> bool:
    node = part.value
    if part.format_spec is not None or _last_name(node) in NUMBERS:
        return True
    return isinstance(node, ast.Call) and _last_name(node.func) == "plain"


def _unescaped_parts(call: ast.Call) -> list[str]:
    """The f-string pieces of a markup call's text that do not go through plain()."""
    if any(k.arg == "markup" and isinstance(k.value, ast.Constant) and k.value.value is False for k in call.keywords):
        return []
    texts = list(call.args) + [k.value for k in call.keywords if k.arg == "title"]
    found = []
    for text in texts:
        for node in ast.walk(text):
            if isinstance(node, ast.JoinedStr):
                found += [ast.unparse(part.value) for part in node.values
                          if isinstance(part, ast.FormattedValue) and not _escaped(part)]
    return found


def test_every_printed_fstring_escapes_its_dynamic_parts():
    offenders = []
    for path in sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and _is_markup_call(node):
                offenders += [f"{path.relative_to(ROOT)}:{node.lineno}: {part}" for part in _unescaped_parts(node)]
    assert not offenders, "dynamic text printed as rich markup without plain():\n" + "\n".join(offenders)


def test_plain_keeps_brackets_through_rich():
    from rich.console import Console

    console = Console(record=True, width=200)
    for text in ["pip install -e '.[vllm]'", "runs/[x]/a", "[bold]not bold[/]", "has value ['last']"]:
        console.print(f"[yellow]note:[/] {plain(text)}")
    out = console.export_text()
    assert "pip install -e '.[vllm]'" in out and "runs/[x]/a" in out and "[bold]not bold[/]" in out


def test_fail_renders_an_error_with_brackets(capsys):
    import typer

    from meds_cli.app import _one_line_errors

    def broken():
        raise UserError("needs the vllm package (GPU: pip install -e '.[vllm]'); variant [b] in runs/[a]")

    with pytest.raises(typer.Exit):
        _one_line_errors(broken, "do it")()
    err = capsys.readouterr().err
    assert "pip install -e '.[vllm]'" in err and "variant [b] in runs/[a]" in err


def test_vllm_advice_keeps_its_extra_on_the_command_line(tmp_path):
    try:
        import vllm  # noqa: F401
        pytest.skip("vllm is installed here: the advice is not printed")
    except ImportError:
        pass
    result = subprocess.run([sys.executable, "-m", "meds_cli", "eval", "--model", "tiny", "--backend", "vllm",
                             "--limit", "1", "--output", str(tmp_path / "eval")], capture_output=True, text=True,
                            cwd=ROOT)
    assert result.returncode == 2
    assert "pip install -e '.[vllm]'" in result.stderr, result.stderr
    assert not (tmp_path / "eval").exists()

"""benchmarks.load_all skips a module only for a missing package it declares optional; a missing
or broken module, or a missing required package, raises."""

import logging
import sys

import pytest

from benchmarks import REGISTERING_MODULES, load_all
from benchmarks.registry import BENCHMARKS, TASKS

ABSENT = "meds_test_absent_package"  # a package no environment has


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    """A folder on sys.path for throw-away plug-in modules, forgotten again afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [n for n in sys.modules if n.startswith("meds_test_plugin")]:
        del sys.modules[name]


def test_the_project_modules_all_load_and_register():
    assert load_all() == {}
    assert all(name in sys.modules for name in REGISTERING_MODULES)
    assert "arithmetic" in TASKS and "math500" in BENCHMARKS


def test_a_missing_optional_package_skips_its_module_with_a_reason(plugin_dir, caplog):
    (plugin_dir / "meds_test_plugin_a.py").write_text(f"import {ABSENT}.sub\n")
    with caplog.at_level(logging.WARNING, logger="benchmarks"):
        skipped = load_all({"meds_test_plugin_a": (ABSENT,), "benchmarks.tasks": ()})
    assert list(skipped) == ["meds_test_plugin_a"]
    assert f"optional package '{ABSENT}'" in skipped["meds_test_plugin_a"]
    assert "meds_test_plugin_a" in caplog.text


def test_a_missing_package_not_declared_optional_raises(plugin_dir):
    (plugin_dir / "meds_test_plugin_b.py").write_text(f"import {ABSENT}\n")
    with pytest.raises(ModuleNotFoundError, match=ABSENT):
        load_all({"meds_test_plugin_b": ("some_other_extra",)})


def test_a_missing_module_raises_even_with_optional_packages():
    with pytest.raises(ModuleNotFoundError, match="meds_test_plugin_nowhere"):
        load_all({"meds_test_plugin_nowhere": (ABSENT,)})


@pytest.mark.parametrize("body, error", [
    ("from benchmarks.registry import NO_SUCH_NAME\n", ImportError),  # broken import inside the project
    ("raise RuntimeError('bug at import time')\n", RuntimeError),
    ("def broken(:\n", SyntaxError),
])
def test_a_broken_module_raises(plugin_dir, body, error):
    (plugin_dir / "meds_test_plugin_c.py").write_text(body)
    with pytest.raises(error):
        load_all({"meds_test_plugin_c": (ABSENT,)})

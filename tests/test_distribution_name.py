"""The distribution is `meds-rl` ("meds" on the package index is an unrelated package); the command
stays `meds` and the import package `meds_cli`, and provenance records this distribution's version."""

import tomllib
from pathlib import Path

from meds_cli.engine.run_folders import run_dir

PYPROJECT = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())


def test_the_distribution_is_not_named_like_the_unrelated_meds_package():
    assert PYPROJECT["project"]["name"] == "meds-rl"


def test_the_command_and_import_package_keep_their_names():
    assert PYPROJECT["project"]["scripts"]["meds"].startswith("meds_cli")


def test_provenance_records_the_version_of_this_distribution_not_another():
    name = PYPROJECT["project"]["name"]
    assert name in run_dir.PACKAGES and "meds" not in run_dir.PACKAGES

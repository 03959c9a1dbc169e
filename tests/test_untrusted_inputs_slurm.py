"""Issue 43's generated scripts through a real `sbatch --test-only` (marked slurm: `make
test-slurm`, after `bash scripts/slurm_local.sh start`; skipped where sinfo reaches no cluster):
folders, Python paths and values that hold spaces, quotes and shell syntax are read by Slurm as
one value each, and nothing in them runs. `--test-only` validates the script and its directives
and schedules nothing."""

import shutil
import subprocess
from pathlib import Path

import pytest

from meds_cli.engine.launchers.slurm_settings import SlurmSettings
from meds_cli.engine.launchers.slurm_train import render_train_script

pytestmark = pytest.mark.slurm


@pytest.fixture(autouse=True, scope="module")
def cluster():
    if shutil.which("sinfo") is None or subprocess.run(["sinfo"], capture_output=True).returncode != 0:
        pytest.skip("no Slurm cluster reachable here (bash scripts/slurm_local.sh start)")


def sbatch_test_only(script_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["sbatch", "--test-only", str(script_path)], capture_output=True, text=True,
                          cwd=script_path.parent)


@pytest.mark.parametrize("name", ["my run's \"x\"", "run $(touch {marker})", "run `touch {marker}`", "a;b&&c|d"])
def test_a_hostile_run_folder_passes_sbatch_and_runs_nothing(tmp_path, name):
    marker = tmp_path / "ran"
    run = tmp_path / name.format(marker=marker)
    script = render_train_script(run, nodes=1, gpus_per_node=0, processes_per_node=1,
                                 settings=SlurmSettings(time="00:05:00", partition="debug"),
                                 python="/opt/my py/bin/python", workdir=tmp_path / "work dir")
    path = tmp_path / "train.sbatch"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    checked = sbatch_test_only(path)
    # sbatch --test-only says when the job would start, on stderr, and exits 0; an injected line
    # would end its reading of the #SBATCH lines, and a bad directive is "Invalid directive".
    assert checked.returncode == 0 and "to start at" in checked.stderr, checked.stderr
    assert not marker.exists()

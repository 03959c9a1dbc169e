"""Build the GPU kit (`make gpu-kit`, docs/gpu.md): a git-ignored folder, at most 48 MiB, that
travels with the working tree to a bare, offline GPU machine and runs `make gpu-check` there in
one call (its run.sh).

    python scripts/gpu_kit.py                          # gpu-kit/ for the lent H200 (Python 3.12)
    python scripts/gpu_kit.py --python-version 3.11 --out /tmp/kit   # the same kit for another Python

What it holds:
- wheels/: the project's own wheel, and a wheel of every runtime dependency (and theirs) that
  the machine's image lacks (scripts/gpu_machine_packages.txt), for its Python, x86-64,
  manylinux. What the image has is not carried (torch, transformers, accelerate, peft: the
  machine's own), except where a requirement refuses the version the list gives, or asks for an
  upper bound on a package whose version there is unknown (then a fallback wheel that pip takes
  only if the machine's version does not fit);
- tokenizer/: the embedded SmolLM2 model's tokenizer, extracted once from its GGUF (about 90 MB,
  too big to travel), so the random-weight 1.5B architecture gets a real tokenizer;
- run.sh (from scripts/gpu_kit_run.sh): the entry the device call runs;
- kit.json: what was carried and what is left to the machine, and the pyproject.toml it was
  built from (run.sh warns when the tree's differs).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MACHINE_LIST = ROOT / "scripts" / "gpu_machine_packages.txt"
RUN_TEMPLATE = ROOT / "scripts" / "gpu_kit_run.sh"
MAX_MIB = 48  # 64 MiB travel with the working tree; the rest is left to the tree itself
# The manylinux tags pip may take (it matches each exactly): glibc 2.28 at most, which any recent
# image has (the lent machine's Python 3.12.3 is Ubuntu 24.04's, glibc 2.39).
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux_2_12_x86_64", "manylinux2010_x86_64", "manylinux_2_5_x86_64",
             "manylinux1_x86_64")
UPPER_BOUNDS = ("<", "<=", "==", "===", "~=")


class KitError(Exception):
    """A kit that cannot be built as asked: one line for the user."""


def machine_packages(path: Path = MACHINE_LIST) -> dict[str, str | None]:
    """The GPU machine's packages: canonical name -> version (None where the list gives none)."""
    packages = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            packages[canonicalize_name(name)] = version or None
    return packages


def target_markers(python_version: str) -> dict[str, str]:
    """The environment markers of the target machine (Linux x86-64 CPython) for `python_version`."""
    major_minor = ".".join(python_version.split(".")[:2])
    return {**default_environment(), "python_version": major_minor, "python_full_version": f"{major_minor}.0",
            "implementation_name": "cpython", "platform_python_implementation": "CPython", "sys_platform": "linux",
            "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix", "extra": ""}


def applies(requirement: Requirement, markers: dict[str, str]) -> bool:
    return requirement.marker is None or requirement.marker.evaluate(markers)


def wheel_requirements(wheel: Path) -> list[Requirement]:
    """A wheel's Requires-Dist lines (its METADATA), extras' included (the caller's markers drop them)."""
    import zipfile

    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        text = archive.read(metadata).decode()
    return [Requirement(line.split(":", 1)[1].strip()) for line in text.splitlines()
            if line.startswith("Requires-Dist:")]


def wheel_version(wheel: Path) -> tuple[str, Version]:
    name, version, _, _ = parse_wheel_filename(wheel.name)
    return canonicalize_name(name), version


def fits(requirement: Requirement, version: str | Version) -> bool:
    return requirement.specifier.contains(Version(str(version)), prereleases=True)


def machine_verdict(requirement: Requirement, version: str | None) -> str:
    """What to do with a requirement on a package the machine has: 'machine' (leave it to the
    machine's), 'carry' (its version does not fit), 'fallback' (its version is unknown and the
    requirement bounds it from above: carry one pip takes only if the machine's does not fit)."""
    if version is not None:
        return "machine" if fits(requirement, version) else "carry"
    bounded = any(spec.operator in UPPER_BOUNDS for spec in requirement.specifier)
    return "fallback" if bounded else "machine"


def pip_download(requirements: list[str], dest: Path, python_version: str) -> None:
    """Wheels only, no dependencies (the resolution here decides them), for the target Python."""
    if not requirements:
        return
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
            "--python-version", python_version, "--implementation", "cp", "--dest", str(dest)]
    for platform in PLATFORMS:
        argv += ["--platform", platform]
    done = subprocess.run([*argv, *requirements], capture_output=True, text=True)
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.startswith("ERROR")] or done.stderr.splitlines()
        raise KitError(f"pip download failed for Python {python_version}: {' '.join(lines[-2:])}")


@dataclass
class Resolution:
    carried: dict[str, Path] = field(default_factory=dict)         # name -> wheel
    fallbacks: set[str] = field(default_factory=set)               # carried only in case the machine's does not fit
    machine: dict[str, list[str]] = field(default_factory=dict)    # name -> the specifiers left to the machine


def resolve(top: list[Requirement], machine: dict[str, str | None], wheels: Path, python_version: str,
            download=pip_download) -> Resolution:
    """Walk the requirements breadth first: each is left to the machine, or carried as a wheel
    whose own requirements are walked in turn. One version of each package (two would stop the
    install): a later requirement the carried version does not fit is an error."""
    markers = target_markers(python_version)
    found = Resolution()
    queue = [r for r in top if applies(r, markers)]
    while queue:
        wanted: dict[str, Requirement] = {}
        for requirement in queue:
            name = canonicalize_name(requirement.name)
            if name in found.carried:
                version = wheel_version(found.carried[name])[1]
                if not fits(requirement, version):
                    raise KitError(f"{name} {version} is carried, but another package needs {requirement}")
                continue
            verdict = machine_verdict(requirement, machine[name]) if name in machine else "carry"
            if verdict == "machine":
                found.machine.setdefault(name, []).append(str(requirement.specifier))
                continue
            if verdict == "fallback":
                found.fallbacks.add(name)
            if name in wanted:  # two requirements on it in one round: both specifiers
                requirement = Requirement(f"{name}{wanted[name].specifier & requirement.specifier}")
            wanted[name] = Requirement(f"{name}{requirement.specifier}")
        download([str(r) for r in wanted.values()], wheels, python_version)
        by_name = {wheel_version(w)[0]: w for w in wheels.glob("*.whl")}
        queue = []
        for name in wanted:
            if name not in by_name:
                raise KitError(f"pip download gave no wheel of {name}")
            found.carried[name] = by_name[name]
            queue += [r for r in wheel_requirements(by_name[name]) if applies(r, markers)]
    for name in sorted(set(found.carried) & set(found.machine) - found.fallbacks):
        # carried because one package refused the machine's version: it must fit the others too
        version = wheel_version(found.carried[name])[1]
        for specifier in found.machine.pop(name):
            if not fits(Requirement(f"{name}{specifier}"), version):
                raise KitError(f"{name} {version} is carried, but another package needs {name}{specifier}")
    return found


def build_project_wheel(dest: Path) -> Path:
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(dest),
                           str(ROOT)], capture_output=True, text=True)
    if done.returncode != 0:
        raise KitError(f"building the project's wheel failed: {done.stderr.strip().splitlines()[-1:]}")
    return next(dest.glob("meds_rl-*.whl"))


def extract_tokenizer(dest: Path) -> None:
    """The embedded model's tokenizer files, saved once from its GGUF. The saved config names
    where it was loaded from (a path on this machine): that entry is dropped."""
    from meds_cli.engine.model_io.model import EMBEDDED, load_tokenizer, resolve_model

    load_tokenizer(resolve_model(EMBEDDED)).save_pretrained(dest)
    for path in dest.glob("*.json"):
        config = json.loads(path.read_text())
        if isinstance(config, dict) and "name_or_path" in config:
            config["name_or_path"] = EMBEDDED
            path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def this_machines_paths() -> list[str]:
    """Folders of the machine that builds the kit, which no file in it may name."""
    from meds_cli.engine.model_io.cache import cache_dir

    return sorted({str(p) for p in (ROOT, Path.home(), Path(sys.prefix), cache_dir(), Path(tempfile.gettempdir()))
                   if str(p) != "/"})


def travel_problems(folder: Path, forbidden: list[str] | None = None) -> list[str]:
    """What would not travel with the working tree, or would not work on another machine: links,
    anything but plain files and folders, and text files that name a folder of this machine."""
    forbidden = this_machines_paths() if forbidden is None else forbidden
    problems = []
    for path in sorted(folder.rglob("*")):
        where = path.relative_to(folder)
        if path.is_symlink():
            problems.append(f"{where}: a link (travels only as a link)")
        elif path.is_dir():
            continue
        elif not path.is_file():
            problems.append(f"{where}: not a plain file")
        elif path.suffix != ".whl":
            text = path.read_bytes().decode("utf-8", errors="replace")
            named = [p for p in forbidden if re.search(re.escape(p) + r"(?![\w.-])", text)]
            if named:
                problems.append(f"{where}: names {named[0]}, a folder of the machine that built the kit")
    return problems


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build(out: Path, python_version: str, max_mib: float = MAX_MIB, machine_list: Path = MACHINE_LIST) -> dict:
    """Build the kit into `out` (replacing an earlier kit there, its run's out/ too) and return its manifest."""
    if out.exists() and any(out.iterdir()) and not (out / "kit.json").is_file():
        raise KitError(f"{out} is not empty and holds no kit (kit.json): give an empty or new folder")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    (out / "kit.json").write_text("{}\n")  # a build stopped half way is still a kit the next one replaces
    wheels, tokenizer = out / "wheels", out / "tokenizer"
    wheels.mkdir()
    project = build_project_wheel(wheels)
    machine = machine_packages(machine_list)
    found = resolve(wheel_requirements(project), machine, wheels, python_version)
    extract_tokenizer(tokenizer)
    shutil.copyfile(RUN_TEMPLATE, out / "run.sh")
    os.chmod(out / "run.sh", 0o755)
    manifest = {
        "python_version": python_version, "platforms": list(PLATFORMS),
        "pyproject_sha256": sha256(ROOT / "pyproject.toml"),
        "project_wheel": project.name,
        "carried": {name: {"wheel": w.name, "bytes": w.stat().st_size, "fallback": name in found.fallbacks}
                    for name, w in sorted(found.carried.items())},
        "machine": {name: {"needs": sorted(set(specs)), "listed_version": machine[name]}
                    for name, specs in sorted(found.machine.items())},
    }
    (out / "kit.json").write_text(json.dumps(manifest, indent=2) + "\n")
    problems = travel_problems(out)
    if problems:
        raise KitError(f"{out} holds what would not travel: {problems[0]}")
    size = folder_bytes(out)
    manifest["bytes"] = size
    if size > max_mib * 2**20:
        raise KitError(f"the kit is {size / 2**20:.1f} MiB, over its {max_mib:g} MiB (64 MiB travel in all)")
    return manifest


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "gpu-kit", help="the kit's folder (default: gpu-kit)")
    parser.add_argument("--python-version", default="3.12", help="the GPU machine's Python, major.minor (3.12)")
    parser.add_argument("--max-mib", type=float, default=MAX_MIB, help=f"size limit (default {MAX_MIB})")
    args = parser.parse_args(argv)
    if not re.fullmatch(r"3\.\d+", args.python_version):
        print(f"error: --python-version must look like 3.12, got '{args.python_version}'", file=sys.stderr)
        return 2
    try:
        manifest = build(args.out, args.python_version, args.max_mib)
    except KitError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    carried = ", ".join(f"{n} {wheel_version(args.out / 'wheels' / c['wheel'])[1]}"
                        for n, c in manifest["carried"].items())
    print(f"gpu-kit: {args.out} ({manifest['bytes'] / 2**20:.1f} MiB, Python {args.python_version}): "
          f"{manifest['project_wheel']}; carried: {carried}; left to the machine: {', '.join(manifest['machine'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env bash
# The GPU kit's entry: scripts/gpu_kit_run.sh, copied to gpu-kit/run.sh by `make gpu-kit` (docs/gpu.md).
# On the lent GPU machine, in the repository root of the working tree that travelled with the kit:
#   bash gpu-kit/run.sh              # every row that can run there
#   bash gpu-kit/run.sh --only hf    # arguments go on to scripts/gpu_check_all.py
#   GPU_KIT_TINY=1 bash gpu-kit/run.sh   # the CPU stand-in of every row (CI: tests/test_gpu_kit.py)
# It makes a venv that sees the machine's own packages (torch among them), installs the kit's wheels into it offline,
# records the environment, then runs scripts/gpu_check_all.py with the kit's row limits, all within
# GPU_KIT_BUDGET_S seconds (480). Into $OUT (gpu-kit/out without one): run.log (everything printed),
# environment.txt (GPU, driver, CUDA, versions, pip check), table.txt and rows.log (each row's tails).
# PYTHON: the machine's Python with torch (python3).
set -uo pipefail
KIT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$KIT/.." && pwd)
OUT=${OUT:-$KIT/out}
PYTHON=${PYTHON:-python3}
BUDGET_S=${GPU_KIT_BUDGET_S:-480}
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PIP_DISABLE_PIP_VERSION_CHECK=1
mkdir -p "$OUT"

environment() {  # what the table's figures depend on
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
    nvidia-smi 2>&1 | grep -o 'CUDA Version: *[0-9.]*'
  else
    echo "nvidia-smi: not found"
  fi
  "$VENV/bin/python" - "$KIT/kit.json" <<'PY'
import importlib.metadata as md, json, platform, sys
print(f"python: {platform.python_version()} ({sys.executable})")
try:
    import torch
    cuda = torch.cuda.is_available()
    print(f"torch: {torch.__version__}, CUDA build {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, "
          f"GPU visible: {cuda}" + (f", {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}" if cuda else ""))
except Exception as error:  # noqa: BLE001 - the record says what failed
    print(f"torch: cannot be imported ({error})")
kit = json.load(open(sys.argv[1]))
for name in ["transformers", "accelerate", "peft", "vllm", *kit["machine"], *kit["carried"]]:
    try:
        print(f"{name}: {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"{name}: not installed")
PY
}

main() {
  echo "gpu-kit: $KIT for Python $("$PYTHON" -c 'import sys; print(sys.version.split()[0])'), budget ${BUDGET_S} s"
  "$PYTHON" - "$KIT/kit.json" "$ROOT/pyproject.toml" <<'PY'
import hashlib, json, sys
if json.load(open(sys.argv[1]))["pyproject_sha256"] != hashlib.sha256(open(sys.argv[2], "rb").read()).hexdigest():
    print("gpu-kit: warning: pyproject.toml changed since the kit was built (make gpu-kit again)")
PY
  VENV=$(mktemp -d)/venv
  # A venv that sees the machine Python's packages (torch and the rest) behind the kit's. Not with
  # --system-site-packages: the machine's python3 is itself a venv (/opt/torch/.venv), and a venv
  # made from it would see its base interpreter's packages, not torch; a .pth file names the
  # machine Python's own package folders instead (here, in CI, the same holds for the test's venv).
  "$PYTHON" -m venv --without-pip "$VENV" || { echo "gpu-kit: venv failed"; return 3; }
  "$PYTHON" -c 'import site, sys; print("\n".join(dict.fromkeys(
      site.getsitepackages() + [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))])))' \
    >"$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/gpu-kit-machine.pth"
  local pip=("$PYTHON" -m pip --python "$VENV/bin/python" install --quiet --no-index --no-cache-dir --no-compile
             --find-links "$KIT/wheels")
  if ! "${pip[@]}" meds-rl; then
    echo "gpu-kit: the install with dependencies failed (above); installing the kit's wheels without them"
    "${pip[@]}" --no-deps "$KIT"/wheels/*.whl || { echo "gpu-kit: install failed"; return 3; }
  fi
  { environment; echo "pip check:"; "$PYTHON" -m pip --python "$VENV/bin/python" check 2>&1; } \
    | tee "$OUT/environment.txt"
  local left=$((BUDGET_S - SECONDS))
  echo "gpu-kit: installed in ${SECONDS} s; rows get the ${left} s left"
  timeout --kill-after=15 "$left" "$VENV/bin/python" "$ROOT/scripts/gpu_check_all.py" --kit "$KIT" \
    --report "$OUT" ${GPU_KIT_TINY:+--tiny} "$@"
  local code=$?
  [ "$code" -eq 124 ] && echo "gpu-kit: stopped at the budget of ${BUDGET_S} s"
  echo "gpu-kit: done in ${SECONDS} s, exit code $code; in $OUT: $(ls "$OUT" | tr '\n' ' ')"
  return "$code"
}

main "$@" 2>&1 | tee "$OUT/run.log"
exit "${PIPESTATUS[0]}"

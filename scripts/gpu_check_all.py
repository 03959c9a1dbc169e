"""One command for the first GPU (`make gpu-check`, docs/gpu.md): the GPU check on the
Qwen2.5-Math-1.5B architecture, then a short `meds train` run of each setup a user would pick,
each under a time limit, and one table: setup, passed or the first line of its error, peak GPU
memory, tokens per second.

    python scripts/gpu_check_all.py            # every row this machine has the GPUs for
    python scripts/gpu_check_all.py --only hf  # rows whose name starts with `hf`
    python scripts/gpu_check_all.py --kit gpu-kit --report OUT  # the GPU kit's rows (gpu-kit/run.sh)
    python scripts/gpu_check_all.py --tiny     # every row's path on CPU with a 2-layer model

The rows that need vLLM are skipped ("skipped: vLLM not installed") where it is not installed, the
rows that need more GPUs than the machine has are skipped naming the count, and under --kit the
rows without a kit limit are skipped (they would not fit its 8 minutes).

The runs train a random-weight model built from configs/gpu_check/qwen2.5-math-1.5b (saved once
to a temporary folder with the embedded SmolLM2 tokenizer, so nothing is downloaded) with the
settings of scripts/gpu_check.py: DAPO+MEDS on arithmetic, every response forced to the length
limit, dynamic sampling off. Peak memory is the largest GPU's, polled from nvidia-smi every
second (vLLM's memory included); tokens per second are the generated tokens of the run's
steps (metrics.jsonl). Without a GPU it says so in one line and exits 2.

`--kit DIR` sizes the rows for the GPU kit (`make gpu-kit`, docs/gpu.md): each row stops at its
KIT_LIMITS_S limit so the whole fits in 8 minutes on one H200, and the tokenizer comes from
DIR/tokenizer instead of the embedded GGUF (which the kit does not carry).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

NO_GPU = "gpu-check: no GPU visible (torch.cuda.is_available() is false); nothing run"
RUN_SHAPE = {"prompts": 8, "group": 8, "tokens": 256, "micro": 8, "steps": 2, "precision": "bf16"}
CHECK_ROW = "gpu_check.py, 1.5B architecture"
# The GPU kit's limits (seconds): the three rows one H200 without vLLM runs, 400 s together, plus
# about a minute to install the kit and build the random model, inside gpu-kit/run.sh's 8 minutes.
# The vLLM rows' limits count only where vLLM is installed (then the whole takes longer).
KIT_LIMITS_S = {CHECK_ROW: 180, "hf engine": 100, "FSDP2 on every GPU": 120, "vLLM colocated, sleep level 1": 150,
                "vLLM colocated, sleep level 2": 150, "LoRA, vLLM adapter sync": 150, "vLLM tensor parallel 2": 180}
TINY_LIMIT_S = 600  # the CPU stand-in on a loaded 2-core machine
LOG_TAIL_LINES = 60  # of each row's stdout and stderr, in the report's rows.log
VLLM_MISSING = "skipped: vLLM not installed"
NOT_IN_KIT = "skipped: outside the GPU kit's 8 minutes (make gpu-check runs it)"
VLLM_ENGINES = ("rollout.engine=vllm", "rollout.engine=vllm-server")


def too_few_gpus(needed: int, gpus: int) -> str:
    return f"skipped: needs {needed} GPUs, this machine has {gpus}"


@dataclass(frozen=True)
class Setup:
    """One row: `overrides` on top of the GPU check's run settings; `processes`: 1, or 0 for
    one per GPU; `min_gpus`: the row is skipped on a machine with fewer."""

    name: str
    overrides: tuple[str, ...] = ()
    processes: int = 1
    min_gpus: int = 1
    time_limit_s: int = 900

    @property
    def needs_vllm(self) -> bool:
        return any(engine in self.overrides for engine in VLLM_ENGINES)


VLLM = ("rollout.engine=vllm",)
# meds starts `vllm serve` on the last GPU (rollout.server.gpus=1), training on the first; the server owns its GPU
SERVER_ON_GPU_2 = ("rollout.engine=vllm-server", "rollout.server.start=true", "rollout.server.gpus=1",
                   "rollout.vllm.gpu_memory_utilization=0.8")
SETUPS = (
    Setup("hf engine", ("rollout.engine=hf",)),
    Setup("vLLM colocated, sleep level 1", (*VLLM, "rollout.vllm.sleep_level=1")),
    Setup("vLLM colocated, sleep level 2", (*VLLM, "rollout.vllm.sleep_level=2")),
    Setup("LoRA, vLLM adapter sync", (*VLLM, "model.lora.enabled=true", "optim.lr=1e-5", "rollout.vllm.sync=adapter",
                                      "rollout.vllm.sleep_level=1")),
    Setup("FSDP2 on every GPU", ("rollout.engine=hf", "train.sharding=fsdp2"), processes=0, time_limit_s=1200),
    Setup("vLLM tensor parallel 2", (*VLLM, "rollout.vllm.tensor_parallel_size=2", "rollout.vllm.sleep_level=1"),
          processes=2, min_gpus=2, time_limit_s=1200),
    Setup("hf-worker, k=1 off-policy", ("rollout.engine=hf-worker", "rollout.max_staleness=1")),
    Setup("vllm-server, LoRA, server on GPU 2 of 2", (*SERVER_ON_GPU_2, "model.lora.enabled=true", "optim.lr=1e-5",
                                                      "rollout.vllm.sync=adapter"), min_gpus=2, time_limit_s=1200),
    Setup("vllm-server, full weights over NCCL", (*SERVER_ON_GPU_2, "model.lora.enabled=false"), min_gpus=2,
          time_limit_s=1200),
)


@dataclass
class Planned:
    name: str
    argv: list[str]
    time_limit_s: int
    run_dir: Path | None = None  # where a meds run writes metrics.jsonl (None: the GPU check script)
    skip: str = ""  # why the row is not run ("" : it runs)


@dataclass
class Result:
    name: str
    outcome: str  # "passed", or the first line of the error
    peak_gib: float | None = None
    tokens_per_s: float | None = None
    extra: dict = field(default_factory=dict)
    log: str = ""  # the tails of its output, for the report


def counts_as_passed(outcome: str) -> bool:
    return outcome.startswith(("passed", "skipped"))


# A row can pass without running what its name promises: the run says so in a note, and the table
# must too (the first H200 run's "FSDP2 on every GPU" row, on one GPU, trained unsharded).
PASSED_WITH_A_CAVEAT = {"has nothing to shard; training unsharded": "passed (1 process: not sharded)"}


def passed_outcome(output: str) -> str:
    """"passed", or "passed (...)" where the run's own output says it fell back."""
    flat = " ".join(output.split())  # rich wraps long notes over lines
    return next((said for note, said in PASSED_WITH_A_CAVEAT.items() if note in flat), "passed")


def gpu_check_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_overrides(setup: Setup, model_dir: Path, processes: int, tiny: bool = False) -> list[str]:
    """The `--set` values of a setup's `meds train` run: the GPU check's settings at RUN_SHAPE
    (or its tiny CPU settings; prompts rounded to a multiple of the processes), the model, then
    the setup's own."""
    shape = gpu_check_module().settings(True, RUN_SHAPE["steps"]) if tiny else dict(RUN_SHAPE)
    shape["prompts"] = max(1, shape["prompts"] // processes) * processes
    return [*gpu_check_module().overrides(shape), f"model.name={model_dir}", *setup.overrides]


def meds_argv(python: str, setup: Setup, gpus: int, model_dir: Path, run_dir: Path, tiny: bool = False) -> list[str]:
    """The command line of a setup's run: `python -m meds_cli train ...`, under `accelerate
    launch` where the setup takes several processes. A setup of one process per GPU on a
    one-GPU machine runs under torch.distributed.run: FSDP2's device mesh needs a process group
    even of one."""
    processes = gpus if setup.processes == 0 else setup.processes
    train = ["train", "--quiet", "--output", str(run_dir)]
    for value in run_overrides(setup, model_dir, processes, tiny):
        train += ["--set", value]
    if processes == 1 and setup.processes == 0:
        return [python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1", "-m", "meds_cli",
                *train]
    if processes == 1:
        return [python, "-m", "meds_cli", *train]
    return [python, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes),
            "--num_machines", "1", "--mixed_precision", "bf16", "--dynamo_backend", "no", "-m", "meds_cli", *train]


def skip_reason(setup: Setup, gpus: int, vllm: bool, limits: dict[str, int] | None) -> str:
    """Why this machine does not run the row ("": it runs): too few GPUs, no vLLM, or (the kit's
    `limits`) no place in the kit's budget."""
    if gpus < setup.min_gpus:
        return too_few_gpus(setup.min_gpus, gpus)
    if setup.needs_vllm and not vllm:
        return VLLM_MISSING
    if limits is not None and setup.name not in limits:
        return NOT_IN_KIT
    return ""


def plan(gpus: int, python: str, model_dir: Path, out_root: Path, only: str = "", *, tiny: bool = False,
         tokenizer: str = "", limits: dict[str, int] | None = None, vllm: bool = True) -> list[Planned]:
    """The rows this machine runs, in order: the GPU check script, then every setup it has the
    GPUs for. `tiny`: the CPU stand-in (2-layer model, a few tokens); `tokenizer`: the GPU check
    script's tokenizer folder; `limits`: time limits by row name in place of each row's own;
    `vllm`: whether vLLM is installed (else its rows are planned as skipped)."""
    check = [python, str(ROOT / "scripts" / "gpu_check.py"), "--steps", "2", *(["--tiny"] if tiny else []),
             *(["--tokenizer", tokenizer] if tokenizer else [])]
    rows = [Planned(CHECK_ROW, check, 900)]
    for number, setup in enumerate(SETUPS, start=1):
        run_dir = out_root / f"run-{number}"
        rows.append(Planned(setup.name, meds_argv(python, setup, max(gpus, setup.min_gpus), model_dir, run_dir, tiny),
                            setup.time_limit_s, run_dir, skip_reason(setup, gpus, vllm, limits)))
    for row in rows:
        row.time_limit_s = TINY_LIMIT_S if tiny else (limits or {}).get(row.name, row.time_limit_s)
    return [row for row in rows if row.name.startswith(only)]


def first_error_line(stderr: str, returncode: int) -> str:
    """The line that says what went wrong: meds's own one-line error ('error: ...'), else the
    last line of a traceback (the exception), else the last line written, else the exit code."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in lines:
        if line.lower().startswith("error:"):
            return line
    for line in reversed(lines):
        head = line.split(":", 1)[0]
        if head.endswith(("Error", "Exception", "Interrupt")) or head == "AssertionError":
            return line
    return lines[-1] if lines else f"exit code {returncode}"


def gpu_memory_mib(text: str) -> list[int]:
    """Memory in use per GPU from `nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits`."""
    return [int(float(line)) for line in text.split() if line.strip()]


def run_tokens_per_s(run_dir: Path) -> float | None:
    """Generated tokens per second of sampling over a run's steps (metrics.jsonl), None where it wrote none."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = [row for row in rows if "tokens_per_s" in row]
    return sum(row["tokens_per_s"] for row in rows) / len(rows) if rows else None


def check_tokens_per_s(stdout: str) -> float | None:
    """The mean of the `gen tok/s` column of gpu_check.py's step table."""
    lines = stdout.splitlines()
    header = next((i for i, line in enumerate(lines) if "gen tok/s" in line), None)
    if header is None:
        return None
    column = lines[header].split("  ")
    column = [c.strip() for c in column if c.strip()].index("gen tok/s")
    values = []
    for line in lines[header + 1:]:
        cells = line.split()
        if not cells or not cells[0].isdigit():
            break
        values.append(float(cells[column]))
    return sum(values) / len(values) if values else None


def table(results: list[Result]) -> str:
    """The report: one line per setup."""
    heads = ("setup", "result", "peak GiB", "tokens/s")
    cells = [(r.name, r.outcome, "-" if r.peak_gib is None else f"{r.peak_gib:.1f}",
              "-" if r.tokens_per_s is None else f"{r.tokens_per_s:.0f}") for r in results]
    widths = [max(len(row[i]) for row in [heads, *cells]) for i in range(2)]
    lines = [f"{heads[0]:<{widths[0]}}  {heads[1]:<{widths[1]}}  {heads[2]:>8}  {heads[3]:>9}"]
    lines += [f"{a:<{widths[0]}}  {b:<{widths[1]}}  {c:>8}  {d:>9}" for a, b, c, d in cells]
    return "\n".join(lines)


class MemoryPoller:
    """The largest memory in use on any GPU while the block runs, from nvidia-smi every second."""

    def __init__(self):
        self.peak_mib, self._stop = None, threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self):
        while not self._stop.is_set():
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                     capture_output=True, text=True, timeout=10).stdout
                used = gpu_memory_mib(out)
                if used:
                    self.peak_mib = max(self.peak_mib or 0, max(used))
            except (OSError, ValueError, subprocess.TimeoutExpired):
                return  # no nvidia-smi: the column stays empty
            self._stop.wait(1.0)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=15)
        return False


def run_limited(argv: list[str], env: dict, limit_s: int) -> tuple[int | None, str, str]:
    """Run a command in its own process group; at `limit_s` the whole group is killed (a
    launcher's workers too, which would otherwise hold the GPU for the next row). Returns the
    exit code (None: timed out), stdout and stderr."""
    process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=limit_s)
        return process.returncode, stdout, stderr
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        return None, stdout, stderr
    except BaseException:  # stopped from outside (SIGTERM from run.sh's budget, Ctrl-C): the row goes too
        os.killpg(process.pid, signal.SIGKILL)
        raise


def tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(text.splitlines()[-lines:])


def run_row(row: Planned, env: dict) -> Result:
    if row.skip:
        return Result(row.name, row.skip)
    with MemoryPoller() as memory:
        code, stdout, stderr = run_limited(row.argv, env, row.time_limit_s)
    if code is None:
        outcome = f"timed out after {row.time_limit_s} s"
    else:
        outcome = passed_outcome(stdout + stderr) if code == 0 else first_error_line(stderr, code)
    speed = run_tokens_per_s(row.run_dir) if row.run_dir is not None else check_tokens_per_s(stdout)
    peak = None if memory.peak_mib is None else memory.peak_mib / 1024
    log = (f"$ {' '.join(row.argv)}\n--- stdout (last {LOG_TAIL_LINES} lines)\n{tail(stdout)}\n"
           f"--- stderr (last {LOG_TAIL_LINES} lines)\n{tail(stderr)}\n")
    return Result(row.name, outcome, peak, speed, log=log)


def write_report(folder: Path, results: list[Result], seconds: list[float]) -> None:
    """table.txt (the table) and rows.log (each row's outcome, time and output tails) in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "table.txt").write_text(table(results) + "\n")
    parts = [f"=== {r.name}: {r.outcome} ({s:.0f} s)\n{r.log}" for r, s in zip(results, seconds)]
    (folder / "rows.log").write_text("\n".join(parts))


def save_random_model(folder: Path, tiny: bool = False, tokenizer: str = "") -> None:
    """The 1.5B architecture with random weights (bfloat16 on disk; the tiny stand-in: 2 layers,
    float32) and the tokenizer: `tokenizer`'s folder, else the embedded model's."""
    import torch

    from meds_cli.engine.model_io.model import EMBEDDED, load_tokenizer, resolve_model

    model = gpu_check_module().build_model(tiny=tiny, device="cpu")
    (model if tiny else model.to(torch.bfloat16)).save_pretrained(folder)
    load_tokenizer(tokenizer or resolve_model(EMBEDDED)).save_pretrained(folder)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run only the rows whose name starts with this")
    parser.add_argument("--keep", action="store_true", help="keep the model and run folders (printed at the end)")
    parser.add_argument("--kit", type=Path, default=None,
                        help="the GPU kit's folder: its tokenizer, and each row at its KIT_LIMITS_S limit")
    parser.add_argument("--tiny", action="store_true",
                        help="the CPU stand-in: every row's path with a 2-layer model and a few tokens, no GPU needed")
    parser.add_argument("--report", type=Path, default=None,
                        help="a folder for table.txt and rows.log (each row's output tails)")
    args = parser.parse_args(argv)
    import torch

    if not args.tiny and not torch.cuda.is_available():
        print(NO_GPU)
        return 2
    gpus = 1 if args.tiny else torch.cuda.device_count()
    tokenizer = str((args.kit / "tokenizer").resolve()) if args.kit else ""
    work = Path(tempfile.mkdtemp(prefix="gpu-check-all-"))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONUNBUFFERED": "1",  # a row stopped at its limit still shows what it printed
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    where = "CPU stand-in" if args.tiny else f"{gpus} GPU(s) ({torch.cuda.get_device_name(0)})"
    print(f"gpu-check: {where}; building the random {'tiny' if args.tiny else '1.5B'} model in {work}", flush=True)
    save_random_model(work / "model", args.tiny, tokenizer)
    rows = plan(gpus, sys.executable, work / "model", work, args.only, tiny=args.tiny, tokenizer=tokenizer,
                limits=KIT_LIMITS_S if args.kit else None, vllm=importlib.util.find_spec("vllm") is not None)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))  # a budget's `timeout` ends the row in progress too
    results, seconds = [], []
    for row in rows:
        started = time.perf_counter()
        results.append(run_row(row, env))
        seconds.append(time.perf_counter() - started)
        print(f"  {row.name}: {results[-1].outcome} ({seconds[-1]:.0f} s)", flush=True)
        if args.report:  # after each row: what ran is kept if a budget stops the rest
            write_report(args.report, results, seconds)
    print(table(results))
    if args.keep:
        print(f"model and runs kept in {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if all(counts_as_passed(r.outcome) for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

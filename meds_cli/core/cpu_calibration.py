"""Which CPU fast paths this machine's CPU runs faster, measured once per kind of machine.

What is fastest differs between CPUs. MKL's packed float32 matmul saved 30% of a decode step on
an Intel Xeon and cost 24% on an AMD EPYC with AVX512-BF16. Weights prepacked for oneDNN took
SmolLM2's stacked layers 1.44-1.57x less time than plain F.linear at 8-64 rows on an AMD EPYC
with AVX2 only, where MKL's packing gained nothing (0.92-1.00x; 2 threads). bf16 linear layers
took 1.3-3.8x less time than float32 on a Xeon with AMX-BF16, 1.5-2.1x on an EPYC with
AVX512-BF16, and are emulated (slower than float32) on a CPU without bf16 units (2-core cloud
machines of each kind, SmolLM2's layers). So each path is chosen by timing it here, on linear
layers of SmolLM2's shapes at the row counts of a decode step (8, 64) and of an update's
micro-batch (1,536): plain float32 F.linear against the MKL-packed and the oneDNN-packed products
(core/packed_matmul.py), and, where the CPU has bf16 units, against F.linear on bf16 copies of
the weights. The paths are timed side by side, each round running every one once, and each keeps
its least time of five rounds, so that other work on the machine slows them alike. The timings
are kept in a JSON file keyed by CPU model, torch version, thread count and the way of timing
(MEDS_CPU_CALIBRATION_FILE, else $XDG_CACHE_HOME/meds/cpu_calibration.json or ~/.cache/meds/...),
so a machine kind pays the calibration (under a second) once.

Without bf16 units (no amx_bf16 or avx512_bf16, or ONEDNN_MAX_CPU_ISA capping oneDNN below
them) bf16 is never timed nor chosen. MEDS_CPU_FAST_PATHS=default skips every timing and keeps
the paths written before calibration existed (MKL packing where torch has it, float32): the test
suite sets it, so its numbers do not change with the machine it runs on.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Mapping

import torch

from meds_cli.core.packed_matmul import PackedWeight, mkl_packing_available, packings_available

CACHE_VARIABLE = "MEDS_CPU_CALIBRATION_FILE"
PIN_VARIABLE = "MEDS_CPU_FAST_PATHS"  # "default": no timing, the pre-calibration choices
ISA_VARIABLES = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")
# (out_features, in_features) of SmolLM2-135M's linear layers: query/output (576 x 576), key and
# value (192 x 576), gate and up (1536 x 576), down (576 x 1536)
SHAPES = ((576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536))
DECODE_ROWS = (8, 64)
UPDATE_ROWS = 1536
# bf16 is chosen only where it is clearly faster: converting activations costs something the
# linear layers alone do not show, and a near tie is not worth bf16's rounding
BF16_MARGIN = 1.1
# oneDNN ISA caps (ONEDNN_MAX_CPU_ISA) that still allow bf16 dot products; lower caps
# (SSE41 .. AVX512_CORE_VNNI, AVX2_VNNI_2) leave bf16 to emulation
BF16_ISAS = ("AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX512_CORE_AMX", "AVX512_CORE_AMX_FP16", "AVX10_1_512",
             "AVX10_1_512_AMX", "AVX10_1_512_AMX_FP16", "AVX10_2_512", "AVX10_2_512_AMX_2", "ALL", "DEFAULT")


@dataclass(frozen=True)
class Timings:
    """Seconds for one product of every SHAPES layer, by row count (rows -> seconds); an empty
    mapping for a path this CPU cannot run or was not timed. `packed`: by packing ("mkl",
    "onednn"), float32 at the decode row counts."""

    float32: dict[int, float]
    packed: dict[str, dict[int, float]] = field(default_factory=dict)
    bf16: dict[int, float] = field(default_factory=dict)


@dataclass(frozen=True)
class FastPaths:
    float32_packing: str  # the float32 decode weights' packing, one of packed_matmul.PACKINGS
    bf16: bool  # compute in bf16 where train.mixed_precision is auto
    why: str  # the reason for the bf16 choice, in a phrase


def native_bf16_unit(environ: Mapping[str, str] | None = None, flags: set[str] | None = None) -> tuple[str | None, str]:
    """(the CPU's bf16 matrix unit, "AMX-BF16" or "AVX512-BF16", or None; the reason in a
    phrase): none, or oneDNN capped below it by ONEDNN_MAX_CPU_ISA. `flags`: the CPU's feature
    flags (default: torch's cpuinfo and /proc/cpuinfo)."""
    environ = os.environ if environ is None else environ
    flags = cpu_flags() if flags is None else flags
    unit = "AMX-BF16" if "amx_bf16" in flags else "AVX512-BF16" if "avx512_bf16" in flags else None
    if unit is None:
        return None, "CPU has no bf16 units"
    variable = next((v for v in ISA_VARIABLES if environ.get(v, "").strip()), None)
    cap = environ[variable].strip().upper() if variable else ""
    if cap and cap not in BF16_ISAS:
        return None, f"{variable}={cap} leaves oneDNN no bf16 units"
    if unit == "AMX-BF16" and cap and "AMX" not in cap and cap not in ("ALL", "DEFAULT"):
        unit = "AVX512-BF16" if "avx512_bf16" in flags else None
    return unit, f"CPU has {unit}" if unit else f"{variable}={cap} leaves oneDNN no bf16 units"


@functools.cache
def cpu_flags() -> frozenset[str]:
    found = set()
    for flag, probe in (("amx_bf16", "_is_amx_tile_supported"), ("avx512_bf16", "_is_avx512_bf16_supported")):
        check = getattr(torch.cpu, probe, None)
        if check is not None and check():
            found.add(flag)
    for line in _cpuinfo_lines():
        if line.startswith("flags"):
            found.update(line.partition(":")[2].split())
            break
    return frozenset(found)


def cpu_model_name() -> str:
    for line in _cpuinfo_lines():
        if line.startswith("model name"):
            return line.partition(":")[2].strip()
    import platform

    return platform.processor() or platform.machine() or "unknown CPU"


@functools.cache
def _cpuinfo_lines() -> tuple[str, ...]:
    """/proc/cpuinfo, read once (a line per core and flag set: large on a many-core machine)."""
    try:
        return tuple(Path("/proc/cpuinfo").read_text().splitlines())
    except OSError:
        return ()


def default_packing() -> str:
    """The packing chosen before calibration existed: MKL's, where torch has it."""
    return "mkl" if mkl_packing_available() else "none"


# ---------------------------------------------------------------- the decision, from timings


def speedups(slow: Mapping[int, float], fast: Mapping[int, float]) -> dict[int, float]:
    """slow / fast at each row count both were timed at."""
    return {rows: slow[rows] / fast[rows] for rows in sorted(set(slow) & set(fast)) if fast[rows] > 0}


def choose_fast_paths(timings: Timings, bf16_unit: str | None, *, no_unit: str = "CPU has no bf16 units",
                      margin: float = BF16_MARGIN) -> FastPaths:
    """Pack float32 decode weights for the packing whose product took the least time over the
    decode row counts together (none, where the plain product took no more); compute in bf16
    when the CPU has bf16 units and bf16 is at least `margin` times faster than the fastest
    float32 path (geometric mean over every row count timed: a decode step at 8 and 64 rows, an
    update's micro-batch). `no_unit`: why there is no unit, for the reason."""
    paths = {"none": timings.float32, **timings.packed}
    timed = {name: sum(rows[r] for r in DECODE_ROWS) for name, rows in paths.items()
             if all(r in rows for r in DECODE_ROWS)}
    packing = min(timed, key=timed.get) if "none" in timed else "none"  # a tie stays unpacked
    if bf16_unit is None:
        return FastPaths(packing, False, no_unit)
    packed = timings.packed.get(packing, {})
    best = {r: min(t, packed.get(r, t)) for r, t in timings.float32.items()}
    ratios = speedups(best, timings.bf16)
    if not ratios:
        return FastPaths(packing, False, f"CPU has {bf16_unit}; bf16 not timed")
    mean = statistics.geometric_mean(ratios.values())
    figures = " / ".join(f"{v:.2f}" for v in ratios.values())
    rows = " / ".join(str(r) for r in ratios)
    faster = mean >= margin
    return FastPaths(packing, faster, f"CPU has {bf16_unit}; bf16 linear {figures}x float32 at {rows} rows, "
                                   f"{'at least' if faster else 'under'} {margin}x")


# ---------------------------------------------------------------- the measurement


def time_side_by_side(calls: Mapping[object, Callable[[], object]], rounds: int = 5,
                      clock: Callable[[], float] = time.perf_counter) -> dict[object, float]:
    """The least seconds each call took over `rounds` rounds, each round running every call once
    (after a warm-up round). Side by side, so that other work starting or stopping on the machine
    slows every path alike instead of all the repeats of one (one path timed while another process
    spun on the same cores once came out 12x slower than the other); the least, because
    other work only ever adds time."""
    for call in calls.values():
        call()
    best = {key: float("inf") for key in calls}
    for _ in range(rounds):
        for key, call in calls.items():
            start = clock()
            call()
            best[key] = min(best[key], clock() - start)
    return best


def measure(*, bf16: bool, packings: tuple[str, ...] = (), timer: Callable[[Mapping], Mapping] = time_side_by_side,
            shapes=SHAPES, decode_rows=DECODE_ROWS, update_rows: int = UPDATE_ROWS) -> Timings:
    """Timings of SHAPES' products: float32 at the decode row counts (and the update's with
    `bf16`), packed float32 at the decode row counts for each of `packings`, bf16 on weights
    converted once at every row count (with `bf16`); every path timed side by side (`timer`:
    {(path, rows): call} -> {(path, rows): seconds})."""
    generator = torch.Generator().manual_seed(0)
    weights = [torch.randn(shape, generator=generator) / shape[1] ** 0.5 for shape in shapes]
    all_rows = (*decode_rows, update_rows) if bf16 else tuple(decode_rows)  # float32's update rows: for bf16 only
    widest = max(s[1] for s in shapes)
    # one input per row count, each layer reading as many of its columns as it takes
    inputs = {r: torch.randn(r, widest, generator=generator) for r in all_rows}
    layer_inputs = {r: [inputs[r][:, :w.shape[1]].contiguous() for w in weights] for r in all_rows}

    def products(rows: int, ws):
        def run():
            with torch.no_grad():
                for w, x in zip(ws, layer_inputs[rows]):
                    torch.nn.functional.linear(x.to(w.dtype), w)
        return run

    def packed_products(packing: str, rows: int):
        packs = [PackedWeight(packing, w, None, rows) for w in weights]

        def run():
            for pack, x in zip(packs, layer_inputs[rows]):
                pack.multiply(x)
        return run

    calls = {("float32", r): products(r, weights) for r in all_rows}
    calls.update({(packing, r): packed_products(packing, r) for packing in packings for r in decode_rows})
    if bf16:
        low = [w.to(torch.bfloat16) for w in weights]
        calls.update({("bf16", r): products(r, low) for r in all_rows})
    seconds = timer(calls)

    def path(name):
        return {rows: seconds[(kind, rows)] for kind, rows in calls if kind == name}
    return Timings(path("float32"), {packing: path(packing) for packing in packings}, path("bf16"))


# ---------------------------------------------------------------- the cache


def cache_file(environ: Mapping[str, str] | None = None) -> Path:
    environ = os.environ if environ is None else environ
    if environ.get(CACHE_VARIABLE):
        return Path(environ[CACHE_VARIABLE])
    base = Path(environ["XDG_CACHE_HOME"]) if environ.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "meds" / "cpu_calibration.json"


# Raised when the way of timing changes, so that timings taken the old way are taken again
# (2: paths side by side, the least of five rounds; 1 timed each path's repeats in a row)
TIMING_VERSION = 2


def machine_key(threads: int | None = None) -> str:
    threads = torch.get_num_threads() if threads is None else threads
    return f"{cpu_model_name()} | torch {torch.__version__} | {threads} threads | timing {TIMING_VERSION}"


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}  # none yet, or unreadable: measured again and rewritten


def _timings(entry: dict) -> Timings:
    def rows(part):
        return {int(r): float(t) for r, t in (part or {}).items()}
    packed = entry.get("packed") if isinstance(entry.get("packed"), dict) else {}
    return Timings(rows(entry.get("float32")), {name: rows(part) for name, part in packed.items()},
                   rows(entry.get("bf16")))


def calibrated_timings(key: str, path: Path, *, bf16: bool, packings: tuple[str, ...], measure_fn=measure) -> Timings:
    """This machine kind's timings from the cache file, measured and added to it where missing
    (or timed without a path now wanted: bf16 after ONEDNN_MAX_CPU_ISA was lifted)."""
    entries = _read(path)
    entry = entries.get(key)
    if isinstance(entry, dict):
        timings = _timings(entry)
        if timings.float32 and (timings.bf16 or not bf16) and all(timings.packed.get(p) for p in packings):
            return timings
    timings = measure_fn(bf16=bf16, packings=packings)
    entries[key] = asdict(timings)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        partial.write_text(json.dumps(entries, indent=1, sort_keys=True))
        partial.replace(path)
    except OSError:
        pass  # a read-only home: measured again next run, nothing else lost
    return timings


@dataclass(frozen=True)
class Calibration:
    paths: FastPaths
    source: str  # the cache file, or why nothing was timed


def cpu_fast_paths(environ: Mapping[str, str] | None = None, *, measure_fn=measure,
                   flags: frozenset[str] | None = None) -> Calibration:
    """The fast paths for this CPU, from the calibration cache (measured on first use).
    `flags`: the CPU's feature flags (default: this CPU's)."""
    environ = os.environ if environ is None else environ
    if environ.get(PIN_VARIABLE, "").strip().lower() == "default":
        return Calibration(FastPaths(default_packing(), False, f"{PIN_VARIABLE}=default"), "not calibrated")
    unit, why = native_bf16_unit(environ, flags)
    return _calibrated(machine_key(), str(cache_file(environ)), unit, why, packings_available(), measure_fn)


@functools.cache
def _calibrated(key: str, path: str, unit: str | None, why: str, packings: tuple[str, ...], measure_fn) -> Calibration:
    timings = calibrated_timings(key, Path(path), bf16=unit is not None, packings=packings, measure_fn=measure_fn)
    return Calibration(choose_fast_paths(timings, unit, no_unit=why), f"calibrated {path}")

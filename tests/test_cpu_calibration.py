"""The CPU calibration (meds_cli/core/cpu_calibration.py): the choice from hand-made timings, the
bf16 units found from the CPU's flags and ONEDNN_MAX_CPU_ISA, the cache file keyed per machine
kind, and the pin the test suite runs under. No test times anything: measurements are faked."""

import json

import pytest

from meds_cli.core import cpu_calibration as calibration
from meds_cli.core.cpu_calibration import Timings, choose_fast_paths, native_bf16_unit

AMX = frozenset({"avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})
AVX512_BF16 = frozenset({"avx512f", "avx512_bf16"})
AVX2 = frozenset({"avx2", "fma"})


def test_the_packing_that_measured_fastest_over_the_decode_rows_is_chosen():
    # Intel-like: MKL-packed 58 ms against 83 at 8 rows, 90 against 100 at 64: (58 + 90) < (83 + 100)
    intel = Timings({8: 0.083, 64: 0.100}, {"mkl": {8: 0.058, 64: 0.090}})
    assert choose_fast_paths(intel, None).float32_packing == "mkl"
    # AMD-like (issue 36): the MKL-packed path slower, 23.3 s against 18.8 s of decoding
    amd = Timings({8: 0.188, 64: 0.200}, {"mkl": {8: 0.233, 64: 0.210}})
    assert choose_fast_paths(amd, None).float32_packing == "none"
    # this AVX2 EPYC's stacked layers at 2 threads (ms): plain 2.91 / 7.88, MKL 3.12 / 7.89, oneDNN 1.85 / 5.16
    epyc = Timings({8: 2.91, 64: 7.88}, {"mkl": {8: 3.12, 64: 7.89}, "onednn": {8: 1.85, 64: 5.16}})
    assert choose_fast_paths(epyc, None).float32_packing == "onednn"
    # over the decode rows together: oneDNN faster at 8 rows, slower by more at 64
    mixed = Timings({8: 2.0, 64: 5.0}, {"onednn": {8: 1.0, 64: 6.5}})
    assert choose_fast_paths(mixed, None).float32_packing == "none"
    tie = Timings({8: 1.0, 64: 1.0}, {"mkl": {8: 1.0, 64: 1.0}})
    assert choose_fast_paths(tie, None).float32_packing == "none"  # a tie stays unpacked
    assert choose_fast_paths(Timings({8: 0.1, 64: 0.1}), None).float32_packing == "none"  # no packing timed
    partial = Timings({8: 0.1, 64: 0.1}, {"mkl": {8: 0.01}})  # not timed at every decode row count
    assert choose_fast_paths(partial, None).float32_packing == "none"


def test_bf16_needs_units_and_a_margin_over_the_faster_float32_path():
    # float32 plain 0.10 s at every row count, packed 0.08 at the decode rows; bf16 0.05 everywhere:
    # against the faster float32 path the speed-ups are 0.08/0.05 = 1.6, 1.6 and 0.10/0.05 = 2.0
    timings = Timings({8: 0.10, 64: 0.10, 1536: 0.10}, {"mkl": {8: 0.08, 64: 0.08}},
                      {8: 0.05, 64: 0.05, 1536: 0.05})
    chosen = choose_fast_paths(timings, "AMX-BF16")
    assert chosen.float32_packing == "mkl" and chosen.bf16
    assert chosen.why == ("CPU has AMX-BF16; bf16 linear 1.60 / 1.60 / 2.00x float32 at 8 / 64 / 1536 rows, "
                          "at least 1.1x")
    # no bf16 units: float32, whatever bf16 measured
    assert not choose_fast_paths(timings, None).bf16
    assert choose_fast_paths(timings, None).why == "CPU has no bf16 units"
    # bf16 emulated (this AVX2 machine's kind): 0.05 / 0.14 / 1.24 s; ratios 1.6, 0.571, 0.0806,
    # geometric mean (1.6 * 0.571 * 0.0806) ** (1/3) = 0.419 < 1.1
    slow = Timings({8: 0.10, 64: 0.10, 1536: 0.10}, {"mkl": {8: 0.08, 64: 0.08}}, {8: 0.05, 64: 0.14, 1536: 1.24})
    assert not choose_fast_paths(slow, "AVX512-BF16").bf16
    # a near tie: 1.05x at every row count is under the 1.1x margin
    tie = Timings({8: 0.105, 64: 0.105, 1536: 0.105}, {}, {8: 0.1, 64: 0.1, 1536: 0.1})
    assert not choose_fast_paths(tie, "AMX-BF16").bf16
    assert choose_fast_paths(tie, "AMX-BF16", margin=1.04).bf16


@pytest.mark.parametrize("flags, environ, unit", [
    (AMX, {}, "AMX-BF16"),
    (AVX512_BF16, {}, "AVX512-BF16"),
    (AVX2, {}, None),
    (AMX, {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}, None),  # oneDNN capped below its bf16 kernels
    (AMX, {"DNNL_MAX_CPU_ISA": "avx2"}, None),  # the older name, any case
    (AMX, {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}, "AVX512-BF16"),  # AMX off, AVX512-BF16 left
    (AMX, {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"}, "AMX-BF16"),
    (AVX2, {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"}, None),  # a cap adds no units
])
def test_bf16_units_from_flags_and_the_onednn_cap(flags, environ, unit):
    assert native_bf16_unit(environ, flags)[0] == unit


def test_the_cap_is_named_in_the_reason():
    assert native_bf16_unit({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}, AMX)[1] == \
        "ONEDNN_MAX_CPU_ISA=AVX512_CORE leaves oneDNN no bf16 units"


def test_timings_are_measured_once_per_machine_kind_and_cached(tmp_path):
    path = tmp_path / "calibration.json"
    calls = []

    def fake_measure(*, bf16, packings):
        calls.append((bf16, packings))
        return Timings({8: 1.0, 64: 2.0}, {p: {8: 0.5, 64: 1.0} for p in packings}, {8: 0.25} if bf16 else {})

    both = ("mkl", "onednn")
    first = calibration.calibrated_timings("CPU A | torch 2 | 2 threads", path, bf16=True, packings=both,
                                           measure_fn=fake_measure)
    again = calibration.calibrated_timings("CPU A | torch 2 | 2 threads", path, bf16=True, packings=both,
                                           measure_fn=fake_measure)
    assert calls == [(True, both)]
    assert first == again == Timings({8: 1.0, 64: 2.0}, {p: {8: 0.5, 64: 1.0} for p in both}, {8: 0.25})
    calibration.calibrated_timings("CPU A | torch 2 | 2 threads", path, bf16=True, packings=("mkl",),
                                   measure_fn=fake_measure)  # fewer packings wanted: the entry serves
    assert len(calls) == 1
    calibration.calibrated_timings("CPU A | torch 2 | 4 threads", path, bf16=True, packings=both,
                                   measure_fn=fake_measure)  # another thread count: another entry
    assert len(calls) == 2 and set(json.loads(path.read_text())) == {"CPU A | torch 2 | 2 threads",
                                                                     "CPU A | torch 2 | 4 threads"}
    path.write_text("{not json")  # a damaged file is measured again and rewritten
    calibration.calibrated_timings("CPU A | torch 2 | 2 threads", path, bf16=True, packings=both,
                                   measure_fn=fake_measure)
    assert len(calls) == 3 and "CPU A | torch 2 | 2 threads" in json.loads(path.read_text())


def test_a_float32_entry_is_measured_again_when_bf16_is_wanted(tmp_path):
    path, calls = tmp_path / "c.json", []

    def fake_measure(*, bf16, packings):
        calls.append(bf16)
        return Timings({8: 1.0}, {}, {8: 0.5} if bf16 else {})

    calibration.calibrated_timings("k", path, bf16=False, packings=(), measure_fn=fake_measure)
    calibration.calibrated_timings("k", path, bf16=True, packings=(), measure_fn=fake_measure)  # cap lifted
    assert calls == [False, True]


def test_the_cache_file_follows_the_environment(tmp_path):
    assert calibration.cache_file({"MEDS_CPU_CALIBRATION_FILE": str(tmp_path / "x.json")}) == tmp_path / "x.json"
    assert calibration.cache_file({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "meds" / "cpu_calibration.json"


def test_without_bf16_units_nothing_is_timed_for_bf16(tmp_path):
    asked = []

    def fake_measure(*, bf16, packings):
        asked.append(bf16)
        return Timings({8: 1.0, 64: 1.0}, {p: {8: 2.0, 64: 2.0} for p in packings})

    environ = {"MEDS_CPU_CALIBRATION_FILE": str(tmp_path / "c.json"), "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}
    found = calibration.cpu_fast_paths(environ, measure_fn=fake_measure, flags=AMX)
    assert asked == [False] and not found.paths.bf16 and found.paths.float32_packing == "none"  # packed slower
    assert found.paths.why == "ONEDNN_MAX_CPU_ISA=AVX512_CORE leaves oneDNN no bf16 units"


def test_the_pin_times_nothing_and_keeps_the_old_choices():
    def refuse(**_):
        raise AssertionError("timed under the pin")

    found = calibration.cpu_fast_paths({"MEDS_CPU_FAST_PATHS": "default"}, measure_fn=refuse, flags=AMX)
    assert not found.paths.bf16
    assert found.paths.float32_packing == ("mkl" if calibration.mkl_packing_available() else "none")


def test_measure_times_each_path_at_its_row_counts():
    """The timer is faked (each call runs once and counts as 0.5 s): what is timed, at which rows,
    all in one call of the timer (side by side)."""
    ran = []

    def fake_timer(calls):
        for call in calls.values():
            call()  # the products run: a shape mismatch or a bf16 op missing would raise here
            ran.append(1)
        return {key: 0.5 for key in calls}

    shapes = ((8, 4), (4, 8))  # two layers whose input widths differ, as gate/up and down
    packings = calibration.packings_available()
    timings = calibration.measure(bf16=True, packings=packings, timer=fake_timer, shapes=shapes,
                                  decode_rows=(2, 3), update_rows=5)
    assert timings.float32 == {2: 0.5, 3: 0.5, 5: 0.5} and timings.bf16 == {2: 0.5, 3: 0.5, 5: 0.5}
    assert timings.packed == {p: {2: 0.5, 3: 0.5} for p in packings}
    plain = calibration.measure(bf16=False, timer=fake_timer, shapes=shapes, decode_rows=(2, 3), update_rows=5)
    assert plain == Timings({2: 0.5, 3: 0.5})  # without bf16 units the update's rows are not timed
    assert len(ran) == 6 + 2 * len(packings) + 2



def test_paths_are_timed_side_by_side_and_the_least_time_kept():
    """Round by round, every call once a round: a slow spell (other work on the machine) costs
    each call one round, not one path all its rounds."""
    now, order = [0.0], []
    costs = {"a": iter([7, 9, 1, 1, 5]), "b": iter([7, 2, 9, 2, 3])}  # the warm-up round, then 4 rounds

    def call_for(key):
        def call():
            order.append(key)
            now[0] += next(costs[key])
        return call

    best = calibration.time_side_by_side({"a": call_for("a"), "b": call_for("b")}, rounds=4, clock=lambda: now[0])
    assert order == ["a", "b"] * 5  # a warm-up round, then a and b alternate
    assert best == {"a": 1, "b": 2}  # the warm-up's 7 s not counted

"""In a launch of several processes, train.mixed_precision auto on a CPU is decided once, by
process 0's calibration, for every process: each timing its own CPU could choose differently
(cores shared while timing, machines of different kinds), and DDP and FSDP2 need one precision."""

import json

import pytest

from meds_cli.core.cpu_calibration import Calibration, FastPaths
from meds_cli.engine.training.precision import choose_mixed_precision
from tests.cpu_launch import ROOT, launch_cpu


def calibration(bf16: bool) -> Calibration:
    return Calibration(FastPaths("none", bf16, "timed"), "calibrated here")


def test_the_cpu_is_asked_through_the_agreement():
    asked = []

    def agree(decide):
        asked.append("agree")
        return calibration(True)  # process 0's answer, whatever this process would time

    value, _ = choose_mixed_precision("auto", environ={}, gpu_bf16=False, on_gpu=False,
                                      cpu_paths=lambda environ: asked.append("timed") or calibration(False),
                                      agree=agree)
    assert value == "bf16" and asked == ["agree"]


@pytest.mark.parametrize("setting, environ, gpu", [("no", {}, False), ("auto", {"ACCELERATE_MIXED_PRECISION": "fp16"},
                                                                        False), ("auto", {}, True)])
def test_no_agreement_is_asked_where_nothing_is_timed(setting, environ, gpu):
    def agree(decide):
        raise AssertionError("a collective where every process already has the same answer")

    choose_mixed_precision(setting, environ=environ, gpu_bf16=gpu, on_gpu=gpu, agree=agree)


def test_a_single_process_decides_itself():
    from meds_cli.engine.training.precision import process_zeros_answer

    asked = []
    assert process_zeros_answer(lambda: asked.append(1) or "mine") == "mine" and asked == [1]


def test_two_launched_processes_compute_in_process_zeros_precision(tmp_path):
    """Process 0's calibration says bf16 and process 1's says float32: both Accelerators compute
    in bf16, and only process 0 timed its CPU."""
    launch_cpu(2, [str(ROOT / "tests" / "precision_agreement_check.py"), str(tmp_path)], timeout=180)
    seen = [json.loads((tmp_path / f"rank-{rank}.json").read_text()) for rank in (0, 1)]
    assert [s["world"] for s in seen] == [2, 2]
    assert [s["mixed_precision"] for s in seen] == ["bf16", "bf16"], seen
    assert [s["timed"] for s in seen] == [1, 0], seen

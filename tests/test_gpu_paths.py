"""Issue 37: the GPU-only paths (vLLM tensor parallelism under DDP, FSDP2 + LoRA adapter sync,
the merged weight push's peak) as they show on 2 CPU processes over gloo, with fakes recording
calls and collectives in place of vLLM (tests/gpu_paths_check.py). `make test-gpu-paths`."""

import json
from pathlib import Path

import pytest

from tests.cpu_launch import ROOT, launch_cpu

pytestmark = [pytest.mark.gpu_paths]

# A hang is a failure: a tiny model's launch ends well within this.
LAUNCH_TIMEOUT_S = 120


def run_check(mode: str, out: Path) -> list[dict]:
    launch_cpu(2, [str(ROOT / "tests" / "gpu_paths_check.py"), mode, str(out)], timeout=LAUNCH_TIMEOUT_S)
    results = [json.loads((out / f"rank-{rank}.json").read_text()) for rank in range(2)]
    assert [r["world"] for r in results] == [2, 2]
    return results


def test_dynamic_sampling_with_uneven_quotas_enters_every_engine_call(tmp_path):
    """Process 0 fills its quota in round 1, process 1 never: process 0 still enters the engine's
    collective in rounds 2 and 3, with nothing to ask."""
    first, second = run_check("collect", tmp_path)
    assert first["engine_calls"] == second["engine_calls"] == first["generation_rounds"] == 3
    assert first["requests"] == [2, 0, 0] and second["requests"] == [2, 2, 2]
    assert first["groups_trained"] == second["groups_trained"] == 0  # process 1 kept nothing


def test_quick_eval_with_fewer_problems_than_processes_enters_the_engine_everywhere(tmp_path):
    first, second = run_check("eval", tmp_path)
    # eval.problems=1: process 1 has none and still calls the engine, with nothing to ask
    assert first["1"]["requests"] == [1] and second["1"]["requests"] == [0]
    assert first["1"]["problems"] == second["1"]["problems"] == 1
    # eval.problems=3 over 2 processes: 2 and 1
    assert first["3"]["requests"] == [2] and second["3"]["requests"] == [1]
    assert first["3"]["problems"] == second["3"]["problems"] == 3


def test_fsdp2_lora_adapter_sync_writes_the_unsharded_adapter(tmp_path):
    """The adapter the vLLM engine is pointed at equals the unsharded model's, bit for bit,
    whether the push runs outside sampling (parameters sharded) or inside its gather."""
    results = run_check("adapter", tmp_path)
    for rank, result in enumerate(results):
        for where in ("outside", "inside"):
            assert result[where].get("equal"), (rank, where, result[where])
    # one writer: every process serves the same folder
    assert results[0]["outside"]["path"] == results[1]["outside"]["path"]


def test_fsdp2_merged_weight_push_holds_one_unit_unsharded_at_a_time(tmp_path):
    """The merged push gathers, merges, casts and hands over one FSDP2 unit at a time: what is
    held unsharded at once is one unit (a decoder layer, or the root: embeddings, norm, head) and
    the merged copy of the one weight being handed over, not the model. Prints the numbers
    (docs/gpu-paths-notes.md quotes them)."""
    results = run_check("peak", tmp_path)
    for result in results:
        print(f"peak unsharded {result.get('peak_unsharded_bytes')} B (inside sampling's gather: "
              f"{result['peak_inside_gather_bytes']} B) of a {result['model_bytes']} B model "
              f"(one layer {result['layer_bytes']} B, root {result['root_bytes']} B)")
        assert "error" not in result, result["error"]
        assert result["tensors_loaded"] > 0 and result["still_gathered"]
        one_unit = max(result["layer_bytes"], result["root_bytes"]) + result["largest_weight_bytes"]
        assert result["peak_unsharded_bytes"] <= one_unit < result["model_bytes"] / 2, result

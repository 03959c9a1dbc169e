"""Engines apart from the trainer under two training processes (accelerate launch, CPU, gloo;
tests/apart_processes_check.py runs them all in one launch): hf-worker at k = 0 trains to the
weights of the colocated hf run, at k = 1 each process trains on rollouts one version old;
vllm-server against the fake server loads each version once and every request of both processes
names a loaded adapter; a worker killed in one process ends both processes in one line. In the
default suite (issue 47 asks it there): one launch, about 40 s on 2 cores."""

import json

import pytest
import torch
from safetensors.torch import load_file

from tests.cpu_launch import ROOT, launch_cpu
from tests.fake_vllm_server import FakeVLLMServer

STEPS = 3
SAMPLES_PER_STEP = 4 * 4  # prompts_per_step x group_size, over both processes


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    out = tmp_path_factory.mktemp("apart")
    fake = FakeVLLMServer().start()
    try:
        launch_cpu(2, [str(ROOT / "tests" / "apart_processes_check.py"), str(out), fake.url])
    finally:
        fake.stop()
    assert int((out / "world.txt").read_text()) == 2  # really two processes
    return out, fake


def weights(out, run: str) -> dict:
    return load_file(str(out / run / "weights.safetensors"))


def versions(out, run: str, rank: int) -> list[list[int]]:
    return json.loads((out / run / f"versions{rank}.json").read_text())


def assert_k1_versions(steps: list[list[int]]) -> None:
    """Step s's first round (2 prompts x 4 samples) from version max(0, s - 2), DAPO's extra rounds
    from the newest, s - 1: never more than one version old."""
    assert len(steps) == STEPS
    for step, found in enumerate(steps, start=1):
        assert found[:8] == [max(0, step - 2)] * 8, (step, found)
        assert set(found[8:]) <= {step - 1}, (step, found)


def test_worker_at_k0_trains_to_the_colocated_runs_weights(launched):
    out, _ = launched
    colocated, apart = weights(out, "hf"), weights(out, "worker-k0")
    assert colocated.keys() == apart.keys() and colocated
    for name in colocated:  # the same seeds, the same tokens, the same update
        assert torch.equal(colocated[name], apart[name]), name
    assert any(apart[n].abs().max() > 0 for n in apart if "lora_B" in n)  # it trained
    # each process sent its worker its own share, with the colocated run's seeds (the same tokens show it)
    sent = [set(json.loads((out / "worker-k0" / f"seeds{rank}.json").read_text())) for rank in (0, 1)]
    assert sent[0] and sent[1] and not sent[0] & sent[1]
    for rank in (0, 1):
        found = versions(out, "worker-k0", rank)
        assert [set(v) for v in found] == [{step} for step in range(STEPS)], found


def test_worker_at_k1_each_process_trains_on_rollouts_at_most_one_version_old(launched):
    out, _ = launched
    for rank in (0, 1):
        assert_k1_versions(versions(out, "worker-k1", rank))
    assert any(len(v) > 8 for v in versions(out, "worker-k1", 0))  # DAPO took extra rounds


def test_server_loads_each_version_once_and_both_processes_name_loaded_adapters(launched):
    out, fake = launched
    loads = [body["lora_name"] for route, body in fake.calls if route == "/v1/load_lora_adapter"]
    assert loads == [f"policy-v{v}" for v in range(len(loads))] and len(loads) >= 2  # each version once, in order
    unloads = [body["lora_name"] for route, body in fake.calls if route == "/v1/unload_lora_adapter"]
    assert set(unloads) < set(loads)
    # the fake refuses a request naming an adapter not loaded (404), which would have ended the run
    assert {body["model"] for body in fake.completions} <= set(loads)
    sent = [set(json.loads((out / "server-k1" / f"seeds{rank}.json").read_text())) for rank in (0, 1)]
    assert not sent[0] & sent[1] and sent[0] | sent[1] == {body["seed"] for body in fake.completions}
    assert len(fake.completions) >= STEPS * SAMPLES_PER_STEP
    for rank in (0, 1):
        assert_k1_versions(versions(out, "server-k1", rank))


def test_a_worker_killed_in_one_process_ends_both_in_one_line(launched):
    out, _ = launched
    pid = (out / "killed.txt").read_text()
    mine, other = (out / "gone1.txt").read_text(), (out / "gone0.txt").read_text()
    assert "\n" not in mine and f"hf-worker, pid {pid}" in mine and "died" in mine, mine
    assert "\n" not in other and "another training process failed" in other, other
    assert all(line.endswith("its last checkpoint kept") for line in (mine, other))

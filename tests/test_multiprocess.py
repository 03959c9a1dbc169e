"""Two processes under `accelerate launch` (CPU, gloo) make the same update as one process
with the same global batch, under DDP and under FSDP2 (train.sharding=fsdp2); an FSDP2 run of
`meds train` resumes exactly."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.cpu_launch import ROOT, launch_cpu
from tests.float64 import assert_equal_in_float64


def launch(processes: int, out: Path, *overrides: str) -> dict:
    out.mkdir(parents=True)
    launch_cpu(processes, [str(ROOT / "tests" / "ddp_update_check.py"), str(out), *overrides])
    assert int((out / "world.txt").read_text()) == processes  # really that many processes
    return load_file(str(out / "weights.safetensors"))


@pytest.mark.slow
def test_two_processes_match_one(tmp_path):
    one = launch(1, tmp_path / "one")
    two = launch(2, tmp_path / "two")
    initial = None
    assert one.keys() == two.keys() and one
    # float32 on purpose (the trainer as users run it): two processes sum gradients in another
    # order, a relative difference of a few float32 ulps (~1e-7); Adam's update is lr x m/sqrt(v),
    # which moves by about that relative amount, 1e-2 x 1e-7 per step: atol 1e-6 leaves a margin
    # of two orders for any CPU's kernels, and a wrong global normalisation moves weights by ~1e-2
    for name in one:
        assert torch.allclose(one[name], two[name], atol=1e-6, rtol=1e-4), name
    # the update did something, and the second PPO epoch saw a ratio different from 1
    lora_b = [n for n in one if "lora_B" in n]
    assert any(one[n].abs().max() > 0 for n in lora_b), initial
    assert float((tmp_path / "one" / "ratio.txt").read_text()) != 1.0


@pytest.mark.slow
def test_fsdp2_two_processes_match_one(tmp_path):
    """Sharded over two processes (with gradient checkpointing): the update one unsharded process makes."""
    one = launch(1, tmp_path / "one")
    two = launch(2, tmp_path / "two", "train.sharding=fsdp2", "train.gradient_checkpointing=true")
    assert (tmp_path / "two" / "sharded.txt").read_text() == "True"
    assert one.keys() == two.keys() and one
    for name in one:  # float32 as above; FSDP2's reduce-scatter and recomputed checkpoints add rounding
        assert torch.allclose(one[name], two[name], atol=1e-5, rtol=0), name
    assert any(one[n].abs().max() > 0 for n in one if "lora_B" in n)


@pytest.mark.slow
@pytest.mark.parametrize("sharding", ["none", "fsdp2"])
@pytest.mark.parametrize("padding_free", ["false", "true"])
def test_micro_batches_by_tokens_line_up_over_processes(tmp_path, sharding, padding_free):
    """One process with short rows and one with long plan different numbers of micro-batches by
    tokens (padded or packed: train.padding_free); both run as many as the busier one (FSDP2
    gathers in each), and the update is the one one process makes with fixed, padded micro-batches."""
    # float64: the two sides' micro-batches differ, and float32 rounding, which Adam amplifies where
    # a gradient is tiny, moves weights by ~1e-4 (measured on one process); in float64 by ~1e-13
    one = launch(1, tmp_path / "one", "--uneven", "--float64", "train.padding_free=false")
    two = launch(2, tmp_path / "two", "--uneven", "--by-tokens", "--float64", f"train.sharding={sharding}",
                 f"train.padding_free={padding_free}")
    assert (tmp_path / "two" / "packed.txt").read_text() == str(padding_free == "true")
    planned = [int((tmp_path / "two" / f"planned{rank}.txt").read_text()) for rank in (0, 1)]
    forwards = [int((tmp_path / "two" / f"forwards{rank}.txt").read_text()) for rank in (0, 1)]
    assert planned[0] == 1 < planned[1]  # the short rows fit one micro-batch, the long ones do not
    assert forwards[0] == forwards[1] == 2 * planned[1]  # two PPO epochs, the short side split to match
    assert one.keys() == two.keys() and one
    for name in one:
        assert_equal_in_float64(two[name], one[name], name)
    assert any(one[n].abs().max() > 0 for n in one if "lora_B" in n)


RUN = ["--model", "tiny-llama", "--task", "copy", "--algo", "meds", "--base", "dapo", "--quiet",
       "--set", "rollout.prompts_per_step=4", "--set", "rollout.group_size=8", "--set", "rollout.max_new_tokens=3",
       "--set", "train.ppo_epochs=2", "--set", "train.micro_batch_size=8", "--set", "optim.lr=0.01",
       "--set", "optim.warmup_steps=0", "--set", "model.lora.rank=8", "--set", "dapo.max_gen_batches=2",
       "--set", "train.checkpoint_every=2", "--set", "eval.every=2", "--set", "eval.problems=3",
       "--set", "train.sharding=fsdp2"]


def train_cli(*args: str) -> None:
    launch_cpu(2, ["-m", "meds_cli", "train", *args])


def learning_rows(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith("time_") and k != "tokens_per_s"} for row in rows]


@pytest.mark.slow
def test_fsdp2_training_resumes_exactly(tmp_path):
    """MEDS on DAPO, sharded over two processes (sampling rounds, scoring of the trained groups,
    the logit lens through the root's head, a quick eval with uneven shares): 4 steps straight
    equal 2 steps, a checkpoint of gathered shards, and 2 more after --resume."""
    straight, split = tmp_path / "straight", tmp_path / "split"
    train_cli(*RUN, "--steps", "4", "--output", str(straight))
    train_cli(*RUN, "--steps", "2", "--output", str(split))
    train_cli("--resume", str(split), "--steps", "4", "--quiet")
    state = json.loads((split / "checkpoints/step_4/state.json").read_text())
    assert state["sharding"] == "fsdp2" and state["world_size"] == 2
    a, b = learning_rows(straight), learning_rows(split)
    assert [r["step"] for r in b] == [1, 2, 3, 4] and a == b
    assert any(r.get("groups_trained", 0) > 0 for r in a) and "eval/accuracy" in a[1]
    wa = load_file(str(straight / "checkpoints/step_4/weights.safetensors"))
    wb = load_file(str(split / "checkpoints/step_4/weights.safetensors"))
    assert wa.keys() == wb.keys() and wa
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert (split / "checkpoints/step_4/adapter/adapter_model.safetensors").is_file()


@pytest.mark.slow
def test_a_hung_launch_fails_and_leaves_no_worker_behind(tmp_path):
    with pytest.raises(pytest.fail.Exception, match="did not end within 30 s"):
        launch_cpu(2, [str(ROOT / "tests" / "hung_worker.py"), str(tmp_path)], timeout=30)
    pids = [int(path.read_text()) for path in tmp_path.glob("pid-*")]
    assert len(pids) == 2
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()

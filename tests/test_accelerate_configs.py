"""The Accelerate launch files in configs/accelerate/ load with Accelerate's own reader, launch the
number of processes they promise, and use no plugin the loop refuses (FSDP, DeepSpeed)."""

from pathlib import Path

import pytest

from meds_cli.engine.training.sharding import SHARDINGS, check_distributed_setup

ROOT = Path(__file__).resolve().parent.parent
EXPECTED = {  # file: (distributed type, processes, machines, the train.sharding values it names)
    "one_gpu.yaml": ("NO", 1, 1, {"none"}),
    "eight_gpus.yaml": ("MULTI_GPU", 8, 1, {"none", "fsdp2"}),
    "two_nodes.yaml": ("MULTI_GPU", 16, 2, {"fsdp2"}),
}


def test_every_launch_file_is_listed():
    assert sorted(p.name for p in (ROOT / "configs" / "accelerate").glob("*.yaml")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_launch_file_loads_and_is_accepted_by_the_loop(name, monkeypatch):
    from types import SimpleNamespace

    from accelerate.commands.config.config_args import load_config_from_file

    path = ROOT / "configs" / "accelerate" / name
    config = load_config_from_file(str(path))
    kind, processes, machines, shardings = EXPECTED[name]
    assert (config.distributed_type.name, config.num_processes, config.num_machines) == (kind, processes, machines)
    assert config.mixed_precision == "bf16" and not config.use_cpu
    assert not config.fsdp_config and not config.deepspeed_config
    header = "".join(line for line in path.read_text().splitlines(keepends=True) if line.startswith("#"))
    named = {s for s in SHARDINGS if f"train.sharding: {s}" in header or f"train.sharding={s}" in header}
    assert named == shardings, header
    monkeypatch.setenv("WORLD_SIZE", str(processes))
    accelerator = SimpleNamespace(distributed_type=config.distributed_type, gradient_accumulation_steps=1,
                                  num_processes=processes)
    for sharding in shardings:
        check_distributed_setup(accelerator, sharding)

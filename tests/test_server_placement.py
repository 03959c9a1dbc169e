"""Where a vLLM server meds starts runs on its node (engine/rollout/server_placement.py):
`rollout.server.gpus: M` gives it the last M of the N visible GPUs and the first N - M to
training; the plan as pure functions (N, M, processes -> devices), each bad value one line, and
a started server (the fake, as a process) given its CUDA_VISIBLE_DEVICES while one training
process trains on the GPU count faked to 2."""

from __future__ import annotations

import sys

import pytest

from meds_cli.core.errors import UserError
from meds_cli.engine.model_io.tiny import tiny_model_and_tokenizer
from meds_cli.engine.rollout.server_placement import (
    node_processes,
    node_rank,
    parse_server_gpus,
    placement_note,
    plan_placement,
    visible_devices,
)
from tests.conftest import TINY_COPY
from tests.fake_vllm_server import FakeVLLMServer


def _devices(n: int) -> list[str]:
    return [str(i) for i in range(n)]


# ---------------------------------------------------------------- the plan


@pytest.mark.parametrize("n, m, server, trainer", [
    (2, 1, ("1",), ("0",)),
    (8, 2, ("6", "7"), ("0", "1", "2", "3", "4", "5")),
    (4, 3, ("1", "2", "3"), ("0",)),
])
def test_the_server_takes_the_last_m_gpus_and_training_the_first_n_minus_m(n, m, server, trainer):
    plan = plan_placement(_devices(n), m)
    assert plan.server_devices == server and plan.trainer_devices == trainer
    assert plan.trainer_processes == n - m and plan.server_visible() == ",".join(server)


def test_the_devices_are_named_as_cuda_visible_devices_names_them():
    env = {"CUDA_VISIBLE_DEVICES": "4, 5,GPU-abc,7"}
    assert visible_devices(env, count=4) == ["4", "5", "GPU-abc", "7"]
    assert plan_placement(visible_devices(env, count=4), 1).server_visible() == "7"
    assert visible_devices({}, count=3) == ["0", "1", "2"]
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "3,2,1"}, count=2) == ["3", "2"]  # as many as torch counts
    assert visible_devices({"CUDA_VISIBLE_DEVICES": ""}, count=0) == []


def test_the_gpu_count_is_read_from_torch(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert visible_devices() == ["0", "1", "2"]


@pytest.mark.parametrize("devices, m, processes, says", [
    ([], 1, 1, "rollout.server.gpus=1 places the server on GPUs, but this process sees none"),
    (_devices(2), 0, 1, "rollout.server.gpus=0 is not a count M of GPUs, 1 or more"),
    (_devices(2), 2, 1, "rollout.server.gpus=2 leaves no GPU to training: this node has 2 GPU(s) visible and "
                        "training needs one; give 1 to 1"),
    (_devices(1), 1, 1, "rollout.server.gpus=1 leaves no GPU to training: this node has 1 GPU(s) visible and "
                        "training needs one; use a node with 2 or more"),
    (_devices(4), 2, 3, "rollout.server.gpus=2: 3 training processes on this node would compute on GPUs 0, 1, 2, "
                        "overlapping the server's (2, 3); run at most 2 process(es) a node"),
])
def test_each_bad_placement_is_one_line_naming_the_value(devices, m, processes, says):
    with pytest.raises(UserError) as error:
        plan_placement(devices, m, processes)
    assert says in str(error.value) and "\n" not in str(error.value)


def test_the_count_is_parsed_and_the_older_device_list_refused_with_its_count():
    assert parse_server_gpus("") is None and parse_server_gpus(2) == 2 and parse_server_gpus("3") == 3
    with pytest.raises(UserError, match=r"rollout.server.gpus='2,3' is not a count M.*give its length, 2"):
        parse_server_gpus("2,3")
    for bad in (0, -1, "x", True):
        with pytest.raises(UserError, match="is not a count M of GPUs"):
            parse_server_gpus(bad)


def test_the_node_rank_and_process_count_come_from_the_launcher():
    assert (node_rank({}), node_processes({})) == (0, 1)
    assert (node_rank({"LOCAL_RANK": "3"}), node_processes({"LOCAL_WORLD_SIZE": "4"})) == (3, 4)


def test_gpus_left_unused_are_said_with_the_command_that_uses_them():
    plan = plan_placement(_devices(4), 1)
    note = placement_note(plan, 1)
    assert "training runs 1 process(es) on GPU(s) 0, leaving 2 unused" in note
    assert "accelerate launch --num_processes 3 -m meds_cli train" in note
    assert placement_note(plan, 3) is None and placement_note(plan_placement(_devices(2), 1), 1) is None


# ---------------------------------------------------------------- the config


@pytest.mark.parametrize("settings, says", [
    (["rollout.server.start=true", "rollout.server.gpus=0"], "rollout.server.gpus"),
    (["rollout.server.start=true", "rollout.server.gpus='1,2'"], "the older form, is now given as its count, got 1,2"),
    (["rollout.server.url=http://127.0.0.1:1", "rollout.server.gpus=1"],
     "rollout.server.gpus=1 places a server meds starts"),
])
def test_bad_gpus_are_refused_when_the_config_loads(settings, says):
    from meds_cli.engine.config import load_config

    with pytest.raises(UserError) as error:
        load_config(overrides=[*TINY_COPY, "model.name=/some/model", "rollout.engine=vllm-server", *settings])
    assert says in str(error.value) and "\n" not in str(error.value)


# ---------------------------------------------------------------- a started server, placed


@pytest.fixture
def model_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-model")
    model, tokenizer = tiny_model_and_tokenizer()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture
def two_gpus_and_a_fake_serve(monkeypatch):
    """torch counts 2 GPUs (the trainer still computes on the CPU: CUDA stays unavailable), and
    `vllm serve` is the fake server as a process; the started servers' argv and env are kept."""
    import torch

    from meds_cli.engine.rollout import engines, vllm_server

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(engines, "_vllm_unavailable", lambda: None)
    started = []
    real_serve = vllm_server.serve_command

    def fake_serve(model, *, port, **options):
        started.append({"serve": real_serve(model, port=port, **options)})
        return [sys.executable, "-m", "tests.fake_vllm_server", str(port)]

    class Recorded(vllm_server.StartedServer):
        def __init__(self, argv, **kwargs):
            started[-1]["env"] = kwargs.get("env") or {}
            super().__init__(argv, **kwargs)

    monkeypatch.setattr(vllm_server, "serve_command", fake_serve)
    monkeypatch.setattr(vllm_server, "StartedServer", Recorded)
    return started


def _placed_config(model_folder, tmp_path, port: int, *extra):
    from tests.conftest import tiny_config

    return tiny_config(f"model.name={model_folder}", "rollout.prompts_per_step=2", "rollout.group_size=4",
                       "rollout.engine=vllm-server", "rollout.server.start=true", f"rollout.server.port={port}",
                       "rollout.server.gpus=1", "rollout.server.health_timeout_s=60", *extra, output_dir=tmp_path)


def test_one_training_process_trains_beside_a_server_on_gpu_1_of_2(two_gpus_and_a_fake_serve, model_folder,
                                                                   tmp_path):
    from meds_cli.engine.trainer import Trainer
    from tests.test_vllm_server import free_port

    trainer = Trainer(_placed_config(model_folder, tmp_path, free_port()), tmp_path)
    try:
        server = trainer.engine.engine.server
        rows = [trainer.train_step() for _ in range(2)]
    finally:
        trainer.close()
    (started,) = two_gpus_and_a_fake_serve
    assert started["env"]["CUDA_VISIBLE_DEVICES"] == "1"  # the last GPU; training keeps GPU 0 (local rank 0)
    assert started["env"]["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "1" and "--enable-lora" in started["serve"]
    assert len(rows) == 2 and trainer.engine.engine.pushes == [0, 1]
    assert server.exit_code() is not None  # stopped with the run


def test_only_the_nodes_first_process_starts_the_server_the_others_connect(two_gpus_and_a_fake_serve, monkeypatch,
                                                                          model_folder, tmp_path):
    import torch

    from meds_cli.engine.rollout.engines import EngineContext, _server_for_training, engine_settings

    fake = FakeVLLMServer().start()
    try:
        port = int(fake.url.rsplit(":", 1)[1])
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
        monkeypatch.setenv("LOCAL_RANK", "1")
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
        cfg = _placed_config(model_folder, tmp_path, port)
        model, tokenizer = tiny_model_and_tokenizer()
        engine = _server_for_training(engine_settings(cfg, "vllm-server"), EngineContext.of(
            cfg, model, tokenizer, task=None, scratch_dir=tmp_path / "scratch"))
        engine.close()
    finally:
        fake.stop()
    assert two_gpus_and_a_fake_serve == [] and engine.server is None and engine.urls == [fake.url]


def test_a_placement_that_overlaps_the_trainers_gpus_ends_before_any_server_starts(two_gpus_and_a_fake_serve,
                                                                                  monkeypatch, model_folder, tmp_path):
    from meds_cli.engine.rollout.engines import EngineContext, _server_for_training, engine_settings

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # 2 processes on 2 GPUs, one of them the server's
    cfg = _placed_config(model_folder, tmp_path, 1)
    model, tokenizer = tiny_model_and_tokenizer()
    with pytest.raises(UserError, match=r"2 training processes on this node would compute on GPUs 0, 1, "
                                        r"overlapping the server's \(1\)"):
        _server_for_training(engine_settings(cfg, "vllm-server"), EngineContext.of(
            cfg, model, tokenizer, task=None, scratch_dir=tmp_path / "scratch"))
    assert two_gpus_and_a_fake_serve == []


"""The `vllm-server` rollout engine (engine/rollout/vllm_server.py) against a fake server speaking
vLLM 0.32's routes (tests/fake_vllm_server.py), no vLLM needed: the request and answer shapes
(token ids, seeds, log-probs), one adapter per policy version loaded and the previous unloaded,
the version each rollout records, several servers taking turns, a server that is never healthy
or dies mid-run ending in one line with the checkpoint intact, and `meds train` at k = 0 and
k = 1. tests/test_vllm_server_real.py runs the engine against a real `vllm serve`."""

from __future__ import annotations

import json
import socket
import sys
import time
from dataclasses import replace

import pytest
import torch
from typer.testing import CliRunner

from meds_cli.engine.rollout.pipeline import RolloutEngineGone, RolloutPipeline
from meds_cli.engine.rollout.sampling_engine import SampleRequest, SamplingSettings
from meds_cli.engine.rollout.vllm_engine import VLLMConfig
from meds_cli.engine.rollout.vllm_server import StartedServer, VLLMServerEngine, serve_command
from meds_cli.engine.trainer import Trainer
from tests.conftest import TINY_COPY, tiny_config
from tests.fake_vllm_server import FakeVLLMServer, rule_tokens

SETTINGS = SamplingSettings(temperature=0.7, top_p=0.9, max_new_tokens=5, stop_ids=(1, 2), min_new_tokens=1)


@pytest.fixture
def fake():
    server = FakeVLLMServer().start()
    yield server
    server.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- requests and answers


def test_requests_carry_token_ids_seeds_and_settings_and_answers_give_tokens_and_logprobs(fake, tmp_path):
    engine = VLLMServerEngine([fake.url], policy=None, scratch_dir=tmp_path)
    try:
        requests = [SampleRequest((5, 6, 7), (11, 12)), SampleRequest((8,), (13,))]
        result = engine.result(engine.submit(requests, SETTINGS))
    finally:
        engine.close()
    bodies = sorted(fake.completions, key=lambda b: b["seed"])
    assert [(b["prompt"], b["seed"]) for b in bodies] == [([5, 6, 7], 11), ([5, 6, 7], 12), ([8], 13)]
    for body in bodies:  # one sample per request, its seed, the stop ids as the only ones, the sampled log-prob
        assert (body["n"], body["temperature"], body["top_p"], body["max_tokens"], body["min_tokens"]) == \
               (1, 0.7, 0.9, 5, 1)
        assert body["stop_token_ids"] == [1, 2] and body["ignore_eos"] and body["logprobs"] == 0
        assert body["return_token_ids"] and "model" not in body  # no adapter pushed: the base model
    assert [len(group) for group in result.samples] == [2, 1]
    for group, request in zip(result.samples, requests):
        for sample, seed in zip(group, request.seeds):
            tokens, logprobs, finish = rule_tokens(list(request.prompt_ids), seed, 0, bodies[0])
            assert sample.token_ids == tokens and sample.logprobs == logprobs and sample.stopped == (finish == "stop")
    assert result.started <= result.ended


def test_tool_turns_ask_with_stop_strings_and_their_own_budget_and_pause_at_a_string(tmp_path):
    """A tool turn's request carries the stop strings (kept in the output) and the request's own
    max_tokens; the fake, given the tiny tokenizer, ends a response at the token whose text completes
    a string, and the engine reads that as a pause (Sample.paused), not a stop."""
    from meds_cli.engine.model_io.tiny import tiny_tokenizer

    decode = tiny_tokenizer().decode
    fake = FakeVLLMServer(decode=decode).start()
    engine = VLLMServerEngine([fake.url], policy=None, scratch_dir=tmp_path)
    settings = replace(SETTINGS, max_new_tokens=40, min_new_tokens=0, stop_ids=(1,), stop_strings=("=", "."))
    try:
        requests = [SampleRequest((5, 6, 7), (11, 12)), SampleRequest((5, 6, 7), (13,), max_new_tokens=6)]
        result = engine.result(engine.submit(requests, settings))
    finally:
        engine.close()
        fake.stop()
    bodies = {b["seed"]: b for b in fake.completions}
    assert [bodies[seed]["max_tokens"] for seed in (11, 12, 13)] == [40, 40, 6]
    assert all(b["stop"] == ["=", "."] and b["include_stop_str_in_output"] for b in bodies.values())
    (first, second), (third,) = result.samples
    for sample, seed, stop in ((first, 11, "."), (second, 12, "=")):  # what the rule gives these seeds
        assert sample.paused and not sample.stopped
        assert decode(sample.token_ids).endswith(stop)
        assert not any(s in decode(sample.token_ids[:-1]) for s in settings.stop_strings)  # the first string ends it
        unpaused = rule_tokens([5, 6, 7], seed, 0, {**bodies[seed], "stop": None})[0]
        assert sample.token_ids == unpaused[:len(sample.token_ids)]  # the rule's tokens, up to the string
    assert len(third.token_ids) == 6 and not third.paused and not third.stopped  # its own budget, then cut


def test_serve_command_has_the_colocated_engines_settings():
    options = VLLMConfig(dtype="float32", enforce_eager=True, max_num_batched_tokens=512)
    argv = serve_command("/m", port=8123, options=options, dtype="float32", seed=4, lora_rank=12, model_len=96,
                         cores=[1])
    assert argv[:3] == ["taskset", "-c", "1"]
    text = " ".join(argv)
    for part in ("-m vllm.entrypoints.openai.api_server --model /m",
                 "--host 127.0.0.1", "--port 8123", "--dtype float32", "--seed 4", "--max-model-len 96",
                 "--max-num-batched-tokens 512", "--enforce-eager", "--enable-lora", "--max-lora-rank 16",
                 "--logprobs-mode processed_logprobs"):
        assert part in text, part


@pytest.mark.parametrize("settings, given", [([], "neither"),
                                             (["rollout.server.url=http://127.0.0.1:1", "rollout.server.start=true"],
                                              "both")])
def test_the_server_is_either_connected_to_or_started_never_both_nor_neither(settings, given):
    from meds_cli.core.errors import UserError
    from meds_cli.engine.config import load_config

    with pytest.raises(UserError) as error:
        load_config(overrides=[*TINY_COPY, "rollout.engine=vllm-server", *settings])
    assert "rollout.server.url" in str(error.value) and f"given: {given}" in str(error.value)


# ---------------------------------------------------------------- in the trainer


def _trainer(tmp_path, url: str, k: int = 0, *extra):
    cfg = tiny_config("rollout.prompts_per_step=2", "rollout.group_size=4", "rollout.engine=vllm-server",
                      f"rollout.server.url={url}", f"rollout.max_staleness={k}", *extra, output_dir=tmp_path)
    return Trainer(cfg, tmp_path)


def _steps(trainer, steps: int) -> list[dict]:
    try:
        return [trainer.train_step() for _ in range(steps)]
    finally:
        trainer.close()


def _loads(server) -> list[str]:
    return [body["lora_name"] for route, body in server.calls if route == "/v1/load_lora_adapter"]


def test_each_version_is_loaded_as_its_own_adapter_and_the_previous_unloaded(fake, tmp_path):
    trainer = _trainer(tmp_path, fake.url)
    rows = _steps(trainer, 3)
    # version 0 (the adapter as the run starts) before step 1's rollouts, then after each update the steps' sampled
    assert _loads(fake) == ["policy-v0", "policy-v1", "policy-v2"]
    assert [b["lora_name"] for r, b in fake.calls if r == "/v1/unload_lora_adapter"] == ["policy-v0", "policy-v1"]
    assert fake.weight_version == "2" and set(fake.adapters) == {"policy-v2"}
    # requests name the adapter of their step: 8 samples per step
    assert [b["model"] for b in fake.completions] == [f"policy-v{v}" for v in range(3) for _ in range(8)]
    folders = sorted(p.name for p in (tmp_path / "scratch" / "server-adapters").iterdir())
    assert folders == ["policy-v2"]  # the older folders go when their adapter is unloaded
    assert all(r["rollout/staleness_max"] == 0.0 for r in rows)


def test_at_k1_the_next_steps_rollouts_are_one_version_old(fake, tmp_path):
    rows = _steps(_trainer(tmp_path, fake.url, 1, "train.steps=3"), 3)  # the last step prefetches nothing
    assert rows[0]["rollout/staleness_max"] == 0.0
    assert [(r["rollout/staleness_mean"], r["rollout/staleness_max"]) for r in rows[1:]] == [(1.0, 1.0)] * 2
    assert all("rollouts_sampled_again" not in r for r in rows)
    # step 2's rollouts were sampled (as step 1 trained) from version 0, step 3's from version 1
    models = [b["model"] for b in fake.completions]
    assert models == ["policy-v0"] * 16 + ["policy-v1"] * 8


def test_the_version_that_sampled_is_recorded_per_rollout(fake, tmp_path):
    trainer = _trainer(tmp_path, fake.url, 1)
    try:
        trainer.train_step()
        pipeline = trainer.engine
        assert isinstance(pipeline, RolloutPipeline)
        request = [SampleRequest((3, 4), (1, 2))]
        pipeline.policy_settled(1)
        samples = pipeline.generate(request, SETTINGS)[0]
        assert {s.policy_version for s in samples} == {1}
    finally:
        trainer.close()


def test_several_servers_take_the_requests_in_turn(fake, tmp_path):
    other = FakeVLLMServer().start()
    try:
        _steps(_trainer(tmp_path, f"{fake.url},{other.url}"), 2)
    finally:
        other.stop()
    assert len(fake.completions) == len(other.completions) == 8  # 16 samples dealt in turn
    assert _loads(fake) == _loads(other) == ["policy-v0", "policy-v1"]  # every server serves every version


def test_meds_train_runs_with_the_server_engine_at_k0_and_k1(fake, tmp_path):
    from meds_cli.app import app

    for k in (0, 1):
        sets = [*TINY_COPY, "train.steps=2", "rollout.prompts_per_step=2", "rollout.group_size=4",
                "rollout.engine=vllm-server", f"rollout.server.url={fake.url}", f"rollout.max_staleness={k}"]
        out = tmp_path / f"k{k}"
        result = CliRunner().invoke(app, ["train", "--output", str(out), "-q", *sum((["--set", s] for s in sets), [])])
        assert result.exit_code == 0, result.output
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        assert [r["rollout/staleness_max"] for r in rows] == [0.0, float(k)]


# ---------------------------------------------------------------- failures, in one line


def test_a_server_never_healthy_ends_in_one_line_naming_it_and_its_log(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    server = StartedServer([sys.executable, "-c", "import time; time.sleep(60)"], url=url,
                           log_path=tmp_path / "vllm-server.log")
    with pytest.raises(RolloutEngineGone) as gone:
        server.wait_healthy(1.0)
    message = str(gone.value)
    assert "\n" not in message and url in message and str(tmp_path / "vllm-server.log") in message
    assert "not healthy after 1 s" in message and server.exit_code() is not None  # stopped


def test_a_server_that_exits_at_start_says_its_exit_code(tmp_path):
    server = StartedServer([sys.executable, "-c", "print('no model here'); raise SystemExit(3)"],
                           url=f"http://127.0.0.1:{free_port()}", log_path=tmp_path / "vllm-server.log")
    with pytest.raises(RolloutEngineGone, match=r"exited with code 3 before it was healthy"):
        server.wait_healthy(30.0)
    assert "no model here" in (tmp_path / "vllm-server.log").read_text()


def test_a_server_dying_mid_run_ends_in_one_line_with_the_checkpoint_intact(fake, tmp_path):
    trainer = _trainer(tmp_path, fake.url, 0, "train.checkpoint_every=1")
    try:
        trainer.train_step()
        checkpoint = trainer.save_checkpoint()
        files = sorted(p.name for p in checkpoint.iterdir())
        fake.stop()
        fake.stop = lambda: None  # the fixture's stop: already done
        with pytest.raises(RolloutEngineGone) as gone:
            trainer.train_step()
    finally:
        trainer.close()
    message = str(gone.value)
    assert "\n" not in message and fake.url in message and "last checkpoint kept" in message
    assert sorted(p.name for p in checkpoint.iterdir()) == files


def test_a_started_server_dying_mid_run_names_its_log_and_exit_code(tmp_path):
    port = free_port()
    server = StartedServer([sys.executable, "-m", "tests.fake_vllm_server", str(port)], url=f"http://127.0.0.1:{port}",
                           log_path=tmp_path / "vllm-server.log")
    engine = VLLMServerEngine([server.url], policy=None, scratch_dir=tmp_path, server=server)
    try:
        server.wait_healthy(30.0)
        request = [SampleRequest((3,), (1,))]
        assert len(engine.result(engine.submit(request, SETTINGS)).samples[0][0].token_ids) >= 1
        server.process.kill()
        server.process.wait(timeout=10)
        time.sleep(0.1)
        with pytest.raises(RolloutEngineGone) as gone:
            engine.result(engine.submit(request, SETTINGS))
    finally:
        engine.close()
    message = str(gone.value)
    assert "\n" not in message and server.url in message and str(tmp_path / "vllm-server.log") in message
    assert "exited with code -9" in message


# ---------------------------------------------------------------- several training processes


def test_process_0_loads_each_version_once_and_unloads_only_what_no_process_still_names(fake, tmp_path):
    from meds_cli.engine.model_io.model import apply_lora
    from meds_cli.engine.model_io.tiny import tiny_model_and_tokenizer
    from meds_cli.engine.rollout.training_processes import TrainingProcesses

    cfg = tiny_config()
    policy = apply_lora(tiny_model_and_tokenizer()[0], cfg.model.lora)
    oldest_in_flight = [0]  # what the line-up's collective answers: the oldest version any process still names
    lined_up = lambda value: min(value, oldest_in_flight[0])  # noqa: E731
    first = VLLMServerEngine([fake.url], policy=policy, scratch_dir=tmp_path,
                             processes=TrainingProcesses(0, 2, min=lined_up))
    other = VLLMServerEngine([fake.url], policy=policy, scratch_dir=tmp_path,
                             processes=TrainingProcesses(1, 2, min=lined_up))
    request = [SampleRequest((3, 4), (7,))]
    try:
        for engine in (first, other):
            engine.push_policy(0)
        assert _loads(fake) == ["policy-v0"]  # process 0 alone loads; the push returned after the load
        assert other.result(other.submit(request, SETTINGS)).version == 0
        for engine in (first, other):
            engine.push_policy(1)  # another process still names version 0: it stays loaded
        assert other.result(other.submit(request, SETTINGS)).version == 1
        assert set(fake.adapters) == {"policy-v0", "policy-v1"}
        oldest_in_flight[0] = 2
        for engine in (first, other):
            engine.push_policy(2)
        first.result(first.submit(request, SETTINGS))  # after the unload, in order
        assert set(fake.adapters) == {"policy-v2"} and _loads(fake) == ["policy-v0", "policy-v1", "policy-v2"]
        assert [b["model"] for b in fake.completions] == ["policy-v0", "policy-v1", "policy-v2"]
        oldest_in_flight[0] = -1  # process 0 failed to load: every process ends in one line
        with pytest.raises(RolloutEngineGone, match="process 0 could not send policy version 3"):
            other.push_policy(3)
    finally:
        first.close()
        other.close()


def test_a_resume_at_k1_against_a_deterministic_server_samples_what_the_uninterrupted_run_did(tmp_path):
    from safetensors.torch import load_file

    settings = ("algo.name=dapo", "rollout.prompts_per_step=4", "train.steps=4", "train.checkpoint_every=2",
                "optim.lr=0.01")  # DAPO: a reward spread to train on

    def run(folder, stop_after: int | None) -> list[str]:
        """The adapters the requests named, from the resume on where the run stops after a step."""
        server = FakeVLLMServer().start()
        try:
            trainer = _trainer(folder, server.url, 1, *settings)
            if stop_after is None:
                trainer.train()
                return [b["model"] for b in server.completions]
            try:
                for _ in range(stop_after):
                    trainer.train_step()
                checkpoint = trainer.save_checkpoint()
            finally:
                trainer.close()
            sent = len(server.completions)
            trainer = _trainer(folder, server.url, 1, *settings)
            trainer.load_checkpoint(checkpoint)
            trainer.train()
            return [b["model"] for b in server.completions[sent:]]
        finally:
            server.stop()

    straight, resumed = run(tmp_path / "straight", None), run(tmp_path / "split", 2)
    # the resume sent step 3's first round again from version 1 (loaded again), then went on as the straight run
    assert resumed[:16] == ["policy-v1"] * 16 and straight[-len(resumed):] == resumed
    wa, wb = (load_file(str(tmp_path / run / "checkpoints/step_4/weights.safetensors"))
              for run in ("straight", "split"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert any(wa[k].abs().max() > 0 for k in wa if "lora_B" in k)


@pytest.mark.parametrize("settings, world, on_node, named", [
    (["model.lora.enabled=false"], 2, 2, "from one training process only"),
    (["rollout.vllm.sync=merged"], 2, 2, "from one training process only"),
    (["rollout.server.start=true"], 4, 2, "span several nodes (2 on this one)"),
])
def test_what_the_server_engine_refuses_with_several_training_processes(settings, world, on_node, named):
    from meds_cli.core.errors import UserError
    from meds_cli.engine.rollout.engines import _several_processes_check, sends_full_weights

    cfg = tiny_config("rollout.engine=hf", *settings)
    facts = (sends_full_weights(cfg), cfg.rollout.server.start)
    with pytest.raises(UserError) as refused:
        _several_processes_check(*facts, world, on_node)
    assert named in str(refused.value)
    _several_processes_check(*facts, 1, 1)  # one process: nothing refused
    if "start" not in settings[0]:
        return
    _several_processes_check(*facts, 2, 2)  # one node: its server serves every process

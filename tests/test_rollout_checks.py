"""Issue 53: what a rollout server or worker sends is checked like a stranger's file
(engine/rollout/rollout_check.py, the vllm-server engine's HTTP client): no NaN trained on, no
hang, one line for every fault.

The fake server of tests/fake_vllm_server.py answers the real routes wrongly in each way
(`answer_wrongly`); a stand-in for the hf worker returns bad samples; the colocated hf engine's
samples are corrupted on their way out. Each run through `meds train` asserts the exit code, the
one line (no traceback), the last checkpoint there and finite with nothing of the bad step
trained or logged, and nothing written outside the run folder."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from meds_cli.app import app
from meds_cli.core.errors import UserError
from meds_cli.engine.config import load_config
from meds_cli.engine.rollout.pipeline import JobResult, RolloutEngineGone
from meds_cli.engine.rollout.rollout_check import Limits, RolloutRefused, check_samples, sample_fault
from meds_cli.engine.rollout.sampling_engine import Sample, SampleRequest, SamplingSettings
from meds_cli.engine.rollout.vllm_server import VLLMServerEngine, url_problem
from meds_cli.engine.run_folders.checkpoint_store import write_manifest
from tests.conftest import TINY_COPY
from tests.fake_vllm_server import FAULTS, FakeVLLMServer, rule_tokens

SETTINGS = SamplingSettings(temperature=0.7, top_p=1.0, max_new_tokens=5, stop_ids=(1,))
LIMITS = Limits.of(SETTINGS, 53)
# 2 prompts x 4 samples a step: the fault begins with step 2, after step 1's checkpoint
PER_STEP = 8
RUN = ["train.steps=2", "train.checkpoint_every=1", "rollout.prompts_per_step=2", "rollout.group_size=4"]


@pytest.fixture
def fake():
    server = FakeVLLMServer().start()
    yield server
    server.stop()


# ---------------------------------------------------------------- the check, by hand


@pytest.mark.parametrize("sample, says", [
    (Sample([4, 5, 1], True, [-0.1, -0.2, -0.3]), None),
    (Sample([4, 5, 6, 7, 8], False, None), None),
    (Sample([4, 5, 1], True, [-0.1, 0.0005, -0.3]), None),  # rounding above 0, within the tolerance
    (Sample([4, 5, 6, 7, 8, 9], False, None), "6 tokens, more than rollout.max_new_tokens=5"),
    (Sample([4, 53, 1], True, None), "token id 53 at position 1, outside the vocabulary (0..52)"),
    (Sample([4, -1, 1], True, None), "token id -1 at position 1, outside the vocabulary"),
    (Sample([4, 1, 5], False, None), "stop id 1 at position 1, before the response's end"),
    (Sample([4, 5], True, None), "marked stopped whose last token (5) is not a stop id"),
    (Sample([4, 5], False, [-0.1]), "1 log-probs for 2 tokens"),
    (Sample([4, 5], False, [-0.1, float("nan")]), "log-prob nan at position 1, not a finite number <= 0"),
    (Sample([4, 5], False, [float("inf"), -0.1]), "log-prob inf at position 0"),
    (Sample([4, 5], False, [-0.1, float("-inf")]), "log-prob -inf at position 1"),
    (Sample([4, 5], False, [-0.1, 0.5]), "log-prob 0.5 at position 1"),
    (Sample([4, 5], False, None, torch.zeros(3, 2)), "logit-lens values for 3 tokens, not 2"),
])
def test_each_fault_of_a_sample_is_named_with_its_first_offending_value(sample, says):
    problem = sample_fault(sample, LIMITS)
    assert problem == says if says is None else says in problem


def test_huge_finite_log_probs_whose_sum_overflows_are_not_a_fault():
    assert sample_fault(Sample([4, 5, 6], False, [-1e308, -1e308, -1e308]), LIMITS) is None


def test_the_samples_of_requests_are_counted_and_their_versions_must_have_been_sent():
    requests = [SampleRequest((3, 4), (10, 11)), SampleRequest((5,), (12,))]
    good = [[Sample([4], False), Sample([5], False)], [Sample([6], False)]]
    check_samples("hf", requests, good, SETTINGS, 53)
    for samples, says in [(good[:1], "answered 2 requests with 1 lists of samples"),
                          ([good[0][:1], good[1]], "answered request 0 (2 samples asked) with 1 samples")]:
        with pytest.raises(RolloutRefused, match=r"rollout refused \(hf engine\)") as refused:
            check_samples("hf", requests, samples, SETTINGS, 53)
        assert says in str(refused.value)
    stale = [[Sample([4], False, policy_version=3), Sample([5], False, policy_version=1)], [Sample([6], False)]]
    with pytest.raises(RolloutRefused) as refused:
        check_samples("hf-worker", requests, stale, SETTINGS, 53, newest_version=2)
    assert "request 0 (seed 10, prompt of 2 tokens) with policy version 3, not one sent (0..2)" in str(refused.value)


def test_the_colocated_hf_engine_gets_the_same_check():
    from meds_cli.engine.model_io.tiny import tiny_model_and_tokenizer
    from meds_cli.engine.rollout.batch import sample_rollouts
    from meds_cli.engine.rollout.hf_sampler import HFEngine

    model, tokenizer = tiny_model_and_tokenizer()

    class Corrupted(HFEngine):  # the decode loop's answer with one log-prob turned to NaN
        def generate(self, requests, settings):
            samples = super().generate(requests, settings)
            samples[1][0].logprobs[0] = float("nan")
            return samples

    engine = Corrupted(model, tokenizer.pad_token_id, 8)
    settings = SamplingSettings(1.0, 1.0, 3, (1,))
    with pytest.raises(RolloutRefused) as refused:
        sample_rollouts(engine, tokenizer, ["ab", "cd"], [None, None], 2, settings)
    message = str(refused.value)
    assert "rollout refused (hf engine): the hf engine answered request 1 (seed" in message
    assert "log-prob nan at position 0" in message and "\n" not in message


# ---------------------------------------------------------------- config: URLs and deadlines, by hand


@pytest.mark.parametrize("url, says", [
    ("ftp://127.0.0.1:8000", "is not an http or https URL"),
    ("127.0.0.1:8000", "is not an http or https URL"),
    ("http://127.0.0.1:70000", "a port that is not a number in 1-65535"),
    ("http://127.0.0.1:0", "has port 0, not one in 1-65535"),
    ("http://127.0.0.1:80a", "a port that is not a number in 1-65535"),
    ("http://user:secret@127.0.0.1:8000", "holds a user or password"),
    ("http://:8000", "names no host"),
    ("http://127.0.0.1:8000\nx", "holds a space or a control character"),
    ("http://127.0.0.1:8000/\x7f", "holds a space or a control character"),
    ("http://127.0.0.1:8000?a=1", "has a query or fragment"),
    (",", "has an empty item"),
    ("http://127.0.0.1:8000,,http://127.0.0.1:8001", "has an empty item"),
    ("http://127.0.0.1:8000,", "has an empty item"),
])
def test_a_bad_server_url_is_refused_by_hand(url, says):
    assert says in url_problem(url)


@pytest.mark.parametrize("url", ["", "http://127.0.0.1:8000", "https://rollouts.example.org/v", "http://[::1]:8000",
                                 "http://a:8000, http://b:8001/", "http://node7"])
def test_good_server_urls_pass(url):
    assert url_problem(url) is None


@pytest.mark.parametrize("setting, says", [
    ("rollout.server.url=http://127.0.0.1:70000", "rollout.server.url 'http://127.0.0.1:70000' has a port"),
    ("rollout.server.url=,", "rollout.server.url has an empty item"),
    ("rollout.server.url=http://u:p@h:1", "holds a user or password"),
    ("rollout.server.request_timeout_s=inf", "rollout.server.request_timeout_s must be a finite number of seconds"),
    ("rollout.server.request_timeout_s=nan", "rollout.server.request_timeout_s must be a finite number of seconds"),
    ("rollout.server.request_timeout_s=0", "rollout.server.request_timeout_s must be a finite number of seconds"),
    ("rollout.server.health_timeout_s=inf", "rollout.server.health_timeout_s must be a finite number of seconds"),
    ("rollout.server.retries=-1", "rollout.server.retries must be at least 0"),
])
def test_bad_server_settings_are_one_line_at_config_time(setting, says):
    with pytest.raises(UserError) as refused:
        load_config(overrides=[*TINY_COPY, "rollout.engine=vllm-server", setting])
    message = str(refused.value)
    assert says in message and "\n" not in message, message
    if "url" in setting:
        assert "give http://host:port or https://host:port" in message


def test_a_url_with_a_newline_in_a_config_file_is_one_line_naming_it(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text('rollout:\n  engine: vllm-server\n  server:\n    url: "http://h:1\\nx"\n')
    with pytest.raises(UserError) as refused:
        load_config([str(config)], overrides=TINY_COPY)
    assert "\n" not in str(refused.value) and "'http://h:1\\nx'" in str(refused.value), str(refused.value)


# ---------------------------------------------------------------- every HTTP failure: one line, URL and route


@pytest.mark.parametrize("fault, says", [
    ("nan_logprob", "log-prob nan at position 0"),
    ("inf_logprob", "log-prob inf at position 0"),
    ("positive_logprob", "log-prob 0.7 at position 0"),
    ("out_of_vocab_id", "token id 1000000 at position 0, outside the vocabulary (0..52)"),
    ("negative_id", "token id -1 at position 0"),
    ("too_many_tokens", "40 tokens, more than rollout.max_new_tokens=5"),
    ("logprob_count", "log-probs for"),
    ("empty_choices", "0 choices, not the 1 asked for"),
    ("no_token_ids", "no list of integer token_ids"),
    ("non_json", "a body that is not a JSON object (\"<html><body>502 Bad Gateway"),
    ("cut_off", "an answer cut off after"),
    ("reset", "stopped answering /v1/completions"),
])
def test_each_wrong_answer_of_the_completions_route_is_one_line_with_url_and_route(fake, tmp_path, fault, says):
    fake.answer_wrongly(fault)
    engine = VLLMServerEngine([fake.url], policy=None, scratch_dir=tmp_path, request_timeout_s=10, vocab_size=53)
    try:
        with pytest.raises(RolloutEngineGone) as gone:
            engine.result(engine.submit([SampleRequest((5, 6), (11,))], SETTINGS))
    finally:
        engine.close()
    message = str(gone.value)
    assert says in message and fake.url in message and "/v1/completions" in message, message
    assert "\n" not in message and "last checkpoint kept" in message


def test_every_fault_of_the_fake_is_tried_here_or_below():
    tried = {"nan_logprob", "inf_logprob", "positive_logprob", "out_of_vocab_id", "negative_id", "too_many_tokens",
             "logprob_count", "empty_choices", "no_token_ids", "non_json", "cut_off", "reset", "trickle"}
    assert set(FAULTS) == tried


def test_a_trickling_server_ends_within_the_deadline_plus_a_margin(fake, tmp_path):
    fake.answer_wrongly("trickle")  # one byte a second, the status line too: each read is quick, the whole is not
    engine = VLLMServerEngine([fake.url], policy=None, scratch_dir=tmp_path, request_timeout_s=1.5, vocab_size=53)
    started = time.monotonic()
    try:
        with pytest.raises(RolloutEngineGone) as gone:
            engine.result(engine.submit([SampleRequest((5, 6), (11,))], SETTINGS))
    finally:
        engine.close()
    took = time.monotonic() - started
    assert took < 1.5 + 2.0, took
    message = str(gone.value)
    assert "gave /v1/completions no complete answer within 1.5 s (rollout.server.request_timeout_s)" in message
    assert fake.url in message and "\n" not in message


def test_a_retry_sends_a_refused_request_again_and_counts_it(fake, tmp_path):
    fake.answer_wrongly("nan_logprob", times=2)
    engine = VLLMServerEngine([fake.url], policy=None, scratch_dir=tmp_path, vocab_size=53, retries=2)
    try:
        samples = engine.result(engine.submit([SampleRequest((5, 6), (11,))], SETTINGS)).samples
        assert engine.take_retries() == 2 and engine.take_retries() == 0
    finally:
        engine.close()
    tokens, logprobs, _ = rule_tokens([5, 6], 11, 0, fake.completions[0])
    assert samples[0][0].token_ids == tokens and samples[0][0].logprobs == logprobs
    assert len(fake.completions) == 3


# ---------------------------------------------------------------- through `meds train`


def train(tmp_path: Path, *sets: str):
    run = tmp_path / "run"
    options = sum((["--set", s] for s in [*TINY_COPY, *RUN, *sets]), [])
    before = sorted(p.name for p in tmp_path.iterdir())
    result = CliRunner().invoke(app, ["train", "--output", str(run), "-q", *options])
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == sorted({*before, "run"}), written  # nothing beside the run folder
    return result, run


def error_line(result) -> str:
    """The run's one error line (the lines before it are the run's start-up notes)."""
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert len(errors) == 1 and result.output.strip().splitlines()[-1] == errors[0], result.output
    return errors[0]


def assert_stopped_after_step_1(run: Path) -> None:
    """The last checkpoint is step 1's, finite; nothing of step 2 was trained or logged."""
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_1"]
    weights = load_file(str(run / "checkpoints/step_1/weights.safetensors"))
    assert weights and all(bool(torch.isfinite(t).all()) for t in weights.values())
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1]
    assert all(not isinstance(v, float) or math.isfinite(v) for v in rows[0].values())


@pytest.mark.parametrize("fault, route, after, says", [
    ("nan_logprob", "/v1/completions", PER_STEP, "log-prob nan at position 0"),
    ("inf_logprob", "/v1/completions", PER_STEP, "log-prob inf at position 0"),
    ("out_of_vocab_id", "/v1/completions", PER_STEP, "token id 1000000 at position 0, outside the vocabulary"),
    ("negative_id", "/v1/completions", PER_STEP, "token id -1 at position 0"),
    ("too_many_tokens", "/v1/completions", PER_STEP, "40 tokens, more than rollout.max_new_tokens=2"),
    ("logprob_count", "/v1/completions", PER_STEP, "log-probs for"),
    ("empty_choices", "/v1/completions", PER_STEP, "0 choices, not the 1 asked for"),
    ("non_json", "/v1/completions", PER_STEP, "a body that is not a JSON object"),
    ("cut_off", "/v1/completions", PER_STEP, "an answer cut off after"),
    ("reset", "/v1/completions", PER_STEP, "stopped answering /v1/completions"),
    ("cut_off", "/v1/load_lora_adapter", 1, "answered /v1/load_lora_adapter with an answer cut off"),
    ("reset", "/v1/load_lora_adapter", 1, "stopped answering /v1/load_lora_adapter"),
    ("trickle", "/v1/load_lora_adapter", 1, "gave /v1/load_lora_adapter no complete answer within 2 s"),
])
def test_a_server_answering_step_2_wrongly_ends_the_run_in_one_line_after_step_1(fake, tmp_path, fault, route, after,
                                                                                 says):
    fake.answer_wrongly(fault, route, after=after)
    result, run = train(tmp_path, "rollout.engine=vllm-server", f"rollout.server.url={fake.url}",
                        "rollout.server.request_timeout_s=2", "rollout.is_correction=tis")
    line = error_line(result)
    assert says in line and fake.url in line and "last checkpoint kept" in line, line
    assert_stopped_after_step_1(run)


def test_with_retries_a_passing_fault_is_sent_again_and_counted(fake, tmp_path):
    fake.answer_wrongly("reset", after=PER_STEP, times=1)
    result, run = train(tmp_path, "rollout.engine=vllm-server", f"rollout.server.url={fake.url}",
                        "rollout.server.retries=1")
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["rollout/retries"] for r in rows] == [0.0, 1.0]


def test_the_last_checkpoint_is_left_byte_for_byte_as_it_was(fake, tmp_path):
    server = ["rollout.engine=vllm-server", f"rollout.server.url={fake.url}", "rollout.is_correction=tis"]
    result, run = train(tmp_path, *server, "train.steps=1")
    assert result.exit_code == 0, result.output

    def digests():
        folder = run / "checkpoints/step_1"
        return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in folder.rglob("*") if p.is_file()}

    before = digests()
    fake.answer_wrongly("nan_logprob")
    result = CliRunner().invoke(app, ["train", "--resume", str(run), "--steps", "2", "-q"])
    assert "log-prob nan" in error_line(result)
    assert [p.name for p in tmp_path.iterdir()] == ["run"]
    assert digests() == before and sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_1"]


# ---------------------------------------------------------------- a worker that returns bad samples


class BadWorker:
    """A stand-in for the hf worker (an engine apart: the job members of RolloutEngine): honest
    samples by the fake server's rule, with `fault` applied to the first sample of each job from
    the second job on."""

    name, records_lens, reads_policy_weights, starts_with_policy, keeps_versions = "hf-worker", False, False, True, True

    def __init__(self, fault):
        self.fault, self.jobs, self.version = fault, {}, 0

    def describe(self):
        return "the rollout worker (hf-worker, pid 4242)"

    def submit(self, requests, settings):
        ticket = len(self.jobs) + 1
        self.jobs[ticket] = (list(requests), settings)
        return ticket

    def result(self, ticket):
        requests, settings = self.jobs[ticket]
        body = {"max_tokens": settings.max_new_tokens, "stop_token_ids": list(settings.stop_ids)}
        samples = []
        for request in requests:
            group = []
            for seed in request.seeds:
                tokens, logprobs, finish = rule_tokens(list(request.prompt_ids), seed, 0, body)
                group.append(Sample(tokens, finish == "stop", logprobs, source=self.describe()))
            samples.append(group)
        claimed = self.fault(samples) if ticket > 1 else None  # a version the job claims, or None
        return JobResult(samples, self.version if claimed is None else claimed, 0.0, 0.0)

    def push_policy(self, version, weights=None):
        self.version = version

    def forget(self, ticket):
        pass

    def job_times(self, since):
        return []

    def take_retries(self):
        return 0

    def close(self):
        pass


def _nan(samples):
    samples[0][0].logprobs[0] = float("nan")


def _huge_id(samples):
    samples[0][0].token_ids[0] = 10**6


def _missing_sample(samples):
    samples[0].pop()


def _future_version(samples):
    return 7  # the job says version 7 sampled it; the trainer holds version 1


@pytest.mark.parametrize("fault, says", [
    (_nan, "log-prob nan at position 0"),
    (_huge_id, "token id 1000000 at position 0"),
    (_missing_sample, "answered request 0 (4 samples asked) with 3 samples"),
    (_future_version, "policy version 7, not one sent (0..1)"),
])
def test_a_worker_returning_bad_samples_ends_the_run_in_one_line_after_step_1(tmp_path, monkeypatch, fault, says):
    from meds_cli.engine.rollout.engines import ROLLOUT_ENGINES

    entry = ROLLOUT_ENGINES._entries["hf-worker"]
    kind = dataclasses.replace(entry.obj, for_training=lambda *args, **kwargs: BadWorker(fault))
    monkeypatch.setitem(ROLLOUT_ENGINES._entries, "hf-worker", dataclasses.replace(entry, obj=kind))
    result, run = train(tmp_path, "rollout.engine=hf-worker", "rollout.is_correction=tis")
    line = error_line(result)
    assert "rollout refused (hf-worker engine)" in line and says in line, line
    if fault is not _missing_sample:
        assert "the rollout worker (hf-worker, pid 4242) answered request 0 (seed" in line
    assert_stopped_after_step_1(run)


# ---------------------------------------------------------------- the hf worker's exit


HF_WORKER_CLOSE = """
import time
import torch
from meds_cli.engine.model_io.tiny import tiny_model_and_tokenizer
from meds_cli.engine.rollout.hf_worker import HFWorkerEngine
from meds_cli.engine.rollout.sampling_engine import SampleRequest, SamplingSettings
torch.set_num_threads(1)
model, tokenizer = tiny_model_and_tokenizer()
engine = HFWorkerEngine(model, tokenizer.pad_token_id, 64, scratch_dir={scratch!r})
settings = SamplingSettings(1.0, 1.0, 48, (), 48)
request = SampleRequest(tuple(range(2, 50)) * 8, tuple(range(64)))
for _ in range(300):  # far more than the pipe holds, and seconds of work each: a run ending with jobs queued
    engine.submit([request], settings)
started = time.monotonic()
engine.close()
print(f"closed in {{time.monotonic() - started:.1f}} s", flush=True)
"""


def test_the_hf_worker_closes_and_the_process_exits_with_many_jobs_queued(tmp_path):
    script = HF_WORKER_CLOSE.format(scratch=str(tmp_path / "scratch"))
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parent.parent)
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    assert "closed in" in done.stdout and took < 60, (took, done.stdout)


# ---------------------------------------------------------------- records of the sampling in flight, at resume


def _same_seed_twice(record):
    request = record["jobs"][0]["requests"][0]
    request["seeds"][1] = request["seeds"][0]


def _other_seeds(record):
    request = record["jobs"][0]["requests"][0]
    request["seeds"] = [seed + 1 for seed in request["seeds"]]


@pytest.mark.parametrize("tamper, says", [
    (_same_seed_twice, "has a job for step 2 with seed"),
    (_other_seeds, "has a job for step 2 whose prompts or seeds are not those step 2 draws"),
    (lambda r: r["jobs"].append(r["jobs"][0]), "has two jobs for step 2"),
])
def test_a_tampered_in_flight_record_is_refused_at_resume_in_one_line(fake, tmp_path, tamper, says):
    result, run = train(tmp_path, "rollout.engine=vllm-server", f"rollout.server.url={fake.url}",
                        "rollout.max_staleness=1")
    assert result.exit_code == 0, result.output
    path = run / "checkpoints/step_1/in_flight_0.json"
    record = json.loads(path.read_text())
    tamper(record)
    path.write_text(json.dumps(record))
    write_manifest(path.parent, step=1)  # as one who edits a checkpoint would: its manifest agrees
    sent = len(fake.completions)
    result = CliRunner().invoke(app, ["train", "--resume", str(run), "--step", "1", "-q"])
    line = error_line(result)
    assert str(path) in line and says in line and "Resume from another checkpoint" in line, line
    assert len(fake.completions) == sent  # nothing sampled from it, so nothing trained on it
    assert [p.name for p in tmp_path.iterdir()] == ["run"]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]  # the run as it was


def test_with_several_training_processes_every_process_ends_when_one_refuses_its_samples():
    """The check runs inside the pipeline's agreement: a process whose own samples are fine ends
    in one line too when another process's were refused (its `any` says so), instead of waiting
    in the next collective."""
    from meds_cli.engine.model_io.tiny import tiny_model_and_tokenizer
    from meds_cli.engine.rollout.batch import sample_rollouts
    from meds_cli.engine.rollout.pipeline import RolloutPipeline
    from meds_cli.engine.rollout.training_processes import TrainingProcesses

    _, tokenizer = tiny_model_and_tokenizer()
    settings = SamplingSettings(1.0, 1.0, 3, (1,))
    agreements = []  # the other process: its engine answered (1st agreement), its samples were refused (2nd)
    other_refused = lambda failed: agreements.append(failed) or len(agreements) >= 2  # noqa: E731
    healthy = RolloutPipeline(BadWorker(None), processes=TrainingProcesses(1, 2, any=other_refused))
    with pytest.raises(RolloutEngineGone, match="the rollout engine of another training process failed"):
        sample_rollouts(healthy, tokenizer, ["ab"], [None], 2, settings)
    assert agreements == [False, False]  # this process's own samples passed
    alone = RolloutPipeline(BadWorker(None))
    assert sample_rollouts(alone, tokenizer, ["ab"], [None], 2, settings).size == 2

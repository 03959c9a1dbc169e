"""Rollouts from an engine apart (engine/rollout/pipeline.py): the interval arithmetic of the
overlap metrics, the pipeline's matching of prefetched jobs, pushes and staleness bound against an
in-process fake, and the `hf-worker` engine in the trainer: k = 0 is today's colocated `hf` run to
the bit, k = 1 trains on rollouts exactly one version old, and a killed worker ends the run in one
line with its checkpoint intact."""

import json
import os
import signal

import pytest
import torch

from meds_cli.core.errors import UserError
from meds_cli.engine.rollout.hf_worker import cores_of_process, parse_cores
from meds_cli.engine.rollout.pipeline import (
    JobResult,
    RolloutEngineGone,
    RolloutPipeline,
    covered,
    idle_between,
    merged,
    overlap_share,
    staleness,
)
from meds_cli.engine.rollout.sampling_engine import Sample, SampleRequest, SamplingSettings
from meds_cli.engine.run_folders.run_dir import MetricsLog
from meds_cli.engine.trainer import Trainer
from tests.conftest import tiny_config

# ---------------------------------------------------------------- interval arithmetic, by hand


def test_merged_joins_overlapping_and_touching_intervals():
    assert merged([(5, 6), (0, 2), (1, 3), (3, 4), (7, 7)]) == [(0, 4), (5, 6)]  # (7, 7) is empty


def test_covered_counts_each_second_once_within_the_window():
    # (0, 4) and (2, 6) cover 0..6; within the window 1..5 that is 4 s
    assert covered([(0, 4), (2, 6)], (1, 5)) == 4


def test_overlap_share_leaves_out_the_trainers_waits():
    # step 0..10; the sampler busy 0..4 and 6..10 (8 s); the trainer waits 3..5 (1 s of it sampler-busy: 3..4)
    # both computing: 8 - 1 = 7 s of 10
    assert overlap_share([(0, 4), (6, 10)], [(3, 5)], (0, 10)) == pytest.approx(0.7)
    assert overlap_share([], [], (0, 10)) == 0.0
    assert overlap_share([(0, 1)], [], (5, 5)) == 0.0  # an empty step


def test_idle_between_counts_gaps_after_the_first_job():
    # step 0..10, jobs 2..4 and 7..8: idle from 2 on is 8 s - 3 s busy = 5 s
    assert idle_between([(2, 4), (7, 8)], (0, 10)) == pytest.approx(5)
    assert idle_between([], (0, 10)) == 0.0


def test_staleness_is_steps_behind():
    assert staleness([3, 2, 3], 3) == [0, 1, 0]


def test_parse_cores_reads_taskset_lists():
    assert parse_cores("1") == [1] and parse_cores("0,2-4") == [0, 2, 3, 4] and parse_cores("") == []


def test_worker_cores_are_dealt_out_a_block_per_training_process():
    assert [cores_of_process([0, 1, 2, 3], rank, 2) for rank in (0, 1)] == [[0, 1], [2, 3]]
    assert [cores_of_process([4, 5, 6], rank, 2) for rank in (0, 1)] == [[4], [5, 6]]
    assert cores_of_process([], 1, 2) == []  # the trainer's
    with pytest.raises(UserError, match="lists 1 core.* for 2 training processes"):
        cores_of_process([3], 0, 2)


def test_the_worker_refuses_fsdp2_in_one_line():
    with pytest.raises(UserError, match="hf-worker .* train.sharding=fsdp2"):
        tiny_config("rollout.engine=hf-worker", "train.sharding=fsdp2")


# ---------------------------------------------------------------- the pipeline against a fake


class FakeApart:
    """Samples at once, from the version last pushed (or `lag` versions older, to test the bound)."""

    name, records_lens, reads_policy_weights = "fake", False, False
    starts_with_policy, keeps_versions = True, True

    def __init__(self, lag: int = 0):
        self.version, self.lag, self.calls, self.tickets = 0, lag, [], {}

    def push_policy(self, version):
        self.calls.append(("push", version))
        self.version = version

    def submit(self, requests, settings):
        ticket = len(self.tickets)
        self.tickets[ticket] = [[Sample([s % 7], True, [0.0]) for s in r.seeds] for r in requests]
        self.calls.append(("submit", ticket))
        return ticket, self.version - self.lag

    def result(self, ticket):
        number, version = ticket
        return JobResult(self.tickets[number], version, 1.0, 2.0)

    def forget(self, ticket):
        self.calls.append(("forget", ticket[0]))

    def job_times(self, since):
        return [(1.0, 2.0)]

    def take_retries(self):
        return 0

    def close(self):
        self.calls.append("close")


SETTINGS = SamplingSettings(1.0, 1.0, 4, (0,))


def requests(seed: int):
    return [SampleRequest((1, 2), (seed, seed + 1))]


def test_prefetched_requests_are_taken_and_versions_recorded():
    engine = FakeApart()
    pipe = RolloutPipeline(engine, max_staleness=1)
    pipe.prefetch(requests(10), SETTINGS, step=2)
    pipe.policy_settled(1)
    out = pipe.generate(requests(10), SETTINGS)  # the prefetched job: no new submit, no push
    assert engine.calls == [("submit", 0)]
    assert [s.token_ids for s in out[0]] == [[3], [4]] and {s.policy_version for s in out[0]} == {0}
    pipe.generate(requests(20), SETTINGS)  # not prefetched: the new weights go first
    assert engine.calls[1:] == [("push", 1), ("submit", 1)]


def test_a_job_staler_than_allowed_is_sampled_again():
    engine = FakeApart(lag=1)  # every job comes back one version older than pushed
    pipe = RolloutPipeline(engine, max_staleness=1)
    pipe.policy_settled(1)
    pipe.prefetch(requests(10), SETTINGS, step=3)  # pushed 1, sampled from 0
    pipe.policy_settled(2)
    out = pipe.generate(requests(10), SETTINGS)  # 2 - 0 = 2 > 1: sampled again from 2 - 1 = 1
    assert out[0][0].policy_version == 1
    assert pipe.step_metrics((0.0, 4.0))["rollouts_sampled_again"] == 1.0


def test_unused_prefetches_are_forgotten_and_metrics_reset():
    engine = FakeApart()
    pipe = RolloutPipeline(engine, max_staleness=2)
    pipe.prefetch(requests(1), SETTINGS, step=2)
    pipe.prefetch(requests(2), SETTINGS, step=3)
    pipe.forget_through(2)
    assert pipe.prefetched_steps() == {3} and ("forget", 0) in engine.calls
    row = pipe.step_metrics((0.0, 4.0))
    # the fake's job ran 1..2 of the step 0..4 and nobody waited: 1 s of 4 overlapped, idle 2..4
    assert row["overlap_share"] == pytest.approx(0.25) and row["time_sampler_idle_s"] == pytest.approx(2.0)
    assert row["time_wait_rollouts_s"] == 0.0 and row["rollouts_in_flight"] == 1.0


def test_prefetch_needs_staleness():
    with pytest.raises(ValueError):
        RolloutPipeline(FakeApart()).prefetch(requests(1), SETTINGS, step=1)


def test_a_colocated_engine_refuses_staleness():
    with pytest.raises(UserError, match=r"rollout.max_staleness=1 .* use hf-worker"):
        tiny_config("rollout.max_staleness=1")


# ---------------------------------------------------------------- hf-worker in the trainer


def _run(tmp_path, engine: str, k: int, steps: int = 3, *extra):
    cfg = tiny_config("rollout.prompts_per_step=2", "rollout.group_size=4", f"rollout.engine={engine}",
                      f"rollout.max_staleness={k}", f"train.steps={steps}", *extra, output_dir=tmp_path)
    trainer = Trainer(cfg, tmp_path)
    try:
        rows = [trainer.train_step() for _ in range(steps)]
        weights = {n: p.detach().clone() for n, p in trainer.unwrapped.named_parameters() if p.requires_grad}
    finally:
        trainer.close()
    return rows, weights


def test_worker_at_k0_gives_the_colocated_runs_tokens_and_weights(tmp_path):
    colocated, w_colocated = _run(tmp_path / "hf", "hf", 0)
    apart, w_apart = _run(tmp_path / "worker", "hf-worker", 0)
    for a, b in zip(colocated, apart):
        for key in ("reward", "response_length_mean", "loss", "mismatch/logp_abs_diff"):
            assert a[key] == b[key], key
        assert b["rollout/staleness_max"] == 0.0
    assert all(torch.equal(w_colocated[n], w_apart[n]) for n in w_colocated)  # the tokens trained on were the same


def test_worker_under_gradient_checkpointing_gives_the_colocated_runs_weights(tmp_path):
    """Gradient checkpointing hooks the input embeddings with a closure, which the worker's copy of
    the model cannot carry: it is saved without the trainer's hooks, and the trainer keeps them. The
    copy task's 8 x 16 samples get some reward, so the weights move."""
    def run(engine, folder):
        cfg = tiny_config(f"rollout.engine={engine}", "train.gradient_checkpointing=true", "train.steps=2",
                          "optim.lr=0.05", output_dir=tmp_path / folder)
        trainer = Trainer(cfg, tmp_path / folder)
        try:
            rows = [trainer.train_step() for _ in range(2)]
            hooked = any(m._forward_hooks for m in trainer.unwrapped.modules())
            return rows, [p.detach().clone() for p in trainer.unwrapped.parameters() if p.requires_grad], hooked
        finally:
            trainer.close()

    rows, colocated, _ = run("hf", "hf")
    assert rows[0]["grad_norm"] > 0
    _, apart, hooked = run("hf-worker", "worker")
    assert hooked  # the trainer's own hooks were put back
    assert all(torch.equal(a, b) for a, b in zip(colocated, apart))


def test_worker_at_k1_trains_on_rollouts_one_version_old(tmp_path):
    rows, _ = _run(tmp_path, "hf-worker", 1, 4)
    assert rows[0]["rollout/staleness_max"] == 0.0  # step 1 has no older weights
    for row in rows[1:]:
        assert row["rollout/staleness_mean"] == 1.0 and row["rollout/staleness_max"] == 1.0
        assert "rollouts_sampled_again" not in row
    assert [r["rollouts_in_flight"] for r in rows] == [1.0, 1.0, 1.0, 0.0]  # the last step prefetches nothing
    assert [r["rollout/prefetch_miss"] for r in rows] == [0.0] * 4  # every planned round was the step's own
    for key in ("time_wait_rollouts_s", "time_sampler_idle_s", "overlap_share"):
        assert all(r[key] >= 0 for r in rows)


def test_a_seed_draw_that_drifts_from_the_plan_is_counted_as_prefetch_misses(tmp_path, monkeypatch, capsys):
    """A change to the order of the step's seed draws (here one draw more before each round) makes
    every planned round a miss: the steps sample again, and metrics.jsonl and a warning say so."""
    from meds_cli.engine.rollout.batch import draw_seeds
    from meds_cli.engine.rollout.source import RolloutSource

    original = RolloutSource.round_seeds

    def drifted(self, generator, prompts):
        if generator is self._seeds:  # the step's own draw, not the plan's replay of it
            draw_seeds(prompts, self.plan.group_size, generator)
        return original(self, generator, prompts)

    monkeypatch.setattr(RolloutSource, "round_seeds", drifted)
    rows, _ = _run(tmp_path, "hf-worker", 1, 3)
    assert [r["rollout/prefetch_miss"] for r in rows] == [1.0, 1.0, 1.0]
    assert all(r["rollout/staleness_max"] == 0.0 for r in rows)  # sampled again, from the newest weights
    logged = [r["rollout/prefetch_miss"] for r in MetricsLog(tmp_path / "metrics.jsonl").rows()]
    assert logged == [1.0, 1.0, 1.0]
    warning = capsys.readouterr().err
    assert warning.count("planned sampling round") == 1 and "rollout/prefetch_miss" in warning


def test_a_killed_worker_ends_the_run_in_one_line_with_the_checkpoint_intact(tmp_path):
    cfg = tiny_config("rollout.prompts_per_step=2", "rollout.group_size=4", "rollout.engine=hf-worker",
                      "train.steps=3", "train.checkpoint_every=1", output_dir=tmp_path)
    trainer = Trainer(cfg, tmp_path)
    try:
        trainer.train_step()
        checkpoint = trainer.save_checkpoint()
        files = sorted(p.name for p in checkpoint.iterdir())
        pid = trainer.engine.engine.process.pid
        os.kill(pid, signal.SIGKILL)
        trainer.engine.engine.process.join(timeout=10)
        with pytest.raises(RolloutEngineGone) as gone:
            trainer.train_step()
    finally:
        trainer.close()
    message = str(gone.value)
    assert "\n" not in message and f"pid {pid}" in message and "last checkpoint kept" in message
    assert sorted(p.name for p in checkpoint.iterdir()) == files


def test_bad_worker_cores_are_refused_in_one_line():
    with pytest.raises(UserError, match=r"rollout.worker.cores must be a list of CPU numbers"):
        tiny_config("rollout.worker.cores=one")


def test_dapo_extra_rounds_replan_the_next_prefetch(tmp_path):
    # The tiny copy task starts with no reward spread: DAPO takes every round it may, which moves
    # the prompts; the next step's first round is planned again after the collect and still taken.
    rows, _ = _run(tmp_path, "hf-worker", 1, 3, "algo.name=dapo")
    for row in rows[1:]:
        rounds = row["generation_rounds"]
        assert rounds > 1 and "rollouts_sampled_again" not in row
        # the first round one version old, the extra ones sampled when asked from the newest weights
        assert row["rollout/staleness_max"] == 1.0
        assert row["rollout/staleness_mean"] == pytest.approx(1 / rounds)


# ---------------------------------------------------------------- in flight at a checkpoint, and resume


def test_a_resume_at_k1_samples_the_jobs_in_flight_from_their_own_weights_exactly(tmp_path):
    from safetensors.torch import load_file

    from meds_cli.engine.trainer import TIMING_KEYS

    # DAPO: the copy task gives it a reward spread to train on, and extra rounds that replan the prefetch
    common = ("algo.name=dapo", "rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.engine=hf-worker",
              "rollout.max_staleness=1", "train.steps=4", "train.checkpoint_every=2", "optim.lr=0.01")
    straight, split = tmp_path / "straight", tmp_path / "split"
    Trainer(tiny_config(*common, output_dir=straight), straight).train()

    first = Trainer(tiny_config(*common, output_dir=split), split)  # stopped after step 2, as by a kill
    try:
        first.train_step()
        first.train_step()
        checkpoint = first.save_checkpoint()
    finally:
        first.close()
    record = json.loads((checkpoint / "in_flight_0.json").read_text())
    assert record["weights"] == "saved"
    assert [(job["step"], job["policy_version"]) for job in record["jobs"]] == [(3, 1)]  # step 3 from version 1
    assert (checkpoint / "in_flight_policy_v1.safetensors").is_file()
    second = Trainer(tiny_config(*common, output_dir=split), split)
    second.load_checkpoint(checkpoint)
    second.train()

    pipeline_times = ("time_wait_rollouts_s", "time_sampler_idle_s", "overlap_share")
    a, b = ([{k: v for k, v in row.items() if k not in TIMING_KEYS + pipeline_times} for row in MetricsLog(
        run / "metrics.jsonl").rows()] for run in (straight, split))
    assert [r["step"] for r in b] == [1, 2, 3, 4] and a == b
    assert b[2]["rollout/staleness_max"] == 1.0  # step 3 was sampled from version 1 again, not the loaded 2
    wa, wb = (load_file(str(run / "checkpoints/step_4/weights.safetensors")) for run in (straight, split))
    assert wa.keys() == wb.keys() and wa
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert any(wa[k].abs().max() > 0 for k in wa if "lora_B" in k)  # it trained

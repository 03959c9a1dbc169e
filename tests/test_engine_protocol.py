"""Every registered rollout engine implements the one engine protocol (sampling_engine.RolloutEngine):
each member the rollout source, the pipeline or the eval harness may ask of an engine is declared
there, so nothing reads an engine through a getattr default. An engine implements one way of being
asked (now: generate; as jobs: submit and result) and gets the other from a shared base, whose
members are tested here on small stand-ins."""

from __future__ import annotations

import inspect
import re

import pytest

from meds_cli.engine.rollout.engines import ROLLOUT_ENGINES
from meds_cli.engine.rollout.pipeline import RolloutPipeline
from meds_cli.engine.rollout.sampling_engine import (
    RolloutEngine,
    Sample,
    SampleRequest,
    SamplesApart,
    SamplesInProcess,
    SamplingSettings,
)
from tests.test_rollout_pipeline import FakeApart


def protocol_members(protocol) -> set[str]:
    """The members a Protocol declares: its annotated attributes and its methods (not the dunders
    typing adds)."""
    methods = {name for name, value in vars(protocol).items()
               if inspect.isfunction(value) and not name.startswith("__")}
    return set(getattr(protocol, "__annotations__", {})) | methods


def missing(cls, protocol, instance_attributes: set[str] = frozenset()) -> set[str]:
    """Members of `protocol` that `cls` neither defines (class attribute, property, method, its
    own or a base's) nor sets on its instances (`instance_attributes`, read from its source)."""
    return {name for name in protocol_members(protocol) if not hasattr(cls, name)} - set(instance_attributes)


def init_attributes(cls) -> set[str]:
    """The attributes the methods of `cls` set on its instances (`self.<name> = ...`, tuples too)."""
    assigned = set()
    for line in inspect.getsource(cls).splitlines():
        left, equals, _ = line.partition(" = ")
        if equals:
            assigned |= set(re.findall(r"self\.(\w+)", left))
    return assigned


EVERY_MEMBER = {
    "name", "records_lens", "reads_policy_weights", "starts_with_policy", "keeps_versions",  # what it is
    "generate", "policy_updated", "policy_settled", "release",  # sampling now
    "submit", "result", "push_policy", "forget", "job_times", "take_retries",  # sampling as jobs
    "close",
}


def test_the_one_protocol_declares_every_member_an_engine_is_asked_for():
    assert protocol_members(RolloutEngine) == EVERY_MEMBER


@pytest.mark.parametrize("name", ROLLOUT_ENGINES.names())
def test_every_registered_engine_implements_the_whole_protocol(name):
    cls = ROLLOUT_ENGINES.get(name).engine_class
    assert missing(cls, RolloutEngine, init_attributes(cls)) == set(), f"{name}: {cls.__name__}"


@pytest.mark.parametrize("name", ROLLOUT_ENGINES.names())
def test_an_engine_gets_the_half_it_does_not_implement_from_the_base_of_its_kind(name):
    kind = ROLLOUT_ENGINES.get(name)
    assert issubclass(kind.engine_class, SamplesApart if kind.runs_apart else SamplesInProcess), name


def test_the_pipeline_before_an_engine_apart_implements_it_too():
    assert missing(RolloutPipeline, RolloutEngine, init_attributes(RolloutPipeline)) == set()


def test_the_check_catches_a_missing_member():
    class Partial:
        name, records_lens, reads_policy_weights = "partial", False, True

        def generate(self, requests, settings):
            return []

        def close(self):
            pass

    assert missing(Partial, RolloutEngine) == EVERY_MEMBER - {"name", "records_lens", "reads_policy_weights",
                                                              "generate", "close"}
    # an attribute set in __init__ counts, one set nowhere does not
    assert "keeps_versions" not in missing(Partial, RolloutEngine, {"keeps_versions"})
    # the base of an in-process engine gives it the job members and their flags, not the weight pair
    assert missing(type("InProcess", (SamplesInProcess, Partial), {}), RolloutEngine) == {
        "policy_updated", "policy_settled", "release"}


# ---------------------------------------------------------------- the shared bases, on stand-ins

SETTINGS = SamplingSettings(1.0, 1.0, 4, (0,))
REQUESTS = [SampleRequest((1, 2), (5, 6)), SampleRequest((3,), (7,))]


class InProcess(SamplesInProcess):
    """Samples token `seed % 7 + policy_version`; counts the weight pair's calls."""

    name, records_lens, reads_policy_weights = "in-process", False, True

    def __init__(self):
        self.updates, self.settled = 0, []

    def generate(self, requests, settings):
        return [[Sample([seed % 7 + self.updates], True) for seed in r.seeds] for r in requests]

    def policy_updated(self):
        self.updates += 1

    def policy_settled(self, version):
        self.settled.append(version)

    def release(self):
        pass

    def close(self):
        pass


def tokens(samples):
    return [[s.token_ids for s in group] for group in samples]


def test_an_in_process_engine_samples_a_job_when_submitted_and_pushing_is_the_weight_pair():
    engine = InProcess()
    ticket = engine.submit(REQUESTS, SETTINGS)
    engine.policy_updated()  # after the submit: the job already holds what it sampled
    result = engine.result(ticket)
    assert tokens(result.samples) == [[[5], [6]], [[0]]] and result.version == 0
    assert engine.job_times(result.started - 1) == [(result.started, result.ended)]
    assert engine.job_times(result.ended) == []  # ended before `since`: not of interest
    engine.push_policy(3)
    assert (engine.updates, engine.settled) == (2, [3])
    assert engine.result(engine.submit(REQUESTS, SETTINGS)).version == 3
    assert engine.take_retries() == 0
    with pytest.raises(ValueError, match="in-process engine samples the trainer's live weights"):
        engine.push_policy(2, {"w": 0})


def test_the_pipeline_drives_an_in_process_engine_as_it_generates():
    engine = InProcess()
    pipe = RolloutPipeline(engine)
    assert tokens(pipe.generate(REQUESTS, SETTINGS)) == tokens(InProcess().generate(REQUESTS, SETTINGS))
    pipe.policy_settled(1)  # pushed before the next job: the engine takes the live weights as version 1
    out = pipe.generate(REQUESTS, SETTINGS)
    assert engine.settled == [1] and {s.policy_version for group in out for s in group} == {1}
    assert tokens(out) == [[[6], [7]], [[1]]]


class Apart(SamplesApart, FakeApart):
    """The pipeline tests' stand-in for an engine apart (jobs from the version last pushed), with
    the base's generate and weight pair."""


def test_an_engine_apart_generates_by_one_job_and_is_sent_the_settled_weights():
    engine = Apart()
    engine.policy_updated()
    assert engine.calls == []  # nothing sent mid-update
    engine.policy_settled(2)
    out = engine.generate(REQUESTS, SETTINGS)
    assert engine.calls == [("push", 2), ("submit", 0)]
    assert tokens(out) == [[[5], [6]], [[0]]] and {s.policy_version for group in out for s in group} == {2}

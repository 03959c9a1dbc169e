"""Every registered rollout engine implements the whole engine protocol: each member the rollout
source, the pipeline or the eval harness may ask of it is declared (sampling_engine.RolloutEngine,
and pipeline.SeparateEngine for an engine that runs apart, which the pipeline turns into a
RolloutEngine), so nothing reads an engine through a getattr default."""

from __future__ import annotations

import inspect
import re

import pytest

from meds_cli.engine.rollout.engines import ROLLOUT_ENGINES
from meds_cli.engine.rollout.pipeline import RolloutPipeline, SeparateEngine
from meds_cli.engine.rollout.sampling_engine import RolloutEngine


def protocol_members(protocol) -> set[str]:
    """The members a Protocol declares: its annotated attributes and its methods."""
    methods = {name for name, value in vars(protocol).items() if inspect.isfunction(value)}
    return (set(getattr(protocol, "__annotations__", {})) | methods) - {"__init__"}


def missing(cls, protocol, instance_attributes: set[str] = frozenset()) -> set[str]:
    """Members of `protocol` that `cls` neither defines (class attribute, property, method) nor
    sets on its instances (`instance_attributes`, read from its __init__)."""
    return {name for name in protocol_members(protocol) if not hasattr(cls, name)} - set(instance_attributes)


def init_attributes(cls) -> set[str]:
    """The attributes the methods of `cls` set on its instances (`self.<name> = ...`, tuples too)."""
    assigned = set()
    for line in inspect.getsource(cls).splitlines():
        left, equals, _ = line.partition(" = ")
        if equals:
            assigned |= set(re.findall(r"self\.(\w+)", left))
    return assigned


def test_the_protocols_declare_what_engines_are_asked_for():
    assert {"name", "records_lens", "reads_policy_weights", "generate", "policy_updated", "policy_settled",
            "release", "close"} <= protocol_members(RolloutEngine)
    assert {"starts_with_policy", "keeps_versions", "submit", "result", "push_policy", "forget", "job_times",
            "take_retries", "close"} <= protocol_members(SeparateEngine)


@pytest.mark.parametrize("name", ROLLOUT_ENGINES.names())
def test_every_registered_engine_implements_the_whole_protocol(name):
    kind = ROLLOUT_ENGINES.get(name)
    protocol = SeparateEngine if kind.runs_apart else RolloutEngine
    cls = kind.engine_class
    assert missing(cls, protocol, init_attributes(cls)) == set(), f"{name}: {cls.__name__}"


def test_the_pipeline_before_an_engine_apart_is_a_rollout_engine():
    assert missing(RolloutPipeline, RolloutEngine, init_attributes(RolloutPipeline)) == set()


def test_the_check_catches_a_missing_member():
    class Partial:
        name, records_lens, reads_policy_weights = "partial", False, True

        def generate(self, requests, settings):
            return []

    assert missing(Partial, RolloutEngine) == {"policy_updated", "policy_settled", "release", "close"}

"""Cores per process: torch threads and worker pools never oversubscribe the machine."""

import os

import pytest
import torch

from meds_cli.core import cpu_budget


@pytest.fixture
def eight_cores(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)


def test_cores_are_shared_among_the_processes_a_launcher_started(eight_cores, monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert cpu_budget.cores_for_this_process() == 8
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert cpu_budget.cores_for_this_process() == 4
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "16")
    assert cpu_budget.cores_for_this_process() == 1  # never zero


def test_worker_pools_stay_within_the_budget(eight_cores, monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert cpu_budget.worker_count() == 4
    assert cpu_budget.worker_count(16) == 4
    assert cpu_budget.worker_count(2) == 2
    assert cpu_budget.worker_count(cap=3) == 3


def test_torch_threads_follow_the_budget_unless_omp_says_otherwise(eight_cores, monkeypatch):
    previous = torch.get_num_threads()
    try:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        assert cpu_budget.configure_torch_threads() == 2 and torch.get_num_threads() == 2
        torch.set_num_threads(1)
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        assert cpu_budget.configure_torch_threads() == 1
    finally:
        torch.set_num_threads(previous)


def test_passive_waiting_is_asked_for_unless_the_user_chose(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    cpu_budget.prefer_passive_waiting()
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    cpu_budget.prefer_passive_waiting()
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"
    monkeypatch.delenv("OMP_WAIT_POLICY")
    monkeypatch.setenv("GOMP_SPINCOUNT", "1000")
    cpu_budget.prefer_passive_waiting()
    assert "OMP_WAIT_POLICY" not in os.environ


def test_the_package_sets_the_wait_policy_before_torch_loads():
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    code = "import meds_cli, os, sys; print(os.environ.get('OMP_WAIT_POLICY'), 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["PASSIVE", "False"]

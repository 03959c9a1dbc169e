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

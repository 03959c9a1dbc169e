"""meds: a command-line experiment runner for RL post-training of LLMs on verifiable reasoning."""

from meds_cli.core.cpu_budget import prefer_passive_waiting

__version__ = "0.1.0"
prefer_passive_waiting()  # before anything imports torch: see meds_cli/core/cpu_budget.py

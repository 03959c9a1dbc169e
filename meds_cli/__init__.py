"""meds: a command-line experiment runner for RL post-training of LLMs on verifiable reasoning."""

__version__ = "0.1.0"

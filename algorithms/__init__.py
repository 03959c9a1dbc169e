"""Algorithms, one module each, registered by name in ALGORITHMS.

Importing this package imports every algorithm module so that all of them are registered.
"""

from algorithms import (  # noqa: F401,E402  # noqa: F401,E402
    dapo,
    edas,
    grpo,
    meds,  # noqa: F401,E402
    outcome_ucb,
    rlif_multireward,
    unlikeliness,
    w_reinforce,
)
from algorithms.base import ALGORITHMS, Algorithm, AlgorithmContext, OnBase, compose_algorithm, register  # noqa: F401

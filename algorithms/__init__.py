"""Algorithms, one module each, registered by name in ALGORITHMS.

Importing this package imports every algorithm module so that all of them are registered.
"""

from algorithms.base import ALGORITHMS, Algorithm, AlgorithmContext, OnBase, compose_algorithm, register  # noqa: F401
from algorithms import grpo, dapo  # noqa: F401,E402
from algorithms import edas, rlif_multireward  # noqa: F401,E402
from algorithms import meds  # noqa: F401,E402

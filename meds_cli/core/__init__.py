"""Layer 1, the neutral core: errors, the registry, config field helpers, rollout records and
problem/verdict records. Algorithms, benchmarks, the engine and the command line all import it;
it imports nothing else of the project (tests/test_layers.py holds it to that)."""

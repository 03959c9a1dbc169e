"""Layer 3, the engine: config assembly, model loading, generation and scoring, the trainer,
checkpoints, run folders, metrics and the eval backends. Imports the core, algorithms and
benchmarks; never the command line."""

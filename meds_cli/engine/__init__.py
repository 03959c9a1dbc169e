"""Layer 3, the engine. Imports the core, algorithms and benchmarks; never the command line.

Four rooms, each a subpackage with one job, and four modules at the top that join them:

  model_io/     load a model and tokenizer (hub, GGUF, tiny), write model cards
  rollout/      sample responses: the engine registry (`hf`, `vllm`), requests and batches,
                the quick eval during training, the eval backends built on the same engines
  training/     one optimizer step: scoring forwards, log-probs, the policy update, importance
                weights, precision, sharding and collectives, a step's sampling rounds and
                rewards, seeding, reward channels, step metrics
  run_folders/  what a run leaves on disk: the folder and its lock, checkpoints and their codec,
                resume, samples logs, trackers
  config.py     the run config (reads the rooms' constants to check values)
  trainer.py    the training loop: collect -> score -> update -> sync -> log -> checkpoint
  trainer_parts.py  what the loop works with, built once and in order
  export.py     a run folder -> a model folder (merged, adapter or full weights)
  launchers/    where the tasks of a grid run: in this process, N processes, a Slurm job array
                (imports only the core; the command line drives it)

Direction (tests/test_layers.py): model_io imports no room; training imports model_io;
rollout imports model_io and run_folders; run_folders imports training (collectives for
sharded checkpoints); config, trainer, trainer_parts and export may import every room, and no
room imports trainer, trainer_parts or export.
"""

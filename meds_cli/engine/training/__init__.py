"""Training: what one optimizer step needs. Scoring forwards and chunked log-probs, the
policy update with its losses and importance weights, precision and sharding rules (with the
collectives the update and checkpoints share), the collectives the loop agrees on, a step's
dynamic-sampling rounds and rewards (collect), seeding, user reward channels, the algorithm's
context, and per-step metrics (the diversity diagnostics every algorithm logs among them). Imports
model_io only; imported by the trainer, config and run_folders."""

"""Run folders: everything a run leaves on disk. The folder's layout, provenance and lock
(run_dir, run_lock), checkpoints written atomically as data (checkpoints, checkpoint_store,
state_codec), resume rules, samples logs and trackers. Imports training (sharded state dicts)
and config (resume checks); imported by the trainer, export, rollout's eval backends and the
command line."""

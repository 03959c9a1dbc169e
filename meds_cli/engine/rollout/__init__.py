"""Rollout: responses sampled from the policy. The engine interface (sampling_engine), the engine
registry (engines), the `hf` decode loop with its logit-lens recorder, in-place KV cache, packed
CPU matmuls and direct decode step for Llama-layout models, the colocated `vllm` engine with its
config section, the batch builder that turns samples into Rollouts (batch), the quick eval during
training (quick_eval), the eval backends that run the same engines for `meds eval`, and the
tool turn loop (tools/: code blocks run in the sandbox mid-answer, beside any engine). Imports
model_io and run_folders (adapter tensors for eval); imported by config (the engine names and
their checks), the trainer, export and the command line, never by training/."""

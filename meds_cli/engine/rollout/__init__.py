"""Rollout: responses sampled from the policy. The engine interface and registry
(sampling_engine), the `hf` decode loop and its logit-lens recorder, the colocated `vllm`
engine, the batch builder that turns samples into Rollouts (batch), and the eval backends that
run the same engines for `meds eval`. Imports model_io, run_folders (adapter tensors for eval)
and config; imported by the trainer, export and the command line, never by training/."""

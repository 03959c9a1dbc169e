"""`meds train --launcher slurm --server-nodes 1`: the vLLM server of rollout.engine=vllm-server
on a node of its own (the first of the allocation; engine/launchers/slurm_train.py writes the
script). Here: the settings it refuses, each in one line before anything is made, and the server
it runs, built from the run's config as a server meds starts itself is (vllm_server.serve_command,
listening on every interface so the training nodes reach it).

The adapter folders the trainer writes (<run>/scratch/server-adapters/) are read by the server on
its node, so the run folder must be on a path both see (as it must be for a multi-node run anyway).
"""

from __future__ import annotations

import sys

from meds_cli.core.errors import UserError
from meds_cli.engine.launchers.slurm_train import ServerNode

EVERY_INTERFACE = "0.0.0.0"
SERVER_NODES_ACCEPTED = (0, 1)


def check_server_nodes(cfg, nodes: int, server_nodes: int) -> None:
    """--server-nodes against --nodes and the run's config (the module docstring)."""
    from meds_cli.engine.rollout.engines import sends_full_weights

    if server_nodes not in SERVER_NODES_ACCEPTED:
        raise UserError(f"--server-nodes {server_nodes}: give 0 or 1 (one vLLM server on a node of its own)")
    if not server_nodes:
        return
    if server_nodes >= nodes:
        raise UserError(f"--server-nodes {server_nodes} with --nodes {nodes} leaves no node to training: give --nodes "
                        f"{server_nodes + 1} or more")
    server = cfg.rollout.server
    if cfg.rollout.engine != "vllm-server":
        raise UserError(f"--server-nodes {server_nodes} runs the vLLM server of rollout.engine=vllm-server; this run's "
                        f"rollout.engine is {cfg.rollout.engine}: set rollout.engine=vllm-server with "
                        "rollout.server.start=true")
    if sends_full_weights(cfg):
        raise UserError(f"--server-nodes {server_nodes} sends the policy to the server node as LoRA adapters (through "
                        "the run folder); full weights (no LoRA, or rollout.vllm.sync=merged) to another node are not "
                        "built: use model.lora.enabled=true with rollout.vllm.sync=adapter")
    if not server.start:
        raise UserError(f"--server-nodes {server_nodes} starts the server on its own node: set "
                        f"rollout.server.start=true, not rollout.server.url ({server.url})")
    if server.gpus != "":
        raise UserError(f"rollout.server.gpus={server.gpus!r} places a server beside training on one node; with "
                        f"--server-nodes {server_nodes} the server has its node's GPUs: drop rollout.server.gpus")


def server_dtype(cfg, gpus_per_node: int) -> str:
    """rollout.vllm.dtype for a server started before any weights load: `auto` follows what the
    trainer will compute in (its autocast; on GPU nodes `train.mixed_precision: auto` is bf16),
    else the weights' own (vLLM's auto: the checkpoint's)."""
    from meds_cli.engine.rollout.vllm_engine import AUTOCAST_COMPUTE

    if cfg.rollout.vllm.dtype != "auto":
        return cfg.rollout.vllm.dtype
    precision = cfg.train.mixed_precision
    if precision == "auto" and gpus_per_node:
        precision = "bf16"
    return AUTOCAST_COMPUTE.get(precision, "auto")


def server_node(cfg, gpus_per_node: int, python: str = sys.executable) -> ServerNode:
    """The server the first node runs: the model and rollout.vllm's settings, as a server meds
    starts; the KV cache sized for task.max_prompt_tokens plus the response limit where both are
    known before the task loads (rollout.vllm.max_model_len wins), else the model's own limit."""
    from meds_cli.engine.model_io.model import resolve_model
    from meds_cli.engine.rollout.vllm_server import SERVE_VARIABLES, serve_command

    model_len = cfg.task.max_prompt_tokens + cfg.rollout.max_new_tokens if cfg.task.max_prompt_tokens else 0
    argv = serve_command(resolve_model(cfg.model.name), port=cfg.rollout.server.port, options=cfg.rollout.vllm,
                         dtype=server_dtype(cfg, gpus_per_node), seed=cfg.train.seed, lora_rank=cfg.model.lora.rank,
                         model_len=model_len, host=EVERY_INTERFACE, python=python)
    return ServerNode(argv, cfg.rollout.server.port, dict(SERVE_VARIABLES))

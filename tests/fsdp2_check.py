"""Run under `accelerate launch --cpu`: two optimizer steps of a LoRA (or full-weight) tiny Llama
on a fixed global batch, sharded with FSDP2 when there are several processes, plain otherwise.

    fsdp2_check.py OUT [--full-weights] [--resume CHECKPOINT_DIR]

Everything runs in float64 (tests/float64.py): one process and two reduce gradients in different
orders, and in float32 the difference depends on the CPU's kernels; in float64 it is ~1e-15.

Every step accumulates two micro-batches; the loss of each process's rows is normalised by the
global batch, and gradients are clipped (the clip is active). Process 0 writes what
tests/test_sharding.py compares between one process and two: the trainable weights after each
step, the gradient norms, greedily generated tokens (parameters gathered for generate), and a
full-state checkpoint after step 1 that a --resume launch continues from.
"""

import argparse
import json
from pathlib import Path

import torch
from accelerate import Accelerator
from safetensors.torch import save_file

from meds_cli.engine.config import LoraConfig
from meds_cli.engine.model_io.model import apply_lora
from meds_cli.engine.model_io.tiny import tiny_model_and_tokenizer
from meds_cli.engine.training import sharding
from meds_cli.engine.training.logprobs import token_logprobs_and_entropy
from tests.float64 import float64_norms

ROWS, WIDTH, MICRO = 8, 10, 2  # per process: ROWS / world rows, micro-batches of MICRO


def fixed_batch(vocab: int):
    generator = torch.Generator().manual_seed(7)
    ids = torch.randint(2, vocab, (ROWS, WIDTH), generator=generator)
    advantages = torch.randn(ROWS, generator=generator)
    return ids, advantages


def loss_of(model, ids, advantages, total_tokens):
    out = model(input_ids=ids, output_hidden_states=True, use_cache=False, logits_to_keep=1)
    hidden = out.hidden_states[-1][:, :-1]
    logp, _ = token_logprobs_and_entropy(hidden, model.get_output_embeddings(), ids[:, 1:], temperature=0.8,
                                         chunk_tokens=7)
    return -(logp * advantages.unsqueeze(-1)).sum() / total_tokens


def main() -> None:
    with float64_norms():
        run()


def run() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--full-weights", action="store_true")
    parser.add_argument("--resume", type=Path)
    args = parser.parse_args()
    acc = Accelerator(cpu=True)
    world, rank = acc.num_processes, acc.process_index
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model, tokenizer = tiny_model_and_tokenizer()
    model.double()
    if not args.full_weights:
        model = apply_lora(model, LoraConfig(rank=4, alpha=8))
        for name, p in model.named_parameters():  # a non-zero adapter, so step 1 already moves the logits
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.02)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    sharded = sharding.shard_model(model, sharding.device_mesh(acc)) if world > 1 else None
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.02, weight_decay=0.1)
    first_step = 1
    if args.resume:
        weights = torch.load(args.resume / "weights.pt", weights_only=False)
        optim_state = torch.load(args.resume / "optimizer.pt", weights_only=False)
        if sharded:
            sharding.load_full_state(model, weights)
            sharding.load_full_optimizer_state(model, optimizer, optim_state)
        else:
            model.load_state_dict(weights, strict=False)
            optimizer.load_state_dict(optim_state)
        first_step = 2

    ids, advantages = fixed_batch(len(tokenizer))
    mine = list(range(rank, ROWS, world))  # this process's share of the global batch
    total_tokens = ROWS * (WIDTH - 1)
    record = {"world": world, "grad_norms": []}
    for step in range(first_step, 3):
        model.train()
        for start in range(0, len(mine), MICRO):
            rows = mine[start:start + MICRO]
            loss = loss_of(model, ids[rows], advantages[rows], total_tokens)
            (loss * world).backward()  # gradients are averaged over processes; the loss is global already
        params = [p for p in model.parameters() if p.requires_grad]
        record["grad_norms"].append(float(sharding.clip_gradients(params, 0.05)))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        state = sharding.full_state(model) if sharded else {n: p.detach().clone() for n, p in model.named_parameters()
                                                              if p.requires_grad}
        if step == 1:
            optim_state = sharding.full_optimizer_state(model, optimizer) if sharded else optimizer.state_dict()
            if rank == 0:
                folder = args.out / "checkpoint"
                folder.mkdir(parents=True, exist_ok=True)
                torch.save(state, folder / "weights.pt")
                torch.save(optim_state, folder / "optimizer.pt")
        if rank == 0:
            assert sorted(state) == sorted(names), (sorted(state)[:3], names[:3])
            save_file({k: v.contiguous() for k, v in state.items()}, str(args.out / f"weights_step{step}.safetensors"))

    model.eval()
    with sharding.gathered_parameters(sharded), torch.no_grad():
        prompt = ids[:2, :4] if rank == 0 else ids[2:3, :4]  # processes generate different amounts
        new = 6 if rank == 0 else 3
        generated = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                   max_new_tokens=new, min_new_tokens=new, pad_token_id=tokenizer.pad_token_id)
    record["generated"] = generated[:, 4:].tolist()
    acc.wait_for_everyone()
    if rank == 0:
        (args.out / "record.json").write_text(json.dumps(record))
    sharding.close_process_group(acc)


if __name__ == "__main__":
    main()

"""Update (and scoring pass) seconds per real token on a long-tailed batch of response lengths, side
by side with the same number of real tokens at equal lengths (`train.micro_batch_tokens`,
`train.padding_free`, docs/long-tailed-batches.md).

The response lengths are fixed (seeded: most short, a few at the limit) and forced per row, random
tokens after a real prompt of the task, so every setting does the same work:
  (a) fixed:        train.micro_batch_size rows per micro-batch, padded to the batch's longest row
  (b) by tokens:    train.micro_batch_tokens (default: the largest micro-batch of (a), in tokens),
                    each micro-batch padded to its own longest row
  (p) packed:       (b)'s budget counted in real tokens, train.padding_free: the rows of a
                    micro-batch laid end to end (engine/training/packing.py)
  (c) equal:        the same real tokens, every response at their mean length, under (a)'s, (b)'s and
                    (p)'s settings (the fastest is the reference)
One trainer; the settings alternate within each repeat, so load on a shared machine hits them alike.
Each setting times the update and, right after it, the no-grad scoring pass (old log-probs), on
the same batch.

    python scripts/bench_lengths.py [--rows 16] [--max-len 128] [--repeats 2] [--config configs/meds_smollm2.yaml]
                                    [--set key=value ...]
"""

import argparse
import copy
import dataclasses
import statistics
import tempfile
import time
from pathlib import Path

import torch

from meds_cli.core.cpu_budget import configure_torch_threads
from meds_cli.engine.config import load_config
from meds_cli.engine.rollout.batch import rollouts_from_samples
from meds_cli.engine.rollout.sampling_engine import Sample
from meds_cli.engine.trainer import Trainer
from meds_cli.engine.training.packing import PADDED, Packing
from meds_cli.engine.training.scoring import score_rollouts, scoring_temperature

GROUP = 8  # responses per prompt


def long_tailed_lengths(rows: int, max_len: int, seed: int = 0) -> list[int]:
    """Response lengths of `rows` rows: exponential with mean max_len / 8, at least 4 and at most
    max_len, and one row in eight at max_len (the truncated responses of a real batch)."""
    gen = torch.Generator().manual_seed(seed)
    drawn = torch.empty(rows).exponential_(8.0 / max_len, generator=gen).round().clamp(4, max_len).long()
    drawn[::8] = max_len
    return drawn.tolist()


def forced_batch(trainer, lengths: list[int], seed: int = 0):
    """Rollouts of real task prompts (GROUP rows each) with random responses of `lengths` tokens."""
    tokenizer = trainer.tokenizer
    problems = trainer.task.train[:len(lengths) // GROUP]
    texts = [trainer.task.prompt(p, tokenizer) for p in problems]
    prompts = [tuple(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    gen = torch.Generator().manual_seed(seed)
    vocab = min(len(tokenizer), trainer.unwrapped.get_input_embeddings().weight.shape[0])
    special = set(tokenizer.all_special_ids)
    ordinary = torch.tensor([t for t in range(vocab) if t not in special])

    def response(n):  # n - 1 ordinary tokens and the stop token: the response ends where it was cut
        return Sample(ordinary[torch.randint(len(ordinary), (n - 1,), generator=gen)].tolist()
                      + [tokenizer.eos_token_id], True)

    samples = [[response(n) for n in lengths[g * GROUP:(g + 1) * GROUP]] for g in range(len(problems))]
    batch = rollouts_from_samples(tokenizer, prompts, samples, problems, GROUP, [tokenizer.eos_token_id])
    batch.advantages = torch.randn(batch.size, generator=gen)
    return batch


def score(trainer, batch, settings) -> None:
    """The trainer's no-grad scoring pass over `batch` under `settings` (budget, packing)."""
    cfg, model = trainer.cfg, trainer.unwrapped
    model.eval()
    with trainer.acc.autocast():
        score_rollouts(model, batch, cfg.train.micro_batch_size, with_reference=False,
                       temperature=scoring_temperature(cfg.rollout.temperature),
                       chunk_tokens=cfg.train.logprob_chunk_tokens, share_prompts=settings.share_prompts,
                       micro_batch_tokens=settings.micro_batch_tokens, packing=settings.packing)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16, help="rows of the batch (a multiple of 8)")
    parser.add_argument("--max-len", type=int, default=128, help="the response length limit")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--budget", type=int, default=0, help="micro_batch_tokens (0: (a)'s largest micro-batch)")
    parser.add_argument("--config", default="configs/meds_smollm2.yaml")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()
    configure_torch_threads()
    cfg = load_config([args.config], ["train.checkpoint_every=0", "algo.name=grpo", "train.ppo_epochs=1",
                                      "train.mini_batch_size=0", f"rollout.max_new_tokens={args.max_len}",
                                      f"rollout.prompts_per_step={args.rows // GROUP}",
                                      f"rollout.group_size={GROUP}", *args.overrides])
    trainer = Trainer(cfg, Path(tempfile.mkdtemp(prefix="bench-lengths-")))
    lengths = long_tailed_lengths(args.rows, args.max_len)
    mean = round(sum(lengths) / len(lengths))
    tailed, equal = forced_batch(trainer, lengths), forced_batch(trainer, [mean] * len(lengths))
    micro = cfg.train.micro_batch_size
    budget = args.budget or micro * tailed.input_ids.shape[1]
    packing = Packing.for_model(trainer.unwrapped, "true")
    share = trainer.cfg.train.share_prompts and not cfg.train.gradient_checkpointing  # one process, unsharded
    fixed = dataclasses.replace(trainer.update_settings, micro_batch_tokens=0, packing=PADDED, share_prompts=share)
    by_tokens = dataclasses.replace(fixed, micro_batch_tokens=budget)
    packed = dataclasses.replace(by_tokens, packing=packing, share_prompts=share and packing.masked)
    runs = {"(a) fixed, padded to the batch": (tailed, fixed),
            "(b) micro_batch_tokens, padded": (tailed, by_tokens),
            "(p) micro_batch_tokens, packed": (tailed, packed),
            "(c) equal lengths, fixed": (equal, fixed),
            "(c) equal lengths, by tokens": (equal, by_tokens),
            "(c) equal lengths, packed": (equal, packed)}
    print(f"model {cfg.model.name}, {args.rows} rows, prompt width {tailed.prompt_width}, response lengths "
          f"{sorted(lengths)} (mean {mean}, limit {args.max_len}), micro_batch_size {micro}, "
          f"micro_batch_tokens {budget}, packed: {packing}, {torch.get_num_threads()} threads")
    passes = {"update": lambda rows, settings: trainer.update(rows),
              "scoring": lambda rows, settings: score(trainer, rows, settings)}
    times = {(which, name): [] for which in passes for name in runs}
    for repeat in range(args.repeats + 1):  # the first round warms up and is not counted
        for name, (batch, settings) in runs.items():
            trainer.update_settings = settings
            for which, run in passes.items():
                rows = copy.copy(batch)  # the update fills old log-probs in the batch it is given
                t0 = time.perf_counter()
                run(rows, settings)
                seconds = time.perf_counter() - t0
                print(f"  round {repeat}{' (warm-up)' if not repeat else ''}: {which} {name} {seconds:.2f} s",
                      flush=True)
                if repeat:
                    times[which, name].append(seconds)
    for which in passes:
        print(f"{which}:")
        per_token = {}
        for name, (batch, _) in runs.items():
            real = int(batch.response_mask.sum())
            seconds = statistics.median(times[which, name])
            per_token[name] = seconds / real
            print(f"  {name:<32} {seconds:7.2f} s  {real:5d} response tokens  {1e3 * per_token[name]:7.3f} ms/token  "
                  f"(each: {', '.join(f'{t:.2f}' for t in times[which, name])})")
        equal_runs = [name for name in runs if name.startswith("(c)")]
        references = {"the fastest equal-lengths run": equal_runs,
                      "the faster padded equal-lengths run": [name for name in equal_runs if "packed" not in name]}
        for against, names in references.items():
            reference = min(per_token[name] for name in names)
            ratios = ", ".join(f"{name[:3]} {per_token[name] / reference:.2f}x" for name in runs if name[:3] != "(c)")
            print(f"  {which} per real token against {against}: {ratios} (target: (p) <= 1.2x)")


if __name__ == "__main__":
    main()

"""The testbed's base model (`--model testbed-base`): a small Llama with a character tokenizer,
trained from scratch on worked chain-sum traces of which a share carry a systematic bug
(testbed_traces.py), so that its wrong answers repeat across samples of one problem.

Built once per recipe and cached as the dequantized GGUF is (cache.py): a folder under
MEDS_CACHE/testbed named by a hash of the recipe (and of RECIPE_VERSION, bumped when the trace
format or the training loop changes), written under a temporary name and renamed into place. It
is an ordinary local model folder (config.json, model.safetensors, tokenizer) so LoRA, the logit
lens, the hf engine and export treat it as any other; `base_figures.json` in it holds the recipe,
how it was built and the figures measured on held-out problems when it was built.

Deterministic: the problems, the students' bugs, the initial weights and the batch order all
come from the recipe's seed, and the build runs on the recipe's thread count (a matmul's sums
may be split otherwise on another count), so one recipe gives the same weights.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import random
import sys
import time
from pathlib import Path

import torch

from meds_cli.engine.model_io.cache import cache_dir, publish_folder, reuse
from meds_cli.engine.model_io.testbed_traces import draw_student, parse_chain, worked_trace

TESTBED = "testbed-base"  # the --model name
RECIPE_VERSION = 1  # bump when the traces, the tokenizer or the training loop change
FIGURES_FILE = "base_figures.json"
# Every printable ASCII character: the questions of the arithmetic generators and the traces.
CHARS = [chr(c) for c in range(32, 127)]


@dataclasses.dataclass(frozen=True)
class Recipe:
    """Everything the base's weights depend on; its hash names the cache folder."""

    dataset: str = "chain_sum"
    task_config: tuple = (("min_terms", 3), ("max_terms", 5), ("min_digits", 1), ("max_digits", 1))
    bug_rates: tuple = (("carry_drop", 0.3), ("minus_as_plus", 0.3), ("precedence", 0.3), ("sign_drop", 0.3),
                        ("skip_last", 0.3), ("sticky_sign", 0.3))
    examples: int = 20000          # training traces (one per problem)
    layers: int = 4
    hidden: int = 64               # a step of 16 x 8 responses in about a second on one core (docs/testbed.md)
    heads: int = 4
    steps: int = 400               # optimizer steps
    batch_size: int = 64
    lr: float = 5e-3
    warmup_steps: int = 30
    seed: int = 0
    threads: int = 2
    eval_problems: int = 50        # held-out problems the figures are measured on
    eval_samples: int = 64         # samples per held-out problem (pass@1 .. pass@eval_samples)
    temperature: float = 0.7       # the sampling temperature of the figures: configs/testbed.yaml's rollouts
    max_new_tokens: int = 64

    def key(self) -> str:
        text = json.dumps({"version": RECIPE_VERSION, **dataclasses.asdict(self)}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def folder(self) -> Path:
        return cache_dir() / "testbed" / f"{TESTBED}-{self.key()}"


def gym_items(recipe: Recipe, first_seed: int, size: int) -> list[dict]:
    """`size` problems of the recipe's reasoning-gym generator. Item i is drawn from seed
    first_seed + i (reasoning-gym's own rule), so two calls whose seed ranges do not meet share
    no draw."""
    import reasoning_gym

    return list(reasoning_gym.create_dataset(recipe.dataset, size=size, seed=first_seed, **dict(recipe.task_config)))


def training_texts(recipe: Recipe) -> list[tuple[str, str]]:
    """(prompt, response) pairs: the question as is (the testbed's plain prompt style), then a
    worked trace by a student drawn from the bug rates."""
    rng = random.Random(f"{recipe.seed}:students")
    pairs = []
    for item in gym_items(recipe, recipe.seed * 10_000_019, recipe.examples):
        terms, ops = parse_chain(item["metadata"]["expression"])
        text, _ = worked_trace(terms, ops, draw_student(rng, dict(recipe.bug_rates)))
        pairs.append((item["question"], text))
    return pairs


def held_out_items(recipe: Recipe) -> list[dict]:
    return gym_items(recipe, recipe.seed * 10_000_019 + recipe.examples, recipe.eval_problems)


def new_model(recipe: Recipe, tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=recipe.hidden, intermediate_size=2 * recipe.hidden,
        num_hidden_layers=recipe.layers, num_attention_heads=recipe.heads, num_key_value_heads=recipe.heads,
        max_position_embeddings=256, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None, tie_word_embeddings=False,
    )
    torch.manual_seed(recipe.seed)
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def encode_pairs(pairs: list[tuple[str, str]], tokenizer) -> list[tuple[list[int], int]]:
    """(token ids of prompt + response + EOS, prompt length) per pair."""
    encoded = []
    for prompt, response in pairs:
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        response_ids = tokenizer(response, add_special_tokens=False)["input_ids"]
        encoded.append((prompt_ids + response_ids + [tokenizer.eos_token_id], len(prompt_ids)))
    return encoded


def batch_tensors(rows: list[tuple[list[int], int]], pad_id: int) -> tuple[torch.Tensor, ...]:
    """Right-padded ids, attention mask and labels (-100 on the prompt and the padding: the loss
    is on the trace and its EOS only)."""
    width = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (row, prompt_len) in enumerate(rows):
        ids[i, :len(row)] = torch.tensor(row)
        mask[i, :len(row)] = 1
        labels[i, prompt_len:len(row)] = torch.tensor(row[prompt_len:])
    return ids, mask, labels


def learning_rate(recipe: Recipe, step: int) -> float:
    """Linear warm-up, then cosine decay to a tenth of the peak."""
    if step < recipe.warmup_steps:
        return recipe.lr * (step + 1) / recipe.warmup_steps
    progress = (step - recipe.warmup_steps) / max(1, recipe.steps - recipe.warmup_steps)
    return recipe.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train_base(recipe: Recipe, tokenizer, progress=None) -> tuple:
    """(model, final mean loss) trained from scratch by the recipe."""
    model = new_model(recipe, tokenizer)
    rows = encode_pairs(training_texts(recipe), tokenizer)
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr, betas=(0.9, 0.98), weight_decay=0.01)
    order = torch.Generator().manual_seed(recipe.seed)
    model.train()
    losses = []
    for step in range(recipe.steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(recipe, step)
        picks = torch.randint(len(rows), (recipe.batch_size,), generator=order).tolist()
        ids, mask, labels = batch_tensors([rows[i] for i in picks], tokenizer.pad_token_id)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        if progress is not None:
            progress(step + 1, sum(losses[-50:]) / len(losses[-50:]))
    model.eval()
    return model, sum(losses[-50:]) / max(1, len(losses[-50:]))


@torch.no_grad()
def sample_answers(model, tokenizer, prompts: list[str], samples: int, max_new_tokens: int, seed: int,
                   temperature: float, batch_rows: int = 512) -> list[list[str]]:
    """`samples` responses per prompt at `temperature` (no top-p, no top-k), as the RL rollouts sample."""
    torch.manual_seed(seed)
    flat = [p for p in prompts for _ in range(samples)]
    texts = []
    for start in range(0, len(flat), batch_rows):
        batch = tokenizer(flat[start:start + batch_rows], return_tensors="pt", padding=True, add_special_tokens=False)
        out = model.generate(**batch, do_sample=True, temperature=temperature, top_p=1.0, top_k=0,
                             max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id)
        texts += tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
    return [texts[i * samples:(i + 1) * samples] for i in range(len(prompts))]


def held_out_figures(recipe: Recipe, model, tokenizer) -> dict:
    """pass@1, pass@k (k = eval_samples, unbiased estimator) and the distinct wrong answers per
    group of 8 samples (mean over groups, no answer not counted: the training metric's rule) on
    the recipe's held-out problems, graded by the generator's own score_answer."""
    import reasoning_gym

    from benchmarks.answer_extraction import answer_key, extract_answer
    from benchmarks.passk import pass_at_k

    items = held_out_items(recipe)
    scorer = reasoning_gym.create_dataset(recipe.dataset, size=1, seed=0, **dict(recipe.task_config))
    responses = sample_answers(model, tokenizer, [item["question"] for item in items], recipe.eval_samples,
                               recipe.max_new_tokens, recipe.seed, recipe.temperature)
    k, group = recipe.eval_samples, 8
    pass1 = passk = 0.0
    distinct, boxed = [], 0
    for item, texts in zip(items, responses):
        answers = [extract_answer(t, "boxed") for t in texts]
        correct = [a is not None and scorer.score_answer(a, item) == 1.0 for a in answers]
        boxed += sum(a is not None for a in answers)
        pass1 += pass_at_k(len(texts), sum(correct), 1)
        passk += pass_at_k(len(texts), sum(correct), k)
        for start in range(0, len(texts) - group + 1, group):
            wrong = {answer_key(a) for a, ok in zip(answers[start:start + group], correct[start:start + group])
                     if not ok} - {None}
            distinct.append(len(wrong))
    n = len(items)
    return {"held_out_problems": n, "samples_per_problem": k, "temperature": recipe.temperature,
            "pass@1": pass1 / n, f"pass@{k}": passk / n,
            "distinct_wrong_per_8": sum(distinct) / max(1, len(distinct)),
            "boxed_share": boxed / (n * k), "example": responses[0][0] if responses else ""}


def build(recipe: Recipe, folder: Path, console=None) -> dict:
    """Train the base into `folder` and measure it; returns what base_figures.json holds."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from meds_cli.engine.model_io.tiny import tiny_tokenizer

    tokenizer = tiny_tokenizer(CHARS)
    threads = torch.get_num_threads()
    torch.set_num_threads(recipe.threads)
    started = time.perf_counter()
    try:
        with Progress(TextColumn("[bold]testbed base"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TextColumn("loss {task.fields[loss]}"), console=console, transient=False) as bar:
            task = bar.add_task("train", total=recipe.steps, loss="-")
            model, loss = train_base(recipe, tokenizer,
                                     lambda step, loss: bar.update(task, completed=step, loss=f"{loss:.3f}"))
        trained_s = time.perf_counter() - started
        figures = held_out_figures(recipe, model, tokenizer)
    finally:
        torch.set_num_threads(threads)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    record = {"recipe": dataclasses.asdict(recipe), "recipe_key": recipe.key(), "recipe_version": RECIPE_VERSION,
              "final_train_loss": loss, "train_seconds": round(trained_s, 1),
              "measure_seconds": round(time.perf_counter() - started - trained_s, 1),
              "torch": torch.__version__, "threads": recipe.threads, "figures": figures}
    (folder / FIGURES_FILE).write_text(json.dumps(record, indent=2) + "\n")
    return record


def describe(record: dict) -> str:
    f = record["figures"]
    k = f["samples_per_problem"]
    return (f"trained {record['recipe']['steps']} steps in {record['train_seconds']} s on {record['threads']} threads; "
            f"held-out ({f['held_out_problems']} problems x {k} samples at temperature {f['temperature']}): "
            f"pass@1 {f['pass@1']:.3f}, "
            f"pass@{k} {f[f'pass@{k}']:.3f}, distinct wrong answers per 8 {f['distinct_wrong_per_8']:.2f}")


TESTBED_RECIPE = Recipe()  # what `--model testbed-base` is


def base_folder(recipe: Recipe | None = None, say=None) -> Path:
    """The cached base of `recipe` (default: TESTBED_RECIPE), built first when the cache has none;
    `say` (default: a line on stderr) is told which folder and how it was built."""
    recipe = recipe or TESTBED_RECIPE
    say = say or (lambda line: print(line, file=sys.stderr))
    target = recipe.folder()
    if reuse(target):
        record = json.loads((target / FIGURES_FILE).read_text())
        say(f"{TESTBED}: cached in {target} ({describe(record)})")
        return target
    say(f"{TESTBED}: building into {target} (recipe {recipe.key()}: {recipe.examples} traces, bugs "
        f"{', '.join(f'{n} {r}' for n, r in recipe.bug_rates)}; {recipe.layers} layers x {recipe.hidden})")
    records = []
    publish_folder(target, lambda folder: records.append(build(recipe, folder)))
    say(f"{TESTBED}: built in {target} ({describe(records[0])})")
    return target


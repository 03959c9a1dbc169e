"""Build small Rollouts batches by hand for hook tests (no model involved)."""

import torch

from meds_cli.core.records import Problem, Verdict
from meds_cli.core.rollouts import Rollouts


def make_rollouts(correct: list[bool], group_size: int, lengths: list[int] | None = None,
                  truncated: list[bool] | None = None, answers: list[str | None] | None = None,
                  width: int = 4) -> Rollouts:
    size = len(correct)
    lengths = lengths or [width] * size
    width = max(width, max(lengths) if lengths else 1)
    mask = torch.zeros(size, width)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1.0
    answers = answers or [None] * size
    verdicts = [Verdict(c, a, "correct" if c else "wrong") for c, a in zip(correct, answers)]
    return Rollouts(
        problems=[Problem(id=f"p{g}", question=f"q{g}", answer="1") for g in range(size // group_size)],
        group_size=group_size,
        input_ids=torch.zeros(size, 2 + width, dtype=torch.long),
        attention_mask=torch.ones(size, 2 + width, dtype=torch.long),
        prompt_width=2,
        response_ids=torch.zeros(size, width, dtype=torch.long),
        response_mask=mask,
        response_texts=[f"r{i}" for i in range(size)],
        truncated=torch.tensor(truncated or [False] * size),
        verdicts=verdicts,
    )

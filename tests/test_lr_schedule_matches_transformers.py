"""The hand-written LR schedules against transformers.get_scheduler (docs/design.md): equal after the
warm-up, one step ahead during it (meds' first update is never at learning rate 0)."""

import pytest
import torch

from meds_cli.engine.trainer import lr_lambda

WARMUP, TOTAL = 4, 12
TRANSFORMERS_NAME = {"constant": "constant_with_warmup", "cosine": "cosine", "linear": "linear"}


def transformers_factors(schedule: str) -> list[float]:
    from transformers import get_scheduler

    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([parameter], lr=1.0)
    scheduler = get_scheduler(TRANSFORMERS_NAME[schedule], optimizer, num_warmup_steps=WARMUP, num_training_steps=TOTAL)
    factors = []
    for _ in range(TOTAL):
        factors.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    return factors


@pytest.mark.parametrize("schedule", ["constant", "cosine", "linear"])
def test_after_warmup_the_schedules_are_transformers(schedule):
    ours = [lr_lambda(WARMUP, TOTAL, schedule)(step) for step in range(TOTAL)]
    theirs = transformers_factors(schedule)
    assert ours[WARMUP:] == pytest.approx(theirs[WARMUP:], abs=1e-12)
    # warm-up: transformers starts at 0 (a wasted first update); meds is one step ahead
    assert theirs[0] == 0.0 and ours[0] == 1 / WARMUP
    assert ours[:WARMUP - 1] == pytest.approx(theirs[1:WARMUP], abs=1e-12)
    assert ours[WARMUP - 1] == 1.0

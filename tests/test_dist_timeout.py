"""train.dist_timeout_s (issue 37): the process group's collective timeout, passed to Accelerate
as InitProcessGroupKwargs (NCCL's own default, 600 s, is shorter than a 7B checkpoint written by
one process or a long vLLM start while the others wait)."""

from datetime import timedelta

import pytest

from meds_cli.core.errors import UserError
from meds_cli.engine.training import sharding
from tests.conftest import tiny_config


def accelerator_kwargs_of(monkeypatch, *overrides):
    import accelerate

    seen = {}
    monkeypatch.setattr(accelerate, "Accelerator", lambda **kwargs: seen.update(kwargs) or "accelerator")
    assert sharding.make_accelerator(tiny_config(*overrides).train) == "accelerator"
    return seen


@pytest.mark.parametrize("overrides, seconds", [((), 1800), (("train.dist_timeout_s=45",), 45)])
def test_the_timeout_reaches_the_process_group_kwargs(monkeypatch, overrides, seconds):
    from accelerate.utils import InitProcessGroupKwargs

    handlers = accelerator_kwargs_of(monkeypatch, *overrides)["kwargs_handlers"]
    assert len(handlers) == 1 and isinstance(handlers[0], InitProcessGroupKwargs)
    assert handlers[0].timeout == timedelta(seconds=seconds)


@pytest.mark.parametrize("value", ["0", "-5", "soon"])
def test_a_bad_timeout_is_one_line(value):
    with pytest.raises(UserError) as error:
        tiny_config(f"train.dist_timeout_s={value}")
    message = str(error.value)
    assert "train.dist_timeout_s" in message and value in message and "\n" not in message, message
    assert "at least 1" in message or "expected int" in message, message

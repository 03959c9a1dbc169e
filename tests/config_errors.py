"""A config the loader refuses: one line, naming the bad setting and what is accepted."""

import pytest

from meds_cli.core.errors import UserError
from meds_cli.engine.config import load_config


def assert_refused_in_one_line(overrides: list[str], words: list[str]) -> None:
    with pytest.raises(UserError) as err:
        load_config(overrides=overrides)
    for word in words:
        assert word in str(err.value)
    assert "\n" not in str(err.value)

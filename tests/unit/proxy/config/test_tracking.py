"""proxy/config/tracking.py: the experiment's `log` block, strict like the rest of the schema."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from proxy.config.tracking import LogConfig


def test_off_by_default():
    assert not LogConfig().enabled


def test_tensorboard_and_wandb():
    log = LogConfig.model_validate({"tensorboard": True, "wandb": {"project": "p", "mode": "online", "tags": ["a"]}})
    assert log.enabled and log.wandb.mode == "online" and log.wandb.tags == ["a"]
    assert LogConfig.model_validate({"wandb": {"project": "p"}}).wandb.mode == "offline"


@pytest.mark.parametrize(
    "data",
    [
        {"tensorboard": 1},
        {"tensorbord": True},
        {"wandb": {}},
        {"wandb": {"project": "p", "mode": "sometimes"}},
        {"wandb": {"project": "p", "key": "secret"}},
    ],
)
def test_strict(data):
    with pytest.raises(ValidationError):
        LogConfig.model_validate(data)

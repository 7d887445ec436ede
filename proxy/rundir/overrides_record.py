"""RUN/.overrides.json: the `--set` overrides the last `proxy run` launched with (docs/FORMATS.md).

    {"overrides": ["train.lr=0.002", "train.max_steps=120"]}

The effective experiment they made is the frozen RUN/experiment.json; this
record says which of its values came from the command line (`proxy status`
shows them). Written atomically on every launch that gets past the frozen
experiment's check.
"""

from __future__ import annotations

from pydantic import Field, ValidationError

from ..atomic import atomic_write_bytes, json_bytes
from ..config.overrides import MAX_OVERRIDES
from ..config.strict import MAX_PATH, StrictModel
from ..formats import bounded_json
from ..safe_fs import UnsafeFileError
from .layout import RunDir


class OverridesRecord(StrictModel):
    overrides: list[str] = Field(default_factory=list, max_length=MAX_OVERRIDES)

    @classmethod
    def of(cls, texts: list[str]) -> OverridesRecord:
        return cls(overrides=[t[:MAX_PATH] for t in texts])


def write_overrides(run: RunDir, record: OverridesRecord) -> None:
    atomic_write_bytes(run.overrides, json_bytes(record.model_dump(mode="json")))


def read_overrides(run: RunDir) -> OverridesRecord | None:
    """The record, or None when there is none or it is not one (a snapshot anyone can edit: only shown)."""
    try:
        return OverridesRecord.model_validate(bounded_json.loads(run.read_small(run.overrides)))
    except (OSError, UnsafeFileError, ValueError, RecursionError, ValidationError):
        return None

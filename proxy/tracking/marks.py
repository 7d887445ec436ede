"""A sink's high-water mark: the last step, evaluation, sample audit and phase it wrote, whether it wrote the
config, and for TensorBoard how many bytes of its event file that covers (RUN/tensorboard/.marks.json,
RUN/wandb/.marks.json).

Saved atomically after the sink's writes are durable, so a relaunch (after
kill -9 too) resumes exactly there: TensorBoard truncates its event file to
`size` and writes every later step again from `.loss.json`, never one twice.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from pydantic import Field, ValidationError

from ..atomic import atomic_write_bytes, json_bytes, make_dirs
from ..config.strict import StrictModel
from ..errors import EXIT_FAILURE, ProxyError
from ..formats import bounded_json
from ..rundir.layout import READ_LIMITS, TRACKER_MARKS
from ..safe_fs import UnsafeFileError, read_regular
from .records import CONFIG_TAG, SAMPLES_TAG, Note


class TrackerError(ProxyError):
    """A sink that cannot go on: the tracker reports it in one line and drops that sink (follow.py)."""

    code = EXIT_FAILURE


def own_directory(directory: Path) -> None:
    """Create a sink's directory in the run; one that is a symlink (or not a directory) is refused: a sink
    never writes outside the run through a link someone left there."""
    make_dirs(directory)
    if not stat.S_ISDIR(os.lstat(directory).st_mode):
        raise TrackerError(f"{directory}: not a directory of the run (a symlink?); not writing there")


class Marks(StrictModel):
    step: int = Field(default=-1, ge=-1)  # the last training step written
    eval: int = Field(default=-1, ge=-1)  # the last evaluation's step
    sample: int = Field(default=-1, ge=-1)  # the last sample audit's step
    phase: int = Field(default=0, ge=0)  # the phase of the last step written (a higher one is a pivot)
    size: int = Field(default=0, ge=0)  # TensorBoard: the event file's bytes these marks cover
    config: bool = False  # the experiment was written (TensorBoard: as text at step 0)

    @classmethod
    def load(cls, path: Path) -> Marks:
        """The saved marks; fresh ones (everything is written again) when there are none or they are damaged."""
        try:
            return cls.model_validate(
                bounded_json.loads(read_regular(path, READ_LIMITS[TRACKER_MARKS], within=path.parent))
            )
        except (OSError, UnsafeFileError, ValueError, RecursionError, ValidationError):
            return cls()

    def wrote_step(self, step: int, phase: int) -> None:
        self.step, self.phase = step, phase

    def wrote_eval(self, step: int) -> None:
        self.eval = step

    def wrote_sample(self, step: int) -> None:
        self.sample = step

    def wrote_config(self) -> None:
        self.config = True

    def rewound(self, step: int) -> None:
        """A pivot re-trains from `step`: evaluations from there on are the new phase's to write."""
        self.eval = min(self.eval, step - 1)

    def covers(self, size: int) -> None:
        self.size = size

    def save(self, path: Path) -> None:
        atomic_write_bytes(path, json_bytes(self.model_dump(mode="json")))


def note_is_new(note: Note, marks: Marks) -> bool:
    """Whether a sink has not written this note yet: a sample audit past its last one, a pivot of a later
    phase, a fork's note past its last step."""
    if note.tag == SAMPLES_TAG:
        return note.step > marks.sample
    if note.tag == CONFIG_TAG:
        return not marks.config
    return note.phase > marks.phase or note.step > marks.step

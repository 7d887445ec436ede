"""A Weights & Biases run (the optional `wandb` extra), offline or online as the experiment's `log.wandb` says.

The run's id is kept in RUN/wandb/.run_id.json, written before the first
`wandb.init`, so every relaunch resumes the same W&B run (`resume="allow"`).
Every point carries its step as `train/step`, the x axis of every chart
(`define_metric`): an evaluation read after later steps, or a pivot's
re-trained steps, still plot at their own step. A pivot or a fork is logged
as a row of the `events` table and in the run's summary; sample audits as rows
of a `samples` table.
"""

from __future__ import annotations

import secrets
import string
from pathlib import Path

from pydantic import Field

from ..atomic import atomic_write_bytes, json_bytes
from ..config.strict import StrictModel
from ..config.tracking import WandbConfig
from ..errors import one_line
from ..formats import bounded_json
from ..rundir.layout import READ_LIMITS, TRACKER_MARKS, WANDB_RUN_ID, RunDir
from ..safe_fs import UnsafeFileError, read_regular
from .marks import Marks, TrackerError, note_is_new, own_directory
from .records import CONFIG_TAG, SAMPLES_TAG, EvalPoint, Note, StepPoint

STEP_AXIS = "train/step"
ID_CHARS = string.ascii_lowercase + string.digits


class RunIdRecord(StrictModel):
    """RUN/wandb/.run_id.json."""

    id: str = Field(pattern=r"^[a-z0-9]{1,64}$")


def run_id(directory: Path) -> str:
    """The W&B run id of this run directory, minted and saved durably on first use. A damaged record is an
    error, never a new W&B run in its place."""
    path = directory / WANDB_RUN_ID
    try:
        return RunIdRecord.model_validate(
            bounded_json.loads(read_regular(path, READ_LIMITS[WANDB_RUN_ID], within=directory))
        ).id
    except FileNotFoundError:
        pass
    except (OSError, UnsafeFileError, ValueError, RecursionError) as exc:  # ValidationError is a ValueError
        raise TrackerError(
            f"{path}: not a W&B run id record ({one_line(exc)}); delete it to start a new W&B run"
        ) from None
    minted = "".join(secrets.choice(ID_CHARS) for _ in range(8))
    atomic_write_bytes(path, json_bytes(RunIdRecord(id=minted).model_dump(mode="json")))
    return minted


class WandbSink:
    name = "wandb"

    def __init__(self, run: RunDir, config: WandbConfig, experiment: dict):
        try:
            import wandb
        except ImportError:
            raise TrackerError("the wandb package is not installed (pip install 'microgpt[wandb]')") from None
        self.wandb = wandb
        own_directory(run.wandb)
        self.marks_path = run.wandb / TRACKER_MARKS
        self.marks = Marks.load(self.marks_path)
        self.id = run_id(run.wandb)
        # dir=RUN: wandb keeps its files in RUN/wandb/ (offline-run-*/run-* directories)
        self.run = wandb.init(
            project=config.project,
            entity=config.entity,
            name=config.name or experiment.get("name"),
            tags=config.tags or None,
            id=self.id,
            resume="allow",
            mode=config.mode,
            dir=str(run.root),
            config=experiment,
            settings=wandb.Settings(console="off", silent=True),
        )
        self.run.define_metric(STEP_AXIS)
        self.run.define_metric("*", step_metric=STEP_AXIS)
        self.samples = wandb.Table(columns=["step", "prompt", "completion"], log_mode="INCREMENTAL")
        self.events = wandb.Table(columns=["step", "event"], log_mode="INCREMENTAL")

    def write(self, points: list[StepPoint | EvalPoint | Note]) -> None:
        m = self.marks
        for p in points:
            if isinstance(p, StepPoint):
                if p.step <= m.step and p.phase <= m.phase:
                    continue
                self.run.log({STEP_AXIS: p.step, **p.scalars})
                m.wrote_step(p.step, p.phase)
            elif isinstance(p, EvalPoint):
                if p.step > m.eval or p.phase > m.phase:
                    self.run.log({STEP_AXIS: p.step, **p.scalars})
                    m.wrote_eval(p.step)
            elif p.tag != CONFIG_TAG and note_is_new(p, m):  # the config went to wandb.init
                self._note(p)

    def _note(self, note: Note) -> None:
        if note.tag == SAMPLES_TAG:
            for prompt, completion in note.rows:
                self.samples.add_data(note.step, prompt, completion)
            self.run.log({STEP_AXIS: note.step, "samples": self.samples})
            self.marks.wrote_sample(note.step)
        else:
            self.events.add_data(note.step, note.text)
            self.run.log({STEP_AXIS: note.step, "events": self.events})
            self.run.summary.update({"last_event": note.text})

    def commit(self) -> None:
        self.marks.save(self.marks_path)

    def close(self) -> None:
        self.run.finish()
        self.commit()

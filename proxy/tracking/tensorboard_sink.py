"""TensorBoard event files in RUN/tensorboard/, written with the `tensorboard` package's own record writer
and event protos (the optional `tensorboard` extra; no TensorFlow, no torch).

One event file per run directory, appended across launches: on open it is
cut back to the bytes its marks cover (marks.py), so whatever a killed
tracker wrote after its last durable mark is written again once, from
`.loss.json`. A pivot re-trains from its step: a SessionLog START event at
that step tells TensorBoard's readers to drop the old phase's later points.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import Any

from ..atomic import sync_fd
from ..rundir.layout import TRACKER_MARKS
from .marks import Marks, TrackerError, note_is_new, own_directory
from .records import CONFIG_TAG, SAMPLES_TAG, EvalPoint, Note, StepPoint

EVENT_FILE = "events.out.tfevents.0000000000.microgpt"  # TensorBoard finds files by this prefix


class TensorBoardSink:
    name = "tensorboard"

    def __init__(self, directory: Path):
        from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2
        from tensorboard.plugins.text import metadata as text_metadata
        from tensorboard.summary.writer.record_writer import RecordWriter

        self._event_pb2, self._summary_pb2 = event_pb2, summary_pb2
        self._tensor_pb2, self._shape_pb2, self._text_metadata = tensor_pb2, tensor_shape_pb2, text_metadata
        own_directory(directory)
        self.marks_path = directory / TRACKER_MARKS
        self.marks = Marks.load(self.marks_path)
        self.path = directory / EVENT_FILE
        # no link followed, and no blocking on a FIFO left under the name (ENXIO without a reader)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o644)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise TrackerError(f"{self.path}: not a regular file; not writing there")
        if os.fstat(fd).st_size < self.marks.size:  # the file is not the one the marks describe
            self.marks = Marks()
        os.ftruncate(fd, self.marks.size)
        self.file = os.fdopen(fd, "ab")
        self.writer = RecordWriter(self.file)
        if self.marks.size == 0:
            self._add(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))

    def _add(self, event: Any) -> None:  # a tensorboard Event protobuf: the package ships no type information
        self.writer.write(event.SerializeToString())

    def write(self, points: list[StepPoint | EvalPoint | Note]) -> None:
        pb, m = self._event_pb2, self.marks
        for p in points:
            if isinstance(p, StepPoint):
                if p.phase > m.phase and p.step <= m.step:  # a pivot: readers drop the old points from here
                    self._add(
                        pb.Event(wall_time=p.wall, step=p.step, session_log=pb.SessionLog(status=pb.SessionLog.START))
                    )
                    m.rewound(p.step)
                elif p.step <= m.step:
                    continue
                self._scalars(p.step, p.wall, p.scalars)
                m.wrote_step(p.step, p.phase)
            elif isinstance(p, EvalPoint):
                if p.step > m.eval or p.phase > m.phase:
                    self._scalars(p.step, p.wall, p.scalars)
                    m.wrote_eval(p.step)
            elif note_is_new(p, m):
                self._text(p.step, p.wall, p.tag, p.text)
                if p.tag == SAMPLES_TAG:
                    m.wrote_sample(p.step)
                elif p.tag == CONFIG_TAG:
                    m.wrote_config()

    def _scalars(self, step: int, wall: float, scalars: dict[str, float]) -> None:
        s = self._summary_pb2
        values = [s.Summary.Value(tag=tag, simple_value=v) for tag, v in scalars.items()]
        self._add(self._event_pb2.Event(wall_time=wall, step=step, summary=s.Summary(value=values)))

    def _text(self, step: int, wall: float, tag: str, text: str) -> None:
        tensor = self._tensor_pb2.TensorProto(
            dtype="DT_STRING",
            string_val=[text.encode("utf-8")],
            tensor_shape=self._shape_pb2.TensorShapeProto(dim=[self._shape_pb2.TensorShapeProto.Dim(size=1)]),
        )
        meta = self._text_metadata.create_summary_metadata(display_name=tag, description="")
        value = self._summary_pb2.Summary.Value(tag=tag, metadata=meta, tensor=tensor)
        self._add(self._event_pb2.Event(wall_time=wall, step=step, summary=self._summary_pb2.Summary(value=[value])))

    def commit(self) -> None:
        """Make what was written durable, then move the marks past it."""
        self.file.flush()
        sync_fd(self.file.fileno(), self.path)
        self.marks.covers(self.file.tell())
        self.marks.save(self.marks_path)

    def close(self) -> None:
        self.commit()
        self.file.close()

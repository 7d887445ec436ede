"""proxy/tracking/tensorboard_sink.py: one event file, cut back to its durable marks, each step written once."""

from __future__ import annotations

import os

import pytest

from proxy.tracking.marks import Marks
from proxy.tracking.records import EvalPoint, Note, StepPoint

pytest.importorskip("tensorboard")
from harness.tracking_readers import tensorboard_scalars as scalars_of  # noqa: E402
from harness.tracking_readers import tensorboard_texts as texts_of
from proxy.tracking.tensorboard_sink import EVENT_FILE, TensorBoardSink  # noqa: E402


def points(first: int, last: int, phase: int = 0) -> list:
    return [StepPoint(s, phase, 1000.0 + s, {"train/loss": 10.0 / s + phase}) for s in range(first, last + 1)]


def test_uncommitted_writes_are_written_again_once(tmp_path):
    sink = TensorBoardSink(tmp_path)
    sink.write(points(1, 5))
    sink.commit()
    sink.write(points(6, 8))  # a kill -9 here: written, never committed
    sink.file.flush()
    sink.file.close()
    again = TensorBoardSink(tmp_path)
    assert again.marks.step == 5
    again.write(points(1, 10))  # the tracker reads the whole log again
    again.close()
    assert [s for s, _ in scalars_of(tmp_path)["train/loss"]] == list(range(1, 11))
    assert Marks.load(tmp_path / ".marks.json").step == 10


def test_a_pivot_starts_a_new_session_at_its_step(tmp_path):
    sink = TensorBoardSink(tmp_path)
    sink.write(points(1, 5) + [Note(3, 1003.0, "events", "pivot: phase 1 from step 3", 1)] + points(3, 6, phase=1))
    sink.close()
    loss = scalars_of(tmp_path, purge=True)["train/loss"]
    assert [s for s, _ in loss] == [1, 2, 3, 4, 5, 6] and loss[2][1] == pytest.approx(10.0 / 3 + 1)
    assert texts_of(tmp_path, "events") == [(3, "pivot: phase 1 from step 3")]


def test_evals_and_samples_once_each(tmp_path):
    sink = TensorBoardSink(tmp_path)
    batch = [EvalPoint(4, 0, 1004.0, {"val/loss": 5.0}), Note(4, 1004.0, "samples", "text")]
    sink.write(batch)
    sink.commit()
    sink.write(batch)
    sink.close()
    assert scalars_of(tmp_path)["val/loss"] == [(4, 5.0)]
    assert texts_of(tmp_path, "samples") == [(4, "text")]


def test_an_event_file_shorter_than_its_marks_is_written_anew(tmp_path):
    sink = TensorBoardSink(tmp_path)
    sink.write(points(1, 3))
    sink.close()
    sink.path.write_bytes(b"")  # replaced behind the tracker's back
    again = TensorBoardSink(tmp_path)
    again.write(points(1, 3))
    again.close()
    assert [s for s, _ in scalars_of(tmp_path)["train/loss"]] == [1, 2, 3]


def test_a_link_or_a_fifo_is_refused_not_followed(tmp_path):
    from proxy.tracking.marks import TrackerError

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "linked").symlink_to(elsewhere)
    with pytest.raises(TrackerError, match="not a directory of the run"):
        TensorBoardSink(tmp_path / "linked")
    fifo_dir = tmp_path / "fifo"
    fifo_dir.mkdir()
    os.mkfifo(fifo_dir / EVENT_FILE)
    with pytest.raises(OSError):  # ENXIO: no reader, and no waiting for one
        TensorBoardSink(fifo_dir)
    (tmp_path / "link_file").mkdir()
    (tmp_path / "link_file" / EVENT_FILE).symlink_to(elsewhere / "x")
    with pytest.raises(OSError):  # ELOOP
        TensorBoardSink(tmp_path / "link_file")
    assert list(elsewhere.iterdir()) == []


def test_the_config_once(tmp_path):
    sink = TensorBoardSink(tmp_path)
    config = Note(0, 1000.0, "config", "{}")
    sink.write([config])
    sink.commit()
    sink.write([config] + points(1, 2))
    sink.close()
    again = TensorBoardSink(tmp_path)
    again.write([config] + points(1, 2))
    again.close()
    assert texts_of(tmp_path, "config") == [(0, "{}")]

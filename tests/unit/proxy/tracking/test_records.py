"""proxy/tracking/records.py: what the tracker reads from a run directory, each step once."""

from __future__ import annotations

from proxy.rundir.layout import RunDir
from proxy.tracking.records import EVENTS_TAG, EvalPoint, Note, RunRecords, StepPoint

from .loss_lines import append, evaluation, step


def steps(points) -> list[int]:
    return [p.step for p in points if isinstance(p, StepPoint)]


def test_steps_and_evals_in_file_order_with_their_scalars(tmp_path):
    append(tmp_path, step(1), step(2), evaluation(2), step(3))
    points = RunRecords(RunDir(tmp_path)).poll()
    assert steps(points) == [1, 2, 3]
    first = points[0].scalars
    assert first["train/loss"] == 10.0 and first["train/loss_smoothed"] == 10.0 and first["mixture/a"] == 1.0
    assert "train/tokens_per_s" not in first  # no step before it to measure from
    assert points[1].scalars["train/tokens_per_s"] == 512 / 0.010
    assert points[1].scalars["train/loss_smoothed"] == 0.9 * 10.0 + 0.1 * 5.0
    assert [(p.step, p.scalars["val/loss"], p.scalars["val/a"]) for p in points if isinstance(p, EvalPoint)] == [
        (2, 5.0, 5.0)
    ]


def test_a_line_being_written_is_read_once_whole(tmp_path):
    records = RunRecords(RunDir(tmp_path))
    line = step(1)
    append(tmp_path, line[:10])
    assert records.poll() == []
    append(tmp_path, line[10:], step(2))
    assert steps(records.poll()) == [1, 2]
    assert records.poll() == []


def test_steps_replayed_after_a_restart_are_read_once(tmp_path):
    append(tmp_path, step(1), step(2), step(3), step(2), step(3), step(4))
    assert steps(RunRecords(RunDir(tmp_path)).poll()) == [1, 2, 3, 4]


def test_a_pivot_rewinds_with_a_note(tmp_path):
    append(tmp_path, step(1), step(2), step(3), step(2, phase=1), step(3, phase=1))
    points = RunRecords(RunDir(tmp_path)).poll()
    assert steps(points) == [1, 2, 3, 2, 3]
    notes = [p for p in points if isinstance(p, Note)]
    assert len(notes) == 1 and notes[0].tag == EVENTS_TAG and notes[0].text.startswith("pivot: phase 1 from step 2")


def test_a_fork_is_noted_where_its_own_steps_begin(tmp_path):
    append(tmp_path, step(1, inherited=True), step(2, inherited=True), step(3))
    notes = [p for p in RunRecords(RunDir(tmp_path)).poll() if isinstance(p, Note)]
    assert [(n.step, n.text) for n in notes] == [(3, "fork: this run continues from step 2")]


def test_garbage_lines_are_skipped(tmp_path):
    append(tmp_path, step(1), b"not json\n", b'{"type": "step"}\n', step(2))
    assert steps(RunRecords(RunDir(tmp_path)).poll()) == [1, 2]


def test_the_frozen_experiment_first_then_never_again(tmp_path):
    (tmp_path / "experiment.json").write_text('{"name": "x"}')
    append(tmp_path, step(1))
    records = RunRecords(RunDir(tmp_path))
    first = records.poll()
    assert isinstance(first[0], Note) and first[0].tag == "config" and '"name": "x"' in first[0].text
    append(tmp_path, step(2))
    assert [type(p) for p in records.poll()] == [StepPoint]

"""`.loss.json` (formats/loss_log.py): torn lines, the last entry per step, replay comparison, the index."""

from __future__ import annotations

import json

from proxy.formats.loss_log import EvalEntry, LossLogIndex, LossLogWriter, StepEntry, compare_replayed, read_tail


def step(n: int, loss: float = 4.0, segment: int = 1, phase: int = 0) -> StepEntry:
    return StepEntry(
        step=n,
        loss=loss,
        lr=1e-3,
        grad_norm=1.5,
        tokens=512 * n,
        time=1.0 * n,
        ms=10.0,
        arms={"a": loss, "b": loss + 0.5},
        mixture={"a": 0.25, "b": 0.75},
        phase=phase,
        segment=segment,
    )


def test_torn_last_line_is_skipped_and_never_glued(tmp_path):
    path = tmp_path / ".loss.json"
    w = LossLogWriter(path)
    w.append(step(1))
    w.append(step(2))
    w.close()
    whole = path.read_bytes()
    path.write_bytes(whole + json.dumps(step(3).to_dict()).encode()[:40])  # a crash mid-line
    index = LossLogIndex.load(path)
    assert sorted(index.steps) == [1, 2] and index.skipped == 1

    w = LossLogWriter(path)  # reopening puts the fragment on a line of its own
    w.append(step(3, loss=3.0, segment=2))
    w.append(EvalEntry(step=3, loss=3.5, arms={"a": 3.4, "b": 3.6}, time=5.0, phase=0, segment=2))
    w.close()
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b"" and len(lines) == 6
    index = LossLogIndex.load(path)
    assert sorted(index.steps) == [1, 2, 3] and index.skipped == 1 and index.max_segment == 2
    assert index.step(3).loss == 3.0 and index.eval(3).loss == 3.5
    assert [e.step for e in read_tail(path)] == [1, 2, 3, 3]


def test_last_entry_per_step_wins_and_phase_coverage(tmp_path):
    path = tmp_path / ".loss.json"
    w = LossLogWriter(path)
    for n in range(1, 6):
        w.append(step(n, segment=1))
    for n in range(3, 5):
        w.append(step(n, loss=9.0, segment=2))
    w.close()
    index = LossLogIndex.load(path)
    assert [e.loss for _, e in index.iter_steps(1, 5)] == [4.0, 4.0, 9.0, 9.0, 4.0]
    assert index.gap(0, 0, 5) == (0, None) and index.gap(0, 0, 7) == (2, 6)
    assert index.gap(1, 2, 4) == (2, 3)  # entries of another phase do not cover a phase
    assert index.gap(0, 0, 3_000_000_000) == (3_000_000_000 - 5, 6)  # no list of three billion steps


def test_compare_replayed_is_exact():
    a = step(7)
    assert compare_replayed(a, step(7, segment=2)) is None
    b = step(7, segment=2)
    b.loss = float.fromhex(a.loss.hex()[:-1] + "1")  # one ulp away
    b.mixture = {"a": 0.25000000000000006, "b": 0.75}
    m = compare_replayed(a, b)
    assert m.fields == ["loss", "mixture"] and m.recorded_segment == 1 and m.replayed_segment == 2
    assert "step 7" in m.message()


def test_the_index_names_the_first_diverged_step_of_a_phase_and_forgets_one_trained_again(tmp_path):
    """The resume rule passes over a checkpoint trained after a diverged step of its phase (a frame in flight
    when the proxy saw the loss): the index keeps the losses that may not be sane, by step, last entry wins."""
    from proxy.divergence import sane_loss  # noqa: PLC0415

    log = tmp_path / ".loss.json"
    writer = LossLogWriter(log)

    def step(s, loss, phase=0, segment=1):
        writer.append(
            StepEntry(
                step=s,
                loss=loss,
                lr=0.1,
                grad_norm=1.0,
                tokens=s,
                time=0.0,
                ms=1.0,
                arms={"a": loss},
                mixture={"a": 1.0},
                phase=phase,
                segment=segment,
            )
        )

    for s, loss in enumerate([5.7, 5.6, 6.2, 8.2, 6.6, 10.3, 8.8, 15.79, 6.59], 1):
        step(s, loss)
    writer.fsync()
    sane = lambda loss: sane_loss(loss, 300)  # noqa: E731 - the bound 2 ln 300 = 11.41
    index = LossLogIndex.load(log)
    assert set(index.high_losses) == {8}
    assert index.first_diverged(0, 0, 9, sane) == 8 and index.first_diverged(0, 0, 7, sane) is None
    assert index.first_diverged(1, 0, 9, sane) is None  # another phase's steps are not this one's lineage
    assert index.first_diverged(0, 0, 9, lambda loss: sane_loss(loss, 65536)) is None  # 15.79 is sane at V=65536
    step(8, 7.5, segment=2)  # relaunched with a lower lr: step 8 trained again, sane
    step(9, 12.0, segment=2)
    writer.close()
    index = LossLogIndex.load(log)
    assert index.first_diverged(0, 0, 9, sane) == 9 and 8 not in index.high_losses

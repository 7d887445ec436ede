"""Checkpoints written in the background (ENGINE.md "Checkpoints"): the step loop only snapshots
the state, a writer thread writes, fsyncs and renames the file while training goes on, and the
`ckpt` event comes when the file is durable. One write is in flight at a time; STOP, EOF and
SIGTERM wait for it; a kill at any moment leaves the newest complete checkpoint valid and a
resume bit-exact; a failed background write ends the run as a synchronous one did (exit 5).

The writes are made slow (or made to fail late) by tests/engine/fsync_shim.c, preloaded into the
engine: every fsync sleeps DELAY_MS first, so a write takes at least 2 * DELAY_MS, far longer
than a few TINY steps on one thread, even on a busy machine."""

from __future__ import annotations

import signal
import time

from harness.data import make_shard, train_frames
from harness.engine import event_path, initial_checkpoint, parse_events, run_once
from harness.fsync_shim import shim_env
from harness.shape import proxy_args, standalone_args
from proxy.formats import frames
from proxy.formats.checkpoint import list_checkpoints, read_checkpoint, verify_checkpoint

from .conftest import TINY

DELAY_MS = 400
SLOW_MS = 1000  # for the tests that act while a write must still be in flight


def proxy_mode(ckpt_dir, *extra) -> list[str]:
    return proxy_args(TINY, ckpt_dir, "--threads", 1, *extra)


def temps(ckpt_dir) -> list[str]:
    return sorted(p.name for p in ckpt_dir.iterdir() if p.name.endswith(".bin.tmp")) if ckpt_dir.exists() else []


def wait_for_temp(ckpt_dir, step: int, timeout: float = 10.0) -> bool:
    """Whether step's temp file appears (its write has begun) within timeout seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if f".step_{step:06d}.bin.tmp" in temps(ckpt_dir):
            return True
        time.sleep(0.002)
    return False


def losses(events) -> dict[int, tuple[float, float]]:
    return {e["step"]: (e["loss"], e["grad_norm"]) for e in events if e.kind == "step"}


def test_training_goes_on_while_a_checkpoint_is_written(engine_bin, run_engine, tmp_path, fsync_shim):
    cfg = TINY.but(steps=20, threads=1)
    shard = make_shard(tmp_path / "d.tok", cfg.vocab)
    ref = run_once(engine_bin, standalone_args(cfg, shard, tmp_path / "ref", 5), cwd=tmp_path)
    assert ref.returncode == 0, ref.stderr.decode()

    ck = tmp_path / "ck"
    eng = run_engine(standalone_args(cfg, shard, ck, 5), env=shim_env(fsync_shim, DELAY_MS))
    on_arrival = {}  # step -> (file verifies, its size, temp file still there) when its ckpt event arrives
    while (ev := eng.next_event()) is not None:
        if ev.kind == "ckpt":
            path = event_path(ev, eng)
            on_arrival[ev["step"]] = (
                path.is_file() and verify_checkpoint(path) is None,
                path.stat().st_size if path.is_file() else None,
                f".step_{ev['step']:06d}.bin.tmp" in temps(ck),
            )
    assert eng.proc.wait(timeout=60) == 0, eng.stderr

    ckpts = eng.of("ckpt")
    assert [(c["step"], c["reason"]) for c in ckpts] == [(s, "periodic") for s in (5, 10, 15, 20)]
    order = [(e.kind, e["step"]) for e in eng.events if e.kind in ("step", "ckpt")]
    for k in (5, 10, 15):  # training went on while step k's file was written
        assert order.index(("step", k + 1)) < order.index(("ckpt", k)), order
    for c in ckpts:
        assert on_arrival[c["step"]] == (True, c["bytes"], False), (
            f"ckpt event for step {c['step']} before its file was complete and in place: {on_arrival[c['step']]}"
        )
        assert c["ms"] >= 2 * DELAY_MS, f"ms is the write's time (two fsyncs of {DELAY_MS} ms): {c.fields}"
        assert c["snapshot_ms"] < DELAY_MS, c.fields
    for c in ckpts[1:]:  # each waited for its predecessor, in flight for >= 2 * DELAY_MS, five steps before
        assert c["wait_ms"] >= 100, f"step {c['step']} did not wait for the write before it: {c.fields}"
    assert [e.kind for e in eng.events[-2:]] == ["ckpt", "exit"]
    # the same losses and files as a run whose writes are fast
    assert losses(eng.events) == losses(parse_events(ref.stdout))
    for s in (5, 10, 15, 20):
        name = f"step_{s:06d}.bin"
        assert (ck / name).read_bytes() == (tmp_path / "ref" / name).read_bytes(), name
    assert temps(ck) == []


def test_sigkill_during_a_background_write_then_resume_is_bit_exact(engine_bin, run_engine, tmp_path, fsync_shim):
    cfg = TINY.but(steps=30, threads=1)
    shard = make_shard(tmp_path / "d.tok", cfg.vocab)
    ref = run_once(engine_bin, standalone_args(cfg, shard, tmp_path / "ref", 10), cwd=tmp_path)
    assert ref.returncode == 0, ref.stderr.decode()
    straight = losses(parse_events(ref.stdout))

    ck = tmp_path / "ck"
    eng = run_engine(standalone_args(cfg, shard, ck, 10), env=shim_env(fsync_shim, SLOW_MS))
    eng.wait_for("ckpt", step=10)
    eng.wait_for("step", step=22)  # step 20's write was handed over two steps ago and takes >= 2 s
    assert wait_for_temp(ck, 20) and not (ck / "step_000020.bin").exists(), "the kill must land inside the write"
    eng.send_signal(signal.SIGKILL)
    eng.proc.wait(timeout=60)
    assert verify_checkpoint(ck / "step_000010.bin") is None
    assert [p.name for p in list_checkpoints(ck)] == ["step_000010.bin"]
    first = losses(eng.events)

    res = run_once(engine_bin, standalone_args(cfg, shard, ck, 10, "--resume", "latest"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr.decode()
    events = parse_events(res.stdout)
    assert next(e for e in events if e.kind == "ready")["step"] == 10
    assert "removed stale temp file" in res.stderr.decode() and temps(ck) == []
    got = {**first, **losses(events)}
    assert got == straight, "losses after the resume differ from the uninterrupted run's"
    for s in (20, 30):
        name = f"step_{s:06d}.bin"
        assert (ck / name).read_bytes() == (tmp_path / "ref" / name).read_bytes(), name


def test_stop_eof_and_sigterm_wait_for_the_write_in_flight(run_engine, tmp_path, fsync_shim):
    for how, reason in (("stop", "stop"), ("eof", "eof"), ("sigterm", "signal")):
        ck = tmp_path / how
        eng = run_engine(proxy_mode(ck), env=shim_env(fsync_shim, SLOW_MS))
        eng.wait_for("ready")
        (s1, t1, g1), (s2, t2, g2) = train_frames(TINY, 1, 2)
        eng.train(s1, t1, g1)
        eng.send(frames.checkpoint_frame())
        eng.train(s2, t2, g2)
        eng.wait_for("step", step=2)
        assert wait_for_temp(ck, 1) and not (ck / "step_000001.bin").exists(), (
            f"{how}: step 1's write should still be in flight"
        )
        if how == "stop":
            eng.send(frames.stop_frame())
        elif how == "eof":
            eng.close_stdin()
        else:
            eng.send_signal(signal.SIGTERM)
        assert eng.finish() == 0, eng.stderr
        assert [(c["step"], c["reason"]) for c in eng.of("ckpt")] == [(1, "frame"), (2, reason)], how
        assert eng.events[-1].kind == "exit" and eng.events[-1]["reason"] == reason, eng.events[-1]
        assert [p.name for p in list_checkpoints(ck)] == ["step_000002.bin", "step_000001.bin"], how
        assert all(verify_checkpoint(p) is None for p in list_checkpoints(ck)) and temps(ck) == [], how
        assert read_checkpoint(ck / "step_000001.bin").step == 1


def test_a_write_that_finishes_while_idle_is_announced_at_once(run_engine, tmp_path, fsync_shim):
    """The proxy may wait for a ckpt event before it sends more (a pivot): the engine must not sit in
    ppoll with a finished write unreported."""
    ck = tmp_path / "ck"
    eng = run_engine(proxy_mode(ck), env=shim_env(fsync_shim, DELAY_MS))
    eng.wait_for("ready")
    eng.train(*train_frames(TINY, 1, 1)[0])
    eng.send(frames.checkpoint_frame())
    c = eng.wait_for("ckpt", timeout=10 * DELAY_MS / 1000)  # nothing more is sent meanwhile
    assert (c["step"], c["reason"]) == (1, "frame") and verify_checkpoint(ck / "step_000001.bin") is None
    eng.send(frames.stop_frame())
    assert eng.finish() == 0, eng.stderr
    assert [c["step"] for c in eng.of("ckpt")] == [1], "step 1 is saved: STOP writes nothing more"


def test_a_failed_background_write_exits_5_and_keeps_the_previous_checkpoint(
    engine_bin, run_engine, tmp_path, fsync_shim
):
    """The file's fsync fails (EIO) after DELAY_MS, while training goes on: the run ends as a failed
    synchronous write ended it, with exit 5 and one line, the previous checkpoint intact, no partial file."""
    cfg = TINY.but(steps=1000, threads=1)
    ck = tmp_path / "ck"
    prev = initial_checkpoint(engine_bin, cfg, ck)
    before = (prev.read_bytes(), prev.stat().st_mtime_ns)
    shard = make_shard(tmp_path / "d.tok", cfg.vocab)
    eng = run_engine(
        standalone_args(cfg, shard, ck, 5, "--resume", "latest"), env=shim_env(fsync_shim, DELAY_MS, fail=True)
    )
    assert eng.finish() == 5, eng.stderr
    err = eng.stderr.splitlines()
    assert len(err) == 1 and err[0].startswith("microgpt: error: checkpoint at step 5 failed (fsync"), err
    assert "previous checkpoints are intact" in err[0]
    assert eng.events[-1].kind == "error" and eng.events[-1]["code"] == 5, eng.events[-1]
    assert not eng.of("ckpt")
    trained = [e["step"] for e in eng.of("step")]
    assert trained[-1] > 5, "training should have gone on while step 5 was being written"
    assert trained[-1] <= 10, "the next checkpoint (step 10) waits for the failed write and reports it"
    assert [p.name for p in list_checkpoints(ck)] == ["step_000000.bin"] and temps(ck) == []
    assert (prev.read_bytes(), prev.stat().st_mtime_ns) == before


def test_an_error_while_a_write_is_in_flight_lets_it_finish_and_announces_it_first(engine_bin, tmp_path, fsync_shim):
    """A protocol error ends the run; the checkpoint being written completes first and is announced,
    so no file on disk goes unannounced, no temp file stays, and the error is the last event."""
    ck = tmp_path / "ck"
    ((s, tok, grp),) = train_frames(TINY, 1, 1)
    stdin = frames.train_frame(s, tok, grp) + frames.checkpoint_frame() + b"XGF1" + bytes(28)
    res = run_once(engine_bin, proxy_mode(ck), cwd=tmp_path, stdin=stdin, env=shim_env(fsync_shim, DELAY_MS))
    assert res.returncode == 4, res.stderr.decode()
    assert res.stderr.decode().splitlines() == ["microgpt: error: malformed frame: bad magic"]
    events = parse_events(res.stdout)
    assert [e.kind for e in events[-2:]] == ["ckpt", "error"], [e.kind for e in events]
    assert events[-2]["step"] == 1 and verify_checkpoint(ck / "step_000001.bin") is None
    assert [p.name for p in list_checkpoints(ck)] == ["step_000001.bin"] and temps(ck) == []

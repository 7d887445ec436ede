"""Signals, EOF and the CHECKPOINT/STOP frames (ARCHITECTURE.md "Signals", FORMATS.md "Engine frames"),
and crash safety of checkpoint writes (FORMATS.md "Writing")."""

from __future__ import annotations

import os
import random
import resource
import signal
import subprocess
import time

import numpy as np

from harness.data import make_shard, train_frames
from harness.engine import event_path, initial_checkpoint, parse_events
from harness.shape import Shape, proxy_args
from proxy.formats import frames
from proxy.formats.checkpoint import list_checkpoints, read_checkpoint, verify_checkpoint
from proxy.formats.engine_cli import engine_args

from .conftest import TINY


def assert_only_complete_checkpoints(ckpt_dir, allow_tmp: bool):
    """Every step_*.bin verifies; anything else is a .step_*.bin.tmp (only if allowed)."""
    for p in ckpt_dir.iterdir():
        if p.name.startswith(".step_") and p.name.endswith(".bin.tmp"):
            assert allow_tmp, f"stale temp file {p.name} left after an engine start"
            continue
        assert p.name.startswith("step_") and p.name.endswith(".bin"), f"unexpected file in ckpt dir: {p.name}"
        assert verify_checkpoint(p) is None, verify_checkpoint(p)


def assert_one_checkpoint_and_exit(eng, step: int, reason: str) -> None:
    """The engine checkpointed once, at `step`, for `reason`, and exited at that step for the same reason."""
    assert [(e["step"], e["reason"]) for e in eng.of("ckpt")] == [(step, reason)]
    assert [(e["step"], e["reason"]) for e in eng.of("exit")] == [(step, reason)]


def fed(run_engine, cfg, ck, steps: int):
    """An engine in proxy mode, ready and sent the TRAIN frames of steps 1..`steps`, its checkpoints in `ck`."""
    eng = run_engine(proxy_args(cfg, ck))
    eng.wait_for("ready")
    for s, tok, grp in train_frames(cfg, 1, steps):
        eng.train(s, tok, grp)
    return eng


def after_one_step(run_engine, cfg, ck):
    """An engine in proxy mode that has trained and reported step 1, its checkpoints in `ck`."""
    eng = fed(run_engine, cfg, ck, 1)
    eng.wait_for("step", step=1)
    return eng


def test_sigusr1_checkpoints_and_training_goes_on(run_engine, tmp_path):
    cfg = TINY.but(steps=1_000_000)
    shard = make_shard(tmp_path / "d.tok", cfg.vocab)
    ck = tmp_path / "ck"
    eng = run_engine(engine_args(ck, data=shard, ckpt_every=0, settings=cfg.flags()))
    before = eng.wait_for("step")["step"]
    eng.send_signal(signal.SIGUSR1)
    c = eng.wait_for("ckpt")
    assert c["reason"] == "sigusr1", c.fields
    # The engine checkpoints the step it is at when it handles the signal (between steps); the
    # file is written in the background while training goes on, so the ckpt event may come after
    # later step events: the step it holds is one trained no earlier than the signal was sent.
    last = eng.of("step")[-1]["step"]
    assert before <= c["step"] <= last, (
        f"SIGUSR1 (sent after step {before}) checkpoint at {c['step']}, last step {last}"
    )
    path = event_path(c, eng)
    assert path.name == f"step_{c['step']:06d}.bin" and verify_checkpoint(path) is None
    assert c["bytes"] == path.stat().st_size
    eng.wait_for("step", step=last + 3)  # training goes on
    assert eng.proc.poll() is None
    eng.send_signal(signal.SIGTERM)
    assert eng.finish() == 0, eng.stderr
    assert [e["reason"] for e in eng.of("exit")] == ["signal"]
    assert eng.of("ckpt")[-1]["reason"] == "signal"


def test_a_sigusr1_checkpoint_changes_no_result(run_engine, tmp_path):
    """Two runs of the same frames are bit-identical, and a third, sent SIGUSR1 once step 6 is trained,
    checkpoints step 6 and goes on to the very losses of the two that were never signalled."""
    cfg = TINY.but(steps=20)
    data = train_frames(cfg, 1, cfg.steps, seed=8)
    straight = []
    for name in ("straight", "again"):
        eng = run_engine(proxy_args(cfg, tmp_path / name))
        for s, tok, grp in data:
            eng.train(s, tok, grp)
        eng.close_stdin()
        assert eng.finish() == 0, eng.stderr
        straight.append(eng.losses())
    assert sorted(straight[0]) == list(range(1, cfg.steps + 1))
    assert straight[1] == straight[0], "two runs of the same frames differ"

    ck = tmp_path / "ck"
    eng = run_engine(proxy_args(cfg, ck))
    for s, tok, grp in data[:6]:
        eng.train(s, tok, grp)
    eng.wait_for("step", step=6)
    eng.send_signal(signal.SIGUSR1)
    ev = eng.wait_for("ckpt")
    assert ev["step"] == 6 and ev["reason"] == "sigusr1", ev.fields
    for s, tok, grp in data[6:]:
        eng.train(s, tok, grp)
    eng.close_stdin()
    assert eng.finish() == 0, eng.stderr
    assert eng.losses() == straight[0], "a SIGUSR1 checkpoint changed the losses after it"
    assert read_checkpoint(ck / "step_000006.bin").step == 6


def test_sigusr1_while_idle_in_proxy_mode(run_engine, tmp_path):
    """A proxy that sends SIGUSR1 and waits for the checkpoint before feeding more frames
    (the pivot) must get it: the engine must not sleep in read() until the next frame."""
    cfg = TINY
    ck = tmp_path / "ck"
    eng = fed(run_engine, cfg, ck, 2)
    eng.wait_for("step", step=2)
    eng.send_signal(signal.SIGUSR1)
    c = eng.wait_for("ckpt", timeout=20)
    assert (c["step"], c["reason"]) == (2, "sigusr1"), c.fields
    for s, tok, grp in train_frames(cfg, 3, 1):  # still taking frames
        eng.train(s, tok, grp)
    eng.wait_for("step", step=3)
    eng.send_signal(signal.SIGTERM)
    c = eng.wait_for("ckpt", timeout=20)
    assert (c["step"], c["reason"]) == (3, "signal"), c.fields
    assert eng.finish() == 0, eng.stderr
    assert [e["reason"] for e in eng.of("exit")] == ["signal"]
    assert [p.name for p in list_checkpoints(ck)] == ["step_000003.bin", "step_000002.bin"]


def test_eof_checkpoints_and_exits_0(run_engine, tmp_path):
    cfg = TINY
    ck = tmp_path / "ck"
    eng = fed(run_engine, cfg, ck, 2)
    eng.close_stdin()
    assert eng.finish() == 0, eng.stderr
    assert_one_checkpoint_and_exit(eng, 2, "eof")
    assert eng.events[-1].kind == "exit"
    ckpt = read_checkpoint(ck / "step_000002.bin")
    assert ckpt.step == 2 and verify_checkpoint(ck / "step_000002.bin") is None


def test_checkpoint_frame_then_stop(run_engine, tmp_path):
    cfg = TINY
    ck = tmp_path / "ck"
    eng = run_engine(proxy_args(cfg, ck))
    eng.wait_for("ready")
    data = train_frames(cfg, 1, 3)
    eng.train(*data[0])
    eng.send(frames.checkpoint_frame())
    c = eng.wait_for("ckpt")
    assert (c["step"], c["reason"]) == (1, "frame"), c.fields
    assert verify_checkpoint(ck / "step_000001.bin") is None
    eng.train(*data[1])  # goes on after a CHECKPOINT frame
    eng.send(frames.checkpoint_frame())
    assert eng.wait_for("ckpt")["step"] == 2
    eng.send(frames.stop_frame())  # step 2 is saved: STOP must not write it again
    assert eng.finish() == 0, eng.stderr
    assert [(e["step"], e["reason"]) for e in eng.of("ckpt")] == [(1, "frame"), (2, "frame")]
    assert [(e["step"], e["reason"]) for e in eng.of("exit")] == [(2, "stop")]
    assert [p.name for p in list_checkpoints(ck)] == ["step_000002.bin", "step_000001.bin"]


def test_stop_frame_checkpoints_unsaved_step(run_engine, tmp_path):
    cfg = TINY
    ck = tmp_path / "ck"
    eng = fed(run_engine, cfg, ck, 2)
    eng.send(frames.stop_frame())
    try:
        eng.send(b"this is never read as a frame")  # nothing after STOP is consumed
    except BrokenPipeError:
        pass
    assert eng.finish() == 0, eng.stderr
    assert_one_checkpoint_and_exit(eng, 2, "stop")
    assert verify_checkpoint(ck / "step_000002.bin") is None


def test_sigterm_while_idle_in_proxy_mode(run_engine, tmp_path):
    """No step in flight: SIGTERM checkpoints and exits 0 promptly, without waiting for a frame."""
    cfg = TINY
    ck = tmp_path / "ck"
    eng = after_one_step(run_engine, cfg, ck)
    eng.send_signal(signal.SIGTERM)
    assert eng.finish(timeout=20) == 0, eng.stderr
    assert [(e["step"], e["reason"]) for e in eng.of("ckpt")] == [(1, "signal")]
    assert [e["reason"] for e in eng.of("exit")] == ["signal"]


# ---------------------------------------------------------------------------
# SIGKILL during checkpoint writes

# ~2.7M parameters: a 32 MB checkpoint, so a write (and its fsync) takes a while.
BIG = Shape(vocab=4096, ctx=32, dim=256, layers=2, heads=4, batch=1, steps=100, warmup=2)


def test_sigkill_during_checkpoint_write_keeps_previous_valid(run_engine, tmp_path):
    cfg = BIG
    ck = tmp_path / "ck"
    rng = random.Random(1234)

    eng = run_engine(proxy_args(cfg, ck))
    eng.wait_for("ready")
    eng.send(frames.checkpoint_frame())
    first = eng.wait_for("ckpt")
    eng.send(frames.stop_frame())
    assert eng.finish() == 0, eng.stderr
    base = ck / "step_000000.bin"
    base_bytes = base.read_bytes()
    write_s = max(first["ms"] / 1000.0, 0.001)

    killed_mid_write = 0
    for _attempt in range(5):
        eng = run_engine(proxy_args(cfg, ck, "--resume", "latest"))
        ready = eng.wait_for("ready")
        assert_only_complete_checkpoints(ck, allow_tmp=False)  # stale temp files are gone at start
        newest = list_checkpoints(ck)[0]
        assert ready["step"] == read_checkpoint(newest).step, (ready.fields, newest)
        s = ready["step"] + 1
        eng.train(s, *train_frames(cfg, s, 1)[0][1:])
        eng.wait_for("step", step=s)
        eng.send(frames.checkpoint_frame())
        # wait for the temp file to appear, then kill at a random moment of the write
        tmp = ck / f".step_{s:06d}.bin.tmp"
        deadline = time.monotonic() + 30
        while not tmp.exists() and eng.proc.poll() is None and time.monotonic() < deadline:
            if (ck / f"step_{s:06d}.bin").exists():
                break
            time.sleep(0.0002)
        time.sleep(rng.uniform(0, 0.8) * write_s)
        os.kill(eng.proc.pid, signal.SIGKILL)
        eng.proc.wait(timeout=30)
        if tmp.exists():
            killed_mid_write += 1
        assert_only_complete_checkpoints(ck, allow_tmp=True)
        assert verify_checkpoint(base) is None and base.read_bytes() == base_bytes
    assert killed_mid_write >= 1, (
        f"never caught a write in progress (write takes {write_s * 1000:.1f} ms); "
        "temp files named .step_NNNNNN.bin.tmp?"
    )

    # a final start cleans the temp files and resumes from the newest complete file
    eng = run_engine(proxy_args(cfg, ck, "--resume", "latest"))
    ready = eng.wait_for("ready")
    assert_only_complete_checkpoints(ck, allow_tmp=False)
    assert ready["step"] == read_checkpoint(list_checkpoints(ck)[0]).step
    eng.close_stdin()
    assert eng.finish() == 0, eng.stderr


def test_failed_checkpoint_write_exits_5_previous_intact(engine_bin, run_engine, tmp_path):
    """A write that fails (here: the file size limit, as a full disk would) exits 5, says so
    once, and leaves the previous checkpoint intact and no partial step_*.bin behind."""
    cfg = TINY
    ck = tmp_path / "ck"
    prev = initial_checkpoint(engine_bin, cfg, ck)
    before = (prev.read_bytes(), prev.stat().st_mtime_ns)
    limit = prev.stat().st_size // 3

    def small_disk():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() then fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    stdin = b"".join(frames.train_frame(s, t, g) for s, t, g in train_frames(cfg, 1, 2)) + frames.checkpoint_frame()
    res = subprocess.run(
        [str(engine_bin), *proxy_args(cfg, ck, "--resume", "latest")],
        input=stdin,
        capture_output=True,
        cwd=tmp_path,
        timeout=60,
        preexec_fn=small_disk,
    )
    err = res.stderr.decode()
    assert res.returncode == 5, (res.returncode, err)
    assert len(err.splitlines()) == 1 and err.startswith("microgpt"), err
    errors = [e for e in parse_events(res.stdout) if e.kind == "error"]
    assert len(errors) == 1 and errors[0]["code"] == 5, errors
    assert (prev.read_bytes(), prev.stat().st_mtime_ns) == before
    assert [p.name for p in list_checkpoints(ck)] == ["step_000000.bin"]
    assert_only_complete_checkpoints(ck, allow_tmp=True)


# ---------------------------------------------------------------------------
# A stop answered after the step in flight, not the frames queued behind it

# about 20-40 ms a step on this machine: steps long enough to freeze the engine inside one
QUEUED = Shape(vocab=256, ctx=64, dim=64, layers=2, heads=4, batch=8, steps=1000, warmup=5)


def _frozen_at_a_step(eng, cfg: Shape, queued: int):
    """Feed `queued` TRAIN frames at once, let a few steps pass, SIGSTOP the engine; the last step it reported
    once frozen (every event it wrote before freezing has been read)."""
    for s, tok, grp in train_frames(cfg, 1, queued):
        eng.train(s, tok, grp)
    eng.wait_for("step", step=3)
    eng.send_signal(signal.SIGSTOP)
    while True:
        try:
            ev = eng.next_event(timeout=1.0)
        except AssertionError:  # nothing more within 1 s: all it wrote has been read
            break
        assert ev is not None and ev.kind in ("step", "ckpt"), ev
    return eng.of("step")[-1]["step"]


def test_stop_latency_is_one_step_whatever_is_queued(run_engine, tmp_path):
    """SIGTERM with 40 TRAIN frames queued in the pipe: the engine finishes the step it is computing (at
    most one step after the last one it reported), checkpoints that step and exits 0; the frames behind it
    are neither trained nor an error. Measured in steps: trained after the signal <= 1."""
    cfg = QUEUED
    ck = tmp_path / "ck"
    eng = run_engine(proxy_args(cfg, ck))
    eng.wait_for("ready")
    reported = _frozen_at_a_step(eng, cfg, queued=40)
    eng.send_signal(signal.SIGTERM)
    eng.send_signal(signal.SIGCONT)
    assert eng.finish(timeout=30) == 0, eng.stderr
    last = eng.of("step")[-1]["step"]
    latency = last - reported
    assert 0 <= latency <= 1, f"trained {latency} steps after SIGTERM (it had reported step {reported})"
    assert reported + 2 < 40, "the engine reached the end of the queue before the signal: nothing was tested"
    assert_one_checkpoint_and_exit(eng, last, "signal")
    assert not eng.of("error")
    assert verify_checkpoint(ck / f"step_{last:06d}.bin") is None


def test_a_stop_interrupts_a_long_sample_audit(run_engine, tmp_path):
    """A SAMPLE frame that would take minutes (256 completions of 4096 tokens, most of them past the context,
    each recomputing its window): SIGTERM is looked at between sampled tokens, so the engine abandons the
    audit (no `sample` event), checkpoints the last completed step and exits within a second of its own CPU
    time (on a loaded machine the wall time also counts the time it waited for a core)."""
    cfg = QUEUED
    ck = tmp_path / "ck"
    eng = fed(run_engine, cfg, ck, 2)
    eng.wait_for("step", step=2)
    prompts = [frames.SamplePrompt([1 + i, 2, 3], count=16, seed=i) for i in range(16)]
    eng.send(frames.sample_batch_frame(7, prompts, 4096, temperature=0.8, top_k=10))
    eng.train(*train_frames(cfg, 3, 1)[0])  # queued behind the audit: never trained
    time.sleep(1.0)  # well inside the audit
    assert eng.proc.poll() is None
    t0, cpu0 = time.monotonic(), eng.cpu_seconds()
    eng.send_signal(signal.SIGTERM)
    eng.wait_for("ckpt", timeout=30)
    # the answer: the audit given up and the checkpoint begun and written, in the engine's own CPU time
    # (finishing the audit would take minutes of it)
    worked = eng.cpu_seconds() - cpu0
    wall = time.monotonic() - t0
    assert worked < 1.0, f"the engine worked {worked:.2f} s of CPU after the stop ({wall:.2f} s wall)"
    assert eng.finish(timeout=30) == 0, eng.stderr
    assert not eng.of("sample") and not eng.of("error")
    assert_one_checkpoint_and_exit(eng, 2, "signal")
    assert verify_checkpoint(ck / "step_000002.bin") is None


def test_a_stop_interrupts_a_long_evaluation(run_engine, tmp_path):
    """An EVAL frame of many rows is abandoned between two forward passes, as a sample audit is."""
    cfg = QUEUED
    ck = tmp_path / "ck"
    eng = after_one_step(run_engine, cfg, ck)
    # 65,536 rows take many seconds on any CPU (4,096 took 0.8 s on a fast one, so finished before the stop).
    n_rows = 65536
    rows = np.random.default_rng(3).integers(0, cfg.vocab, size=(n_rows, cfg.ctx + 1), dtype=np.uint16)
    eng.send(frames.eval_frame(9, rows, np.zeros(n_rows, np.uint16)))
    time.sleep(0.5)
    assert eng.proc.poll() is None and not eng.of("eval")
    t0, cpu0 = time.monotonic(), eng.cpu_seconds()
    eng.send_signal(signal.SIGTERM)
    eng.wait_for("ckpt", timeout=30)
    # one forward pass of 8 rows, then the checkpoint: the engine's own CPU time (the rest of the evaluation
    # would take many seconds of it), whatever else the machine runs
    worked = eng.cpu_seconds() - cpu0
    assert worked < 1.0, f"the engine worked {worked:.2f} s of CPU after the stop ({time.monotonic() - t0:.2f} s wall)"
    assert eng.finish(timeout=30) == 0, eng.stderr
    assert not eng.of("eval") and not eng.of("error")
    assert [(e["step"], e["reason"]) for e in eng.of("ckpt")] == [(1, "signal")]


def test_version_flag(engine_bin):
    out = subprocess.run([str(engine_bin), "--version"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and out.stderr == ""
    line = out.stdout.strip()
    assert line.startswith("microgpt engine 0.1.0 (") and "source " in line, line
    assert "--version" in subprocess.run([str(engine_bin), "--help"], capture_output=True, text=True).stdout

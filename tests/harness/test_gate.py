"""The frame gate itself (harness/gate.py), on the engine under test in proxy mode: it holds TRAIN
frames above the limit and nothing else, lets a STOP and an EOF through, keeps the engine's pid
and its results bit for bit, says where a launch starts, and ends with the engine."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from harness.data import train_frames
from harness.engine import Engine, Hang
from harness.engines import engine_under_test
from harness.gate import Gate
from harness.shape import Shape, proxy_args
from proxy.formats import frames

ENGINE = engine_under_test()
QUIET_S = 1.0  # a held tiny engine (Shape()) would have sent its next step in well under this


@pytest.fixture(scope="module")
def engine_path() -> Path:
    if ENGINE.problem:
        pytest.fail(ENGINE.problem, pytrace=False)
    return ENGINE.path


def assert_held(eng) -> None:
    """No event arrives while the gate holds the next TRAIN frame."""
    with pytest.raises(Hang, match="no output"):
        ev = eng.next_event(QUIET_S)
        pytest.fail(f"the gate let an event through: {ev.fields}")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def wait_gone(pid: int, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while alive(pid):
        assert time.monotonic() < end, f"process {pid} still running {timeout:.0f}s after its engine ended"
        time.sleep(0.01)


def start(engine_path, gate: Gate | None, cfg, workdir: Path):
    binary = Path(gate.engine_flag) if gate else engine_path
    eng = Engine(binary, proxy_args(cfg, workdir / "ck"), workdir)
    eng.wait_for("ready", step=0)
    for s, tokens, groups in train_frames(cfg, 1, cfg.steps):
        eng.train(s, tokens, groups)
    return eng


def test_gate_holds_train_frames_and_a_stop_passes(engine_path, tmp_path):
    cfg = Shape().but(steps=6)
    gate = Gate(tmp_path / "gate", engine_path)
    gate.hold_after(3)
    eng = start(engine_path, gate, cfg, tmp_path / "gated")
    try:
        eng.wait_for("step", step=3)
        assert_held(eng)
        [launch] = gate.launches()
        assert (launch.pid, launch.first_step) == (eng.proc.pid, 1)
        assert os.path.realpath(f"/proc/{eng.proc.pid}/exe") == os.path.realpath(engine_path)  # exec'd
        gate.hold_after(5)
        eng.wait_for("step", step=5)
        assert_held(eng)
        eng.send(frames.stop_frame())  # passes, with the held step 6 before it
        assert eng.finish() == 0, eng.stderr
    finally:
        eng.kill()
    assert [e["step"] for e in eng.of("step")] == [1, 2, 3, 4, 5, 6]
    assert [(e["step"], e["reason"]) for e in eng.of("exit")] == [(6, "stop")]
    wait_gone(launch.relay_pid)

    direct = start(engine_path, None, cfg, tmp_path / "direct")
    direct.send(frames.stop_frame())
    assert direct.finish() == 0, direct.stderr
    assert eng.losses() == direct.losses()
    assert (tmp_path / "gated" / "ck" / "step_000006.bin").read_bytes() == (
        tmp_path / "direct" / "ck" / "step_000006.bin"
    ).read_bytes()


def test_gate_passes_everything_at_eof(engine_path, tmp_path):
    cfg = Shape().but(steps=5)
    gate = Gate(tmp_path / "gate", engine_path)
    gate.hold_after(2)
    eng = start(engine_path, gate, cfg, tmp_path)
    try:
        eng.wait_for("step", step=2)
        assert_held(eng)
        eng.close_stdin()  # as a killed proxy would: the engine trains what was sent, checkpoints, exits
        assert eng.finish() == 0, eng.stderr
    finally:
        eng.kill()
    assert [e["step"] for e in eng.of("step")] == [1, 2, 3, 4, 5]
    assert [(e["step"], e["reason"]) for e in eng.of("exit")] == [(5, "eof")]


def test_relay_ends_with_a_killed_engine_and_launches_are_recorded(engine_path, tmp_path):
    cfg = Shape().but(steps=4)
    gate = Gate(tmp_path / "gate", engine_path)
    gate.hold_after(0)  # every launch waits at its first step
    first = start(engine_path, gate, cfg, tmp_path / "a")
    launch = gate.wait_launch(0, lambda: first.proc.poll() is None, 60)
    assert launch is not None and (launch.pid, launch.first_step) == (first.proc.pid, 1)
    assert_held(first)
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(30)
    wait_gone(launch.relay_pid)

    gate.open()
    second = start(engine_path, gate, cfg, tmp_path / "b")
    second.send(frames.stop_frame())
    assert second.finish() == 0, second.stderr
    assert [e["step"] for e in second.of("step")] == [1, 2, 3, 4]
    assert [(ln.pid, ln.first_step) for ln in gate.launches()] == [(first.proc.pid, 1), (second.proc.pid, 1)]


def test_a_checkpoint_request_waits_behind_held_steps_and_is_seen_arriving(engine_path, tmp_path):
    cfg = Shape().but(steps=5)
    gate = Gate(tmp_path / "gate", engine_path)
    gate.hold_after(2)
    eng = start(engine_path, gate, cfg, tmp_path)  # steps 1..5 sent, 3..5 held
    try:
        eng.wait_for("step", step=2)
        eng.send(frames.checkpoint_frame())  # behind the held steps: it must not overtake them
        got = gate.wait_frame(frames.CHECKPOINT, 0, lambda: eng.proc.poll() is None, 60)
        assert got is not None and got.pid == eng.proc.pid
        assert_held(eng)
        gate.hold_after(5)
        ck = eng.wait_for("ckpt")
        eng.send(frames.stop_frame())
        assert eng.finish() == 0, eng.stderr
    finally:
        eng.kill()
    assert (ck["step"], ck["reason"]) == (5, "frame")
    assert [e["step"] for e in eng.of("step")] == [1, 2, 3, 4, 5]

"""Whole-system bit-exact resume, and the replay comparison that guards it.

A run killed at random moments (the proxy's process group, the engine, or
both, SIGKILL) and relaunched with the same command each time must end with
the same per-step losses (last entry per step), mixtures and final weights,
Adam m and v, bit for bit, as a run never interrupted.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time

import pytest

from harness.gate import KILL_SLACK
from proxy.formats.checkpoint import checkpoint_step, list_checkpoints, verify_checkpoint

from .conftest import (
    Proxy,
    assert_same_checkpoint,
    engine_pid,
    last_steps,
    make_experiment,
    max_logged_step,
    pid_alive,
    run_args,
    run_cmd,
    state,
    wait_for,
)

MAX_STEPS = 160
TRAIN = dict(max_steps=MAX_STEPS, ckpt_every=20, eval_every=40, sample_every=40, keep_last=2, milestone_every=80)
COMPARED = ("loss", "grad_norm", "lr", "tokens", "arms", "mixture")


@pytest.fixture(scope="module")
def straight(engine, data_cache, tmp_path_factory):
    """The reference: the resume experiment run once, uninterrupted."""
    base = tmp_path_factory.mktemp("straight")
    exp = make_experiment(base, "RESUME", **TRAIN)
    proxy = Proxy(run_args(exp, base / "run"), data_cache).start()
    assert proxy.wait() == 0, proxy.output()
    return base / "run"


def assert_same_run(a, b) -> None:
    sa, sb = last_steps(a), last_steps(b)
    assert sorted(sa) == sorted(sb) == list(range(1, MAX_STEPS + 1))
    diffs = [(s, f) for s in sa for f in COMPARED if sa[s][f] != sb[s][f]]
    assert not diffs, f"steps differ: {diffs[:10]}"
    name = f"step_{MAX_STEPS:06d}.bin"
    assert_same_checkpoint(a / "checkpoints" / name, b / "checkpoints" / name)


def test_bit_exact_resume_after_random_kills(straight, gate, data_cache, tmp_path):
    rng = random.Random(20251122)
    exp = make_experiment(tmp_path, "RESUME", **TRAIN)
    run_dir = tmp_path / "run"
    args = run_args(exp, run_dir, engine=gate.engine_flag)
    targets = sorted(rng.sample(range(8, MAX_STEPS - 15), 3))
    modes = [rng.choice(["proxy-group", "engine", "both"]) for _ in targets]
    proxy = None
    for target, mode in zip(targets, modes, strict=False):
        gate.hold_after(target + KILL_SLACK)  # the kill lands at most KILL_SLACK steps past its target
        proxy = proxy or Proxy(args, data_cache).start()
        wait_for(lambda: max_logged_step(run_dir) >= target, 240, f"step {target}", proxy, poll=0.005)
        pid = engine_pid(run_dir)
        if mode in ("engine", "both"):
            os.kill(pid, signal.SIGKILL)
        if mode in ("proxy-group", "both"):
            proxy.kill_group()
            proxy.proc.wait(30)
            proxy = None  # the same command is relaunched once the gate is set for the next target
        else:  # the proxy restarts the engine by itself
            wait_for(lambda: engine_pid(run_dir) != pid, 60, "the engine's restart", proxy)
    gate.open()
    proxy = proxy or Proxy(args, data_cache).start()
    assert proxy.wait() == 0, proxy.output()

    assert_same_run(straight, run_dir)
    entries = [json.loads(line) for line in (run_dir / ".loss.json").read_bytes().split(b"\n") if line.strip()]
    assert max(e["segment"] for e in entries) >= 1 + len(targets)
    st = state(run_dir)
    assert st["status"] == "finished" and st["replay_mismatch_count"] == 0, st["replay_mismatches"]
    assert "determinism" not in proxy.stderr()
    # retention: the last 2, the milestone at 80, and at most the final segment's resume point
    steps = sorted(checkpoint_step(p) for p in list_checkpoints(run_dir / "checkpoints"))
    assert {80, MAX_STEPS - 20, MAX_STEPS} <= set(steps) and len(steps) <= 4, steps


def test_wall_clock_checkpoints_change_nothing_but_where_checkpoints_land(straight, gate, data_cache, tmp_path):
    """train.ckpt_every_seconds instead of ckpt_every: checkpoints land on timing-dependent steps,
    engine kills resume from whichever is newest, and the run still equals the straight one."""
    exp = make_experiment(tmp_path, "RESUME", **{**TRAIN, "ckpt_every": 0, "ckpt_every_seconds": 0.2})
    run_dir = tmp_path / "run"
    gate.hold_after(40 + KILL_SLACK)
    proxy = Proxy(run_args(exp, run_dir, engine=gate.engine_flag), data_cache).start()
    for target, then in ((40, 110 + KILL_SLACK), (110, None)):
        wait_for(lambda: max_logged_step(run_dir) >= target, 240, f"step {target}", proxy, poll=0.005)
        pid = engine_pid(run_dir)
        os.kill(pid, signal.SIGKILL)
        if then is None:
            gate.open()
        else:
            gate.hold_after(then)
        wait_for(lambda: engine_pid(run_dir) != pid, 60, "the engine's restart", proxy)
    assert proxy.wait() == 0, proxy.output()
    assert "; timed, write " in proxy.stdout(), "no checkpoint came from the clock"
    assert_same_run(straight, run_dir)
    st = state(run_dir)
    assert st["restarts"] == 2 and st["replay_mismatch_count"] == 0, st


def test_engine_crash_restarts_and_stays_exact(straight, gate, data_cache, tmp_path):
    exp = make_experiment(tmp_path, "RESUME", **TRAIN)
    run_dir = tmp_path / "run"
    gate.hold_after(50 + KILL_SLACK)
    proxy = Proxy(run_args(exp, run_dir, engine=gate.engine_flag), data_cache).start()
    wait_for(lambda: max_logged_step(run_dir) >= 50, 240, "step 50", proxy)
    first = engine_pid(run_dir)
    os.kill(first, signal.SIGKILL)
    gate.open()
    wait_for(lambda: engine_pid(run_dir) != first, 60, "a new engine", proxy)
    assert proxy.wait() == 0, proxy.output()
    assert "killed by SIGKILL" in proxy.stderr() and "restarting" in proxy.stderr()
    assert_same_run(straight, run_dir)
    st = state(run_dir)
    assert st["restarts"] == 1 and st["replay_mismatch_count"] == 0


def test_replayed_step_mismatch_is_reported(engine, gate, data_cache, tmp_path):
    exp = make_experiment(tmp_path, "PLANT", **TRAIN)
    run_dir = tmp_path / "run"
    args = run_args(exp, run_dir, engine=gate.engine_flag)
    gate.hold_after(45)  # logged past the checkpoint of step 40, and nowhere near the end
    proxy = Proxy(args, data_cache).start()
    wait_for(lambda: max_logged_step(run_dir) >= 45, 240, "step 45", proxy)
    # freeze the proxy, kill the engine (no EOF checkpoint), then the proxy: a crash
    os.killpg(proxy.proc.pid, signal.SIGSTOP)
    pid = engine_pid(run_dir)
    os.kill(pid, signal.SIGKILL)
    proxy.kill_group()
    proxy.proc.wait(30)
    wait_for(lambda: not pid_alive(pid), 30, "the engine to die")

    # plant a wrong loss at a step after the newest checkpoint
    newest = checkpoint_step(list_checkpoints(run_dir / "checkpoints")[0])
    logged = max_logged_step(run_dir)
    assert logged > newest, (logged, newest)
    planted = newest + 1
    path = run_dir / ".loss.json"
    lines = path.read_bytes().split(b"\n")
    for i in range(len(lines) - 1, -1, -1):
        try:
            entry = json.loads(lines[i])
        except ValueError:
            continue
        if entry.get("type") == "step" and entry["step"] == planted:
            entry["loss"] += 0.125
            lines[i] = json.dumps(entry).encode()
            break
    path.write_bytes(b"\n".join(lines))

    gate.open()
    proxy = Proxy(args, data_cache).start()
    assert proxy.wait() == 0, proxy.output()
    assert f"determinism: step {planted} " in proxy.stderr()
    st = state(run_dir)
    assert st["replay_mismatch_count"] == 1
    report = st["replay_mismatches"][0]
    assert report["step"] == planted and report["fields"] == ["loss"]
    assert report["recorded"]["loss"] == report["replayed"]["loss"] + 0.125
    # the re-trained entry wins; the run itself was not disturbed
    assert last_steps(run_dir)[planted]["loss"] == report["replayed"]["loss"]
    # a later relaunch keeps the report (the log, not .state.json, is the truth; reports carry over)
    status = json.loads(run_cmd(["status", "--run-dir", str(run_dir), "--json"], data_cache).stdout)
    assert status["replay_mismatches"] == 1


def test_a_stop_drops_the_queued_steps_and_the_resume_is_exact(straight, gate, data_cache, tmp_path):
    """A stop (SIGTERM to the proxy: Ctrl-C and `proxy stop` do the same) while the engine computes a step
    with the next one queued in its pipe (lag 2): the engine finishes the step in flight only, checkpoints it
    and exits; the relaunch sends the dropped frame again and the run equals the uninterrupted one bit for
    bit. The latency, in steps past the last one the engine had reported when the stop came: at most 1."""
    exp = make_experiment(tmp_path, "RESUME", **TRAIN)
    run_dir = tmp_path / "run"
    args = run_args(exp, run_dir, engine=gate.engine_flag)
    gate.hold_after(150)  # the run cannot finish before the test acts
    proxy = Proxy(args, data_cache).start()
    wait_for(lambda: max_logged_step(run_dir) >= 50, 240, "step 50", proxy, poll=0.005)
    pid = engine_pid(run_dir)
    os.kill(pid, signal.SIGSTOP)  # frozen inside a step, the next frame in its pipe
    time.sleep(1.0)  # the proxy logs every event the engine wrote before it froze
    reported = max_logged_step(run_dir)
    assert reported < 148, "the engine had run into the gate: no frame was queued behind its step"
    proxy.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: "stop requested" in proxy.stdout(), 30, "the stop request", proxy)
    os.kill(pid, signal.SIGCONT)
    assert proxy.wait(60) == 0, proxy.output()
    stopped = max_logged_step(run_dir)
    assert reported <= stopped <= reported + 1, f"reported step {reported} when stopped, trained to {stopped}"
    assert verify_checkpoint(run_dir / "checkpoints" / f"step_{stopped:06d}.bin") is None
    assert (
        f"stopped at step {stopped}; checkpoint {run_dir / 'checkpoints' / f'step_{stopped:06d}.bin'}" in proxy.stdout()
    )
    assert state(run_dir)["status"] == "stopped"

    gate.open()
    proxy = Proxy(args, data_cache).start()
    assert proxy.wait() == 0, proxy.output()
    assert f"starting from step_{stopped:06d}.bin" in proxy.stdout()
    assert_same_run(straight, run_dir)
    assert state(run_dir)["replay_mismatch_count"] == 0

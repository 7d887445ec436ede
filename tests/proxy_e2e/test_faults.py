"""Supervision under faults: crash loops, hung engines, signals, the lock, changed experiments, bad input."""

from __future__ import annotations

import json
import os
import signal

from proxy.formats import frames

from .conftest import (
    ENGINE,
    Proxy,
    engine_pid,
    last_steps,
    make_experiment,
    max_logged_step,
    one_line_error,
    pid_alive,
    run_args,
    run_cmd,
    state,
    wait_for,
)

TRAIN = dict(max_steps=200, ckpt_every=20, eval_every=50, sample_every=50, keep_last=2, milestone_every=0)


def test_crash_loop_stops_with_a_clear_message(engine, data_cache, tmp_path):
    exp = make_experiment(tmp_path, "LOOP", **TRAIN)
    bad = tmp_path / "bad-engine.sh"
    bad.write_text("#!/bin/sh\necho 'bad engine: giving up' >&2\nexit 1\n")
    bad.chmod(0o755)
    run_dir = tmp_path / "run"
    result = run_cmd(
        [
            "run",
            str(exp),
            "--run-dir",
            str(run_dir),
            "--no-dashboard",
            "--engine",
            str(bad),
            "--restart-backoff",
            "0.05",
        ],
        data_cache,
    )
    assert result.returncode == 3, result.stderr
    assert "crash loop" in result.stderr and "5 times" in result.stderr
    assert "bad engine: giving up" in result.stderr  # the engine's own last words
    assert "Traceback" not in result.stderr
    st = state(run_dir)
    assert st["status"] == "crashloop" and "5 times" in st["message"]
    assert (run_dir / "engine.log").read_text().count("bad engine: giving up") == 5


def test_engine_that_rejects_its_flags_is_fatal_at_once(engine, data_cache, tmp_path):
    exp = make_experiment(tmp_path, "USAGE", **TRAIN)
    bad = tmp_path / "usage-engine.sh"
    bad.write_text("#!/bin/sh\necho 'error: unknown flag --whatever' >&2\nexit 2\n")
    bad.chmod(0o755)
    result = run_cmd(
        ["run", str(exp), "--run-dir", str(tmp_path / "run"), "--no-dashboard", "--engine", str(bad)], data_cache
    )
    assert result.returncode == 1, result.stderr
    assert "engine cannot run: error: unknown flag --whatever" in result.stderr


def test_hung_engine_is_killed_and_replaced(engine, gate, data_cache, tmp_path):
    exp = make_experiment(tmp_path, "HANG", **TRAIN)
    run_dir = tmp_path / "run"
    gate.hold_after(30)  # the engine waits at step 30 for its SIGSTOP, however fast it is
    proxy = Proxy(run_args(exp, run_dir, "--hang-timeout", "5", engine=gate.engine_flag), data_cache).start()
    wait_for(lambda: max_logged_step(run_dir) >= 30, 240, "step 30", proxy)
    hung = engine_pid(run_dir)
    os.kill(hung, signal.SIGSTOP)
    gate.open()
    wait_for(lambda: engine_pid(run_dir) != hung, 60, "the hung engine's replacement", proxy)
    assert not pid_alive(hung)
    assert proxy.wait() == 0, proxy.output()
    assert "sent nothing for" in proxy.stderr() and "killing its process group" in proxy.stderr()
    assert sorted(last_steps(run_dir)) == list(range(1, TRAIN["max_steps"] + 1))
    st = state(run_dir)
    assert st["status"] == "finished" and st["restarts"] >= 1 and st["replay_mismatch_count"] == 0


def test_checkpoint_stop_signals_lock_and_relaunch(engine, gate, data_cache, tmp_path):
    # long enough never to finish while the test talks to it (it is stopped, never finished); no
    # periodic checkpoints, which could make the requested one a no-op (the step already saved).
    # The gate holds the engine a few steps past each point the test waits for: whatever its speed,
    # it is where the test expects when the test acts.
    exp = make_experiment(
        tmp_path, "SIGNALS", **{**TRAIN, "max_steps": 20000, "ckpt_every": 0, "eval_every": 100, "sample_every": 100}
    )
    run_dir = tmp_path / "run"
    args = run_args(exp, run_dir, engine=gate.engine_flag)
    gate.hold_after(25)
    proxy = Proxy(args, data_cache).start()
    wait_for(lambda: max_logged_step(run_dir) >= 25, 240, "step 25", proxy)

    # one proxy per run directory
    second = run_cmd(args, data_cache, timeout=60)
    line = one_line_error(second, 1)
    assert f"in use by proxy pid {proxy.proc.pid}" in line

    # status while running
    report = json.loads(run_cmd(["status", "--run-dir", str(run_dir), "--json"], data_cache).stdout)
    assert report["alive"] and report["proxy_pid"] == proxy.proc.pid and report["status"] == "running"
    assert report["engine"]["alive"] and report["mixture"]

    # `proxy checkpoint`: a checkpoint now, training continues (the CHECKPOINT frame waits at the gate
    # behind the steps in flight; ten more steps let it through)
    result = run_cmd(["checkpoint", "--run-dir", str(run_dir)], data_cache)
    assert result.returncode == 0, result.stderr
    gate.wait_frame(frames.CHECKPOINT, 0, proxy.running, 60)
    gate.hold_after(max_logged_step(run_dir) + 10)
    wait_for(lambda: "; frame, write " in proxy.stdout(), 60, "the requested checkpoint", proxy)

    # `proxy stop`: checkpoint, flush, exit 0
    result = run_cmd(["stop", "--run-dir", str(run_dir)], data_cache)
    assert result.returncode == 0, result.stderr
    assert proxy.wait(60) == 0, proxy.output()
    stopped_at = state(run_dir)["step"]
    assert state(run_dir)["status"] == "stopped" and stopped_at < TRAIN["max_steps"]
    assert (run_dir / "checkpoints" / f"step_{stopped_at:06d}.bin").exists()
    assert max_logged_step(run_dir) == stopped_at
    assert not (run_dir / ".loss.json").read_bytes().endswith(b"}")  # whole lines only
    result = run_cmd(["stop", "--run-dir", str(run_dir)], data_cache)
    assert "no proxy is running" in one_line_error(result, 1)

    # SIGTERM and SIGINT to the proxy do the same
    for sig in (signal.SIGTERM, signal.SIGINT):
        before = max_logged_step(run_dir)
        gate.hold_after(before + 5)
        proxy = Proxy(args, data_cache).start()
        wait_for(lambda: max_logged_step(run_dir) >= before + 5, 240, "progress", proxy)
        os.kill(proxy.proc.pid, sig)
        assert proxy.wait(60) == 0, proxy.output()
        st = state(run_dir)
        assert st["status"] == "stopped" and st["engine"]["alive"] is False
        assert (run_dir / "checkpoints" / f"step_{st['step']:06d}.bin").exists()

    # a changed experiment needs --allow-experiment-change
    changed = json.loads(exp.read_text())
    changed["train"]["lr"] = 0.002
    exp.write_text(json.dumps(changed))
    result = run_cmd(args, data_cache)
    line = one_line_error(result, 2)
    assert "train.lr" in line and "--allow-experiment-change" in line
    before = max_logged_step(run_dir)
    gate.hold_after(before + 5)
    proxy = Proxy(args + ["--allow-experiment-change"], data_cache).start()
    wait_for(lambda: max_logged_step(run_dir) >= before + 5, 240, "progress after the change", proxy)
    assert f"starting from step_{before:06d}.bin" in proxy.stdout()  # resumed, not restarted from scratch
    assert "experiment changed (train.lr)" in proxy.stderr()
    assert json.loads((run_dir / "experiment.json").read_text())["train"]["lr"] == 0.002
    assert len(list((run_dir / "archive").glob("experiment_*.json"))) == 1
    assert run_cmd(["stop", "--run-dir", str(run_dir)], data_cache).returncode == 0
    assert proxy.wait(60) == 0, proxy.output()
    # the next plain relaunch accepts the older checkpoints' optimizer settings too
    before = max_logged_step(run_dir)
    gate.hold_after(before + 3)
    proxy = Proxy(args, data_cache).start()
    wait_for(lambda: max_logged_step(run_dir) >= before + 3, 240, "progress", proxy)
    assert f"starting from step_{before:06d}.bin" in proxy.stdout()
    os.kill(proxy.proc.pid, signal.SIGTERM)
    assert proxy.wait(60) == 0, proxy.output()
    steps = last_steps(run_dir)
    assert sorted(steps) == list(range(1, max(steps) + 1))
    assert state(run_dir)["status"] == "stopped" and state(run_dir)["replay_mismatch_count"] == 0


def test_bad_input_is_one_line_and_no_traceback(engine, data_cache, tmp_path):
    exp = make_experiment(tmp_path, "BAD", **TRAIN)
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    wrong = make_experiment(tmp_path, "WRONG", lr="fast")
    engine = ["--engine", ENGINE.flag]
    cases = [
        (["run", str(tmp_path / "missing.json"), *engine], 2, "no such file"),
        (["run", str(broken), *engine], 2, "not JSON"),
        (["run", str(wrong), *engine], 2, "train.lr"),
        (["run", str(exp), "--run-dir", str(tmp_path / "r"), "--engine", str(tmp_path / "nope")], 2, "--engine"),
        (["run", str(exp), "--hang-timeout", "-1", *engine], 2, "--hang-timeout"),
        (["run", *engine], 2, "EXPERIMENT.json"),
        (["frobnicate"], 2, "invalid choice"),
        (["status", "--run-dir", str(tmp_path / "none")], 2, "no such run directory"),
        (["status", "--run-dir", str(tmp_path)], 2, "not a run directory"),
        (["checkpoint", "--run-dir", str(tmp_path / "none")], 2, "no such run directory"),
    ]
    for argv, code, needle in cases:
        line = one_line_error(run_cmd(argv, data_cache, timeout=60), code)
        assert needle in line, (argv, line)
    # a run directory with no proxy: checkpoint/stop say so
    assert not (tmp_path / "r").exists()  # a bad --engine creates no run directory
    run_dir = tmp_path / "idle"
    run_dir.mkdir()
    (run_dir / "experiment.json").write_text(exp.read_text())
    for command in ("checkpoint", "stop"):
        line = one_line_error(run_cmd([command, "--run-dir", str(run_dir)], data_cache), 1)
        assert "no proxy is running" in line


def test_run_starts_the_dashboard_and_it_dies_with_the_proxy(engine, gate, data_cache, tmp_path):
    import re
    import socket
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exp = make_experiment(tmp_path, "DASH", **{**TRAIN, "max_steps": 20000, "ckpt_every": 100})
    run_dir = tmp_path / "run"
    gate.hold_after(5)  # still training (held at step 5) when the proxy is killed, however fast the engine is
    proxy = Proxy(run_args(exp, run_dir, "--port", port, engine=gate.engine_flag, dashboard=True), data_cache).start()
    url = wait_for(lambda: re.search(r"dashboard: (http://\S+)", proxy.stdout()), 120, "the dashboard URL", proxy)[1]
    assert url == f"http://127.0.0.1:{port}/"
    wait_for(lambda: max_logged_step(run_dir) >= 5, 240, "step 5", proxy)

    def page():
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.status == 200
        except OSError:
            return False

    wait_for(page, 60, "the dashboard page", proxy, poll=0.5)
    # proxy run starts the dashboard as `python -m dashboard ...` (proxy/commands/run.py)
    children = [int(p) for p in open(f"/proc/{proxy.proc.pid}/task/{proxy.proc.pid}/children").read().split()]
    dashboards = [p for p in children if "\0-m\0dashboard\0" in open(f"/proc/{p}/cmdline").read()]
    assert len(dashboards) == 1
    os.kill(proxy.proc.pid, signal.SIGKILL)  # the proxy alone, not its group
    proxy.proc.wait(30)
    wait_for(lambda: not pid_alive(dashboards[0]), 30, "the orphaned dashboard to exit")
    wait_for(lambda: not pid_alive(engine_pid(run_dir)), 60, "the orphaned engine to checkpoint and exit")

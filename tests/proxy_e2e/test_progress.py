"""What `proxy run` tells a user while it trains: a progress line on a step count and on the clock, checkpoint
lines that name their own step, a stop that ends a long sample audit at once, and `proxy --version`."""

from __future__ import annotations

import json
import re
import signal
import time

from proxy.formats import frames
from proxy.formats.checkpoint import verify_checkpoint
from proxy.supervision.live_status import PROGRESS_EVERY_S

from .conftest import TINY, Proxy, make_experiment, max_logged_step, run_args, run_cmd, state, wait_for

PROGRESS = re.compile(
    r"^step (\d+)/(\d+) \| loss (\d+\.\d{4}) \(smoothed (\d+\.\d{4})\) \| (\S+) tok/s \(engine (\S+)\)"
    r" \| ETA (\S+) \| mixture (code [01]\.\d\d, docstrings [01]\.\d\d, topics [01]\.\d\d)"
    r"( \| last step \S+ ago)?$"
)


def timed_lines(proxy: Proxy, seen: dict[str, float]) -> None:
    """Note when each new stdout line of `proxy` was first seen (monotonic seconds)."""
    for line in proxy.stdout().splitlines():
        seen.setdefault(line, time.monotonic())


def test_progress_lines_on_the_step_count(engine, data_cache, tmp_path):
    """A fast engine: a progress line every `train.log_every` steps with step, loss, smoothed loss, tokens/s of
    the wall clock and of the engine, ETA and the mixture; checkpoint lines name the checkpoint's own step."""
    exp = make_experiment(
        tmp_path, "FAST", max_steps=300, log_every=50, ckpt_every=100, eval_every=100, sample_every=100
    )
    proxy = Proxy(run_args(exp, tmp_path / "run"), data_cache).start()
    assert proxy.wait() == 0, proxy.output()
    out = proxy.stdout().splitlines()
    assert any(line.startswith("engine ready: ") and "(1 thread)" in line for line in out), out
    progress = [m for line in out if (m := PROGRESS.match(line))]
    assert [int(m[1]) for m in progress] == [1, 50, 100, 150, 200, 250, 300], out  # the first: training started
    assert all(m[2] == "300" and m[9] is None for m in progress)
    assert progress[-1][7] == "0m00s"  # ETA at the last step
    checkpoints = [line for line in out if line.startswith("checkpoint ")]
    assert [line.split(" (")[0] for line in checkpoints] == [f"checkpoint step_{s:06d}.bin" for s in (100, 200, 300)]
    for line, step in zip(checkpoints, (100, 200, 300), strict=False):
        assert line.startswith(f"checkpoint step_{step:06d}.bin (step {step}; periodic, write "), line
        assert re.search(
            r"\| overhead \d+\.\d% \(sample \d+\.\d%, eval \d+\.\d%, checkpoint \d+\.\d%, "
            r"other -?\d+\.\d%\)$",
            line,
        ), line
    assert [line.split(":")[0] for line in out if line.startswith("eval step")] == [
        "eval step 100",
        "eval step 200",
        "eval step 300",
    ]
    assert not [line for line in out if "threads)" in line]


def test_progress_lines_on_the_clock_when_steps_are_slow(engine, gate, data_cache, tmp_path):
    """An engine slower than the clock (held by the gate, as a CPU holds a big model for minutes per step):
    a progress line at least every 30 s of wall time, before the first step of a launch too."""
    assert PROGRESS_EVERY_S == 30.0
    exp = make_experiment(tmp_path, "SLOW", max_steps=20000, log_every=1000, ckpt_every=0, eval_every=0, sample_every=0)
    gate.hold_after(0)  # the first step waits
    proxy = Proxy(run_args(exp, tmp_path / "run", engine=gate.engine_flag), data_cache).start()
    seen: dict[str, float] = {}

    def line_with(text: str) -> str | None:
        timed_lines(proxy, seen)
        return next((line for line in seen if text in line), None)

    ready_line = wait_for(lambda: line_with("engine ready: "), 120, "engine ready", proxy, poll=0.1)
    first = wait_for(
        lambda: line_with("first step of this launch in progress"), 45, "a line before the first step", proxy, poll=0.1
    )
    waited = seen[first] - seen[ready_line]
    assert PROGRESS_EVERY_S - 1 <= waited <= PROGRESS_EVERY_S + 2, waited
    assert first.startswith("step 0/20000 | first step of this launch in progress (0m29s") or first.startswith(
        "step 0/20000 | first step of this launch in progress (0m30s"
    ), first
    # `proxy status` meanwhile: no overhead figure before the first step (not "overhead 100%")
    status = run_cmd(["status", "--run-dir", str(tmp_path / "run")], data_cache)
    assert "goodput:     no figure before the first step" in status.stdout, status.stdout
    assert "overhead" not in status.stdout

    gate.hold_after(3)  # three steps, then a long wait
    wait_for(lambda: max_logged_step(tmp_path / "run") >= 3, 60, "step 3", proxy)
    started = wait_for(lambda: line_with("step 1/20000 | "), 10, "the line of the launch's first step", proxy)
    assert PROGRESS.match(started) and PROGRESS.match(started)[9] is None, started
    later = wait_for(lambda: line_with("last step "), 45, "a line while the fourth step waits", proxy, poll=0.1)
    match = PROGRESS.match(later)
    assert match and match[1] == "3" and match[9] is not None, later
    assert seen[later] - seen[started] <= PROGRESS_EVERY_S + 2
    proxy.proc.send_signal(signal.SIGTERM)
    assert proxy.wait(60) == 0, proxy.output()
    assert "stopped at step 3; checkpoint " in proxy.stdout()


def test_one_stop_ends_a_long_sample_audit_at_once(engine, gate, data_cache, tmp_path):
    """A sample audit of 16 prompts x 16 completions x 4096 tokens (minutes on a CPU) is stopped by a single
    SIGTERM within a few seconds: the engine gives the audit up between two tokens, checkpoints the last
    completed step, and the proxy says where it stopped (never `checkpoint None`)."""
    exp = json.loads(TINY.read_text())
    exp["name"] = "AUDIT"
    exp["train"].update(max_steps=20000, ckpt_every=0, eval_every=0, sample_every=10, threads=1)
    exp["samples"].update(prompts=[f"def f{i}(" for i in range(16)], count=16, max_new=4096)
    path = tmp_path / "AUDIT.json"
    path.write_text(json.dumps(exp))
    run_dir = tmp_path / "run"
    gate.hold_after(10)  # the engine has nothing but the audit of step 10 to work on
    proxy = Proxy(run_args(path, run_dir, engine=gate.engine_flag), data_cache).start()
    gate.wait_frame(frames.SAMPLE, 0, proxy.running, 240)
    wait_for(lambda: max_logged_step(run_dir) >= 10, 60, "step 10", proxy)
    time.sleep(2.0)  # inside the audit
    assert proxy.running() and not (run_dir / ".samples.json").exists()  # no audit has come back
    t0 = time.monotonic()
    proxy.proc.send_signal(signal.SIGTERM)
    assert proxy.wait(60) == 0, proxy.output()
    took = time.monotonic() - t0
    assert took < 10.0, f"one stop took {took:.1f} s to end the run"
    out = proxy.stdout()
    assert "stop requested: the engine abandons the sample audit of step 10" in out, out
    ckpt = run_dir / "checkpoints" / "step_000010.bin"
    assert f"stopped at step 10; checkpoint {ckpt}" in out and "checkpoint None" not in out
    assert verify_checkpoint(ckpt) is None
    assert "second stop" not in proxy.stderr() and "killing" not in proxy.stderr()
    st = state(run_dir)
    assert st["status"] == "stopped" and st["step"] == 10 and st["last_checkpoint"] == str(ckpt)


def test_version(engine, data_cache):
    result = run_cmd(["--version"], data_cache)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    lines = result.stdout.splitlines()
    assert re.match(r"^microgpt \d+\.\d+\.\d+ \(proxy and dashboard, Python 3\.\d+\.\d+\)$", lines[0]), lines
    cpu = next(line for line in lines if line.strip().startswith("engine cpu"))
    assert "microgpt_cpu: microgpt engine " in cpu and "(cpu; source " in cpu, cpu
    assert any(line.strip().startswith("engine cuda") for line in lines)

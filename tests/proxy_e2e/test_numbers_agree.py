"""Numbers that agree: the smoothed loss goes on across a relaunch as `proxy status` computes it,
`proxy status` counts tokens/s over running time only, and a stop is answered at once with the step being
finished and roughly how long that takes. Real proxies, the real engine behind a frame gate, real signals."""

from __future__ import annotations

import json
import re
import signal
import statistics
import time

from .conftest import Proxy, last_steps, make_experiment, max_logged_step, run_args, run_cmd, wait_for

SMOOTHED = re.compile(r"^step (\d+)/\d+ \| loss \d+\.\d{4} \(smoothed (\d+\.\d{4})\)")
STOP = re.compile(
    r"^stop requested: the engine finishes step (\d+) if it has begun it, checkpoints.* and exits "
    r"\(a step takes about (under 0\.01|\d+(?:\.\d+)?)s here, this one has taken (\d+(?:\.\d+)?)s so far"
    r"(, then a checkpoint write \(\S+ the slowest so far\))?\)$"
)


def ema(losses: list[float]) -> float:
    """The smoothed loss as docs/CLI.md defines it: 0.9 of the old value, the first loss sets it."""
    smoothed = losses[0]
    for loss in losses[1:]:
        smoothed = 0.9 * smoothed + 0.1 * loss
    return smoothed


def test_a_stop_is_answered_at_once_with_the_step_and_its_time(engine, gate, data_cache, tmp_path):
    """The engine held before step 21 (as a slow CPU step holds it): SIGINT is answered within a second or
    two, while the step is still unfinished, with the step and a per-step time that the logged steps show."""
    exp = make_experiment(tmp_path, "STOP", max_steps=20000, ckpt_every=0, eval_every=0, sample_every=0)
    run_dir = tmp_path / "run"
    gate.hold_after(20)
    proxy = Proxy(run_args(exp, run_dir, engine=gate.engine_flag), data_cache).start()
    wait_for(lambda: max_logged_step(run_dir) >= 20, 240, "step 20", proxy)
    time.sleep(1.5)  # step 21 waits at the gate
    proxy.proc.send_signal(signal.SIGINT)
    line = wait_for(
        lambda: next((ln for ln in proxy.stdout().splitlines() if ln.startswith("stop requested")), None),
        2.0,
        "the answer to the stop",
        proxy,
    )
    match = STOP.match(line)
    assert match and match[1] == "21", line
    assert float(match[3]) >= 1.5, line  # it knows the step has been waiting
    steps = last_steps(run_dir)
    intervals = sorted(steps[s]["time"] - steps[s - 1]["time"] for s in range(13, 21))
    if match[2] == "under 0.01":  # seconds() says so below 10 ms: the median interval was under it
        assert statistics.median(intervals) < 0.01, (line, intervals)
    else:
        assert intervals[0] * 0.5 - 0.01 <= float(match[2]) <= intervals[-1] * 2 + 0.01, (line, intervals)
    assert proxy.wait(60) == 0, proxy.output()
    assert "stopped at step " in proxy.stdout()


def test_smoothed_loss_and_tokens_per_s_across_a_relaunch(engine, gate, data_cache, tmp_path):
    """Stopped near step 30, left stopped for 5 s, relaunched to step 60: the relaunch's first progress line
    carries the smoothed loss of every logged step (not its first step's raw loss), the last line agrees with
    `proxy status`, and status's tokens/s is that of the running time, not dragged down by the stop."""
    exp = make_experiment(tmp_path, "AGREE", max_steps=60, log_every=10, ckpt_every=0, eval_every=0, sample_every=0)
    run_dir = tmp_path / "run"
    args = run_args(exp, run_dir, engine=gate.engine_flag)
    gate.hold_after(30)
    first = Proxy(args, data_cache).start()
    wait_for(lambda: max_logged_step(run_dir) >= 30, 240, "step 30", first)
    first.proc.send_signal(signal.SIGINT)
    assert first.wait(60) == 0, first.output()
    stopped = max_logged_step(run_dir)
    time.sleep(5.0)
    gate.open()
    second = Proxy(args, data_cache).start()
    assert second.wait() == 0, second.output()

    steps = last_steps(run_dir)
    assert sorted(steps) == list(range(1, 61))
    losses = [steps[s]["loss"] for s in range(1, 61)]
    lines = [m for ln in second.stdout().splitlines() if (m := SMOOTHED.match(ln))]
    assert int(lines[0][1]) == stopped + 1, second.stdout()
    assert lines[0][2] == f"{ema(losses[: stopped + 1]):.4f}", (lines[0][0], losses)
    assert lines[-1][1] == "60" and lines[-1][2] == f"{ema(losses):.4f}"
    report = json.loads(run_cmd(["status", "--run-dir", str(run_dir), "--json"], data_cache).stdout)
    assert f"{report['loss_smoothed']:.4f}" == lines[-1][2]

    def rate(first_step: int, last_step: int) -> float:
        a, b = steps[first_step], steps[last_step]
        return (b["tokens"] - a["tokens"]) / (b["time"] - a["time"])

    running = sorted([rate(1, stopped), rate(stopped + 1, 60)])
    assert rate(1, 60) < running[0] / 2  # the stop is most of the wall time: the test can tell the two apart
    assert running[0] * 0.8 <= report["tokens_per_s"] <= running[1] * 1.25, (report["tokens_per_s"], running)

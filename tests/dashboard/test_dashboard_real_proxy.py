"""The dashboard on a run the real training proxy is writing (TINY-TRAIN on the engine under test: the
CPU engine unless MICROGPT_TEST_ENGINE names another)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import ARTIFACTS, REPO
from harness.engines import engine_under_test
from harness.gate import Gate

ENGINE = engine_under_test()

READY = "() => window.__dashboard && window.__dashboard.ready"


def _skip_reason() -> str | None:
    if not (REPO / "proxy" / "cli.py").is_file():
        return "proxy/cli.py does not exist yet (the training proxy is not built)"
    if not (REPO / "experiments" / "TINY-TRAIN.json").is_file():
        return "experiments/TINY-TRAIN.json is missing"
    if ENGINE.problem:
        return ENGINE.problem
    return None


@pytest.mark.slow
@pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")
def test_dashboard_follows_a_real_training_run(tmp_path, server_factory, page):
    run_dir = tmp_path / "tiny"
    # the engine waits at step 20 (a frame gate) until the page is up, so that new steps are still to
    # come when the page looks for them, however fast the engine is
    gate = Gate(tmp_path / "gate", ENGINE.path)
    gate.hold_after(20)
    log = open(tmp_path / "proxy.log", "wb")
    proxy = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "proxy",
            "run",
            "experiments/TINY-TRAIN.json",
            "--run-dir",
            str(run_dir),
            "--engine",
            gate.engine_flag,
            "--no-dashboard",
            "--set",
            "train.lr=0.002",
        ],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    try:
        deadline = time.monotonic() + 300
        while not (run_dir / ".loss.json").is_file() or (run_dir / ".loss.json").stat().st_size == 0:
            if proxy.poll() is not None:
                pytest.fail(f"proxy exited {proxy.returncode}: {(tmp_path / 'proxy.log').read_text()[-3000:]}")
            assert time.monotonic() < deadline, "no training step logged in 300 s"
            time.sleep(0.2)
        srv = server_factory([run_dir])
        page.goto(srv.url)
        page.wait_for_function(READY, timeout=10000)
        page.wait_for_function("() => window.__dashboard.points > 0", timeout=10000)
        first = page.evaluate("() => window.__dashboard.lastStep")
        assert first <= 20 and proxy.poll() is None
        gate.open()  # new steps arrive without a reload
        page.wait_for_function(f"() => window.__dashboard.lastStep > {first}", timeout=60000)
        page.wait_for_function("() => document.querySelector('#status .pill') !== null", timeout=5000)
        info = srv.get("/api/runs/0").json()
        assert info["steps"] > 0 and info["experiment"] == "TINY-TRAIN"
        assert srv.get("/api/runs/0/state").json()["value"] is not None
        # the configuration panel: the effective experiment with the override marked, and the engine's build
        # and the commit it was built from, as its own --version says them
        version = subprocess.run([str(ENGINE.path), "--version"], capture_output=True, text=True, timeout=30).stdout
        source = version.split("source ")[1].split(";")[0].split(")")[0]
        page.wait_for_function(
            f"() => document.querySelector('#config .config-engine').textContent.includes({source!r})", timeout=10000
        )
        row = page.locator("#config-table tr.override")
        assert row.count() == 1 and row.locator("td").all_inner_texts() == ["train.lr", "0.002"]
        engine = page.locator("#config .config-engine").inner_text()
        assert "version " + version.split()[2] in engine and "train.lr=0.002" in engine
        # MFU: the engine's own parameter count (its ready event), kept in .state.json
        eng = srv.get("/api/runs/0/state").json()["value"]["engine"]
        assert type(eng["n_params"]) is int and eng["n_params"] > 0
        mfu = srv.get("/api/runs/0/mfu").json()
        if eng["kind"] == "cuda" and "why" not in mfu:  # TINY-TRAIN: 2 layers, dim 64, ctx 64
            assert mfu["flops_per_token"] == 6 * eng["n_params"] + 12 * 2 * 64 * 64
        else:
            assert mfu["why"]
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "dashboard-real-proxy.png"), full_page=True)
        assert not page.console_errors, page.console_errors
    finally:
        if proxy.poll() is None:
            os.killpg(proxy.pid, signal.SIGTERM)
            try:
                proxy.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proxy.pid, signal.SIGKILL)
                proxy.wait()


@pytest.mark.slow
@pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")
def test_wall_clock_rate_of_a_real_run_never_beats_the_engine(tmp_path):
    """TINY-TRAIN longer (evals, sample audits and checkpoints every 100 steps) through the real proxy: no
    point of the dashboard's wall-clock tokens/s (overview, full resolution, live push) is above 1.5x the
    engine's own rate over the same steps (its tokens over the steps' `ms`; the wall clock, which adds the
    audits and the waits, can only be slower, and a point above it is a measuring artefact). The same
    steps: those since the newest point at least 10 s of wall time older (docs/DASHBOARD.md). Compared
    step range by step range, because the engine's speed moves with the load of a shared machine."""
    import json

    from dashboard import payload
    from dashboard.log_follower import parse_lines
    from dashboard.run_index import RunIndex
    from proxy.formats.loss_log import step_fields

    exp = json.loads((REPO / "experiments" / "TINY-TRAIN.json").read_text())
    exp["name"] = "TINY-WALL"
    exp["train"].update(max_steps=2500, ckpt_every=100, eval_every=100, sample_every=100, threads=1)
    path = tmp_path / "TINY-WALL.json"
    path.write_text(json.dumps(exp))
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "proxy",
            "run",
            str(path),
            "--run-dir",
            str(run_dir),
            "--engine",
            ENGINE.flag,
            "--no-dashboard",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]

    data = (run_dir / ".loss.json").read_bytes()
    rows = [f for _s, _e, obj in parse_lines(data, 0)[0] if (f := step_fields(obj)) is not None]
    log = {f.step: f for f in rows}  # one segment, no replays: one entry per step
    assert sorted(log) == list(range(1, 2501))
    ms_through = {}
    total = 0.0
    for step in sorted(log):
        total += log[step].ms
        ms_through[step] = total

    def engine_rate(since: int, step: int) -> float:
        """The engine's tokens/s over steps since+1 .. step, from its own step times."""
        return (log[step].tokens - log[since].tokens) / ((ms_through[step] - ms_through[since]) / 1000.0)

    def worst(ends: list[int], rates: list, starts: list[int]) -> tuple[int, float]:
        """(points with a rate, the highest wall/engine ratio): each point against the engine over the steps
        since the newest candidate start (`starts`, before it) at least 10 s older."""
        n, top = 0, 0.0
        for _i, (end, rate) in enumerate(zip(ends, rates, strict=False)):
            if rate is None:
                continue
            since = max(s for s in starts if s < end and log[s].time <= log[end].time - payload.WALL_WINDOW_S)
            n, top = n + 1, max(top, rate / engine_rate(since, end))
        return n, top

    run = RunIndex(0, "run", run_dir)
    run.refresh_log()
    full = run.series(None, None, 4000)
    assert full["raw"] and full["step"] == sorted(log)
    over = run.series(None, None, 200)
    assert not over["raw"]
    # the log as a live stream reads it: a few lines at a time, the history from the server's store
    live, window, prev = [], None, None
    for i in range(0, len(rows), 7):
        window = window or run.wall_window(rows[i].step)
        out, prev = payload.rows_payload(rows[i : i + 7], prev, window)
        live += out["wall_tok_s"]
    checks = {
        "full resolution": (full["step"], full["wall_tok_s"], full["step"]),
        "live": (sorted(log), live, sorted(log)),
        "overview": (over["step_end"], over["wall_tok_s"], [over["step"][0]] + over["step_end"]),
    }
    for name, (ends, rates, starts) in checks.items():
        n, top = worst(ends, rates, starts)
        assert n >= 0.3 * len(ends), f"{name}: only {n} of {len(ends)} points have a rate"
        assert top <= 1.5, f"{name}: a wall-clock point at {top:.2f}x the engine's rate over the same steps"

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
    proxy = subprocess.Popen([sys.executable, "-m", "proxy", "run", "experiments/TINY-TRAIN.json",
                              "--run-dir", str(run_dir), "--engine", gate.engine_flag, "--no-dashboard"],
                             cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
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

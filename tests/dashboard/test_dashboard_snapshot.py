"""What a new user sees first: charts that say why they are empty, labelled axes, the status card's step
from the newest source, and the static mode (`?static=1`) that lets a headless browser take a screenshot."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from conftest import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, make_run
from dashboard.synthetic import SyntheticRun

READY = "() => window.__dashboard && window.__dashboard.ready"
CHARTS = ("chart-loss", "chart-val", "chart-mix", "chart-lr", "chart-gn", "chart-tps", "chart-mfu")
SYSTEM_CHARTS = ("chart-cpu", "chart-gpu")  # this machine's, not the run's: tests/dashboard/test_dashboard_system.py


def chart(page, chart_id: str) -> dict:
    return page.evaluate(f"() => window.__dashboardChart('{chart_id}')")


def new_run(root, eval_every: int) -> SyntheticRun:
    """A run as `proxy run` leaves it before its first step: the experiment and phase 0, no log yet."""
    run = SyntheticRun(root, t0=time.time())
    run.write_experiment(max_steps=1000)
    exp = json.loads((root / "experiment.json").read_text())
    exp["train"]["eval_every"] = eval_every
    (root / "experiment.json").write_text(json.dumps(exp))
    run.add_phase(0)
    return run


def test_every_empty_chart_says_why_and_every_axis_is_labelled(tmp_path, server_factory, page):
    run = new_run(tmp_path / "fresh", eval_every=100)
    srv = server_factory([run.root])
    page.goto(srv.url)
    page.wait_for_function(READY, timeout=10000)
    empty = {c: chart(page, c)["empty"] for c in CHARTS}
    assert empty == {
        "chart-loss": "no training steps logged yet",
        "chart-val": "no evaluation yet (one every 100 steps)",
        "chart-mix": "no mixture logged yet",
        "chart-lr": "no training steps logged yet",
        "chart-gn": "no training steps logged yet",
        "chart-tps": "no training steps logged yet",
        "chart-mfu": "fresh: MFU is for the CUDA engine (this run: engine unknown)",
    }
    not_system = "".join(f":not(#{c} > *)" for c in SYSTEM_CHARTS)
    assert page.locator(".chart-empty" + not_system).count() == len(CHARTS)

    # the first steps arrive live: the step charts fill in, the validation chart still says why it is empty
    page.wait_for_function("() => window.__dashboard.connected", timeout=5000)
    run.append_steps(30)
    page.wait_for_function("() => window.__dashboard.lastStep >= 30", timeout=5000)
    page.wait_for_function("() => window.__dashboardChart('chart-loss').empty === null", timeout=5000)
    for c in ("chart-loss", "chart-mix", "chart-lr", "chart-gn", "chart-tps"):
        assert chart(page, c)["empty"] is None, c
    assert chart(page, "chart-val")["empty"] == "no evaluation yet (one every 100 steps)"
    # axes: x by what the x axis shows, y by what is plotted
    axes = {c: chart(page, c)["axes"] for c in CHARTS}
    assert axes == {
        "chart-loss": ["step", "loss (nats/token)"],
        "chart-val": ["step", "loss (nats/token)"],
        "chart-mix": ["step", "weight (stacked)"],
        "chart-lr": ["step", "learning rate"],
        "chart-gn": ["step", "gradient norm"],
        "chart-tps": ["step", "tokens / s"],
        "chart-mfu": ["step", "MFU (%)"],
    }
    page.select_option("#xmode", "tokens")
    page.wait_for_function(
        "() => window.__dashboardChart('chart-loss').axes[0] === 'tokens (cumulative)'", timeout=3000
    )
    assert not page.console_errors, page.console_errors


def test_evaluations_off_is_said(tmp_path, server_factory, page):
    run = new_run(tmp_path / "noeval", eval_every=0)
    run.append_steps(5)
    srv = server_factory([run.root])
    srv.wait_indexed()
    page.goto(srv.url)
    page.wait_for_function(READY, timeout=10000)
    assert chart(page, "chart-val")["empty"] == "evaluations are off (train.eval_every is 0)"
    assert chart(page, "chart-loss")["empty"] is None


def test_status_step_comes_from_the_newest_source(tmp_path, server_factory, page):
    """.state.json is rewritten every few seconds; when the log is ahead, the card shows the log's step."""
    run = make_run(tmp_path / "run-a", steps=400)  # state written at step 400
    run.append_steps(50)  # logged, not yet in .state.json
    assert json.loads((run.root / ".state.json").read_text())["step"] == 400
    srv = server_factory([run.root])
    srv.wait_indexed()
    page.goto(srv.url + "?static=1")
    page.wait_for_function(READY, timeout=10000)
    lines = page.locator("#status .card").inner_text().split("\n")
    assert lines[lines.index("step") + 1].startswith("450 / "), lines
    assert lines[lines.index("last logged") + 1].startswith("step 450 "), lines


def test_static_mode_opens_no_stream_and_shows_the_sidecars(tmp_path, server_factory, page):
    run = make_run(tmp_path / "run-a", steps=300)
    srv = server_factory([run.root])
    srv.wait_indexed()
    page.goto(srv.url + "?static=1")
    page.wait_for_function(READY, timeout=10000)
    d = page.evaluate("() => ({...window.__dashboard})")
    assert d["static"] and not d["connected"] and d["lastStep"] == 300 and not d["errors"]
    requested = page.evaluate("() => performance.getEntriesByType('resource').map((e) => e.name)")
    assert not [u for u in requested if "/api/stream" in u], requested
    assert "static snapshot" in page.locator("#conn").inner_text()
    # what only the stream brought before: samples and checkpoints
    assert page.locator("#samples .sample").count() >= 1
    assert page.locator("#checkpoints tbody tr").first.inner_text().startswith("step_000300.bin")
    run.append_steps(5)  # a snapshot does not follow the log
    page.wait_for_timeout(1500)
    assert page.evaluate("() => window.__dashboard.lastStep") == 300
    assert not page.console_errors, page.console_errors


def test_headless_screenshot_with_a_virtual_time_budget_finishes(tmp_path, server_factory):
    """The recipe in docs/DASHBOARD.md: Chromium's --screenshot with --virtual-time-budget ends (the live page's
    event stream would keep it busy for ever) and the picture has the charts in it."""
    if not CHROMIUM.exists():
        pytest.skip("needs Debian's /usr/bin/chromium (absent here); scripts/install_test_deps.sh installs it")
    run = make_run(tmp_path / "run-a", steps=2000)
    srv = server_factory([run.root])
    srv.wait_indexed()
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "dashboard-static.png"
    shot.unlink(missing_ok=True)
    t = time.monotonic()
    done = subprocess.run(
        [
            str(CHROMIUM),
            *CHROMIUM_ARGS,
            f"--screenshot={shot}",
            "--window-size=1400,1800",
            "--virtual-time-budget=10000",
            srv.url + "?static=1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    took = time.monotonic() - t
    assert done.returncode == 0, done.stderr[-2000:]
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert (width, height) == (1400, 1800)
    assert len(png) > 100_000, f"{len(png)} bytes: the charts did not draw?"  # an empty page is ~30 KB
    assert took < 120

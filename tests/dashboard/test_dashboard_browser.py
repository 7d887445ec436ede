"""The page in a real headless Chromium against a real server on a live run directory."""

from __future__ import annotations

import time

import pytest

from conftest import ARTIFACTS, make_run

READY = "() => window.__dashboard && window.__dashboard.ready"


def dash(page) -> dict:
    return page.evaluate("() => ({...window.__dashboard})")


def test_live_page(tmp_path, server_factory, page, live_writer):
    run = make_run(tmp_path / "run-a", steps=400)
    srv = server_factory([run.root])
    srv.wait_indexed()
    page.goto(srv.url)
    page.wait_for_function(READY, timeout=10000)
    d = dash(page)
    assert d["points"] >= 400 and d["lastStep"] == 400 and not d["errors"]
    assert page.locator("#chart-loss canvas").count() == 1
    assert page.locator(".card .pill").first.inner_text() == "alive"
    page.wait_for_function("() => window.__dashboard.connected", timeout=5000)

    # tokens/s: the engine's step compute and the wall clock's over 10 s windows, which see the 5 s audit
    # after every 50 steps of 0.25 s: a window holding one has 20 steps of 16,384 tokens in 10 s, one
    # without it 40; none in the run's first 10 s (nothing that far back to measure from)
    tps = page.evaluate("() => window.__dashboardChart('chart-tps')")
    assert tps["labels"][1:] == ["run-a engine", "run-a wall clock"]
    engine, wall = ([v for v in col if v is not None] for col in tps["data"][1:])
    assert len(engine) >= 400 and 355 <= len(wall) <= 360
    assert min(wall) == pytest.approx(16384 * 20 / 10, rel=0.01) and min(engine) > 16384 / 0.3
    assert max(wall) == pytest.approx(16384 / 0.25, rel=0.001)
    assert "wall clock" in page.locator("#status").inner_text()

    # a step appended to the log shows up without a reload, within 2 s
    for step in (401, 402):
        run.append_steps(1)
        t = time.monotonic()
        page.wait_for_function(
            f"() => window.__dashboard.lastStep >= {step} && "
            f"document.querySelector('#status').textContent.includes('step {step:,}')",
            timeout=2000,
        )
        assert time.monotonic() - t < 2.0
    # the live push carries the wall-clock rate too (over the steps the server had before it)
    page.wait_for_function(
        "() => { const c = window.__dashboardChart('chart-tps'); "
        "return c && c.data[0].length >= 402 && c.data[2][c.data[2].length - 1] != null; }",
        timeout=2000,
    )

    # a pivot (a new phase in phases.json, written by rename) gets a marker
    assert page.locator("#chart-loss .pivot-marker").count() == 0
    run.add_phase(380, policy="polish")
    page.wait_for_selector('#chart-loss .pivot-marker[data-step="380"]', timeout=2000)
    assert page.locator("#phases tbody tr").count() == 2

    # keep it live for a moment, then check status, samples, checkpoints
    live_writer(run, rate=20)
    page.wait_for_function("() => window.__dashboard.lastStep >= 420", timeout=5000)
    assert page.locator("#checkpoints tbody tr").first.inner_text().startswith("step_000400.bin")
    sample = page.locator("#samples .sample").nth(1).inner_text()
    assert "<script>alert(1)</script>" in sample  # model output is shown as text, never as HTML
    assert page.locator("#samples script").count() == 0

    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
    assert not page.console_errors, page.console_errors
    assert not dash(page)["errors"]


def test_zoom_refines_and_resets(tmp_path, server_factory, page):
    run = make_run(tmp_path / "run-a", steps=6000)
    srv = server_factory([run.root])
    srv.wait_indexed()
    page.goto(srv.url)
    page.wait_for_function(READY, timeout=10000)
    page.wait_for_function("() => window.__dashboard.renders >= 1")
    over = page.locator("#chart-loss .u-over")

    def drag_across_the_middle() -> dict:
        """Drag across a narrow slice of the x axis; the zoom the page reports once its data came."""
        box = over.bounding_box()
        y = box["y"] + box["height"] / 2
        page.mouse.move(box["x"] + box["width"] * 0.50, y)
        page.mouse.down()
        page.mouse.move(box["x"] + box["width"] * 0.53, y, steps=5)
        page.mouse.up()
        page.wait_for_function("() => window.__dashboardZoom().raw", timeout=5000)
        return page.evaluate("() => window.__dashboardZoom()")

    # the server sends that range at full resolution
    z = drag_across_the_middle()
    assert z["raw"] and 2800 <= z["from"] < z["to"] <= 3300
    page.click("#reset-zoom")
    page.wait_for_function("() => !window.__dashboardZoom().zoomed", timeout=3000)
    # the same drag with the x axis in tokens, then in wall time, zooms the same steps
    for mode in ("tokens", "time"):
        page.select_option("#xmode", mode)
        page.wait_for_timeout(400)
        z = drag_across_the_middle()
        assert 2800 <= z["from"] < z["to"] <= 3300, (mode, z)
        page.dblclick("#chart-loss .u-over")
        page.wait_for_function("() => !window.__dashboardZoom().zoomed", timeout=3000)
    # toggles rebuild the charts without errors
    page.check("#logscale")
    page.select_option("#xmode", "step")
    page.fill("#smooth", "0.99")
    page.wait_for_timeout(500)
    assert not page.console_errors, page.console_errors
    assert not dash(page)["errors"]


def test_several_runs_overlaid(tmp_path, server_factory, page):
    a = make_run(tmp_path / "runs" / "base", steps=500, pivot=300)
    b = make_run(tmp_path / "runs" / "fork", steps=350, seed=3)
    srv = server_factory([tmp_path / "runs"])  # a directory of runs: each child is a run
    runs = srv.wait_indexed()
    assert [r["name"] for r in runs] == ["base", "fork"]
    page.goto(srv.url)
    page.wait_for_function(READY, timeout=10000)
    assert page.locator("#status .card").count() == 2
    labels = page.locator("#chart-loss .u-legend .u-label").all_inner_texts()
    assert "base smoothed" in labels and "fork smoothed" in labels
    b.append_steps(2)
    a.append_steps(1)
    page.wait_for_function("() => document.querySelector('#status').textContent.includes('step 352')", timeout=2000)
    page.uncheck("#run-picker input[value='1']")
    page.wait_for_function("() => document.querySelectorAll('#status .card').length === 1", timeout=3000)
    assert not page.console_errors, page.console_errors

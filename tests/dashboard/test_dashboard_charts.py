"""The charts' content in a real headless Chromium against a real server: validation loss on the
training-loss chart, one point per bucket with its min and max, runs coloured by run, pivot labels that
do not overlap, floors beside caps, ISO times with the zone."""

from __future__ import annotations

import json
import re

import pytest

from conftest import ARTIFACTS, assert_not_blank, make_run

READY = "() => window.__dashboard && window.__dashboard.ready"
ISO_WITH_ZONE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d$")


def chart(page, chart_id: str) -> dict:
    return page.evaluate(f"() => window.__dashboardChart('{chart_id}')")


def column(c: dict, label: str) -> list:
    return c["data"][c["labels"].index(label)]


def logged_losses(run) -> list[float]:
    lines = (run.root / ".loss.json").read_text().splitlines()
    return [o["loss"] for o in map(json.loads, lines) if o.get("type") == "step"]


def test_loss_chart_has_the_validation_loss_and_each_buckets_extremes(tmp_path, server_factory, page):
    run = make_run(tmp_path / "run-a", steps=6000)  # more steps than pixels: a downsampled overview
    srv = server_factory([run.root])
    srv.wait_indexed()
    page.goto(srv.url + "?static=1")
    page.wait_for_function(READY, timeout=10000)
    c = chart(page, "chart-loss")
    x, raw, lo, hi = c["data"][0], column(c, "run-a raw"), column(c, "run-a min"), column(c, "run-a max")
    smoothed, val = column(c, "run-a smoothed"), column(c, "run-a validation")
    # every eval (one per 50 steps) is on the chart, at its step
    evals = srv.get("/api/runs/0/evals").json()
    assert [v for v in val if v is not None] == evals["loss"] and evals["n"] == 120
    assert [x[k] for k, v in enumerate(val) if v is not None] == evals["step"]
    # one point per bucket (never two, which drew a zigzag between min and max), at the bucket's middle step
    width = page.evaluate("() => document.getElementById('chart-loss').clientWidth")
    series = srv.get(f"/api/runs/0/series?width={width}").json()
    assert not series["raw"] and 1000 <= series["n"] <= width
    steps = [(a + b) / 2 for a, b in zip(series["step"], series["step_end"], strict=True)]
    points = [k for k, v in enumerate(raw) if v is not None]
    assert [x[k] for k in points] == steps
    for k in points:
        assert lo[k] <= raw[k] <= hi[k]
    # the band keeps the extremes of the whole log: the 5.0 spike at step 0 mod 9973 is absent here, so the
    # log's own minimum and maximum (to the 6 significant digits the server sends)
    losses = logged_losses(run)
    assert min(v for v in lo if v is not None) == pytest.approx(min(losses), rel=1e-5)
    assert max(v for v in hi if v is not None) == pytest.approx(max(losses), rel=1e-5)
    # the smoothed line moves at every bucket (the same value at both ends of a bucket drew a staircase)
    s = [smoothed[k] for k in points]
    assert all(a != b for a, b in zip(s, s[1:], strict=False))
    # the gradient norm, an envelope column too, has its band
    gn = chart(page, "chart-gn")
    assert gn["labels"][1:] == ["run-a", "run-a min", "run-a max"]
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator("#chart-loss").screenshot(path=str(ARTIFACTS / "dashboard-loss-chart.png"))
    assert_not_blank(ARTIFACTS / "dashboard-loss-chart.png")
    assert not page.console_errors, page.console_errors


def test_overlaid_runs_are_coloured_by_run_and_their_pivot_labels_do_not_overlap(tmp_path, server_factory, page):
    a = make_run(tmp_path / "runs" / "base", steps=500, pivot=300)
    b = make_run(tmp_path / "runs" / "fork", steps=400, seed=3, pivot=306)  # a few pixels apart
    srv = server_factory([tmp_path / "runs"])
    srv.wait_indexed()
    page.goto(srv.url + "?static=1")
    page.wait_for_function(READY, timeout=10000)
    page.wait_for_function("() => window.__dashboard.pivots === 2", timeout=5000)
    for chart_id in ("chart-val", "chart-loss", "chart-tps", "chart-lr"):
        c = chart(page, chart_id)
        by_run: dict[str, set] = {}
        for label, colour in zip(c["labels"][1:], c["colors"][1:], strict=True):
            by_run.setdefault(label.split(" ")[0].split("/")[0], set()).add(colour)
        assert set(by_run) == {"base", "fork"}, (chart_id, c["labels"])
        assert all(len(v) == 1 for v in by_run.values()), (chart_id, by_run)  # one colour a run
        assert by_run["base"] != by_run["fork"], chart_id
    val = chart(page, "chart-val")
    assert "base/stdlib_code" in val["labels"] and "fork/web_text" in val["labels"]

    labels = page.locator("#chart-loss .pivot-marker span")
    texts = labels.all_inner_texts()
    assert sorted(texts) == ["phase 1 (base)", "phase 1 (fork)"]
    boxes = [labels.nth(k).bounding_box() for k in range(2)]
    left, right = sorted(boxes, key=lambda r: r["x"])
    assert right["x"] - left["x"] < left["width"]  # close enough that one row would overlap
    apart_x = left["x"] + left["width"] <= right["x"]
    apart_y = left["y"] + left["height"] <= right["y"] or right["y"] + right["height"] <= left["y"]
    assert apart_x or apart_y, boxes

    # phases: floors beside caps (the focus run: base)
    assert page.locator("#phases thead th").all_inner_texts() == ["phase", "start step", "policy", "floors", "caps"]
    first = page.locator("#phases tbody tr").first.locator("td").all_inner_texts()
    assert first[3] == "stdlib_code ≥ 0.05, stdlib_docs ≥ 0.05, web_text ≥ 0.05"
    assert first[4] == "stdlib_code ≤ 1, stdlib_docs ≤ 1, web_text ≤ 1"
    # checkpoint and sample audit times: ISO 8601 with the zone
    written = page.locator("#checkpoints tbody tr").first.locator("td").nth(3).inner_text()
    assert ISO_WITH_ZONE.match(written), written
    audit = page.locator("#samples .audit h4").first.inner_text()
    assert ISO_WITH_ZONE.match(audit.split(" · ")[1]), audit
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard-overlay.png"), full_page=True)
    assert_not_blank(ARTIFACTS / "dashboard-overlay.png")
    assert not page.console_errors, page.console_errors
    assert a.step == 500 and b.step == 400

"""The configuration panel and the charts' CSV and PNG downloads, in a real headless Chromium against a real
server on a live run directory."""

from __future__ import annotations

import csv
import io
import json

from PIL import Image

from conftest import ARTIFACTS, assert_not_blank, make_run

READY = "() => window.__dashboard && window.__dashboard.ready"
CHARTS = ("chart-loss", "chart-val", "chart-mix", "chart-lr", "chart-gn", "chart-tps", "chart-mfu", "chart-cpu")
LABELS = (
    "(id) => { const u = window.DashSystem.chart(id); "
    "return u ? u.series.map((s) => s.label) : window.__dashboardChart(id).labels; }"
)


def config_rows(page) -> dict[str, tuple[str, bool]]:
    """The configuration table: setting -> (value, marked as overridden)."""
    rows = page.locator("#config-table tbody tr")
    out = {}
    for k in range(rows.count()):
        tr = rows.nth(k)
        key, value = tr.locator("td").all_inner_texts()
        out[key] = (value, "override" in (tr.get_attribute("class") or ""))
    return out


def test_configuration_panel_shows_the_effective_experiment_and_its_overrides(tmp_path, server_factory, page):
    run = make_run(tmp_path / "run-a", steps=300)
    run.engine_extra = {"ranks": 2}  # a data-parallel run: the engine build says on how many ranks
    run.write_state()
    exp = json.loads((run.root / "experiment.json").read_text())
    exp["train"]["lr"] = 0.002  # the effective experiment, as `--set train.lr=0.002` froze it
    (run.root / "experiment.json").write_text(json.dumps(exp))
    run.write_overrides(["train.lr=0.002"])
    srv = server_factory([run.root])
    srv.wait_indexed()
    assert srv.get("/api/runs/0/overrides").json()["value"] == ["train.lr=0.002"]
    page.goto(srv.url)
    page.wait_for_function(READY, timeout=10000)
    page.wait_for_function("() => window.__dashboard.connected", timeout=5000)
    rows = config_rows(page)
    assert rows["train.lr"] == ("0.002", True)
    assert rows["train.batch"] == ("8", False) and rows["arms.1.name"] == ('"stdlib_docs"', False)
    assert rows["model.dim"] == ("64", False) and rows["name"] == ('"run-a"', False)
    engine = page.locator("#config .config-engine").inner_text()
    assert "version synthetic" in engine and "source commit\nsynthetic" in engine and "2 ranks" in engine
    assert "train.lr=0.002" in page.locator("#config .config-overrides").inner_text()

    # a relaunch with other overrides: the panel follows without a reload
    exp["train"]["max_steps"] = 120
    (run.root / "experiment.json").write_text(json.dumps(exp))
    run.write_overrides(["train.lr=0.002", "train.max_steps=120"])
    page.wait_for_function(
        "() => document.querySelector('#config .config-overrides').textContent.includes('train.max_steps=120')",
        timeout=5000,
    )
    page.wait_for_function(
        "() => [...document.querySelectorAll('#config-table tr.override td:first-child')]"
        ".map((td) => td.textContent).join(',') === 'train.max_steps,train.lr'",
        timeout=5000,
    )
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator("#config").screenshot(path=str(ARTIFACTS / "dashboard-config.png"))
    assert_not_blank(ARTIFACTS / "dashboard-config.png", min_colours=8)
    assert not page.console_errors, page.console_errors


def open_page(browser, url: str):
    """A fresh tab on the page, ready. Each chart's two downloads get a tab of their own: in this suite
    headless Chromium now and then dropped a tab's eleventh download in quick succession (the page had made
    it, from a trusted click), which no user downloading a chart or two meets."""
    ctx = browser.new_context(viewport={"width": 1400, "height": 1300}, accept_downloads=True)
    pg = ctx.new_page()
    errors: list[str] = []
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
    pg.goto(url)
    pg.wait_for_function(READY, timeout=10000)
    return ctx, pg, errors


def test_every_chart_downloads_as_csv_and_png(tmp_path, server_factory, browser, live_writer):
    run = make_run(tmp_path / "run-a", steps=400)
    (run.root / ".overrides.json").write_text('{"overrides": "train.lr=1"}')  # not a record: not shown
    srv = server_factory([run.root])
    srv.wait_indexed()
    assert srv.get("/api/runs/0/overrides").json()["value"] is None
    ctx, page, errors = open_page(browser, srv.url)
    assert page.locator("#config .config-overrides").inner_text().startswith("none")
    assert not page.locator("#config-table tr.override").count()
    ctx.close()
    live_writer(run, rate=10)  # downloads of a live run: what the chart holds at the click
    ARTIFACTS.mkdir(exist_ok=True)
    for chart_id in CHARTS:
        ctx, page, errors = open_page(browser, srv.url)
        page.wait_for_function(
            "() => (window.DashSystem.chart('chart-cpu') || {data: [[]]}).data[0].length > 0", timeout=15000
        )
        panel = page.locator(f"#{chart_id}").locator("xpath=..")
        with page.expect_download() as got:
            panel.locator("button[data-download='csv']").click()
        dl = got.value
        assert dl.suggested_filename == chart_id.removeprefix("chart-") + ".csv"
        table = list(csv.reader(io.StringIO(open(dl.path(), encoding="utf-8").read())))
        assert table[0] == page.evaluate(LABELS, chart_id), chart_id
        assert len(table) - 1 >= 1 and all(len(row) == len(table[0]) for row in table), chart_id
        xs = [float(row[0]) for row in table[1:]]
        assert xs == sorted(xs), chart_id
        with page.expect_download() as got:
            panel.locator("button[data-download='png']").click()
        dl = got.value
        assert dl.suggested_filename == chart_id.removeprefix("chart-") + ".png"
        path = ARTIFACTS / f"download-{chart_id}.png"
        dl.save_as(str(path))
        img = Image.open(path).convert("RGB")
        canvas = page.locator(f"#{chart_id} canvas")
        assert img.width == canvas.evaluate("(c) => c.width"), chart_id
        assert img.height > canvas.evaluate("(c) => c.height"), chart_id  # title and legend added
        # not blank: a white background with lines and text of several colours on it
        colours = img.getcolors(maxcolors=1 << 20) or []
        assert len(colours) > 20, (chart_id, len(colours))
        white = sum(n for n, c in colours if c == (255, 255, 255))
        assert 0.1 < white / (img.width * img.height) < 0.995, chart_id
        assert not errors, errors
        ctx.close()

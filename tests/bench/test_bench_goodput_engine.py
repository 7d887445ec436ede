"""scripts/bench_goodput_engine.py: one short real measurement, the results file, and the
PERFORMANCE.md table it renders."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import bench_goodput_engine  # noqa: E402

SCRIPT = [sys.executable, str(REPO / "scripts" / "bench_goodput_engine.py")]
ENGINE = REPO / "build" / "microgpt_cpu"


def run_script(*args) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([*SCRIPT, *map(str, args)], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def test_a_short_measurement_is_added_to_the_results_file(tmp_path):
    if not ENGINE.is_file():
        pytest.fail("build/microgpt_cpu is missing: build it with `make cpu`")
    results = tmp_path / "engine.json"
    common = ("--threads", 1, "--repeats", 1, "--steps", 4, "--ckpt-every", 2, "--json", results)
    for label in ("first", "second", "first"):  # the same label again replaces its entry
        res = run_script(*common, "--label", label, "--baseline", ENGINE)
        assert res.returncode == 0, res.stderr
    runs = json.loads(results.read_text())
    assert [r["label"] for r in runs] == ["second", "first"]
    r = runs[-1]
    assert r["threads"] == 1 and len(r["audit"]["old"]["ms"]) == len(r["audit"]["new"]["ms"]) == 1
    assert r["audit"]["old"]["frames"] == 4 and r["audit"]["new"]["frames"] == 1 and r["audit"]["speedup"] > 0
    for side in ("checkpoints_engine", "checkpoints_baseline"):
        c = r[side]
        assert c["background_writer"] and len(c["write_ms"]) == len(c["loop_stall_ms"]) == 2, c
    assert len(r["load"]) == 2 and "--label first" in r["command"]
    table = bench_goodput_engine.render_table(runs)
    assert "| first |" in table and "| second |" in table and "bench_goodput_engine.py" in table


def test_table_rendered_between_markers_and_bad_files_refused(tmp_path):
    run = {
        "label": "after",
        "commit": "abc1234",
        "machine": "2 CPUs (X)",
        "date": "d",
        "threads": 1,
        "command": "python scripts/bench_goodput_engine.py --threads 1",
        "load": [0.5, 0.7],
        "audit": {
            "old": {"frames": 4, "ms": [9000.0, 8000.0, 10000.0]},
            "new": {"frames": 1, "ms": [900.0, 1000.0, 1100.0]},
            "speedup": 9.0,
        },
        "checkpoints_engine": {
            "median_step_ms": 500.0,
            "loop_stall_ms": [5.0, 7.0, 9.0],
            "write_ms": [100.0, 120.0, 140.0],
            "background_writer": True,
        },
    }
    results = tmp_path / "r.json"
    results.write_text(json.dumps([run]))
    doc = tmp_path / "PERF.md"
    m = bench_goodput_engine.MARKERS
    doc.write_text(f"intro\n\n{m.begin('x')}\nold table\n{m.end}\n\nafter\n")
    res = run_script("--render", results, "--doc", doc)
    assert res.returncode == 0, res.stderr
    text = doc.read_text()
    assert "old table" not in text and text.startswith("intro\n") and text.endswith("\nafter\n")
    assert "| after | `abc1234` | 1 | 9000 | 1000 | **9.0x** | 500 | 7.0 | 120 | - | 0.5-0.7 |" in text
    for bad in ("not json", json.dumps({"label": "x"}), json.dumps([{"label": "x"}])):
        results.write_text(bad)
        res = run_script("--render", results, "--doc", doc)
        assert res.returncode == 2 and res.stderr.count("\n") == 1 and "bench_goodput_engine:" in res.stderr
        assert "| after |" in doc.read_text()  # the document is left as it was

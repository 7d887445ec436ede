"""scripts/bench_goodput.py: a short real proxy run measured from outside, the results file, and the
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
import bench_goodput  # noqa: E402

SCRIPT = [sys.executable, str(REPO / "scripts" / "bench_goodput.py")]
STEPS = 40


def run_script(*args, cache: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), MICROGPT_CACHE=str(cache))
    return subprocess.run([*SCRIPT, *map(str, args)], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def test_a_tiny_run_through_the_real_proxy(tmp_path):
    if not (REPO / "build" / "microgpt_cpu").is_file():
        pytest.fail("build/microgpt_cpu is missing: build it with `make cpu`")
    results = tmp_path / "goodput.json"
    res = run_script(
        "run",
        REPO / "experiments" / "TINY-TRAIN.json",
        "--steps",
        STEPS,
        "--threads",
        1,
        "--train",
        "eval_every=20",
        "--train",
        "sample_every=20",
        "--train",
        "ckpt_every=10",
        "--label",
        "tiny",
        "--json",
        results,
        "--keep",
        tmp_path / "work",
        cache=tmp_path / "cache",
    )
    assert res.returncode == 0, res.stderr
    (r,) = json.loads(results.read_text())
    assert r["label"] == "tiny" and r["steps"] == STEPS and r["experiment"] == "TINY-TRAIN"
    # the engine's own timings, read from its teed events: 2 evals and 2 audits, 4 checkpoints
    assert {k: a["count"] for k, a in r["audits"].items()} == {"sample": 2, "eval": 2, "checkpoint": 4}
    steps = [json.loads(line) for line in (tmp_path / "work" / "run" / ".loss.json").read_text().splitlines()]
    assert r["step_s"] == pytest.approx(sum(e["ms"] for e in steps if e["type"] == "step") / 1000.0)
    assert r["wall_s"] > r["step_s"] > 0 and r["startup_s"] > 0
    assert r["overhead_s"] == pytest.approx(r["wall_s"] - r["step_s"])
    assert r["other_s"] == pytest.approx(r["overhead_s"] - sum(a["s"] for a in r["audits"].values()))
    assert r["wall_tokens_per_s"] < r["engine_tokens_per_s"]
    # the proxy's own account covers the same run (it stops counting a little before the process exits)
    g = r["proxy_goodput"]
    assert g["steps"] == STEPS and g["step_s"] == pytest.approx(r["step_s"])
    assert g["audits"]["eval"]["count"] == 2 and g["wall_s"] <= r["wall_s"]
    assert "overhead" in res.stdout and "added 'tiny'" in res.stdout


def test_table_rendered_between_markers(tmp_path):
    run = {
        "label": "after",
        "commit": "abc1234",
        "experiment": "P",
        "steps": 100,
        "threads": 1,
        "engine": "cpu",
        "command": "python scripts/bench_goodput.py run --threads 1",
        "machine": "2 CPUs (X)",
        "date": "d",
        "load_before": 6.0,
        "load_after": 6.5,
        "startup_s": 2.0,
        "wall_s": 200.0,
        "step_s": 180.0,
        "audits": {
            "sample": {"count": 4, "s": 5.0},
            "eval": {"count": 4, "s": 12.0},
            "checkpoint": {"count": 4, "s": 0.5},
        },
        "after_last_step_s": 4.0,
        "tokens": 204800,
        "proxy_goodput": None,
    }
    results = tmp_path / "r.json"
    results.write_text(json.dumps([run]))
    table = bench_goodput.render_table(bench_goodput.load_runs(results)).splitlines()
    assert table[2] == (
        "| after | `abc1234` | 100 | 2.0 s | 200.0 s | 180.0 s | **20.0 s (10.0%)** | 5.0 s (2.5%) "
        "| 12.0 s (6.0%) | 0.5 s (0.2%) | 2.5 s (1.2%) | 1,024 / 1,138 | 6.0-6.5 |"
    )
    assert "- `python scripts/bench_goodput.py run --threads 1`" in table
    doc = tmp_path / "PERF.md"
    doc.write_text(
        "# P\n\n" + bench_goodput.MARKERS.begin("old") + "\nstale\n" + bench_goodput.MARKERS.end + "\nkept\n"
    )
    assert bench_goodput.main(["render", str(results), "--doc", str(doc)]) == 0
    text = doc.read_text()
    assert "stale" not in text and "| after |" in text and text.endswith(bench_goodput.MARKERS.end + "\nkept\n")
    assert bench_goodput.MARKERS.begin(str(results)) in text


@pytest.mark.parametrize(
    "content,why",
    [("not json", "not JSON"), ('{"a": 1}', "expected a list of runs"), ('[{"label": 1}]', "a run is malformed")],
)
def test_bad_results_file_is_one_line_and_exit_2(tmp_path, capsys, content, why):
    results = tmp_path / "r.json"
    results.write_text(content)
    doc = tmp_path / "PERF.md"
    doc.write_text("untouched")
    assert bench_goodput.main(["render", str(results), "--doc", str(doc)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and why in err[0] and doc.read_text() == "untouched"

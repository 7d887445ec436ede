"""scripts/bench_ranks.py's table: rendered between PERFORMANCE.md's markers from the results file, the
committed table equal to what docs/bench/ranks-cpu.json renders, and bad files refused in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import bench_ranks  # noqa: E402
from cuda_bench_report import rewrite_between_markers  # noqa: E402

SCRIPT = [sys.executable, str(REPO / "scripts" / "bench_ranks.py")]
RESULTS = REPO / "docs" / "bench" / "ranks-cpu.json"
DOC = REPO / "docs" / "PERFORMANCE.md"

RESULT = {
    "shape": "small",
    "batch": 4,
    "steps": 20,
    "skip": 3,
    "rounds": 3,
    "tokens_per_s": {
        "1 rank x 2 threads": [7000.0, 7100.4, 6900.0],
        "1 rank x 1 thread": [4400.0, 4300.0, 4500.0],
        "2 ranks x 1 thread": [6800.0, 6700.0, 6900.0],
    },
    "median_tokens_per_s": {"1 rank x 2 threads": 7000.0, "1 rank x 1 thread": 4400.0, "2 ranks x 1 thread": 6800.0},
    "same_losses": True,
    "machine": "2 CPUs (X), Linux",
    "commit": "abc1234",
    "command": "python scripts/bench_ranks.py --rounds 3",
    "load_average_at_start": [1.25, 1.0, 1.0],
    "load_average_at_end": [2.0, 1.0, 1.0],
}


def run_script(*args) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([*SCRIPT, *map(str, args)], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def test_table_of_a_result():
    table = bench_ranks.render_table(RESULT)
    assert "| 2 ranks, `--threads 1` each (`mpirun -np 2 build/microgpt_cpu_mpi`) | 6,800 | 6,800, 6,700, 6,900 |" in (
        table
    )
    assert "| 1 process, `--threads 2` (`build/microgpt_cpu`) | 7,000 | 7,000, 7,100, 6,900 |" in table
    assert "2 ranks over 1 process with 2 threads: 0.97;" in table and "twice 1 process with 1 thread: 0.77" in table
    assert "Machine: 2 CPUs (X), Linux, load average 1.2 at the start, 2.0 at the end; commit `abc1234`" in table
    assert table.endswith("Command: `python scripts/bench_ranks.py --rounds 3`")


def test_a_result_recorded_without_command_and_commit():
    """The results of before they were recorded: the command rebuilt from the recorded arguments, no commit."""
    old = {k: v for k, v in RESULT.items() if k not in ("command", "commit")}
    table = bench_ranks.render_table({**old, "machine": {"cpu": "x86_64", "cores": 2}})
    assert "Machine: 2 CPUs (x86_64), load average" in table and "commit not recorded" in table
    assert table.endswith("`python scripts/bench_ranks.py --shape small --batch 4 --steps 20 --skip 3 --rounds 3`")


def test_rendered_between_markers_and_bad_files_refused(tmp_path):
    results = tmp_path / "r.json"
    results.write_text(json.dumps(RESULT))
    doc = tmp_path / "PERF.md"
    m = bench_ranks.MARKERS
    doc.write_text(f"intro\n\n{m.begin('x')}\nold table\n{m.end}\n\nafter\n")
    res = run_script("--render", results, "--doc", doc)
    assert res.returncode == 0, res.stderr
    text = doc.read_text()
    assert "old table" not in text and text.startswith("intro\n") and text.endswith("\nafter\n")
    assert "| 1 process, `--threads 1` | 4,400 | 4,400, 4,300, 4,500 |" in text
    without_machine = {k: v for k, v in RESULT.items() if k != "machine"}
    other_configs = {**RESULT, "median_tokens_per_s": {"4 ranks": 1.0}}
    for bad in ("not json", "[]", json.dumps(without_machine), json.dumps(other_configs)):
        results.write_text(bad)
        res = run_script("--render", results, "--doc", doc)
        assert res.returncode == 2 and res.stderr.count("\n") == 1 and "bench_ranks:" in res.stderr, res.stderr
        assert "| 1 process, `--threads 1` | 4,400 |" in doc.read_text()  # the document is left as it was


def test_performance_md_shows_the_committed_result():
    """The table in docs/PERFORMANCE.md is the one docs/bench/ranks-cpu.json renders (regenerate it with
    `python scripts/bench_ranks.py --render docs/bench/ranks-cpu.json --doc docs/PERFORMANCE.md`)."""
    text = DOC.read_text()
    table = bench_ranks.render_table(bench_ranks.load_result(RESULTS))
    source = str(RESULTS.relative_to(REPO))
    assert rewrite_between_markers(text, table, source, bench_ranks.MARKERS) == text

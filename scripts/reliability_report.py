#!/usr/bin/env python3
"""Run the fault-injection suite and write docs/RELIABILITY.md from what it recorded.

    python scripts/reliability_report.py                 # run tests/faults, write docs/RELIABILITY.md
    FAULT_SEED=7 python scripts/reliability_report.py    # another seed
    python scripts/reliability_report.py --results test-artifacts/faults/results.json   # no run, just render

The CUDA engine's section comes from docs/reliability-cuda.json (`--gpu-results`): the results
`make test-gpu` leaves on a GPU machine (test-artifacts/faults/results-cuda.json), copied there.

The scenarios live in tests/faults/*_scenarios.py (engine_scenarios.py, proxy_scenarios.py,
run_dir_scenarios.py, storage_scenarios.py, process_scenarios.py, path_scenarios.py, divergence_scenarios.py,
input_scenarios.py, data_scenarios.py, dashboard_scenarios.py, flood_scenarios.py, tracking_scenarios.py,
rank_scenarios.py;
shared parts in scenarios.py and proxy_harness.py); the tests in tests/faults/ record every scenario's
outcome (faults injected, survived, steps lost, data lost) to a JSON file, which this script turns into
the table. Nothing in the table is typed by hand.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections import OrderedDict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "docs" / "RELIABILITY.md"
DEFAULT_RESULTS = REPO / "test-artifacts" / "faults" / "report-results.json"
# The kill storms on the CUDA engine (`make test-gpu` on a GPU machine), kept in the repository because
# no machine that regenerates this report has a GPU.
DEFAULT_GPU_RESULTS = REPO / "docs" / "reliability-cuda.json"

sys.path.insert(0, str(REPO / "scripts"))
from reliability_classes import NOTES, WHAT  # noqa: E402  (the report's prose: what each class asserts)


def run_suite(results: Path, pytest_args: list[str]) -> tuple[int, float]:
    env = dict(os.environ, FAULT_RESULTS=str(results))
    results.parent.mkdir(parents=True, exist_ok=True)
    results.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pytest", "tests/faults", "-q", "-p", "no:cacheprovider", *pytest_args]
    print("+", " ".join(cmd), f"(FAULT_SEED={env.get('FAULT_SEED', 'default')})", flush=True)
    t0 = time.monotonic()
    rc = subprocess.call(cmd, cwd=REPO, env=env)
    return rc, time.monotonic() - t0


def aggregate(outcomes: list[dict]) -> OrderedDict[str, dict]:
    rows: OrderedDict[str, dict] = OrderedDict((k, None) for k in WHAT)
    for o in outcomes:
        row = rows.get(o["fault_class"])
        if row is None:
            row = rows[o["fault_class"]] = {
                "injected": 0,
                "survived": 0,
                "steps_lost": 0,
                "data_lost": 0,
                "failures": [],
                "tests": [],
                "notes": [],
                "outcomes": [],
                "seconds": 0.0,
            }
        for k in ("injected", "survived", "steps_lost", "data_lost"):
            row[k] += int(o.get(k) or 0)
        row["seconds"] += float(o.get("seconds") or 0)
        row["failures"] += o.get("failures") or []
        row["tests"].append((o["test"], o.get("test_outcome", "unknown")))
        row["outcomes"].append(o["scenario"])
        for key, value in sorted((o.get("notes") or {}).items()):
            row["notes"].append((o["scenario"], key, value))
    return OrderedDict((k, v) for k, v in rows.items() if v is not None)


_TMP = re.compile(rf"(?:/tmp|/var/tmp|{re.escape(tempfile.gettempdir())})/[^\s'\")]*/")


def _cell(text) -> str:
    """One table/list cell: no pipes, no newlines, temp directories shortened to '.../'."""
    return _TMP.sub(".../", str(text)).replace("|", "\\|").replace("\n", " ")


def _results(doc: dict, suite_rc: int | None, suite_seconds: float | None, heading: str) -> list[str]:
    """The suite's status line, the table of fault classes, the kill count and the failures of one run."""
    rows = aggregate(doc.get("outcomes") or [])
    tests = doc.get("tests") or {}
    failed_tests = sorted(t for t, r in tests.items() if r == "failed")
    skipped_tests = sorted(t for t, r in tests.items() if r == "skipped")
    n_pass = sum(1 for r in tests.values() if r == "passed")
    status = (
        f"suite: {n_pass} passed, {len(failed_tests)} failed, {len(skipped_tests)} skipped"
        + (f" in {suite_seconds:.0f} s" if suite_seconds else f" in {doc.get('seconds', 0):.0f} s")
        + (f" (pytest exit {suite_rc})" if suite_rc is not None else "")
    )
    out = [f"**{status}.**", ""]
    out += ["| fault class | injected | survived | steps lost | data lost | result |", "|---|---:|---:|---:|---:|---|"]
    total = {"injected": 0, "survived": 0, "steps_lost": 0, "data_lost": 0}
    for cls, row in rows.items():
        results = {r for _t, r in row["tests"]}
        ok = (
            not row["failures"]
            and row["survived"] == row["injected"]
            and row["data_lost"] == 0
            and results <= {"passed"}
        )
        for k in total:
            total[k] += row[k]
        out.append(
            f"| {_cell(cls)} | {row['injected']} | {row['survived']} | {row['steps_lost']} | "
            f"{row['data_lost']} | {'pass' if ok else '**FAIL**'} |"
        )
    out.append(
        f"| **all** | **{total['injected']}** | **{total['survived']}** | **{total['steps_lost']}** | "
        f"**{total['data_lost']}** | |"
    )
    out.append("")
    kills = doc.get("kills")
    out += [
        f"`kill -9` faults in this run: {kills['injected']} ({kills['survived']} survived)."
        if kills
        else "`kill -9` faults in this run: not recorded (a results file from before the count).",
        "",
    ]
    if skipped_tests:
        out += ["Skipped: " + ", ".join(f"`{t}`" for t in skipped_tests) + ".", ""]
    if failed_tests or any(r["failures"] for r in rows.values()):
        out += [
            f"{heading} Failures",
            "",
            "Every broken invariant the suite found in this run (first lines of each):",
            "",
        ]
        for cls, row in rows.items():
            if row["failures"]:
                out.append(f"- **{_cell(cls)}**:")
                seen = []
                for f in row["failures"]:
                    line = f.splitlines()[0] if f else f
                    if line not in seen:
                        seen.append(line)
                for line in seen[:6]:
                    out.append(f"  - {_cell(line[:400])}")
                if len(seen) > 6:
                    out.append(f"  - ... and {len(seen) - 6} more")
        for t in failed_tests:
            if not any(t == test for row in rows.values() for test, _ in row["tests"]):
                out.append(f"- `{t}` failed before recording an outcome")
        out.append("")
    return out


def _generated(doc: dict, command: str) -> str:
    machine = doc.get("machine") or {}
    when = dt.datetime.fromtimestamp(doc.get("started") or time.time(), dt.timezone.utc)
    gpu = f", GPU {machine['gpu']}" if machine.get("gpu") else ""
    return (
        f"Generated {when:%Y-%m-%d %H:%M} UTC by `{command}` with `FAULT_SEED={doc.get('seed')}` on "
        f"{machine.get('platform', platform.platform())}, {machine.get('cpus')} CPUs{gpu}, Python "
        f"{machine.get('python')}, engine `{Path(str(machine.get('engine', '?'))).name}`."
    )


def _gpu_section(gpu_doc: dict | None, gpu_source: str) -> list[str]:
    out = ["## The CUDA engine on a GPU", ""]
    if gpu_doc is None:
        return out + [
            "No results for the CUDA engine (no `docs/reliability-cuda.json`). `make test-gpu` on a GPU runs the "
            "kill storms (tests/faults/test_kills.py) with the proxy's end-to-end and pivot suites against "
            "`build/microgpt_cuda` (`MICROGPT_TEST_ENGINE=cuda`), each run compared with its own uninterrupted "
            "reference on the same GPU, prints the kill count and leaves "
            "`test-artifacts/faults/results-cuda.json`; copied to `docs/reliability-cuda.json`, the next "
            "`python scripts/reliability_report.py` puts its table here, the GPU named.",
            "",
        ]
    machine = gpu_doc.get("machine") or {}
    if machine.get("engine_kind") != "cuda":
        raise ValueError(
            f"{gpu_source}: recorded on the {machine.get('engine_kind', 'unknown')} engine "
            f"{machine.get('engine')}, not the CUDA one"
        )
    return (
        out
        + [f"From `{gpu_source}`. " + _generated(gpu_doc, "make test-gpu"), ""]
        + _results(gpu_doc, None, None, "###")
    )


def render(
    doc: dict,
    suite_rc: int | None,
    suite_seconds: float | None,
    command: str,
    gpu_doc: dict | None = None,
    gpu_source: str = "",
) -> str:
    rows = aggregate(doc.get("outcomes") or [])
    out = [
        "# Reliability",
        "",
        "<!-- Generated by scripts/reliability_report.py from the fault-injection suite (tests/faults/). "
        "Do not edit by hand: rerun the script. -->",
        "",
        "What survives when microgpt is attacked with real faults: `kill -9` of the engine, the proxy or "
        "both (inside checkpoint writes too), full disks and write errors (the engine's and the proxy's), "
        "corrupted checkpoints and sidecars, run-directory files that are devices, FIFOs or symlinks, a "
        "rewritten phase history, hung and crash-looping engines, signal storms, fuzzed and oversized "
        "inputs, forged process records and locks, copied and replaced run directories, diverged runs, "
        "and a dashboard indexing a large log or flooded by clients that never read. The suite is "
        "`tests/faults/` (part of `make test`); the scenarios are in `tests/faults/engine_scenarios.py`, "
        "`proxy_scenarios.py` (with the shared parts: `scenarios.py`, `proxy_harness.py`), "
        "`run_dir_scenarios.py` (the proxy's own files, signals before training), "
        "`storage_scenarios.py` (the proxy's own writes failing), "
        "`process_scenarios.py` (forged records and locks, run in a pid namespace: `sandbox.py`), "
        "`path_scenarios.py`, `divergence_scenarios.py`, `input_scenarios.py`, `dashboard_scenarios.py` "
        "and `flood_scenarios.py`.",
        "",
        "## The CPU engine",
        "",
        _generated(doc, command),
        "",
    ]
    out += _results(doc, suite_rc, suite_seconds, "###")
    out += _gpu_section(gpu_doc, gpu_source)
    out += ["## What is asserted", ""]
    for cls, row in rows.items():
        what = WHAT.get(cls, "")
        tnames = ", ".join(sorted({f"`{t.split('::', 1)[-1]}`" for t, _ in row["tests"]}))
        out.append(f"- **{_cell(cls)}** ({tnames}; {row['seconds']:.0f} s): {what}")
        for _scen, key, value in row["notes"]:
            if isinstance(value, (list, dict)):
                value = json.dumps(value)
            out.append(f"  - {key}: {_cell(value)}")
    out += ["", NOTES]
    return "\n".join(out).rstrip() + "\n"


def _display(path: Path) -> str:
    """A path as the report shows it: relative to the repository where it is inside it."""
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, help="render this results file instead of running the suite")
    ap.add_argument(
        "--gpu-results",
        type=Path,
        default=DEFAULT_GPU_RESULTS,
        help="a `make test-gpu` results file for the CUDA engine's section (default "
        "docs/reliability-cuda.json; absent: the section says it has not run)",
    )
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write (default docs/RELIABILITY.md)")
    ap.add_argument("--seed", type=int, help="FAULT_SEED for the run (default: $FAULT_SEED or the suite's)")
    ap.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = ap.parse_args(argv)
    if args.seed is not None:
        os.environ["FAULT_SEED"] = str(args.seed)
    suite_rc = suite_seconds = None
    command = "python scripts/reliability_report.py"
    if args.results:
        results = args.results
        command += f" --results {args.results}"
    else:
        results = DEFAULT_RESULTS
        suite_rc, suite_seconds = run_suite(results, args.pytest_args)
    try:
        doc = json.loads(results.read_text())
    except (OSError, ValueError) as exc:
        print(f"reliability_report: cannot read {results}: {exc}", file=sys.stderr)
        return 1
    gpu_doc = None
    if args.gpu_results.exists():
        try:
            gpu_doc = json.loads(args.gpu_results.read_text())
        except (OSError, ValueError) as exc:
            print(f"reliability_report: cannot read {args.gpu_results}: {exc}", file=sys.stderr)
            return 1
    try:
        text = render(doc, suite_rc, suite_seconds, command, gpu_doc, _display(args.gpu_results))
    except ValueError as exc:
        print(f"reliability_report: {exc}", file=sys.stderr)
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out} ({len(doc.get('outcomes') or [])} scenario outcomes, seed {doc.get('seed')})")
    return 0 if suite_rc in (None, 0) else suite_rc


if __name__ == "__main__":
    sys.exit(main())

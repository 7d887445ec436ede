#!/usr/bin/env python3
"""Does a mixing policy beat uniform? Train one experiment under several policies and seeds, and compare.

    python scripts/eval_mixing.py                       # the committed evaluation (docs/DATA-MIXING.md)
    python scripts/eval_mixing.py --policies uniform progress --seeds 1 --jobs 1
    python scripts/eval_mixing.py --report-only          # summarise the runs already in --runs-dir
    python scripts/eval_mixing.py --from-summary --doc docs/DATA-MIXING.md   # tables and plots from the summary

Every (policy, seed) is a real `proxy run` of the experiment with only its
name, seed and bandit policy changed (scripts/mixing/runs.py), in
RUNS_DIR/<name>, so `proxy dashboard --run-dir RUNS_DIR` overlays them; an
interrupted evaluation resumes where it stopped. Then, per policy
(scripts/mixing/summary.py): the mean validation loss over the target arms
against steps, the first step at which it reaches uniform's final value,
each arm's final validation loss, and the mixture over time, with the goals
checked. It writes the JSON summary (--summary), the PNG plots (--plots,
when matplotlib is installed) and, with --doc, the results tables into the
doc between its markers (scripts/mixing/report.py). --from-summary redraws
the plots and tables from a summary already written, touching nothing else.

Exit status: 0 when the evaluation ran and was summarised (whether or not a
policy met its goals), 1 when a run failed, 2 for bad arguments.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from machine_info import cpu_model  # noqa: E402
from mixing.report import ReportError, plot_summary, results_markdown, write_results  # noqa: E402
from mixing.runs import LaunchOptions, LoadSampler, launch, plan_runs  # noqa: E402
from mixing.summary import BASELINE, SummaryError, read_run, summarize  # noqa: E402
from proxy.atomic import atomic_write_json  # noqa: E402
from proxy.data.prepare import DataError, default_cache_dir, prepare_data  # noqa: E402
from proxy.config.errors import ExperimentError  # noqa: E402
from proxy.config.experiment import load_experiment  # noqa: E402
from proxy.config.policies import POLICIES  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--experiment", type=Path, default=REPO / "experiments" / "MIXING-EVAL.json")
    ap.add_argument("--policies", nargs="+", default=[BASELINE, *(p for p in POLICIES if p != BASELINE)], metavar="POLICY",
                    help=f"policies to compare ({', '.join(POLICIES)}); must include {BASELINE}")
    ap.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3], metavar="SEED")
    ap.add_argument("--jobs", type=int, default=2, help="runs trained at once (default 2)")
    ap.add_argument("--runs-dir", type=Path, default=REPO / "runs" / "mixing-eval")
    ap.add_argument("--summary", type=Path, default=REPO / "docs" / "bench" / "mixing-cpu.json")
    ap.add_argument("--plots", type=Path, default=REPO / "docs" / "img", metavar="DIR")
    ap.add_argument("--doc", type=Path, default=None, help="write the results tables into this doc "
                    "(e.g. docs/DATA-MIXING.md) between its markers")
    ap.add_argument("--engine", default="cpu", help="engine for every run: cpu, cuda or a path (default cpu)")
    ap.add_argument("--cache-dir", type=Path, default=None, help="prepared-data cache (default as `proxy run`)")
    ap.add_argument("--default-policy", default=None, help="the policy whose goals the report leads with "
                    "(default: the experiment's bandit.policy)")
    ap.add_argument("--report-only", action="store_true", help="summarise the runs in --runs-dir; train nothing")
    ap.add_argument("--from-summary", action="store_true", help="only redraw --plots and --doc's tables from the "
                    "--summary file")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    return ap


def check_args(args) -> str | None:
    unknown = [p for p in args.policies if p not in POLICIES]
    if unknown:
        return f"unknown policy {', '.join(unknown)} (known: {', '.join(POLICIES)})"
    if BASELINE not in args.policies:
        return f"--policies must include {BASELINE} (the baseline)"
    if len(set(args.policies)) != len(args.policies) or len(set(args.seeds)) != len(args.seeds):
        return "--policies and --seeds must not repeat"
    if any(s < 0 for s in args.seeds):
        return "--seeds must be non-negative"
    if args.jobs < 1:
        return "--jobs must be at least 1"
    return None


def machine() -> dict:
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform()}


def report(summary: dict, args) -> int:
    """The plots and, with --doc, the tables of `summary`."""
    plots, why_not = plot_summary(summary, args.plots)
    print(f"eval_mixing: plots {', '.join(map(str, plots))}" if plots else f"eval_mixing: {why_not}")
    if args.doc is not None:
        try:
            write_results(args.doc, results_markdown(summary))
        except ReportError as e:
            print(f"eval_mixing: {e}", file=sys.stderr)
            return EXIT_USAGE
        print(f"eval_mixing: results tables written into {args.doc}")
    return EXIT_OK


def from_summary(args) -> int:
    try:
        summary = json.loads(args.summary.read_text())
        results_markdown(summary)  # a file that is not a summary fails here, before anything is written
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"eval_mixing: {args.summary}: not a mixing summary ({e})", file=sys.stderr)
        return EXIT_USAGE
    return report(summary, args)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    problem = check_args(args)
    if problem:
        print(f"eval_mixing: {problem}", file=sys.stderr)
        return EXIT_USAGE
    if args.from_summary:
        return from_summary(args)
    try:
        experiment = load_experiment(args.experiment)
        specs = plan_runs(args.experiment, args.policies, args.seeds, args.runs_dir)
    except ExperimentError as e:
        print(f"eval_mixing: {e}", file=sys.stderr)
        return EXIT_USAGE
    default_policy = args.default_policy or experiment.bandit.policy
    threads = experiment.train.threads or os.cpu_count()
    if args.jobs * threads > (os.cpu_count() or 1) and not args.report_only:
        print(f"eval_mixing: note: {args.jobs} runs x {threads} engine threads on {os.cpu_count()} cores",
              file=sys.stderr)

    load = LoadSampler()
    t0 = time.monotonic()
    run_walls = {}
    if not args.report_only:
        try:
            prepare_data(load_experiment(specs[0].experiment), args.experiment.resolve().parent,
                         args.cache_dir or default_cache_dir(), progress=not args.no_progress)
        except DataError as e:
            print(f"eval_mixing: {e}", file=sys.stderr)
            return EXIT_USAGE
        results = launch(specs, experiment.train.max_steps,
                         LaunchOptions(args.jobs, args.engine, args.cache_dir, not args.no_progress), load)
        failed = [r for r in results if r.returncode != 0]
        for r in failed:
            print(f"eval_mixing: run {r.spec.name} failed (exit {r.returncode}); see {r.spec.log}", file=sys.stderr)
        if failed:
            return EXIT_FAILED
        run_walls = {r.spec.name: round(r.wall_s, 1) for r in results}
    wall = time.monotonic() - t0

    try:
        series = {(s.policy, s.seed): read_run(s.run_dir, experiment.arm_names, experiment.train.max_steps)
                  for s in specs}
        summary = summarize(series, experiment, args.policies, default_policy)
    except SummaryError as e:
        print(f"eval_mixing: {e}", file=sys.stderr)
        return EXIT_FAILED
    summary["how"] = {
        "command": " ".join(["python", os.path.relpath(__file__, REPO), *(argv if argv is not None else sys.argv[1:])]),
        "machine": machine(), "jobs": args.jobs, "engine_threads": threads,
        "wall_s": None if args.report_only else round(wall, 1), "run_wall_s": run_walls,
        "load_average_1m": None if args.report_only else load.summary(),
    }
    args.summary.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.summary, summary)
    print(results_markdown(summary))
    print(f"eval_mixing: summary {args.summary}" + (f"; {wall / 60:.1f} min" if not args.report_only else ""))
    return report(summary, args)


if __name__ == "__main__":
    sys.exit(main())

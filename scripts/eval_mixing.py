#!/usr/bin/env python3
"""Does a mixing policy beat uniform? Train the suite's mixes under several policies and seeds, and compare.

    python scripts/eval_mixing.py --doc docs/DATA-MIXING.md   # the committed suite: every mix, default vs uniform
    python scripts/eval_mixing.py --mix good shuffled          # some mixes of the suite
    python scripts/eval_mixing.py --policies uniform target progress ucb1 exp3   # other policies too
    python scripts/eval_mixing.py --experiment my.json --seeds 1 2 3   # one experiment of your own
    python scripts/eval_mixing.py --report-only                # summarise the runs already in --runs-dir
    python scripts/eval_mixing.py --from-summary --doc docs/DATA-MIXING.md   # tables and plots from the summary
    python scripts/eval_mixing.py --mix shuffled --runs-dir /tmp/r --compare docs/bench/mixing-cpu.json

The suite is scripts/mixing/suite.py: a few mixes built on the machine from
real text, each with a stated purpose; first the corpora its experiments
name are built (scripts/mixing/corpora.py; unchanged ones are left alone).
Every (mix, policy, seed) is a real `proxy run` of the mix's experiment with
only its name, seed and bandit policy changed (scripts/mixing/runs.py), in
RUNS_DIR/<name>, so `proxy dashboard --run-dir RUNS_DIR` overlays them; an
interrupted evaluation resumes where it stopped. Then, per mix and policy (scripts/mixing/summary.py): the mean
validation loss over the target arms against steps, the first step at which
it reaches uniform's final value, each arm's final validation loss, the
mixture over time and how far it moved, with the goals checked. It writes one
JSON summary for all mixes (--summary), the PNG plots (--plots, when
matplotlib is installed; by default docs/img for the committed summary,
else beside the summary, so an evaluation of one's own never overwrites the
committed plots) and, with --doc, the results tables into the doc
between its markers (scripts/mixing/report.py). --from-summary redraws the
plots and tables from a summary already written, touching nothing else.
--compare checks that every mix this summary holds has the same results (all
but the `how` block: wall times, load) in another summary, field by field
(scripts/mixing/compare.py): one line per mix, `identical` or the first field
that differs; the bit-for-bit reproduction of a committed evaluation. With
--compare the summary goes to RUNS_DIR/summary.json unless --summary names it
(never over the summary compared with).

Exit status: 0 when the evaluation ran and was summarised (whether or not a
policy met its goals), 1 when a run failed or --compare found a difference,
2 for bad arguments, 130 when interrupted (Ctrl-C or SIGTERM: the runs in
flight checkpoint and stop; the same command resumes them).
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
from mixing.compare import CompareError, compare_mixes, read_mixes  # noqa: E402
from mixing.corpora import CorpusError, build, needed_by  # noqa: E402
from mixing.report import ReportError, plot_summary, results_markdown, write_results  # noqa: E402
from mixing.runs import LaunchOptions, LoadSampler, finished, launch, plan_runs  # noqa: E402
from mixing.suite import BY_NAME, SUITE, Mix  # noqa: E402
from mixing.summary import BASELINE, SummaryError, read_run, summarize  # noqa: E402

from proxy.atomic import atomic_write_json  # noqa: E402
from proxy.config.config_file import ExperimentError  # noqa: E402
from proxy.config.experiment import load_experiment  # noqa: E402
from proxy.config.policies import DEFAULT_POLICY, POLICIES  # noqa: E402
from proxy.data.prepare import DataError, default_cache_dir, prepare_data  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
COMMITTED_SUMMARY = REPO / "docs" / "bench" / "mixing-cpu.json"
COMMITTED_PLOTS = REPO / "docs" / "img"
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--mix",
        nargs="+",
        default=None,
        metavar="MIX",
        help=f"mixes of the suite to run ({', '.join(m.name for m in SUITE)}; default: all)",
    )
    ap.add_argument(
        "--experiment",
        type=Path,
        default=None,
        help="evaluate this experiment instead of the suite (its arms marked target are the objective)",
    )
    ap.add_argument(
        "--policies",
        nargs="+",
        default=[BASELINE, DEFAULT_POLICY],
        metavar="POLICY",
        help=f"policies to compare ({', '.join(POLICIES)}); must include {BASELINE} "
        f"(default: {BASELINE} {DEFAULT_POLICY})",
    )
    ap.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3], metavar="SEED")
    ap.add_argument("--jobs", type=int, default=2, help="runs trained at once (default 2)")
    ap.add_argument("--runs-dir", type=Path, default=REPO / "runs" / "mixing-eval")
    ap.add_argument(
        "--summary",
        type=Path,
        default=None,
        help="where the summary goes (default: docs/bench/mixing-cpu.json; with --compare, RUNS_DIR/summary.json)",
    )
    ap.add_argument(
        "--plots",
        type=Path,
        default=None,
        metavar="DIR",
        help="where the PNGs go (default: docs/img for the committed summary, else beside --summary)",
    )
    ap.add_argument(
        "--doc",
        type=Path,
        default=None,
        help="write the results tables into this doc (e.g. docs/DATA-MIXING.md) between its markers",
    )
    ap.add_argument(
        "--doc-block",
        default="results",
        metavar="NAME",
        help="which of the doc's marked blocks to write (default: results)",
    )
    ap.add_argument("--engine", default="cpu", help="engine for every run: cpu, cuda or a path (default cpu)")
    ap.add_argument("--cache-dir", type=Path, default=None, help="prepared-data cache (default as `proxy run`)")
    ap.add_argument(
        "--default-policy",
        default=None,
        help=f"the policy whose goals the report leads with (default: {DEFAULT_POLICY}, the schema's default)",
    )
    ap.add_argument("--report-only", action="store_true", help="summarise the runs in --runs-dir; train nothing")
    ap.add_argument(
        "--from-summary", action="store_true", help="only redraw --plots and --doc's tables from the --summary file"
    )
    ap.add_argument(
        "--compare",
        type=Path,
        default=None,
        metavar="SUMMARY",
        help="after summarising, check every mix's results against this summary's (exit 1 if any differ)",
    )
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
    if args.mix is not None and args.experiment is not None:
        return "--mix and --experiment exclude each other"
    unknown = [m for m in args.mix or [] if m not in BY_NAME]
    if unknown:
        return f"unknown mix {', '.join(unknown)} (the suite: {', '.join(m.name for m in SUITE)})"
    if args.mix is not None and len(set(args.mix)) != len(args.mix):
        return "--mix must not repeat"
    if not args.doc_block.replace("-", "").replace("_", "").isalnum():
        return "--doc-block must be letters, digits, '-' or '_'"
    return None


def chosen_mixes(args) -> list[Mix]:
    if args.experiment is not None:
        return [Mix(args.experiment.stem, args.experiment, "")]
    if args.mix is not None:
        return [BY_NAME[m] for m in args.mix]
    return list(SUITE)


def machine() -> dict:
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def report(summary: dict, args) -> int:
    """The plots and, with --doc, the tables of `summary`."""
    # an evaluation of its own (another --summary) never overwrites the committed plots
    plots_dir = args.plots or (
        COMMITTED_PLOTS if args.summary.resolve() == COMMITTED_SUMMARY.resolve() else args.summary.parent
    )
    plots, why_not = plot_summary(summary, plots_dir)
    print(f"eval_mixing: plots {', '.join(map(str, plots))}" if plots else f"eval_mixing: {why_not}")
    if args.doc is not None:
        try:
            write_results(args.doc, results_markdown(summary), args.doc_block)
        except ReportError as e:
            print(f"eval_mixing: {e}", file=sys.stderr)
            return EXIT_USAGE
        print(f"eval_mixing: results tables written into {args.doc}")
    return EXIT_OK


def from_summary(args) -> int:
    try:
        summary = json.loads(args.summary.read_text())
        results_markdown(summary)  # a file that is not a summary fails here, before anything is written
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        print(f"eval_mixing: {args.summary}: not a mixing summary ({e})", file=sys.stderr)
        return EXIT_USAGE
    return report(summary, args)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    problem = check_args(args)
    if problem:
        print(f"eval_mixing: {problem}", file=sys.stderr)
        return EXIT_USAGE
    if args.summary is None:  # a comparison never writes over the committed summary it may compare with
        args.summary = COMMITTED_SUMMARY if args.compare is None else args.runs_dir / "summary.json"
    if args.from_summary:
        return from_summary(args)
    theirs = None
    if args.compare is not None:
        if args.compare.resolve() == args.summary.resolve():
            print(f"eval_mixing: --summary and --compare both name {args.compare}", file=sys.stderr)
            return EXIT_USAGE
        try:
            theirs = read_mixes(args.compare)
        except CompareError as e:
            print(f"eval_mixing: {e}", file=sys.stderr)
            return EXIT_USAGE
    mixes = chosen_mixes(args)
    try:
        for m in mixes:  # before the experiments are read: they name the corpora
            for corpus in needed_by(m.experiment):
                if build(corpus):
                    print(f"eval_mixing: corpus {corpus.file} written (scripts/mixing/corpora.py)")
    except (CorpusError, ExperimentError) as e:
        print(f"eval_mixing: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        experiments = {m.name: load_experiment(m.experiment) for m in mixes}
        specs = {m.name: plan_runs(m.experiment, args.policies, args.seeds, args.runs_dir) for m in mixes}
    except ExperimentError as e:
        print(f"eval_mixing: {e}", file=sys.stderr)
        return EXIT_USAGE
    default_policy = args.default_policy or DEFAULT_POLICY
    threads = max(e.train.threads or os.cpu_count() for e in experiments.values())
    if args.jobs * threads > (os.cpu_count() or 1) and not args.report_only:
        print(
            f"eval_mixing: note: {args.jobs} runs x {threads} engine threads on {os.cpu_count()} cores", file=sys.stderr
        )

    load = LoadSampler()
    t0 = time.monotonic()
    run_walls = {}
    all_specs = [s for m in mixes for s in specs[m.name]]
    max_steps = max(e.train.max_steps for e in experiments.values())
    finished_before = [s.name for s in all_specs if finished(s.run_dir, max_steps)]
    if not args.report_only:
        try:
            for m in mixes:  # once each, before the runs: two runs of a mix never prepare its data at once
                prepare_data(
                    load_experiment(specs[m.name][0].experiment),
                    m.experiment.resolve().parent,
                    args.cache_dir or default_cache_dir(),
                    progress=not args.no_progress,
                )
        except DataError as e:
            print(f"eval_mixing: {e}", file=sys.stderr)
            return EXIT_USAGE
        except KeyboardInterrupt:
            print("eval_mixing: interrupted while preparing the data; nothing was trained", file=sys.stderr)
            return EXIT_INTERRUPTED
        try:
            done = launch(
                all_specs, max_steps, LaunchOptions(args.jobs, args.engine, args.cache_dir, not args.no_progress), load
            )
        except KeyboardInterrupt:
            print(
                "eval_mixing: interrupted; the runs in flight checkpointed and stopped (the same command resumes them)",
                file=sys.stderr,
            )
            return EXIT_INTERRUPTED
        failed = [r for r in done if r.returncode != 0]
        for r in failed:
            print(f"eval_mixing: run {r.spec.name} failed (exit {r.returncode}); see {r.spec.log}", file=sys.stderr)
        if failed:
            return EXIT_FAILED
        run_walls = {r.spec.name: round(r.wall_s, 1) for r in done}
    wall = time.monotonic() - t0

    summary = {"mixes": {}}
    try:
        for m in mixes:
            exp = experiments[m.name]
            series = {
                (s.policy, s.seed): read_run(s.run_dir, exp.arm_names, exp.train.max_steps) for s in specs[m.name]
            }
            summary["mixes"][m.name] = {
                "purpose": m.purpose,
                "file": os.path.relpath(m.experiment.resolve(), REPO),
                **summarize(series, exp, args.policies, default_policy),
            }
    except SummaryError as e:
        print(f"eval_mixing: {e}", file=sys.stderr)
        return EXIT_FAILED
    summary["how"] = {
        "command": " ".join(["python", os.path.relpath(__file__, REPO), *(argv if argv is not None else sys.argv[1:])]),
        "machine": machine(),
        "jobs": args.jobs,
        "engine_threads": threads,
        "wall_s": None if args.report_only else round(wall, 1),
        "run_wall_s": run_walls,
        "finished_before": finished_before,
        "load_average_1m": None if args.report_only else load.summary(),
    }
    args.summary.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.summary, summary)
    print(results_markdown(summary))
    print(f"eval_mixing: summary {args.summary}" + (f"; {wall / 60:.1f} min" if not args.report_only else ""))
    status = report(summary, args)
    if theirs is not None:
        found = compare_mixes(summary["mixes"], theirs)
        for name, difference in found:
            print(f"eval_mixing: compare {name}: {difference or 'identical'}")
        differ = [name for name, difference in found if difference]
        if differ:
            print(f"eval_mixing: {len(differ)} of {len(found)} mixes differ from {args.compare}", file=sys.stderr)
            return EXIT_FAILED
        print(f"eval_mixing: every mix's results equal those in {args.compare}")
    return status


if __name__ == "__main__":
    sys.exit(main())

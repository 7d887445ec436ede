#!/usr/bin/env python3
"""Goodput of a whole `proxy run`: wall time against the engine's step compute, and where the rest goes.

    python scripts/bench_goodput.py run [EXPERIMENT.json] [--steps N] [--threads N] [--train KEY=VALUE]
                                        [--engine cpu|cuda] [--repo DIR] [--label NAME] [--json FILE]
    python scripts/bench_goodput.py render docs/bench/goodput-cpu.json [--doc docs/PERFORMANCE.md]

`run` trains the experiment for --steps steps through the real proxy (`python -m proxy run`
of --repo, default this checkout, with that checkout's engine) in a fresh run directory, and
measures:

- start-up: from launching the proxy to its `engine ready` line (data preparation, engine
  start), counted apart;
- wall: from `engine ready` to the proxy's exit (the whole run after start-up, the last
  checkpoint's wait at exit included);
- engine compute: the sum of the steps' `ms` in `.loss.json`;
- overhead: wall minus engine compute, split by the engine's own timing of each audit kind
  (the `sample` and `eval` events' `ms`; a `ckpt` event's `snapshot_ms + wait_ms`, or its
  `ms` for an engine that writes synchronously) and `other` (the rest: frames the engine
  waited for, the wait for the last write at exit, process exits).

The engine's events are read from a copy of its stdout (the proxy is given a wrapper that
runs the engine with its stdout through `tee`), so an engine or a proxy from before the
proxy reported any of this measures the same way. With no experiment, it runs the CPU probe:
ANDREA-12M's data and cadence file with T=256, C=128, L=4, H=4, batch 8, an eval
(16 rows per arm), a 4 x 128-token sample audit and a checkpoint every 25 steps.

--json FILE adds the result to FILE (a list; an entry with the same label is replaced);
`render` turns such a file into the table between the markers in PERFORMANCE.md
(everything outside them kept). Bad input: one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from cuda_bench_report import Markers, ReportError, read_results_list, render_into_doc  # noqa: E402
from machine_info import git_commit, machine_line  # noqa: E402

from proxy.atomic import atomic_write_json  # noqa: E402
from proxy.supervision.goodput import checkpoint_stall_ms  # noqa: E402

AUDIT_KINDS = ("sample", "eval", "checkpoint")
PROBE_BASE = "experiments/ANDREA-12M-TRAIN.json"
PROBE_MODEL = {"ctx": 256, "dim": 128, "layers": 4, "heads": 4}
PROBE_TRAIN = {"ckpt_every": 25, "eval_every": 25, "sample_every": 25, "eval_rows": 16, "milestone_every": 0}
# A policy every version of the proxy knows, so that --repo can measure an older checkout on the same
# probe; the policy moves the mixture, not the audits' cost.
PROBE_BANDIT = {"policy": "ucb1"}
MARKERS = Markers("bench_goodput table", "scripts/bench_goodput.py")
READY_LINE = "engine ready:"
TEE_WRAPPER = """#!/bin/bash
# The engine, with a copy of its events (stdout) for the benchmark; its exit status is the engine's.
"{engine}" "$@" | tee -a "{events}"
exit "${{PIPESTATUS[0]}}"
"""


@dataclass
class Audit:
    count: int = 0  # events
    s: float = 0.0


@dataclass
class GoodputRun:
    label: str
    commit: str
    experiment: str
    steps: int
    threads: int | None
    engine: str
    command: str
    machine: str
    date: str
    load_before: float
    load_after: float
    startup_s: float
    wall_s: float
    step_s: float
    audits: dict[str, Audit] = field(default_factory=dict)
    after_last_step_s: float = 0.0  # from the last step's log entry to the exit: its audits, the last write
    tokens: int = 0
    proxy_goodput: dict | None = None  # .state.json's own account, where the proxy keeps one

    @property
    def overhead_s(self) -> float:
        return self.wall_s - self.step_s

    @property
    def other_s(self) -> float:
        return self.overhead_s - sum(a.s for a in self.audits.values())

    def share(self, seconds: float) -> float:
        return seconds / self.wall_s if self.wall_s > 0 else float("nan")

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(
            overhead_s=self.overhead_s,
            overhead=self.share(self.overhead_s),
            other_s=self.other_s,
            wall_tokens_per_s=self.tokens / self.wall_s if self.wall_s > 0 else None,
            engine_tokens_per_s=self.tokens / self.step_s if self.step_s > 0 else None,
        )
        return out

    @classmethod
    def from_dict(cls, obj: dict) -> GoodputRun:
        names = set(cls.__dataclass_fields__)
        values = {k: v for k, v in obj.items() if k in names}
        values["audits"] = {k: Audit(**a) for k, a in (obj.get("audits") or {}).items()}
        return cls(**values)


# ------------------------------------------------------------------ running


def probe_experiment(threads: int | None) -> dict:
    exp = json.loads((REPO / PROBE_BASE).read_text())
    exp["name"] = "GOODPUT-PROBE-CPU"
    exp["model"].update(PROBE_MODEL)
    exp["train"].update(PROBE_TRAIN)
    exp["bandit"] = dict(PROBE_BANDIT)
    if threads is not None:
        exp["train"]["threads"] = threads
    return exp


def read_events(path: Path) -> list[dict]:
    out = []
    if path.exists():
        for line in path.read_text(errors="replace").splitlines():
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if isinstance(ev, dict) and "event" in ev:
                out.append(ev)
    return out


def last_step_entries(loss_log: Path) -> list[dict]:
    steps = {}
    for line in loss_log.read_text().splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if isinstance(e, dict) and e.get("type") == "step":
            steps[e["step"]] = e
    return [steps[s] for s in sorted(steps)]


def audits_from_events(events: list[dict]) -> dict[str, Audit]:
    audits = {k: Audit() for k in AUDIT_KINDS}
    for ev in events:
        kind = ev["event"]
        if kind in ("sample", "eval"):
            ms = float(ev.get("ms") or 0.0)
        elif kind == "ckpt":
            kind, ms = "checkpoint", checkpoint_stall_ms(ev)
        else:
            continue
        audits[kind].count += 1
        audits[kind].s += ms / 1000.0
    return audits


def run_once(args, experiment: Path, work: Path) -> GoodputRun:
    repo = Path(args.repo).resolve()
    engine = repo / "build" / f"microgpt_{args.engine}"
    if not engine.is_file():
        raise ReportError(f"no engine {engine}: build it with `make {args.engine}` in {repo}")
    events = work / "events.jsonl"
    wrapper = work / "engine-with-tee.sh"
    wrapper.write_text(TEE_WRAPPER.format(engine=engine, events=events))
    wrapper.chmod(0o755)
    run_dir = work / "run"
    argv = [
        sys.executable,
        "-m",
        "proxy",
        "run",
        str(experiment),
        "--run-dir",
        str(run_dir),
        "--no-dashboard",
        "--engine",
        str(wrapper),
    ]
    if args.cache_dir:
        argv += ["--cache-dir", str(args.cache_dir)]
    env = dict(os.environ, PYTHONPATH=str(repo), PYTHONUNBUFFERED="1")
    load_before = os.getloadavg()[0]
    lines: queue.Queue = queue.Queue()
    t_launch = time.monotonic()
    with open(work / "proxy.err", "wb") as err:
        proc = subprocess.Popen(
            argv, cwd=repo, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, text=True
        )

        def pump():
            for line in proc.stdout:
                lines.put((time.monotonic(), line.rstrip("\n")))

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        rc = proc.wait()
        t_exit, t_exit_wall = time.monotonic(), time.time()
        reader.join(10)
    said = []
    while not lines.empty():
        said.append(lines.get())
    (work / "proxy.out").write_text("".join(f"{t - t_launch:9.3f} {ln}\n" for t, ln in said))
    if rc != 0:
        tail = (work / "proxy.err").read_text(errors="replace")[-1500:]
        raise ReportError(f"the proxy exited {rc} (see {work}): {tail.strip().splitlines()[-1:] or ''}")
    ready = [t for t, ln in said if ln.startswith(READY_LINE)]
    if len(ready) != 1:
        raise ReportError(f"expected one '{READY_LINE}' line from the proxy, got {len(ready)} (see {work})")
    steps = last_step_entries(run_dir / ".loss.json")
    if [e["step"] for e in steps] != list(range(1, args.steps + 1)):
        raise ReportError(f"the run did not log steps 1..{args.steps} once each (see {work})")
    try:
        state = json.loads((run_dir / ".state.json").read_text())
    except (OSError, ValueError):
        state = {}
    return GoodputRun(
        label=args.label,
        commit=git_commit(repo),
        experiment=json.loads(experiment.read_text())["name"],
        steps=args.steps,
        threads=args.threads,
        engine=args.engine,
        command=shlex.join(["python", *sys.argv]),
        machine=machine_line(),
        date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        load_before=load_before,
        load_after=os.getloadavg()[0],
        startup_s=ready[0] - t_launch,
        wall_s=t_exit - ready[0],
        step_s=sum(float(e["ms"]) for e in steps) / 1000.0,
        audits=audits_from_events(read_events(events)),
        after_last_step_s=t_exit_wall - float(steps[-1]["time"]),
        tokens=int(steps[-1]["tokens"]),
        proxy_goodput=state.get("goodput"),
    )


def add_to_file(path: Path, result: GoodputRun) -> None:
    runs = load_runs(path) if path.exists() else []
    runs = [r for r in runs if r.label != result.label] + [result]
    atomic_write_json(path, [r.to_dict() for r in runs])


def summary(r: GoodputRun) -> str:
    parts = ", ".join(f"{k} {a.s:.1f} s ({r.share(a.s):.1%}, {a.count} events)" for k, a in r.audits.items())
    return (
        f"{r.label} ({r.commit}, {r.experiment}, {r.steps} steps, threads {r.threads}): "
        f"start-up {r.startup_s:.1f} s; wall {r.wall_s:.1f} s, engine steps {r.step_s:.1f} s, "
        f"overhead {r.overhead_s:.1f} s = {r.share(r.overhead_s):.1%}: {parts}, "
        f"other {r.other_s:.1f} s ({r.share(r.other_s):.1%}); "
        f"tokens/s wall {r.tokens / r.wall_s:,.0f}, engine {r.tokens / r.step_s:,.0f}; "
        f"load average {r.load_before:.1f} -> {r.load_after:.1f}"
    )


# ------------------------------------------------------------------ the table


def load_runs(path: Path) -> list[GoodputRun]:
    doc = read_results_list(path)
    try:
        return [GoodputRun.from_dict(r) for r in doc]
    except (TypeError, AttributeError) as exc:
        raise ReportError(f"{path}: a run is malformed ({exc})") from None


def render_table(runs: list[GoodputRun]) -> str:
    def pct(r: GoodputRun, s: float) -> str:
        return f"{s:.1f} s ({r.share(s):.1%})"

    lines = [
        "| run | commit | steps | start-up | wall | engine steps | overhead | sample | eval | checkpoint stall "
        "| other | tokens/s wall / engine | load |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        a = r.audits
        cells = [
            r.label,
            f"`{r.commit}`",
            str(r.steps),
            f"{r.startup_s:.1f} s",
            f"{r.wall_s:.1f} s",
            f"{r.step_s:.1f} s",
            f"**{pct(r, r.overhead_s)}**",
            *(pct(r, a[k].s) if k in a else "-" for k in AUDIT_KINDS),
            pct(r, r.other_s),
            f"{r.tokens / r.wall_s:,.0f} / {r.tokens / r.step_s:,.0f}",
            f"{r.load_before:.1f}-{r.load_after:.1f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    machines = sorted({r.machine for r in runs})
    commands = [f"`{r.command}`" for r in runs]
    return "\n".join(
        lines + ["", "Machine: " + "; ".join(machines) + ". Commands, in order:", "", *[f"- {c}" for c in commands]]
    )


def render(args) -> int:
    return render_into_doc(
        args.doc, lambda: render_table(load_runs(args.results)), args.results, MARKERS, "bench_goodput"
    )


def run(args) -> int:
    if args.steps < 1:
        print("bench_goodput: --steps must be at least 1", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="bench_goodput-") as tmp:
        work = Path(args.keep) if args.keep else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        if args.experiment is None:
            exp = probe_experiment(args.threads)
        else:
            try:
                exp = json.loads(Path(args.experiment).read_text())
            except (OSError, ValueError) as exc:
                print(f"bench_goodput: cannot read {args.experiment}: {exc}", file=sys.stderr)
                return 2
            if args.threads is not None:
                exp["train"]["threads"] = args.threads
        exp["train"]["max_steps"] = args.steps
        for setting in args.train:
            key, _, value = setting.partition("=")
            try:
                exp["train"][key] = json.loads(value)
            except ValueError:
                print(f"bench_goodput: --train {setting}: expected KEY=JSON_VALUE", file=sys.stderr)
                return 2
        experiment = work / "experiment.json"
        experiment.write_text(json.dumps(exp, indent=1))
        try:
            result = run_once(args, experiment, work)
        except ReportError as exc:
            print(f"bench_goodput: {exc}", file=sys.stderr)
            return 1
    print(summary(result))
    if result.proxy_goodput:
        g = result.proxy_goodput
        print(
            f"  the proxy's own account (.state.json): wall {g['wall_s']:.1f} s, steps {g['step_s']:.1f} s, "
            f"overhead {g['overhead']:.1%}"
        )
    if args.json:
        add_to_file(Path(args.json), result)
        print(f"bench_goodput: added {result.label!r} to {args.json}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="train through the real proxy and measure")
    r.add_argument("experiment", nargs="?", help="an experiment file (default: the CPU probe)")
    r.add_argument("--steps", type=int, default=100, help="max_steps for this run (default 100)")
    r.add_argument("--threads", type=int, help="train.threads (default: the experiment's)")
    r.add_argument(
        "--train",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override train.KEY (a JSON value), e.g. --train eval_rows=4; repeatable",
    )
    r.add_argument("--engine", choices=("cpu", "cuda"), default="cpu")
    r.add_argument("--repo", default=str(REPO), help="the checkout whose proxy and engine run (default: this one)")
    r.add_argument("--label", default="now", help="the row's name in the results file")
    r.add_argument("--json", metavar="FILE", help="add the result to this results file")
    r.add_argument("--cache-dir", help="prepared-data cache (default: the proxy's)")
    r.add_argument("--keep", metavar="DIR", help="keep the run directory, events and proxy output here")
    g = sub.add_parser("render", help="print the table, or rewrite it in --doc")
    g.add_argument("results", type=Path)
    g.add_argument("--doc", type=Path, help="rewrite the table between the markers of this markdown file")
    args = ap.parse_args(argv)
    return run(args) if args.cmd == "run" else render(args)


if __name__ == "__main__":
    sys.exit(main())

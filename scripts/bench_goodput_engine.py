#!/usr/bin/env python3
"""The engine side of goodput: what a sample audit and a checkpoint cost the step loop.

Shape: vocab 4608, ctx 256, dim 128, layers 4, heads 4, batch 8 (proxy mode, fresh weights).

1. One sample audit, 4 prompts x 128 new tokens (temperature 0.8, top-k 40, count 1):
   - old: one SAMPLE frame per prompt, recomputing the window for every new token
     (`--sample-recompute`: the computation the engine did before the KV cache);
   - new: one SAMPLE frame holding the 4 prompts, through the KV cache.
   Both must give the same tokens. Reported: the sum of the `sample` events' ms, median of --repeats.
2. A checkpoint's stall on the step loop: --steps TRAIN frames back to back with --ckpt-every E.
   Reported from the `ckpt` events: the write's `ms` and the time the step loop spent on it,
   `wait_ms` + `snapshot_ms` (an engine whose events lack them wrote synchronously: `ms` is its stall).
   --baseline ENGINE measures another binary the same way (e.g. one built before the background writer).

    python scripts/bench_goodput_engine.py --threads 2 --baseline /tmp/microgpt_cpu_old
    python scripts/bench_goodput_engine.py --threads 1 --label NAME --json docs/bench/goodput-engine-cpu.json
    python scripts/bench_goodput_engine.py --render docs/bench/goodput-engine-cpu.json --doc docs/PERFORMANCE.md

The last line printed is one JSON object with every figure. --json FILE adds it to FILE (a list; an
entry with the same label is replaced); --render puts the table of FILE's runs between the markers of
--doc (or prints it), measuring nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cuda_bench_report import Markers, ReportError, load_labelled_runs, print_and_keep, render_into_doc  # noqa: E402
from machine_info import git_commit, machine_line  # noqa: E402

from proxy.formats import frames  # noqa: E402

MARKERS = Markers("bench_goodput_engine table", "scripts/bench_goodput_engine.py")

SHAPE = {"vocab": 4608, "ctx": 256, "dim": 128, "layers": 4, "heads": 4, "batch": 8}
PROMPT_LENGTHS = (2, 1, 3, 2)  # "def ", "import ", "class ", "The " are a few tokens each
MAX_NEW, TEMPERATURE, TOP_K = 128, 0.8, 40


class Engine:
    def __init__(self, binary: str, ckpt_dir: Path, *extra: str):
        flags = [x for k, v in SHAPE.items() for x in (f"--{k}", str(v))]
        self.proc = subprocess.Popen(
            [binary, "--data", "-", "--ckpt-dir", str(ckpt_dir), *flags, *extra],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self.ready = self.event("ready")

    def event(self, kind: str) -> dict:
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"engine ended before a {kind} event (rc {self.proc.wait()})")
            ev = json.loads(line)
            if ev["event"] == "error":
                raise RuntimeError(ev["message"])
            if ev["event"] == kind:
                return ev

    def send(self, data: bytes) -> None:
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def close(self) -> list[dict]:
        self.proc.stdin.close()
        rest = [json.loads(line) for line in self.proc.stdout]
        self.proc.wait()
        return rest


def audit(binary: str, threads: int, repeats: int) -> dict:
    rng = np.random.default_rng(1)
    prompts = [
        frames.SamplePrompt(rng.integers(0, SHAPE["vocab"], size=n).tolist(), 1, 100 + i)
        for i, n in enumerate(PROMPT_LENGTHS)
    ]
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("old", "new"):
            extra = ["--threads", str(threads)] + (["--sample-recompute"] if mode == "old" else [])
            eng = Engine(binary, Path(tmp) / mode, "--ckpt-every", "0", *extra)
            times, tokens = [], None
            for _rep in range(repeats):
                if mode == "old":
                    for i, p in enumerate(prompts):
                        eng.send(frames.sample_frame(i + 1, p.tokens, p.count, MAX_NEW, TEMPERATURE, TOP_K, p.seed))
                    events = [eng.event("sample") for _ in prompts]
                else:
                    eng.send(frames.sample_batch_frame(1, prompts, MAX_NEW, TEMPERATURE, TOP_K))
                    events = [eng.event("sample")]
                times.append(sum(e["ms"] for e in events))
                tokens = [t for e in events for t in e["tokens"]]
            eng.close()
            out[mode] = {
                "frames": len(prompts) if mode == "old" else 1,
                "ms": times,
                "median_ms": statistics.median(times),
                "tokens": tokens,
            }
    assert out["old"]["tokens"] == out["new"]["tokens"], "the KV cache changed the sampled tokens"
    return {m: {k: v for k, v in r.items() if k != "tokens"} for m, r in out.items()} | {
        "speedup": out["old"]["median_ms"] / out["new"]["median_ms"]
    }


def checkpoints(binary: str, threads: int, steps: int, every: int) -> dict:
    rng = np.random.default_rng(2)
    rows = rng.integers(0, SHAPE["vocab"], size=(steps, SHAPE["batch"], SHAPE["ctx"] + 1), dtype=np.uint16)
    groups = np.zeros(SHAPE["batch"], np.uint16)
    with tempfile.TemporaryDirectory() as tmp:
        eng = Engine(binary, Path(tmp), "--ckpt-every", str(every), "--threads", str(threads))
        eng.send(b"".join(frames.train_frame(s + 1, rows[s], groups) for s in range(steps)))
        events = eng.close()
    ckpts = [e for e in events if e["event"] == "ckpt" and e["reason"] == "periodic"]
    background = bool(ckpts) and "wait_ms" in ckpts[0]
    return {
        "checkpoint_bytes": ckpts[0]["bytes"] if ckpts else None,
        "background_writer": background,
        "write_ms": [c["ms"] for c in ckpts],
        # the time the step loop spent on each checkpoint: all of it when the write was synchronous
        "loop_stall_ms": [c["wait_ms"] + c["snapshot_ms"] if background else c["ms"] for c in ckpts],
        "median_step_ms": statistics.median(e["ms"] for e in events if e["event"] == "step"),
    }


def render_table(runs: list[dict]) -> str:
    """One row per run: the audit both ways, the checkpoint stall now and (with --baseline) before."""

    def med(values, digits: int = 0) -> str:
        return f"{statistics.median(values):.{digits}f}" if values else "-"

    lines = [
        "| run | commit | threads | audit: 4 frames, recompute (ms) | audit: 1 frame, KV cache (ms) "
        "| speed-up | step (ms) | checkpoint stall (ms) | write, in the background (ms) "
        "| baseline: stall = write (ms) | load |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    try:
        for r in runs:
            a, c, b = r["audit"], r.get("checkpoints_engine") or {}, r.get("checkpoints_baseline") or {}
            cells = [
                r["label"],
                f"`{r['commit']}`",
                str(r["threads"]),
                med(a["old"]["ms"]),
                med(a["new"]["ms"]),
                f"**{a['speedup']:.1f}x**",
                f"{c['median_step_ms']:.0f}" if c else "-",
                med(c.get("loop_stall_ms"), 1),
                med(c.get("write_ms")),
                med(b.get("loop_stall_ms"), 1),
                f"{r['load'][0]:.1f}-{r['load'][1]:.1f}",
            ]
            lines.append("| " + " | ".join(cells) + " |")
        notes = [
            "",
            "Medians of each run's repeats (audit) and checkpoints (stall, write). Machine: "
            + "; ".join(sorted({r["machine"] for r in runs}))
            + ". Commands, in order:",
            "",
        ]
        commands = [f"- `{r['command']}`" for r in runs]
    except (KeyError, TypeError, IndexError, statistics.StatisticsError) as exc:
        raise ReportError(f"a run is malformed ({exc!r})") from None
    return "\n".join(lines + notes + commands)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default=str(REPO / "build" / "microgpt_cpu"))
    ap.add_argument("--baseline", help="another engine binary to measure checkpoints on (e.g. the old one)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--ckpt-every", type=int, default=4)
    ap.add_argument("--label", default="engine", help="the run's name in the results file and the table")
    ap.add_argument("--json", type=Path, metavar="FILE", help="add the result to this results file")
    ap.add_argument("--render", type=Path, metavar="FILE", help="render FILE's table; measure nothing")
    ap.add_argument("--doc", type=Path, help="with --render: put the table between this document's markers")
    args = ap.parse_args()
    if args.render is not None:
        return render_into_doc(
            args.doc,
            lambda: render_table(load_labelled_runs(args.render)),
            args.render,
            MARKERS,
            "bench_goodput_engine",
        )

    load_before = os.getloadavg()[0]
    # the commit the engine was built from: the checkout its build/ directory sits in
    report = {
        "label": args.label,
        "commit": git_commit(Path(args.engine).resolve().parent.parent),
        "machine": machine_line(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": "python scripts/bench_goodput_engine.py " + shlex.join(sys.argv[1:]),
        "shape": SHAPE,
        "threads": args.threads,
        "audit": audit(args.engine, args.threads, args.repeats),
    }
    a = report["audit"]
    print(
        f"audit, 4 prompts x {MAX_NEW} new tokens: old (4 frames, recompute) {a['old']['median_ms']:.0f} ms, "
        f"new (1 frame, KV cache) {a['new']['median_ms']:.0f} ms: {a['speedup']:.1f}x (median of {args.repeats})"
    )
    for name, binary in (("engine", args.engine), ("baseline", args.baseline)):
        if not binary:
            continue
        c = checkpoints(binary, args.threads, args.steps, args.ckpt_every)
        report[f"checkpoints_{name}"] = c
        print(
            f"checkpoints ({name}, {'background' if c['background_writer'] else 'synchronous'} writes of "
            f"{c['checkpoint_bytes']} bytes, step {c['median_step_ms']:.0f} ms): step-loop stall median "
            f"{statistics.median(c['loop_stall_ms']):.1f} ms, write median {statistics.median(c['write_ms']):.1f} ms "
            f"({len(c['write_ms'])} checkpoints)"
        )
    report["load"] = [load_before, os.getloadavg()[0]]
    print_and_keep(report, args.json, "bench_goodput_engine")
    return 0


if __name__ == "__main__":
    sys.exit(main())

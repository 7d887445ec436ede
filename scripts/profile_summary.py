#!/usr/bin/env python3
"""Helpers of scripts/profile_cuda.sh: engine arguments and frames for one
profiled run, and the per-kernel summary of what the profiler saw.

    profile_summary.py engine-args SHAPE BATCH ATTENTION CKPT_DIR   # one argument per line
    profile_summary.py frames SHAPE BATCH STEPS > frames.bin       # STEPS random TRAIN frames, then STOP
    profile_summary.py summarize --tool ncu --csv ncu.csv --out profile.json [--label ...]
    profile_summary.py summarize --tool events --stderr engine.stderr --out profile.json [--label ...]
    profile_summary.py table profile1.json profile2.json ...       # markdown, for docs/PERFORMANCE.md

`ncu`: Nsight Compute's CSV (--page details or --page raw) of one training
step: time per kernel, calls, share of the step's kernel time, and shares by
category (matmuls, attention, ...). `events`: the engine's own CUDA-event
line (MICROGPT_CUDA_PROFILE_STEP): step time and attention forward and
backward time only, no per-kernel split.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))
from bench_cuda import SHAPES  # noqa: E402  (the one definition of the benchmark shapes)

from proxy.atomic import atomic_write_json  # noqa: E402
from proxy.formats import frames  # noqa: E402

TIME_METRIC = "gpu__time_duration.sum"
UNIT_MS = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0, "second": 1e3, "s": 1e3}
# Kernel categories, first match wins (names as ncu prints them with --print-kernel-base function).
CATEGORIES = [
    ("attention", re.compile(r"attention|sdpa|fmha|flash_[fb]prop|cudnn", re.I)),  # cuDNN's SDPA kernels too
    ("matmul (cuBLASLt)", re.compile(r"gemm|xmma|nvjet|cutlass|^sm\d+_|splitk|cublas", re.I)),
    ("classifier", re.compile(r"classifier|gather_logits")),
    ("layernorm", re.compile(r"layernorm")),
    ("column sums", re.compile(r"colsum")),
    ("bias, residual, GELU", re.compile(r"gelu|bias_residual")),
    ("embeddings", re.compile(r"embed|wte_|wpe_")),
    ("optimizer", re.compile(r"adamw|sumsq|convert")),
]
PROFILE_PREFIX = "microgpt: profile "


class SummaryError(ValueError):
    """Input the summary cannot use; the message is one line."""


@dataclass
class Kernel:
    name: str
    calls: int
    ms: float
    share: float


@dataclass
class Profile:
    """One profiled training step (the file profile_cuda.sh writes)."""

    label: str
    tool: str  # ncu or events
    step_ms: float  # ncu: sum of kernel times; events: the step on the GPU timeline
    attention_ms: float
    attention_share: float
    kernels: list[Kernel] = field(default_factory=list)  # ncu only
    categories: dict[str, float] = field(default_factory=dict)  # share of step_ms, ncu only
    note: str = ""


def category(name: str) -> str:
    for cat, pattern in CATEGORIES:
        if pattern.search(name):
            return cat
    return "other"


def parse_ncu_csv(text: str) -> list[tuple[str, float]]:
    """(kernel name, ms) per launch from ncu --csv output, details or raw page."""
    lines = [line for line in text.splitlines() if line.startswith('"')]  # drop ==PROF== and other chatter
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    if not rows:
        raise SummaryError("no CSV rows in the ncu output")
    head = rows[0]
    if "Kernel Name" not in head:
        raise SummaryError(f"no 'Kernel Name' column in the ncu CSV header: {head[:6]}")
    name_at = head.index("Kernel Name")
    out = []
    if "Metric Name" in head:  # --page details: one row per (kernel, metric)
        m_at, u_at, v_at = head.index("Metric Name"), head.index("Metric Unit"), head.index("Metric Value")
        for r in rows[1:]:
            if len(r) == len(head) and r[m_at] == TIME_METRIC:
                out.append((r[name_at], _ms(r[v_at], r[u_at])))
    elif TIME_METRIC in head:  # --page raw: one row per kernel, units in the second row
        t_at = head.index(TIME_METRIC)
        unit = rows[1][t_at] if len(rows) > 1 else ""
        for r in rows[2:]:
            if len(r) == len(head):
                out.append((r[name_at], _ms(r[t_at], unit)))
    else:
        raise SummaryError(f"the ncu CSV has no {TIME_METRIC} values")
    if not out:
        raise SummaryError(f"the ncu CSV has no {TIME_METRIC} rows (was the profiled step reached?)")
    return out


def _ms(value: str, unit: str) -> float:
    if unit not in UNIT_MS:
        raise SummaryError(f"unknown time unit {unit!r} in the ncu CSV")
    try:
        return float(value.replace(",", "")) * UNIT_MS[unit]
    except ValueError:
        raise SummaryError(f"not a number in the ncu CSV: {value!r}") from None


def summarize_ncu(label: str, launches: list[tuple[str, float]]) -> Profile:
    total = sum(ms for _, ms in launches)
    by: dict[str, list[float]] = {}
    for name, ms in launches:
        by.setdefault(name, []).append(ms)
    kernels = sorted((Kernel(n, len(v), sum(v), sum(v) / total) for n, v in by.items()), key=lambda k: -k.ms)
    cats: dict[str, float] = {}
    for k in kernels:
        cats[category(k.name)] = cats.get(category(k.name), 0.0) + k.share
    att = sum(k.ms for k in kernels if category(k.name) == "attention")
    return Profile(
        label,
        "ncu",
        total,
        att,
        att / total,
        kernels,
        dict(sorted(cats.items(), key=lambda c: -c[1])),
        "Nsight Compute, one training step, kernels serialized; shares of the summed kernel time",
    )


def summarize_events(label: str, stderr_text: str) -> Profile:
    line = next((line for line in stderr_text.splitlines() if line.startswith(PROFILE_PREFIX)), None)
    if line is None:
        raise SummaryError(f"no '{PROFILE_PREFIX}' line in the engine's stderr (was the profiled step reached?)")
    try:
        ev = json.loads(line[len(PROFILE_PREFIX) :])
        att = ev["attention_forward_ms"] + ev["attention_backward_ms"]
        return Profile(
            label,
            "events",
            ev["step_ms"],
            att,
            att / ev["step_ms"],
            categories={
                "attention forward": ev["attention_forward_ms"] / ev["step_ms"],
                "attention backward": ev["attention_backward_ms"] / ev["step_ms"],
            },
            note=f"CUDA events in the engine (no ncu): step {ev['step']} on the GPU timeline, attention "
            f"calls {ev['attention_calls']}, {ev['attention']} {ev['precision']}",
        )
    except (json.JSONDecodeError, KeyError, TypeError, ZeroDivisionError) as exc:
        raise SummaryError(f"malformed profile line ({exc}): {line[:200]}") from None


def print_profile(p: Profile, top: int = 15) -> None:
    print(
        f"profile {p.label}: {p.tool}; step {p.step_ms:.3f} ms, attention {p.attention_ms:.3f} ms = "
        f"{p.attention_share:.1%} of the step"
    )
    print(f"  ({p.note})")
    for cat, share in p.categories.items():
        print(f"  {cat:28s} {share:6.1%}")
    if p.kernels:
        print(f"  {'kernel':60s} {'calls':>5s} {'ms':>9s} {'share':>6s}")
        for k in p.kernels[:top]:
            print(f"  {k.name[:60]:60s} {k.calls:5d} {k.ms:9.3f} {k.share:6.1%}")
        if len(p.kernels) > top:
            rest = p.kernels[top:]
            print(
                f"  {'(' + str(len(rest)) + ' more kernels)':60s} {sum(k.calls for k in rest):5d} "
                f"{sum(k.ms for k in rest):9.3f} {sum(k.share for k in rest):6.1%}"
            )


def load_profile(path: Path) -> Profile:
    try:
        doc = json.loads(path.read_text())
        return Profile(**{**doc, "kernels": [Kernel(**k) for k in doc.get("kernels", [])]})
    except (OSError, json.JSONDecodeError, TypeError) as exc:
        raise SummaryError(f"{path}: not a profile file ({exc})") from None


def markdown_table(profiles: list[Profile]) -> str:
    cats = []
    for p in profiles:
        cats += [c for c in p.categories if c not in cats]
    lines = [
        "| run | tool | step ms | attention | " + " | ".join(cats) + " |",
        "|---|---|---:|---:|" + "---:|" * len(cats),
    ]
    for p in profiles:
        cells = [f"{p.categories[c]:.1%}" if c in p.categories else "" for c in cats]
        lines.append(
            f"| {p.label} | {p.tool} | {p.step_ms:.2f} | {p.attention_share:.1%} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines)


# The step paths (--fused, --cuda-graph) as engine flags; scripts/bench_cuda.py names them the same.
STEP_PATHS = {"verified": [], "fused": ["--fused", "on"], "graph": ["--cuda-graph", "on"]}


def engine_args(shape: str, batch: int, attention: str, ckpt_dir: str, step_path: str = "verified") -> list[str]:
    s = SHAPES[shape]
    return [
        "--data",
        "-",
        "--ckpt-dir",
        ckpt_dir,
        "--ckpt-every",
        "0",
        "--vocab",
        str(s["vocab"]),
        "--ctx",
        str(s["ctx"]),
        "--dim",
        str(s["dim"]),
        "--layers",
        str(s["layers"]),
        "--heads",
        str(s["heads"]),
        "--batch",
        str(batch),
        "--precision",
        "bf16",
        "--attention",
        attention,
        *STEP_PATHS[step_path],
    ]


def write_frames(out, shape: str, batch: int, steps: int) -> None:
    s = SHAPES[shape]
    rng = np.random.default_rng(0)
    for step in range(1, steps + 1):
        rows = rng.integers(0, s["vocab"], size=(batch, s["ctx"] + 1), dtype=np.uint16)
        out.write(frames.train_frame(step, rows, np.zeros(batch, np.uint16)))
    out.write(frames.stop_frame())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("engine-args")
    a.add_argument("shape", choices=list(SHAPES))
    a.add_argument("batch", type=int)
    a.add_argument("attention", choices=["naive", "flash", "cudnn"])
    a.add_argument("ckpt_dir")
    a.add_argument("step_path", nargs="?", choices=list(STEP_PATHS), default="verified")
    f = sub.add_parser("frames")
    f.add_argument("shape", choices=list(SHAPES))
    f.add_argument("batch", type=int)
    f.add_argument("steps", type=int)
    s = sub.add_parser("summarize")
    s.add_argument("--tool", choices=["ncu", "events"], required=True)
    s.add_argument("--csv", type=Path, help="ncu CSV (--tool ncu)")
    s.add_argument("--stderr", type=Path, help="the engine's stderr (--tool events)")
    s.add_argument("--label", default="")
    s.add_argument("--out", type=Path, required=True)
    t = sub.add_parser("table")
    t.add_argument("profiles", type=Path, nargs="+")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "engine-args":
            print("\n".join(engine_args(args.shape, args.batch, args.attention, args.ckpt_dir, args.step_path)))
        elif args.cmd == "frames":
            write_frames(sys.stdout.buffer, args.shape, args.batch, args.steps)
        elif args.cmd == "summarize":
            src = args.csv if args.tool == "ncu" else args.stderr
            if src is None:
                raise SummaryError(f"--tool {args.tool} needs --{'csv' if args.tool == 'ncu' else 'stderr'}")
            try:
                text = src.read_text(errors="replace")
            except OSError as exc:
                raise SummaryError(f"cannot read {src}: {exc.strerror}") from None
            prof = (
                summarize_ncu(args.label, parse_ncu_csv(text))
                if args.tool == "ncu"
                else summarize_events(args.label, text)
            )
            atomic_write_json(args.out, asdict(prof))
            print_profile(prof)
        else:
            print(markdown_table([load_profile(p) for p in args.profiles]))
    except SummaryError as exc:
        print(f"profile_summary: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

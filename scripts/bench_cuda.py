#!/usr/bin/env python3
"""Benchmark build/microgpt_cuda against PyTorch (and llm.c) on one GPU.

Trains the same model (docs/ARCHITECTURE.md's GPT: tied head, GELU tanh, no dropout),
batch and sequence length, one trainer after the other in one run:

- the engine (proxy mode, random tokens fed as TRAIN frames), once per
  attention path (`--attention naive flash cudnn`) and step path
  (`--step-paths verified fused graph`: the verified kernels, the fused
  step, the fused step as one CUDA graph), each pair a variant named
  `attention` or `attention+step` (`cudnn+graph`);
- PyTorch (bf16 autocast, fused AdamW, scaled_dot_product_attention) under
  torch.compile in each requested mode: `default` and `reduce-overhead`
  (CUDA graphs), plus `max-autotune` with --max-autotune;
- optionally llm.c's train_gpt2cu (`--llmc PATH`, GPT-2 124M only: llm.c has
  no ANDREA-12M model), on random-token shards in its own format.

For each it reports tokens/s (median step), the ratio against the fastest
PyTorch mode, MFU (6N + 6LCT flops per token against the GPU's dense bf16
peak), peak GPU memory, and for the engine the stall per checkpoint write.
`--json FILE` writes every figure as a BenchReport (scripts/cuda_bench_report.py,
which also renders the table in docs/PERFORMANCE.md from it).

    python scripts/bench_cuda.py                                 # both shapes, B=8
    python scripts/bench_cuda.py --shape gpt2-124m --batch 8 32 64 --json out.json
    python scripts/bench_cuda.py --shape andrea-12m --no-torch --attention flash
    python scripts/bench_cuda.py --shape gpt2-124m --llmc /path/to/train_gpt2cu
    python scripts/bench_cuda.py --shape gpt2-124m --variants naive cudnn+graph --torch-modes default
    python scripts/bench_cuda.py --shape gpt2-124m --ranks 8 --no-torch   # data-parallel scaling (NCCL)

Shapes: ANDREA-12M (C=384, L=6, H=12, V=4608, T=1024) and GPT-2 124M
(C=768, L=12, H=12, V=50304, T=1024). Needs an NVIDIA GPU for numbers; a
side that cannot run (no GPU, a CPU-only torch, out of memory) is recorded as
skipped with the reason, never silently dropped.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import queue
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from proxy.formats import frames  # noqa: E402
from proxy.formats.engine_cli import engine_args, setting_flags  # noqa: E402
from proxy.formats.parameters import n_params  # noqa: E402

sys.path.insert(0, str(REPO / "scripts"))
import bench_cuda_ranks as dp  # noqa: E402  (--ranks N)
from bench_cuda_peers import TORCH_MODES, bench_llmc, bench_torch, torch_versions  # noqa: E402  (the peers)
from cuda_bench_report import BenchReport, Run, Side  # noqa: E402  (the results file's format)
from gpu_facts import cudnn_version, gpu_facts, gpu_peak, process_gpu_mib, source_commit  # noqa: E402

SHAPES = {
    "andrea-12m": dict(dim=384, layers=6, heads=12, vocab=4608, ctx=1024),
    "gpt2-124m": dict(dim=768, layers=12, heads=12, vocab=50304, ctx=1024),
}
ATTENTION = ("naive", "flash", "cudnn")
STEP_PATHS = {"verified": [], "fused": ["--fused", "on"], "graph": ["--cuda-graph", "on"]}


def engine_variant(attention: str, step_path: str) -> str:
    return attention if step_path == "verified" else f"{attention}+{step_path}"


def parse_variant(name: str) -> tuple[str, str]:
    """(attention, step path) of a variant name as engine_variant writes it; ValueError if not one."""
    attention, _, step_path = name.partition("+")
    step_path = step_path or "verified"
    if attention not in ATTENTION or step_path not in STEP_PATHS or engine_variant(attention, step_path) != name:
        raise ValueError(f"not an engine variant: {name!r} (ATTENTION or ATTENTION+STEP, e.g. naive, cudnn+graph)")
    return attention, step_path


def flops_per_token(s: dict) -> float:
    n = n_params(s["vocab"], s["ctx"], s["dim"], s["layers"])
    return 6.0 * n + 6.0 * s["layers"] * s["dim"] * s["ctx"]


# ---------------------------------------------------------------------------
# the CUDA engine


def bench_engine(
    engine: Path,
    shape: dict,
    batch: int,
    steps: int,
    warmup: int,
    ckpts: int,
    precision: str,
    attention: str,
    step_path: str = "verified",
    launcher: list[str] | None = None,
    grad_accum: int = 1,
    variant: str | None = None,
) -> Side:
    """The engine alone, or behind `launcher` (mpirun: --ranks); a step is grad_accum micro-batches of batch rows."""
    T, V = shape["ctx"], shape["vocab"]
    variant = variant or engine_variant(attention, step_path)
    rows = batch * grad_accum
    rng = np.random.default_rng(0)
    total = warmup + steps
    with tempfile.TemporaryDirectory(prefix="bench_cuda_") as tmp:
        settings = setting_flags(**shape, batch=batch, grad_accum=grad_accum, steps=100000, warmup=100)
        args = [
            *(launcher or []),
            str(engine),
            *engine_args(
                Path(tmp) / "ckpt",
                ckpt_every=0,
                settings=settings,
                extra=["--precision", precision, "--attention", attention, *STEP_PATHS[step_path]],
            ),
        ]
        proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        lines: queue.Queue = queue.Queue()
        threading.Thread(
            target=lambda: [lines.put(line) for line in proc.stdout] + [lines.put(None)], daemon=True
        ).start()
        err_lines: list[bytes] = []
        threading.Thread(target=lambda: [err_lines.append(line) for line in proc.stderr], daemon=True).start()

        def event(kind: str | tuple[str, ...], timeout: float = 600.0):
            deadline = time.monotonic() + timeout
            while True:
                line = lines.get(timeout=max(0.01, deadline - time.monotonic()))
                if line is None:
                    raise RuntimeError(
                        f"engine ended early (rc {proc.wait()}): {b''.join(err_lines[-20:]).decode(errors='replace')}"
                    )
                ev = json.loads(line)
                if ev.get("event") == "error":
                    raise RuntimeError(f"engine error: {ev.get('message')}")
                if ev.get("event") in ((kind,) if isinstance(kind, str) else kind):
                    return ev, time.monotonic()

        def frame(step: int) -> bytes:
            tokens = rng.integers(0, V, size=(rows, T + 1), dtype=np.uint16)
            return frames.train_frame(step, tokens, np.zeros(rows, np.uint16))

        try:
            ready, _ = event("ready")
            step = 0
            ms, stamps, mem_mib = [], [], None
            for _ in range(total):
                step += 1
                proc.stdin.write(frame(step))
                proc.stdin.flush()
                ev, t = event("step")
                stamps.append(t)
                if step > warmup:
                    ms.append(ev["ms"])
                if step == total:
                    mem_mib = process_gpu_mib(proc.pid)
            # Checkpoint stall: a CHECKPOINT frame between two steps. The driver
            # writes in the background, so the step loop pays the ckpt event's
            # snapshot_ms + wait_ms (its ms is the write); the wall-clock gap
            # between the surrounding step events says what training lost. The
            # ckpt event may come before or after the next step's.
            ckpt_ms, gaps = [], []
            for _ in range(ckpts):
                proc.stdin.write(frames.checkpoint_frame())
                step += 1
                proc.stdin.write(frame(step))
                proc.stdin.flush()
                ck, ev, t = None, None, None
                while ck is None or ev is None:
                    got, when = event(("ckpt", "step"))
                    if got["event"] == "ckpt":
                        ck = got
                    else:
                        ev, t = got, when
                ckpt_ms.append(ck["ms"])
                gaps.append((t - stamps[-1]) * 1e3)
                stamps.append(t)
                step += 1
                proc.stdin.write(frame(step))
                proc.stdin.flush()
                _, t = event("step")
                stamps.append(t)
            proc.stdin.write(frames.stop_frame())
            proc.stdin.flush()
            proc.stdin.close()
            proc.wait(600)
        except (RuntimeError, queue.Empty, BrokenPipeError) as exc:
            proc.kill()
            proc.wait()
            return Side("engine", variant, skipped=f"engine failed: {exc}"[:300])
    med = statistics.median(ms)
    return Side(
        "engine",
        variant,
        tokens_per_s=rows * T / (med / 1e3),
        step_ms=med,
        gpu_mem_mib=mem_mib,
        extra={
            "device": ready["device"],
            "precision": ready["precision"],
            "mem_bytes": ready["mem_bytes"],
            "paths": ready.get("paths", {}),
            "ckpt_ms": statistics.median(ckpt_ms) if ckpt_ms else None,
            "ckpt_stall_ms": (statistics.median(gaps) - med) if gaps else None,
        },
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=[*SHAPES, "all"], default="all")
    ap.add_argument("--batch", type=int, nargs="+", default=[8], help="rows per step, one run each (default 8)")
    ap.add_argument("--steps", type=int, default=30, help="timed steps (default 30)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first (default 5)")
    ap.add_argument(
        "--ckpts", type=int, default=3, help="checkpoint writes to time, with the last engine variant (default 3)"
    )
    ap.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--engine", type=Path, default=REPO / "build" / "microgpt_cuda")
    ap.add_argument(
        "--attention",
        nargs="+",
        choices=ATTENTION,
        default=["naive", "flash"],
        help="engine attention paths to run (default: naive flash)",
    )
    ap.add_argument(
        "--step-paths",
        nargs="+",
        choices=list(STEP_PATHS),
        default=["verified"],
        help="engine step paths to run with each attention path (default: verified)",
    )
    ap.add_argument(
        "--variants",
        nargs="+",
        default=None,
        metavar="VARIANT",
        help="engine variants to run, in this order, instead of every --attention x --step-paths "
        "pair: ATTENTION or ATTENTION+STEP (naive is the verified path; cudnn+graph, ...)",
    )
    ap.add_argument(
        "--commit", default=None, help="the microgpt commit to record (default: git's, where this checkout has .git)"
    )
    ap.add_argument("--no-engine", action="store_true", help="skip the engine")
    ap.add_argument(
        "--torch-modes",
        nargs="+",
        choices=TORCH_MODES[:2],
        default=list(TORCH_MODES[:2]),
        help="torch.compile modes (default: default reduce-overhead)",
    )
    ap.add_argument("--max-autotune", action="store_true", help="also torch.compile mode max-autotune (slow compile)")
    ap.add_argument("--no-torch", action="store_true", help="skip the PyTorch baseline")
    ap.add_argument("--llmc", type=Path, default=None, help="a built llm.c train_gpt2cu to run beside (GPT-2 only)")
    ap.add_argument("--peak-tflops", type=float, default=None, help="GPU peak for MFU (default: from the GPU name)")
    ap.add_argument("--json", type=Path, default=None, help="write every figure here (a BenchReport)")
    ap.add_argument(
        "--ranks",
        type=int,
        default=None,
        metavar="N",
        help="data-parallel scaling: each engine variant through build/microgpt_cuda_mpi on 1 rank and on N "
        "(mpirun), N micro-batches of --batch rows per step both times (scripts/bench_cuda_ranks.py)",
    )
    args = ap.parse_args(argv)
    if min(args.batch) < 1 or args.steps < 1 or args.warmup < 0 or args.ckpts < 0:
        ap.error("--batch and --steps must be >= 1, --warmup and --ckpts >= 0")
    if args.ranks is not None and args.ranks < 2:
        ap.error("--ranks must be >= 2 (it compares N ranks with one)")
    if args.max_autotune:
        args.torch_modes = [*args.torch_modes, "max-autotune"]
    if args.variants is not None:
        try:
            args.variant_pairs = [parse_variant(v) for v in args.variants]
        except ValueError as exc:
            ap.error(str(exc))
    else:
        args.variant_pairs = [(a, p) for a in args.attention for p in args.step_paths]
    return args


def print_side(s: Side) -> None:
    if s.skipped:
        print(f"  {s.label}: skipped: {s.skipped}", flush=True)
        return
    # The ratio is printed once the run is complete (a later PyTorch mode may be faster).
    print(
        f"  {s.label}: {s.tokens_per_s:,.0f} tok/s, {s.step_ms:.2f} ms/step"
        + (f", MFU {s.mfu:.1%}" if s.mfu is not None else "")
        + (f", GPU memory {s.gpu_mem_mib:,.0f} MiB" if s.gpu_mem_mib else "")
        + (f", engine buffers {s.extra['mem_bytes'] / 2**20:,.0f} MiB" if "mem_bytes" in s.extra else ""),
        flush=True,
    )
    if dp.describe(s):
        print(dp.describe(s))
    if s.extra.get("ckpt_ms") is not None:
        print(
            f"    checkpoint: {s.extra['ckpt_ms']:.0f} ms per write; training stalled {s.extra['ckpt_stall_ms']:.0f} ms"
        )
    if s.kind == "engine" and not s.extra.get("device", "").endswith(f"attention {s.variant.split('+')[0]}"):
        print(f"    note: the engine ran '{s.extra.get('device')}' (asked for {s.variant})")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    engine = args.engine if args.ranks is None else dp.launch(args.engine, args.ranks)[1]
    if not args.no_engine and not engine.is_file():
        print(f"bench_cuda: {engine} not found: build it with `make cuda` (or pass --no-engine)", file=sys.stderr)
        return 2
    if args.llmc is not None and not args.llmc.is_file():
        print(f"bench_cuda: --llmc {args.llmc}: no such file", file=sys.stderr)
        return 2
    facts = gpu_facts()
    peak = gpu_peak(facts["gpu"], args.peak_tflops)
    torch_version, torch_cuda = (None, None) if args.no_torch else torch_versions()
    report = BenchReport(
        gpu=facts["gpu"],
        peak_tflops=peak,
        driver=facts["driver"],
        cuda=facts["cuda"],
        nvcc=facts["nvcc"],
        torch=torch_version,
        torch_cuda=torch_cuda,
        command=shlex.join(["python", "scripts/bench_cuda.py", *(argv if argv is not None else sys.argv[1:])]),
        date=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        runs=[],
        cudnn=cudnn_version(),
        commit=args.commit or source_commit(),
    )
    shapes = list(SHAPES) if args.shape == "all" else [args.shape]
    for key in shapes:
        s = SHAPES[key]
        fpt = flops_per_token(s)
        for batch in args.batch:
            n = n_params(s["vocab"], s["ctx"], s["dim"], s["layers"])
            print(
                f"== {key}: C={s['dim']} L={s['layers']} H={s['heads']} V={s['vocab']} T={s['ctx']} B={batch}, "
                f"{n / 1e6:.1f}M params, {fpt / 1e6:.0f} MFLOP/token",
                flush=True,
            )
            run = Run(shape=key, batch=batch, ctx=s["ctx"], n_params=n, flops_per_token=fpt, sides=[])
            report.runs.append(run)
            jobs: list = []  # each gives its sides
            if not args.no_engine:
                variants = args.variant_pairs
                for attention, step_path in variants:
                    ckpts = args.ckpts if (attention, step_path) == variants[-1] else 0
                    if args.ranks is not None:  # no checkpoint timing: the scaling is the figure
                        jobs.append(
                            lambda a=attention, p=step_path: dp.bench_scaling(
                                lambda argv, binary, accum, name: bench_engine(
                                    binary,
                                    s,
                                    batch,
                                    args.steps,
                                    args.warmup,
                                    0,
                                    args.precision,
                                    a,
                                    p,
                                    argv,
                                    accum,
                                    name,
                                ),
                                args.engine,
                                args.ranks,
                                engine_variant(a, p),
                            )
                        )
                        continue
                    jobs.append(
                        lambda a=attention, p=step_path, c=ckpts: [
                            bench_engine(args.engine, s, batch, args.steps, args.warmup, c, args.precision, a, p)
                        ]
                    )
            if args.llmc is not None:
                jobs.append(lambda: [bench_llmc(args.llmc, key, s, batch, args.steps, args.warmup)])
            for mode in [] if args.no_torch else args.torch_modes:
                jobs.append(lambda m=mode: [bench_torch(s, batch, args.steps, args.warmup, m)])
            for side in (side for job in jobs for side in job()):
                if side.tokens_per_s and peak:
                    side.mfu = side.tokens_per_s * fpt / (peak * 1e12)
                run.sides.append(side)
                run.fill_ratios()
                print_side(side)
                if args.json:  # after every side: a run cut short keeps what it measured
                    report.save(args.json)
            best = run.fastest_torch()
            for side in run.sides:
                if side.kind != "torch" and side.ratio is not None:
                    print(f"  {side.label}: {side.ratio:.2f}x the fastest PyTorch mode ({best:,.0f} tok/s)")
    print(
        f"GPU: {facts['gpu']}, driver {facts['driver']}, CUDA {facts['cuda']}; MFU against "
        f"{peak if peak else 'unknown (pass --peak-tflops)'} TFLOP/s dense bf16"
    )
    if args.json:
        report.save(args.json)  # also when every side was skipped or left out (--no-engine --no-torch)
        print(f"bench_cuda: wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

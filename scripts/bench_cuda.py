#!/usr/bin/env python3
"""Benchmark build/microgpt_cuda against PyTorch on one GPU.

Trains the same model (docs/ARCHITECTURE.md's GPT: tied head, GELU tanh, no dropout),
batch and sequence length with the CUDA engine (proxy mode, random tokens fed
as TRAIN frames) and with PyTorch (bf16 autocast, torch.compile, fused AdamW,
scaled_dot_product_attention), one after the other in one run, and prints for
each: tokens/s, their ratio, MFU (6N + 6LCT flops per token against the GPU's
dense bf16 peak), peak GPU memory, and, for the engine, the training stall per
checkpoint write.

    python scripts/bench_cuda.py                       # both shapes
    python scripts/bench_cuda.py --shape andrea-12m --steps 50
    python scripts/bench_cuda.py --no-torch            # engine only

Shapes: ANDREA-12M (C=384, L=6, H=12, V=4608, T=1024) and GPT-2 124M
(C=768, L=12, H=12, V=50304, T=1024). Needs an NVIDIA GPU; the PyTorch side
needs a CUDA build of torch and says so plainly when torch has no CUDA.
"""
from __future__ import annotations

import argparse
import json
import os
import queue
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
from bench_engine import build_torch_model  # noqa: E402  (one peer model for both benchmarks)

SHAPES = {
    "andrea-12m": dict(dim=384, layers=6, heads=12, vocab=4608, ctx=1024),
    "gpt2-124m": dict(dim=768, layers=12, heads=12, vocab=50304, ctx=1024),
}
# Dense bf16 tensor-core peaks (datasheet, SXM parts), TFLOP/s.
PEAKS = {"H100": 989.0, "H200": 989.0, "H800": 989.0, "A100": 312.0, "A800": 312.0, "L40S": 362.0, "4090": 165.0}


def flops_per_token(s: dict) -> float:
    n = n_params(s["vocab"], s["ctx"], s["dim"], s["layers"])
    return 6.0 * n + 6.0 * s["layers"] * s["dim"] * s["ctx"]


def gpu_peak(name: str, override: float | None) -> float | None:
    if override:
        return override
    for key, peak in PEAKS.items():
        if key in name:
            return peak
    return None


def gpu_name() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "unknown GPU"
    except (OSError, subprocess.TimeoutExpired, IndexError):
        return "unknown GPU"


def process_gpu_mib(pid: int) -> float | None:
    """GPU memory nvidia-smi attributes to pid (MiB), or None."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in out.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0] == str(pid):
            try:
                return float(parts[1])
            except ValueError:
                return None
    return None


# ---------------------------------------------------------------------------
# the CUDA engine


def bench_engine(engine: Path, shape: dict, batch: int, steps: int, warmup: int, ckpts: int, precision: str,
                 env_extra: dict) -> dict:
    T, V = shape["ctx"], shape["vocab"]
    rng = np.random.default_rng(0)
    total = warmup + steps
    with tempfile.TemporaryDirectory(prefix="bench_cuda_") as tmp:
        settings = setting_flags(**shape, batch=batch, steps=100000, warmup=100)
        args = [str(engine), *engine_args(Path(tmp) / "ckpt", ckpt_every=0, settings=settings,
                                          extra=["--precision", precision])]
        env = dict(os.environ, **env_extra)
        proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [lines.put(l) for l in proc.stdout] + [lines.put(None)], daemon=True).start()
        err_lines: list[bytes] = []
        threading.Thread(target=lambda: [err_lines.append(l) for l in proc.stderr], daemon=True).start()

        def event(kind: str, timeout: float = 600.0):
            deadline = time.monotonic() + timeout
            while True:
                line = lines.get(timeout=max(0.01, deadline - time.monotonic()))
                if line is None:
                    raise RuntimeError(f"engine ended early (rc {proc.wait()}): {b''.join(err_lines[-20:]).decode(errors='replace')}")
                ev = json.loads(line)
                if ev.get("event") == "error":
                    raise RuntimeError(f"engine error: {ev}")
                if ev.get("event") == kind:
                    return ev, time.monotonic()

        def frame(step: int) -> bytes:
            rows = rng.integers(0, V, size=(batch, T + 1), dtype=np.uint16)
            return frames.train_frame(step, rows, np.zeros(batch, np.uint16))

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
        # writes synchronously today, so the stall is the ckpt event's ms; the
        # wall-clock gap between the surrounding step events says the same.
        ckpt_ms, gaps = [], []
        for _ in range(ckpts):
            proc.stdin.write(frames.checkpoint_frame())
            step += 1
            proc.stdin.write(frame(step))
            proc.stdin.flush()
            ck, _ = event("ckpt")
            ev, t = event("step")
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
    med = statistics.median(ms)
    return {
        "device": ready["device"], "precision": ready["precision"], "mem_bytes": ready["mem_bytes"],
        "step_ms": med, "tokens_per_s": batch * T / (med / 1e3), "gpu_mem_mib": mem_mib,
        "ckpt_ms": statistics.median(ckpt_ms) if ckpt_ms else None,
        "ckpt_stall_ms": (statistics.median(gaps) - med) if gaps else None,
    }


# ---------------------------------------------------------------------------
# PyTorch


def bench_torch(shape: dict, batch: int, steps: int, warmup: int, compile_model: bool) -> dict:
    try:
        import torch
    except ImportError as exc:
        return {"skipped": f"torch is not installed ({exc})"}
    if not torch.cuda.is_available():
        return {"skipped": f"torch {torch.__version__} has no CUDA (a CPU-only build, or no GPU visible): "
                           "install a CUDA build of torch for the baseline"}
    V, T = shape["vocab"], shape["ctx"]
    dev = torch.device("cuda")
    model = build_torch_model(shape, "cuda")  # the same peer model as the CPU benchmark
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    fwd = torch.compile(model) if compile_model else model
    gen = torch.Generator(device=dev).manual_seed(0)

    def step():
        data = torch.randint(0, V, (batch, T + 1), device=dev, generator=gen)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(data[:, :-1], data[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        loss = step()
        loss.item()  # the engine also waits for each step's loss
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    med = statistics.median(times)
    return {"device": torch.cuda.get_device_name(), "step_ms": med, "tokens_per_s": batch * T / (med / 1e3),
            "gpu_mem_mib": torch.cuda.max_memory_allocated() / 2**20, "torch": torch.__version__,
            "compiled": compile_model}


# ---------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=[*SHAPES, "all"], default="all")
    ap.add_argument("--batch", type=int, default=8, help="rows per step (default 8)")
    ap.add_argument("--steps", type=int, default=30, help="timed steps (default 30)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first (default 5)")
    ap.add_argument("--ckpts", type=int, default=3, help="checkpoint writes to time (default 3)")
    ap.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--engine", type=Path, default=REPO / "build" / "microgpt_cuda")
    ap.add_argument("--no-torch", action="store_true", help="skip the PyTorch baseline")
    ap.add_argument("--no-compile", action="store_true", help="PyTorch without torch.compile")
    ap.add_argument("--peak-tflops", type=float, default=None, help="GPU peak for MFU (default: from the GPU name)")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args()

    if not args.engine.is_file():
        print(f"bench_cuda: {args.engine} not found: build it with `make cuda`", file=sys.stderr)
        return 2
    name = gpu_name()
    peak = gpu_peak(name, args.peak_tflops)
    shapes = list(SHAPES) if args.shape == "all" else [args.shape]
    results = {}
    for key in shapes:
        s = SHAPES[key]
        fpt = flops_per_token(s)
        print(f"== {key}: C={s['dim']} L={s['layers']} H={s['heads']} V={s['vocab']} T={s['ctx']} B={args.batch}, "
              f"{n_params(s['vocab'], s['ctx'], s['dim'], s['layers']) / 1e6:.1f}M params, "
              f"{fpt / 1e6:.0f} MFLOP/token", flush=True)
        eng = bench_engine(args.engine, s, args.batch, args.steps, args.warmup, args.ckpts, args.precision, {})
        ref = {"skipped": "--no-torch"} if args.no_torch else bench_torch(s, args.batch, args.steps, args.warmup,
                                                                          not args.no_compile)
        for r in (eng, ref):
            if "tokens_per_s" in r and peak:
                r["mfu"] = r["tokens_per_s"] * fpt / (peak * 1e12)
        results[key] = {"engine": eng, "torch": ref}
        print(f"  microgpt_cuda ({eng['precision']}): {eng['tokens_per_s']:,.0f} tok/s, {eng['step_ms']:.2f} ms/step"
              + (f", MFU {eng['mfu']:.1%}" if "mfu" in eng else "")
              + f", engine buffers {eng['mem_bytes'] / 2**20:,.0f} MiB"
              + (f", GPU memory {eng['gpu_mem_mib']:,.0f} MiB" if eng["gpu_mem_mib"] else ""))
        if eng["ckpt_ms"] is not None:
            print(f"  checkpoint: {eng['ckpt_ms']:.0f} ms per write; training stalled {eng['ckpt_stall_ms']:.0f} ms")
        if "skipped" in ref:
            print(f"  pytorch: skipped: {ref['skipped']}")
        else:
            print(f"  pytorch {ref['torch']} (bf16 autocast{', compiled' if ref['compiled'] else ''}, fused AdamW, SDPA): "
                  f"{ref['tokens_per_s']:,.0f} tok/s, {ref['step_ms']:.2f} ms/step"
                  + (f", MFU {ref['mfu']:.1%}" if "mfu" in ref else "")
                  + f", peak allocated {ref['gpu_mem_mib']:,.0f} MiB")
            print(f"  ratio microgpt_cuda / pytorch: {eng['tokens_per_s'] / ref['tokens_per_s']:.2f}x")
    print(f"GPU: {name}; MFU against {peak if peak else 'unknown (pass --peak-tflops)'} TFLOP/s dense bf16")
    if args.json:
        args.json.write_text(json.dumps({"gpu": name, "peak_tflops": peak, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

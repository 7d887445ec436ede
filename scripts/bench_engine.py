#!/usr/bin/env python3
"""Training throughput: the microgpt engine against PyTorch on the same model.

Both sides train ARCHITECTURE.md's GPT-2 (tied embeddings, pre-LN, GELU tanh, AdamW
with decay on 2-D tensors, global-norm clip 1.0) with the same shape, batch,
context and thread count, each in its own subprocess, one after the other:

- the engine: `build/microgpt_cpu` in standalone mode on a random token shard;
  steady-state tokens/s comes from its `step` events (`tokens`, `ms`), with the
  first --skip steps left out as warm-up;
- PyTorch: a nanoGPT-style model (nn.Linear, F.scaled_dot_product_attention
  with is_causal=True), timed the same way per step.

Peak RSS of each subprocess comes from os.wait4 (ru_maxrss of that child only).
The last line printed is one JSON object with every figure.

    python scripts/bench_engine.py --shape tiny --steps 30
    python scripts/bench_engine.py --shape andrea12m --steps 6 --batch 4 --threads 2

--device cuda: the engine is build/microgpt_cuda and the PyTorch peer is the
strong GPU baseline (bf16 autocast, torch.compile, fused AdamW, SDPA); see
`torch_worker` for where the two devices differ.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from proxy.formats.engine_cli import engine_args, setting_flags  # noqa: E402
from proxy.formats.frames import parse_event  # noqa: E402
from proxy.formats.parameters import n_params as count_params  # noqa: E402
from proxy.formats.shard import write_shard  # noqa: E402

SHAPES = {
    # name: vocab, dim, layers, heads, ctx
    "tiny": dict(vocab=256, dim=64, layers=2, heads=4, ctx=64),
    "andrea12m": dict(vocab=4608, dim=384, layers=6, heads=12, ctx=256),
}
OPTIM = dict(lr=6e-4, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, grad_clip=1.0)


def n_params(s: dict) -> int:
    return count_params(s["vocab"], s["ctx"], s["dim"], s["layers"])


def steady_rate(steps: list[dict], skip: int) -> dict:
    """tokens/s and ms/step over the steps after the first `skip`."""
    kept = steps[skip:] if len(steps) > skip else steps[-1:]
    tokens = sum(s["tokens"] for s in kept)
    seconds = sum(s["ms"] for s in kept) / 1000.0
    ms = sorted(s["ms"] for s in kept)
    return {
        "tokens_per_s": tokens / seconds if seconds > 0 else float("nan"),
        # robust to a few steps slowed by other load on a shared machine
        "tokens_per_s_median": tokens / len(kept) / (ms[len(ms) // 2] / 1000.0),
        "ms_per_step_mean": 1000.0 * seconds / len(kept),
        "ms_per_step_median": ms[len(ms) // 2],
        "steps_timed": len(kept),
        "final_loss": kept[-1].get("loss"),
    }


def run_child(name: str, cmd: list[str], cwd: Path, on_line, timeout: float = 3600) -> tuple[int, int, str]:
    """Run one child; feed stdout lines to on_line; return (exit code, peak RSS bytes, stderr tail)."""
    err_path = cwd / f"{name}.stderr"
    with open(err_path, "wb") as err:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=err, text=True)
    deadline = time.monotonic() + timeout
    for line in proc.stdout:
        on_line(line)
        if time.monotonic() > deadline:
            proc.kill()
            break
    proc.stdout.close()
    _pid, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_maxrss * 1024, err_path.read_text(errors="replace")[-2000:]


# ---------------------------------------------------------------------------
# engine side


def bench_engine(args, shape: dict, work: Path) -> dict:
    import numpy as np

    engine = Path(args.engine or REPO / "build" / ("microgpt_cuda" if args.device == "cuda" else "microgpt_cpu"))
    if not engine.is_file():
        raise SystemExit(f"bench_engine: {engine} not found; build it with `make`")
    shard = work / "bench.tok"
    n_tok = max(200_000, 4 * args.batch * (shape["ctx"] + 1))
    write_shard(shard, np.random.default_rng(0).integers(0, shape["vocab"], n_tok, dtype=np.uint16), shape["vocab"])
    settings = setting_flags(
        **shape,
        **OPTIM,
        steps=args.steps,
        warmup=1,
        batch=args.batch,
        seed=1,
        threads=args.threads if args.device == "cpu" else None,
    )
    cmd = [str(engine), *engine_args(work / "ck", data=shard, ckpt_every=0, settings=settings)]
    steps, ready = [], {}

    def on_line(line: str) -> None:
        ev = parse_event(line)
        if ev.kind == "ready":
            ready.update(ev.fields)
        elif ev.kind == "step":
            steps.append(ev.fields)
            if args.verbose:
                print(f"  engine step {ev['step']}: loss {ev['loss']:.4f} {ev['ms']:.1f} ms", flush=True)
        elif ev.kind == "error":
            print(f"  engine error: {ev.fields}", file=sys.stderr)

    rc, rss, err = run_child("engine", cmd, work, on_line)
    if rc != 0 or not steps:
        raise SystemExit(f"bench_engine: engine failed (exit {rc}): {err}")
    out = steady_rate(steps, args.skip)
    out.update(
        peak_rss_bytes=rss,
        mem_bytes=ready.get("mem_bytes"),
        threads=ready.get("threads"),
        device=ready.get("device"),
        precision=ready.get("precision"),
        command=" ".join(cmd),
    )
    return out


# ---------------------------------------------------------------------------
# torch side (runs in its own process: `--worker torch`)


def build_torch_model(shape: dict, device: str):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    C, H = shape["dim"], shape["heads"]

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
            self.fc, self.fcproj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

        def forward(self, x):
            B, T, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
            return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(shape["vocab"], C)
            self.wpe = nn.Embedding(shape["ctx"], C)
            self.blocks = nn.ModuleList(Block() for _ in range(shape["layers"]))
            self.lnf = nn.LayerNorm(C)
            for p in self.parameters():
                if p.dim() == 2:
                    nn.init.normal_(p, std=0.02)

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe.weight[: idx.shape[1]]
            for b in self.blocks:
                x = b(x)
            logits = self.lnf(x) @ self.wte.weight.T  # tied output projection
            return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))

    torch.manual_seed(1)
    return GPT().to(device)


def torch_worker(args, shape: dict) -> None:
    """Train with PyTorch; print one JSON line per step ({"tokens", "ms", "loss"})."""
    import torch

    device = args.device
    if device == "cpu":
        torch.set_num_threads(args.threads)
    model = build_torch_model(shape, device)
    decay = [p for p in model.parameters() if p.dim() == 2]
    other = [p for p in model.parameters() if p.dim() != 2]
    groups = [{"params": decay, "weight_decay": OPTIM["weight_decay"]}, {"params": other, "weight_decay": 0.0}]
    adam = dict(lr=OPTIM["lr"], betas=(OPTIM["beta1"], OPTIM["beta2"]), eps=OPTIM["eps"])
    if device == "cuda":
        # The strong GPU baseline: bf16 autocast, torch.compile, fused AdamW, SDPA (flash).
        opt = torch.optim.AdamW(groups, fused=True, **adam)
        step_model = torch.compile(model)
        autocast = lambda: torch.autocast("cuda", dtype=torch.bfloat16)  # noqa: E731
        sync = torch.cuda.synchronize
    else:
        # fp32 on the CPU, as the CPU engine computes.
        opt = torch.optim.AdamW(groups, **adam)
        step_model = model
        import contextlib

        autocast = contextlib.nullcontext
        sync = lambda: None  # noqa: E731

    T, B = shape["ctx"], args.batch
    gen = torch.Generator().manual_seed(0)
    data = torch.randint(0, shape["vocab"], (max(200_000, 4 * B * (T + 1)),), generator=gen)
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        starts = torch.randint(0, data.numel() - T - 1, (B,), generator=gen)
        rows = torch.stack([data[s : s + T + 1] for s in starts.tolist()]).to(device)
        with autocast():
            loss = step_model(rows[:, :-1], rows[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), OPTIM["grad_clip"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        ms = 1000.0 * (time.perf_counter() - t0)
        out = {"step": step, "tokens": B * T, "ms": ms, "loss": loss.item()}
        if device == "cuda":
            out["cuda_max_allocated"] = torch.cuda.max_memory_allocated()
        print(json.dumps(out), flush=True)


def bench_torch(args, shape: dict, work: Path) -> dict:
    from importlib.metadata import version

    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        "torch",
        "--shape",
        args.shape,
        "--threads",
        str(args.threads),
        "--batch",
        str(args.batch),
        "--steps",
        str(args.steps),
        "--device",
        args.device,
    ]
    steps = []

    def on_line(line: str) -> None:
        rec = json.loads(line)
        steps.append(rec)
        if args.verbose:
            print(f"  torch step {rec['step']}: loss {rec['loss']:.4f} {rec['ms']:.1f} ms", flush=True)

    rc, rss, err = run_child("torch", cmd, work, on_line)
    if rc != 0 or not steps:
        raise SystemExit(f"bench_engine: torch worker failed (exit {rc}): {err}")
    out = steady_rate(steps, args.skip)
    out.update(
        peak_rss_bytes=rss,
        threads=args.threads if args.device == "cpu" else None,
        torch=version("torch"),
        command=" ".join(cmd),
    )
    if "cuda_max_allocated" in steps[-1]:
        out["cuda_max_allocated_bytes"] = steps[-1]["cuda_max_allocated"]
    return out


# ---------------------------------------------------------------------------


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="CPU threads for both sides")
    ap.add_argument("--batch", type=int, default=8, help="rows per step (both sides)")
    ap.add_argument("--steps", type=int, default=20, help="steps per side, warm-up included")
    ap.add_argument(
        "--skip",
        type=int,
        default=None,
        help="warm-up steps left out of the rate (default 2 on cpu, 10 on cuda: torch.compile)",
    )
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--engine", help="engine binary (default build/microgpt_cpu or build/microgpt_cuda)")
    ap.add_argument("--only", choices=("both", "engine", "torch"), default="both")
    ap.add_argument("--verbose", action="store_true", help="print every step")
    ap.add_argument("--worker", choices=("torch",), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.skip is None:
        args.skip = 10 if args.device == "cuda" else 2
    if args.steps <= args.skip:
        ap.error(f"--steps {args.steps} leaves nothing to time after {args.skip} warm-up steps")
    shape = SHAPES[args.shape]
    if shape["dim"] % shape["heads"]:
        ap.error("dim must be divisible by heads")

    if args.worker == "torch":
        torch_worker(args, shape)
        return 0

    print(
        f"bench_engine: shape {args.shape} ({n_params(shape) / 1e6:.2f}M params, T={shape['ctx']}), "
        f"batch {args.batch}, {args.steps} steps (first {args.skip} not timed), device {args.device}, "
        f"threads {args.threads}",
        flush=True,
    )
    result = {
        "shape": args.shape,
        **shape,
        "n_params": n_params(shape),
        "batch": args.batch,
        "steps": args.steps,
        "skip": args.skip,
        "device": args.device,
        "threads": args.threads,
        "cpu_count": os.cpu_count(),
        "loadavg_before": os.getloadavg(),
    }
    with tempfile.TemporaryDirectory(prefix="bench_engine.") as tmp:
        work = Path(tmp)
        if args.only in ("both", "engine"):
            result["engine"] = bench_engine(args, shape, work)
        if args.only in ("both", "torch"):
            result["torch"] = bench_torch(args, shape, work)

    result["loadavg_after"] = os.getloadavg()
    for side in ("engine", "torch"):
        if side in result:
            r = result[side]
            print(
                f"{side:>6}: {r['tokens_per_s']:10.0f} tokens/s  {r['ms_per_step_median']:9.1f} ms/step (median)  "
                f"peak RSS {r['peak_rss_bytes'] / 2**20:8.1f} MiB  final loss {r['final_loss']:.4f}"
            )
    if "engine" in result and "torch" in result:
        ratio = result["engine"]["tokens_per_s"] / result["torch"]["tokens_per_s"]
        result["ratio"] = ratio if math.isfinite(ratio) else None
        result["ratio_median"] = result["engine"]["tokens_per_s_median"] / result["torch"]["tokens_per_s_median"]
        print(f" ratio: engine/torch = {ratio:.2f}x tokens/s ({result['ratio_median']:.2f}x by median step)")
    if result["loadavg_before"][0] > 0.5 * (os.cpu_count() or 1):
        print(
            f"bench_engine: warning: load average {result['loadavg_before'][0]:.1f} on {os.cpu_count()} cores "
            "before the run; figures are contended",
            file=sys.stderr,
        )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The peers scripts/bench_cuda.py measures the CUDA engine against, in the same run: PyTorch under
torch.compile (bf16 autocast, fused AdamW, scaled_dot_product_attention) and llm.c's train_gpt2cu on
random-token shards in its own format. Each returns a Side (scripts/cuda_bench_report.py), or a skipped
one with the reason."""

from __future__ import annotations

import gc
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

from bench_engine import build_torch_model  # noqa: E402  (one peer model for both benchmarks)
from cuda_bench_report import Side  # noqa: E402  (the results file's format)
from gpu_facts import process_gpu_mib  # noqa: E402

TORCH_MODES = ("default", "reduce-overhead", "max-autotune")
# llm.c's model descriptor for a shape (its -e flag), where it has one.
LLMC_MODELS = {"gpt2-124m": "d12"}


def torch_versions() -> tuple[str | None, str | None]:
    try:
        import torch
    except ImportError:
        return None, None
    return torch.__version__, torch.version.cuda


def torch_step_times(torch, shape: dict, batch: int, steps: int, warmup: int, mode: str) -> tuple[list[float], float]:
    """(ms of each timed step, peak allocated MiB); the model dies with this frame."""
    V, T = shape["vocab"], shape["ctx"]
    dev = torch.device("cuda")
    model = build_torch_model(shape, "cuda")  # the same peer model as the CPU benchmark
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
        lr=6e-4,
        betas=(0.9, 0.95),
        eps=1e-8,
        fused=True,
    )
    fwd = torch.compile(model) if mode == "default" else torch.compile(model, mode=mode)
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
    return times, torch.cuda.max_memory_allocated() / 2**20


def bench_torch(shape: dict, batch: int, steps: int, warmup: int, mode: str) -> Side:
    try:
        import torch
    except ImportError as exc:
        return Side("torch", mode, skipped=f"torch is not installed ({exc})")
    if not torch.cuda.is_available():
        return Side(
            "torch", mode, skipped=f"torch {torch.__version__} has no CUDA (a CPU-only build, or no GPU visible)"
        )
    torch._dynamo.reset()  # each mode compiles from scratch and drops the last mode's graphs
    gc.collect()
    torch.cuda.empty_cache()
    try:
        times, peak = torch_step_times(torch, shape, batch, steps, warmup, mode)
    except Exception as exc:  # out of memory, a compile failure: recorded, and the benchmark goes on
        first = (str(exc).strip().splitlines() or [""])[0]
        return Side("torch", mode, skipped=f"{type(exc).__name__}: {first}"[:300])
    finally:
        gc.collect()
        torch.cuda.empty_cache()
    med = statistics.median(times)
    return Side(
        "torch",
        mode,
        tokens_per_s=batch * shape["ctx"] / (med / 1e3),
        step_ms=med,
        gpu_mem_mib=peak,
        extra={"device": torch.cuda.get_device_name()},
    )


# ---------------------------------------------------------------------------
# llm.c


LLMC_STEP = re.compile(r"^step\s+(\d+)/\d+ \|.*\|\s*([0-9.]+) ms \|")


def write_llmc_shard(path: Path, n_tokens: int, vocab: int, seed: int) -> None:
    """Random tokens in llm.c's shard format: 256 int32 of header (magic 20240520, version 1, count), uint16."""
    header = np.zeros(256, np.int32)
    header[:3] = (20240520, 1, n_tokens)
    tokens = np.random.default_rng(seed).integers(0, vocab, n_tokens, dtype=np.uint16)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.tobytes())


def bench_llmc(binary: Path, shape_name: str, shape: dict, batch: int, steps: int, warmup: int) -> Side:
    model = LLMC_MODELS.get(shape_name)
    if model is None:
        return Side("llmc", "", skipped=f"llm.c has no {shape_name} model")
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        return Side("llmc", "", skipped=f"{binary} is not an executable")
    T, total = shape["ctx"], warmup + steps
    with tempfile.TemporaryDirectory(prefix="bench_llmc_") as tmp:
        train, val = Path(tmp) / "train.bin", Path(tmp) / "val.bin"
        write_llmc_shard(train, batch * T * (total + 2) + 1, 50257, 0)  # llm.c's GPT-2 vocabulary
        write_llmc_shard(val, batch * T + 1, 50257, 1)
        cmd = [
            str(binary),
            "-i",
            str(train),
            "-j",
            str(val),
            "-e",
            model,
            "-b",
            str(batch),
            "-t",
            str(T),
            "-d",
            str(batch * T),
            "-x",
            str(total),
            "-v",
            "1000000",
            "-m",
            "1",
            "-s",
            "0",
            "-u",
            "100",
            "-l",
            "6e-4",
        ]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp)
        ms, mem_mib, tail = [], None, []
        for line in proc.stdout:
            tail = (tail + [line.rstrip()])[-20:]
            m = LLMC_STEP.match(line)
            if not m:
                continue
            step = int(m.group(1))
            if step > warmup:
                ms.append(float(m.group(2)))
            if step == total - 1:
                mem_mib = process_gpu_mib(proc.pid)
        rc = proc.wait()
    if rc != 0 or not ms:
        return Side("llmc", "", skipped=f"train_gpt2cu exited {rc}: {' / '.join(tail[-3:])}"[:300])
    med = statistics.median(ms)
    return Side(
        "llmc",
        "",
        tokens_per_s=batch * T / (med / 1e3),
        step_ms=med,
        gpu_mem_mib=mem_mib,
        extra={"command": shlex.join(cmd[:1] + ["..."] + cmd[5:])},
    )


# ---------------------------------------------------------------------------

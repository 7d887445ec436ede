#!/usr/bin/env python3
"""Benchmark the proxy's data path alone: batch sampling + TRAIN framing into a null consumer.

    python scripts/bench_proxy.py                       # synthetic shards, ANDREA-12M shape
    python scripts/bench_proxy.py --experiment experiments/ANDREA-12M-TRAIN.json   # real prepared shards
    python scripts/bench_proxy.py --rows 8 64 --ctx 1024 --seconds 3

For each batch size it runs `BatchSampler.train_batch(step, weights, rows)`
then `frames.train_frame(step, tokens, groups)` for consecutive steps (a fresh
Philox generator per step, as in a run), hands the frame to a null consumer
(its length is taken; with --devnull it is written to /dev/null), and prints
tokens/s (rows * (ctx + 1) tokens per frame). The goal is >= 10M tokens/s, far
above what an engine consumes, so the proxy never starves the GPU.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proxy.config.experiment import load_experiment  # noqa: E402
from proxy.data.batches import BatchSampler, segment_arrays  # noqa: E402
from proxy.data.prepare import default_cache_dir, prepare_data  # noqa: E402
from proxy.formats.frames import train_frame  # noqa: E402
from proxy.formats.shard import read_shard, write_shard  # noqa: E402

GOAL = 10e6


def synthetic_shards(tmp: Path, vocab: int, sizes: dict[str, int]) -> tuple[dict, dict]:
    """Random token shards of the given sizes (ANDREA-12M's arms are about 3.2M, 0.6M and 0.1M tokens)."""
    rng = np.random.default_rng(0)
    train, val = {}, {}
    for name, n in sizes.items():
        train[name] = tmp / f"{name}.train.tok"
        val[name] = tmp / f"{name}.val.tok"
        write_shard(train[name], rng.integers(0, vocab, n, dtype=np.uint16), vocab)
        write_shard(val[name], rng.integers(0, vocab, max(n // 100, 20000), dtype=np.uint16), vocab)
    return train, val


def bench(sampler: BatchSampler, weights: np.ndarray, rows: int, seconds: float, sink) -> tuple[float, float]:
    row_len = sampler.row_len
    step, total_bytes = 1, 0
    t0 = time.perf_counter()
    deadline = t0 + seconds
    while True:
        for _ in range(50):
            tokens, groups = sampler.train_batch(step, weights, rows)
            frame = train_frame(step, tokens, groups)
            if sink is not None:
                sink.write(frame)
            total_bytes += len(frame)
            step += 1
        if time.perf_counter() >= deadline:
            break
    elapsed = time.perf_counter() - t0
    steps = step - 1
    return steps * rows * row_len / elapsed, steps / elapsed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--experiment", help="use this experiment's prepared shards (prepares them if missing)")
    ap.add_argument("--cache-dir", help="data cache (default: $MICROGPT_CACHE or ~/.cache/microgpt)")
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=4608)
    ap.add_argument("--rows", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--seconds", type=float, default=2.0, help="per batch size")
    ap.add_argument("--devnull", action="store_true", help="write frames to /dev/null instead of just len()")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmpdir:
        if args.experiment:
            exp = load_experiment(args.experiment)
            data = prepare_data(exp, Path(args.experiment).parent, args.cache_dir or default_cache_dir())
            names, ctx = exp.arm_names, exp.model.ctx
            train = {arm: segment_arrays(data.train[arm]) for arm in names}
            val = {arm: read_shard(data.val_shards[arm])[0] for arm in names}
            source = f"{exp.name} prepared shards"
        else:
            sizes = {"code": 3_200_000, "docstrings": 580_000, "topics": 114_000}
            names, ctx = list(sizes), args.ctx
            paths = synthetic_shards(Path(tmpdir), args.vocab, sizes)
            train = {arm: [read_shard(p)[0]] for arm, p in paths[0].items()}
            val = {arm: read_shard(p)[0] for arm, p in paths[1].items()}
            source = "synthetic shards " + ", ".join(f"{k}={v:,}" for k, v in sizes.items())
        sampler = BatchSampler(train, val, names, seed=1337, row_len=ctx + 1)
        weights = np.full(len(names), 1.0 / len(names))
        sink = open(os.devnull, "wb") if args.devnull else None
        print(
            f"bench_proxy: {source}; ctx {ctx}; arms {len(names)}; consumer {'/dev/null' if sink else 'len()'}; "
            f"{os.cpu_count()} cpus"
        )
        ok = True
        try:
            for rows in args.rows:
                bench(sampler, weights, rows, 0.2, sink)  # warm the page cache and numpy
                tps, bps = bench(sampler, weights, rows, args.seconds, sink)
                ok &= tps >= GOAL
                print(
                    f"rows {rows:4d} x {ctx + 1} tokens: {bps:9.0f} batches/s  "
                    f"{tps / 1e6:8.1f}M tokens/s  {'ok' if tps >= GOAL else 'BELOW GOAL'} (goal {GOAL / 1e6:.0f}M)"
                )
        finally:
            if sink is not None:
                sink.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

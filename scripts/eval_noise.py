#!/usr/bin/env python3
"""How noisy an evaluation's validation loss is against its size in tokens (docs/EXPERIMENTS.md, "How many
tokens an evaluation takes"), on a run's checkpoint, with the run's engine.

Each arm's validation tokens are cut into side-by-side rows of ctx + 1 tokens (at most --max-rows), every
row its own group id in one EVAL frame, so the engine gives each row's mean loss. Then, for each size, the
standard deviation of the mean loss of --draws subsets of that many rows: how far an evaluation of that many
tokens is from the loss over all of them. Two kinds of subset: `random` (rows drawn without replacement,
scaled to a split of unbounded size) and `spaced` (rows evenly spaced from a random first one, as an
evaluation takes them: closer, where the split's documents differ from one another).

    python scripts/eval_noise.py --run-dir runs/TINY-TRAIN
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from proxy.commands.checkpoint_engine import CheckpointEngine  # noqa: E402
from proxy.commands.model_source import resolve_source, run_data  # noqa: E402
from proxy.formats import frames  # noqa: E402
from proxy.supervision.engine_process import choose_engine  # noqa: E402

SIZES = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)  # tokens an evaluation takes


def row_losses(engine: CheckpointEngine, val: np.ndarray, ctx: int, max_rows: int) -> np.ndarray:
    """The mean loss of each side-by-side row of ctx + 1 tokens (the first max_rows), one group id each."""
    n = min((val.size - 1) // ctx, max_rows, 1 << 16)
    rows = np.stack([val[i * ctx : i * ctx + ctx + 1] for i in range(n)]).astype(np.uint16)
    event = engine.ask(frames.eval_frame(1, rows, np.arange(n, dtype=np.uint16)), "eval")
    return np.array([frames.group_result(event, g)[0] for g in range(n)])


def spread(losses: np.ndarray, rows: int, draws: int, rng: np.random.Generator) -> float:
    """The standard deviation of the mean of `rows` rows drawn without replacement, scaled by the finite
    population correction to what a split of unbounded size would give."""
    n = losses.size
    means = [losses[rng.choice(n, rows, replace=False)].mean() for _ in range(draws)]
    return float(np.std(means)) * math.sqrt((n - 1) / (n - rows))


def spaced(losses: np.ndarray, rows: int, draws: int, rng: np.random.Generator) -> float:
    """The standard deviation of the mean of `rows` rows evenly spaced over all of them, from a random start."""
    stride = losses.size / rows
    starts = rng.uniform(0, stride, draws)
    return float(np.std([losses[(s + stride * np.arange(rows)).astype(int)].mean() for s in starts]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--step", type=int, default=None, help="the checkpoint (default: the newest)")
    ap.add_argument("--engine", default=None, help="as `proxy run --engine` (default: the best one here)")
    ap.add_argument("--draws", type=int, default=2000)
    ap.add_argument("--max-rows", type=int, default=4096, help="rows per arm at most")
    args = ap.parse_args()
    source = resolve_source(args.run_dir, args.step, None)
    data = run_data(source, None, "the validation data", need_val=True)
    ctx, rng = source.shape.ctx, np.random.default_rng(0)
    print(f"step {source.step} of {args.run_dir}, ctx {ctx}: std of an evaluation's loss by its size in tokens")
    with CheckpointEngine(choose_engine(args.engine), source) as engine:
        for arm, val in data.val.items():
            losses = row_losses(engine, val, ctx, args.max_rows)
            sizes = [t for t in SIZES if -(-t // ctx) <= losses.size // 2]  # at most half the rows: real draws
            print(f"{arm}: {losses.size} rows, loss over all {losses.mean():.4f}", flush=True)
            for name, kind in (("random", spread), ("spaced", spaced)):
                figures = ", ".join(f"{t}: {kind(losses, -(-t // ctx), args.draws, rng):.4f}" for t in sizes)
                print(f"  {name}: {figures}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

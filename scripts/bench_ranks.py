#!/usr/bin/env python3
"""Data-parallel throughput of the CPU engine: 1 rank against 2 MPI ranks, the same global batch.

Each configuration trains the same model on the same random token shard in standalone mode, with
`--grad-accum 2` (so 2 ranks split every step's micro-batches) and the same batch, run one after the
other in alternating rounds (the machine's load drifts; alternation spreads it over all of them):

- `1 rank x 2 threads`: build/microgpt_cpu, both cores in one process (today's way to use the box);
- `1 rank x 1 thread`:  build/microgpt_cpu on one core (what each rank has below);
- `2 ranks x 1 thread`: `mpirun -np 2 build/microgpt_cpu_mpi --threads 1` (proxy/supervision/ranks.py's
  launcher), one core each, gradients folded in order across ranks (docs/ENGINE.md).

Steady-state tokens/s comes from rank 0's `step` events (`tokens`, `ms`: the whole step, reduction
included), the first --skip steps left out; the median over rounds is reported, with every round's figure.
Every configuration must log the same losses (checked): the speed is of the same computation. The result
records the machine, the commit and the command; `--render FILE --doc docs/PERFORMANCE.md` puts its table
between the document's markers (measuring nothing).

    python scripts/bench_ranks.py --shape small --steps 20 --rounds 3 --out docs/bench/ranks-cpu.json
    python scripts/bench_ranks.py --render docs/bench/ranks-cpu.json --doc docs/PERFORMANCE.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from proxy.atomic import atomic_write_text  # noqa: E402
from proxy.formats.engine_cli import engine_args, setting_flags  # noqa: E402
from proxy.formats.frames import parse_event  # noqa: E402
from proxy.formats.shard import write_shard  # noqa: E402
from proxy.supervision.engine_process import engine_binary  # noqa: E402
from proxy.supervision.ranks import default_launcher, mpi_binary  # noqa: E402

sys.path.insert(0, str(REPO / "scripts"))
from cuda_bench_report import Markers, ReportError, read_json, render_into_doc  # noqa: E402
from machine_info import git_commit, machine_line  # noqa: E402

MARKERS = Markers("bench_ranks table", "scripts/bench_ranks.py")

SHAPES = {
    # name: vocab, dim, layers, heads, ctx
    "tiny": dict(vocab=256, dim=64, layers=2, heads=4, ctx=64),
    "small": dict(vocab=2048, dim=256, layers=4, heads=8, ctx=128),
}
OPTIM = dict(lr=6e-4, min_lr=6e-5, warmup=2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, grad_clip=1.0)
# (name, ranks, threads per rank)
CONFIGS = (("1 rank x 2 threads", 1, 2), ("1 rank x 1 thread", 1, 1), ("2 ranks x 1 thread", 2, 1))
# how the table names each configuration
SHOWN = {
    "1 rank x 2 threads": "1 process, `--threads 2` (`build/microgpt_cpu`)",
    "1 rank x 1 thread": "1 process, `--threads 1`",
    "2 ranks x 1 thread": "2 ranks, `--threads 1` each (`mpirun -np 2 build/microgpt_cpu_mpi`)",
}
# what the table reads from a result; a file without them is refused (re-run the benchmark). A result of
# before the command and commit were recorded shows its command rebuilt from its recorded arguments (the
# script's only ones besides --out) and no commit.
RENDERED = (
    "shape",
    "batch",
    "steps",
    "skip",
    "rounds",
    "tokens_per_s",
    "median_tokens_per_s",
    "same_losses",
    "machine",
)


def run_one(ranks: int, threads: int, shape: dict, batch: int, steps: int, shard: Path, ckpt: Path) -> list[dict]:
    """The step events of one standalone run."""
    flags = setting_flags(**shape, **OPTIM, batch=batch, grad_accum=2, steps=steps, seed=1, threads=threads)
    args = engine_args(ckpt, data=shard, ckpt_every=0, settings=flags)
    single = engine_binary("cpu")
    argv = [str(single), *args] if ranks == 1 else [*default_launcher(ranks), str(mpi_binary(single)), *args]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise SystemExit(f"bench_ranks: {' '.join(argv[:6])} ... exited {done.returncode}: {done.stderr.strip()}")
    events = [parse_event(line) for line in done.stdout.splitlines() if line.strip()]
    return [e.fields for e in events if e.kind == "step"]


def rate(steps: list[dict], skip: int) -> float:
    kept = steps[skip:]
    return sum(s["tokens"] for s in kept) / (sum(s["ms"] for s in kept) / 1000.0)


def load_result(path: Path) -> dict:
    """A result file of this script with every field the table shows; ReportError (one line) otherwise."""
    doc = read_json(path)
    if not isinstance(doc, dict):
        raise ReportError(f"{path}: expected one benchmark result (a JSON object)")
    missing = [k for k in RENDERED if k not in doc]
    if missing:
        raise ReportError(f"{path}: no {', '.join(missing)}: re-run scripts/bench_ranks.py --out {path}")
    rates, medians = doc["tokens_per_s"], doc["median_tokens_per_s"]
    if not all(isinstance(d, dict) and set(d) == set(SHOWN) for d in (rates, medians)):
        raise ReportError(f"{path}: expected the configurations {', '.join(SHOWN)}")
    return doc


def render_table(result: dict) -> str:
    """The PERFORMANCE.md table of one result: each configuration's median and every round's figure, the two
    ratios, the machine and the command."""
    medians, rates = result["median_tokens_per_s"], result["tokens_per_s"]
    lines = [f"| configuration | tokens/s (median of {result['rounds']}) | every round |", "|---|---:|---|"]
    for name, _, _ in CONFIGS:
        rounds = ", ".join(f"{r:,.0f}" for r in rates[name])
        lines.append(f"| {SHOWN[name]} | {medians[name]:,.0f} | {rounds} |")
    two, one_x2, one_x1 = (medians[name] for name in ("2 ranks x 1 thread", "1 rank x 2 threads", "1 rank x 1 thread"))
    load = [f"{result[k][0]:.1f}" for k in ("load_average_at_start", "load_average_at_end") if result.get(k)]
    commit = f"commit `{result['commit']}`" if result.get("commit") else "commit not recorded"
    lines += [
        "",
        f"2 ranks over 1 process with 2 threads: {two / one_x2:.2f}; scaling efficiency, 2 ranks over twice 1 "
        f"process with 1 thread: {two / (2 * one_x1):.2f}. Same losses in every configuration: "
        f"{'yes' if result['same_losses'] else 'no'}. Machine: {machine_of(result['machine'])}"
        + (f", load average {' at the start, '.join(load)} at the end" if len(load) == 2 else "")
        + f"; {commit}. Command: `{command_of(result)}`",
    ]
    return "\n".join(lines)


def machine_of(machine) -> str:
    """machine_line()'s text, or the {"cpu", "cores"} an older result recorded."""
    if isinstance(machine, dict):
        return f"{machine.get('cores', '?')} CPUs ({machine.get('cpu', '?')})"
    return str(machine)


def command_of(result: dict) -> str:
    """The recorded command, or the one its recorded arguments rebuild."""
    if result.get("command"):
        return str(result["command"])
    args = (f"--{k} {result[k]}" for k in ("shape", "batch", "steps", "skip", "rounds"))
    return " ".join(["python scripts/bench_ranks.py", *args])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="small")
    ap.add_argument("--batch", type=int, default=4, help="rows per micro-batch (2 micro-batches per step)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--skip", type=int, default=3, help="warm-up steps left out of the rate")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, help="write the JSON result here too")
    ap.add_argument("--render", type=Path, metavar="FILE", help="render FILE's table; measure nothing")
    ap.add_argument("--doc", type=Path, help="with --render: put the table between this document's markers")
    args = ap.parse_args(argv)
    if args.render is not None:
        return render_into_doc(
            args.doc, lambda: render_table(load_result(args.render)), args.render, MARKERS, "bench_ranks"
        )
    command = " ".join(["python", "scripts/bench_ranks.py", *(sys.argv[1:] if argv is None else argv)])
    if args.steps <= args.skip:
        ap.error("--steps must exceed --skip")
    shape = SHAPES[args.shape]
    load_at_start = os.getloadavg()
    rates: dict[str, list[float]] = {name: [] for name, _, _ in CONFIGS}
    losses: dict[str, list] = {}
    with tempfile.TemporaryDirectory() as tmp:
        shard = Path(tmp) / "shard.bin"
        import numpy as np

        tokens = np.random.default_rng(0).integers(0, shape["vocab"], size=400_000, dtype=np.uint16)
        write_shard(shard, tokens, shape["vocab"])
        for r in range(args.rounds):
            order = CONFIGS if r % 2 == 0 else tuple(reversed(CONFIGS))
            for name, ranks, threads in order:
                steps = run_one(
                    ranks, threads, shape, args.batch, args.steps, shard, Path(tmp) / f"ck{r}{ranks}{threads}"
                )
                rates[name].append(round(rate(steps, args.skip), 1))
                losses[name] = [s["loss"] for s in steps]
                print(f"round {r + 1}: {name}: {rates[name][-1]:,.0f} tokens/s", flush=True)
    same = all(v == losses[CONFIGS[0][0]] for v in losses.values())
    medians = {name: statistics.median(v) for name, v in rates.items()}
    result = {
        "what": "CPU engine, standalone, tokens/s of rank 0's step events (reduction included), same global batch",
        "shape": args.shape,
        **shape,
        "batch": args.batch,
        "grad_accum": 2,
        "tokens_per_step": 2 * args.batch * shape["ctx"],
        "steps": args.steps,
        "skip": args.skip,
        "rounds": args.rounds,
        "tokens_per_s": rates,
        "median_tokens_per_s": medians,
        "two_ranks_over_one_rank_two_threads": round(medians[CONFIGS[2][0]] / medians[CONFIGS[0][0]], 3),
        "scaling_efficiency_vs_one_thread": round(medians[CONFIGS[2][0]] / (2 * medians[CONFIGS[1][0]]), 3),
        "same_losses": same,
        "machine": machine_line(),
        "commit": git_commit(REPO),
        "command": command,
        "load_average_at_start": load_at_start,
        "load_average_at_end": os.getloadavg(),
    }
    if not same:
        raise SystemExit("bench_ranks: the configurations logged different losses; the speeds are not comparable")
    text = json.dumps(result, indent=1)
    if args.out:
        atomic_write_text(args.out, text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

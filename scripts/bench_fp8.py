#!/usr/bin/env python3
"""FP8 against fp32 on the CPU engine at 1-2M parameters (docs/ENGINE.md, "FP8").

    python scripts/bench_fp8.py [--threads N] [--json docs/bench/fp8-cpu.json]

Trains experiments/TINY-TRAIN.json's data for its 300 steps with a wider, deeper model (C=128, L=6,
H=4: 1.26M parameters) through the real proxy, in fp32 and fp8 at two seeds (four runs). The peak
learning rate is 1e-3 (min 1e-4), not TINY's 3e-3, at which this model's final loss moves by 3-4%
from one seed to another in fp32 alone; the bandit is `uniform`, whose mixture does not follow the
losses, so the fp32 and fp8 runs of a seed train on the same batches and differ only in their
arithmetic. The figure is the final validation loss (the evaluation at the last step, on the fixed
held-out rows). The bound, per seed: fp8's final loss within 2% of fp32's (the issue's bound for
TINY); the seed-to-seed gap of each precision is reported beside it. Prints the result as JSON,
writes it to --json if given, and exits 1 if the bound does not hold.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from proxy.formats.parameters import n_params  # noqa: E402

MODEL = {"vocab": 512, "ctx": 64, "dim": 128, "layers": 6, "heads": 4}
GAP_BOUND = 0.02
SEEDS = (1337, 1338)
LR, MIN_LR = 1e-3, 1e-4


def train(work: Path, label: str, threads: int, precision: str, seed: int, engine: str) -> dict:
    exp = json.loads((REPO / "experiments" / "TINY-TRAIN.json").read_text())
    exp["name"] = f"FP8-BENCH-{label}"
    exp["model"].update(MODEL)
    exp["train"].update(threads=threads, precision=precision, seed=seed, lr=LR, min_lr=MIN_LR)
    exp["bandit"] = {"policy": "uniform"}
    path = work / f"{label}.json"
    path.write_text(json.dumps(exp))
    run_dir = work / label
    env = dict(os.environ, MICROGPT_CACHE=str(work / "cache"))
    args = ["run", str(path), "--run-dir", str(run_dir), "--engine", engine, "--no-dashboard"]
    start = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "proxy", *args], cwd=REPO, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"bench_fp8: the {label} run failed (exit {res.returncode}): {res.stderr.strip()[-300:]}")
    entries = [json.loads(line) for line in (run_dir / ".loss.json").read_text().splitlines() if line.strip()]
    evals = [e for e in entries if e.get("type") == "eval"]
    steps = [e for e in entries if e.get("type") == "step"]
    state = json.loads((run_dir / ".state.json").read_text())
    return {
        "label": label,
        "precision": state["engine"]["precision"],
        "seed": seed,
        "final_step": evals[-1]["step"],
        "final_val_loss": evals[-1]["loss"],
        "engine_step_ms_mean": sum(e["ms"] for e in steps) / len(steps),
        "wall_s": round(time.monotonic() - start, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--engine", default="cpu", help="cpu (default) or the path of a CPU engine binary")
    a = ap.parse_args()
    runs: dict[tuple[str, int], dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench-fp8-") as tmp:
        for seed in SEEDS:
            for precision in ("auto", "fp8"):
                label = f"{'fp32' if precision == 'auto' else precision}-seed{seed}"
                runs[precision, seed] = train(Path(tmp), label, a.threads, precision, seed, a.engine)

    def loss(precision: str, seed: int) -> float:
        return runs[precision, seed]["final_val_loss"]

    def rel(a: float, b: float) -> float:
        return round(abs(a - b) / b, 5)

    gaps = {str(seed): rel(loss("fp8", seed), loss("auto", seed)) for seed in SEEDS}
    result = {
        "what": "final validation loss, TINY-TRAIN data, 300 steps, uniform mixture, CPU engine, fp8 vs fp32",
        "machine": "2-core AMD EPYC (shared), no GPU",
        "model": MODEL,
        "n_params": n_params(MODEL["vocab"], MODEL["ctx"], MODEL["dim"], MODEL["layers"]),
        "lr": LR,
        "min_lr": MIN_LR,
        "threads": a.threads,
        "runs": list(runs.values()),
        "fp8_gap_by_seed": gaps,
        "fp32_seed_gap": rel(loss("auto", SEEDS[1]), loss("auto", SEEDS[0])),
        "fp8_seed_gap": rel(loss("fp8", SEEDS[1]), loss("fp8", SEEDS[0])),
        "bound": GAP_BOUND,
        "passed": all(g <= GAP_BOUND for g in gaps.values()),
    }
    text = json.dumps(result, indent=1)
    print(text)
    if a.json:
        a.json.write_text(text + "\n")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())

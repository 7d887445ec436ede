"""A synthetic run directory, written the way the proxy writes a real one.

Used by the dashboard's tests and benchmark, and handy for trying the page
without training anything:

    python -m dashboard.synthetic runs/demo --steps 20000 --live
    python -m dashboard --run-dir runs/demo

Writers follow docs/FORMATS.md, through the proxy's own encoders: `.loss.json`
gets whole `\\n`-terminated lines appended; `.state.json`, `.samples.json`
and `phases.json` are replaced atomically.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import random
import time
from collections.abc import Iterable
from pathlib import Path

from proxy.atomic import atomic_write_bytes, atomic_write_json
from proxy.formats.checkpoint import checkpoint_path
from proxy.formats.loss_log import encode_line
from proxy.formats.state import AUDIT_KINDS, ArmStatus, AuditTime, EngineStatus, Goodput, RunState, write_state
from proxy.rundir.layout import CHECKPOINTS, EXPERIMENT, LOSS_LOG, PHASES, SAMPLES, STATE, RunDir, relative_checkpoint
from proxy.rundir.overrides_record import OverridesRecord, write_overrides

ARMS = ("stdlib_code", "stdlib_docs", "web_text")


class SyntheticRun:
    """`ms` per step of engine compute; with `audit_every`, an audit (an eval, a sample) of `audit_ms`
    after every `audit_every` steps, which the wall clock (`time`) sees and the steps' `ms` do not."""

    def __init__(
        self,
        root: Path,
        arms: Iterable[str] = ARMS,
        seed: int = 0,
        tokens_per_step: int = 16384,
        t0: float | None = None,
        ms: float = 250.0,
        name: str | None = None,
        audit_every: int = 0,
        audit_ms: float = 0.0,
    ) -> None:
        self.root = Path(root)
        self.arms = tuple(arms)
        self.rng = random.Random(seed)
        self.tokens_per_step = tokens_per_step
        self.t0 = time.time() if t0 is None else t0
        self.ms = ms
        self.audit_every = audit_every
        self.audit_ms = audit_ms
        self.name = name or self.root.name
        self.step = 0  # last step written
        self.phase = 0
        self.phases: list[dict] = []
        self.engine_extra: dict = {}  # EngineStatus fields that replace the synthetic CPU engine's in .state.json
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / CHECKPOINTS).mkdir(exist_ok=True)

    # ------------------------------------------------------------ files

    def write_experiment(self, max_steps: int = 200000) -> None:
        exp = {
            "name": self.name,
            "model": {"dim": 64, "layers": 2, "heads": 2, "ctx": 64, "vocab": 512},
            "train": {"max_steps": max_steps, "batch": 8, "lr": 6e-4},
            "arms": [{"name": a, "cap": 1.0, "floor": 0.05} for a in self.arms],
        }
        atomic_write_json(self.root / EXPERIMENT, exp)

    def write_overrides(self, texts: list[str]) -> None:
        """RUN/.overrides.json as `proxy run --set ...` leaves it (the experiment is not changed here)."""
        write_overrides(RunDir(self.root), OverridesRecord.of(texts))

    def weights(self, step: int) -> dict[str, float]:
        n = len(self.arms)
        raw = [1.0 + 0.8 * math.sin(step / 900.0 + 2.1 * i + self.phase) for i in range(n)]
        total = sum(raw)
        return {a: round(w / total, 6) for a, w in zip(self.arms, raw, strict=False)}

    def loss(self, step: int) -> float:
        base = 2.0 + 3.0 * math.exp(-step / 4000.0) - 0.1 * self.phase
        spike = 2.5 if step % 9973 == 0 and step else 0.0
        return round(base + 0.08 * (self.rng.random() - 0.5) + spike, 6)

    def audits_before(self, step: int) -> int:
        return (step - 1) // self.audit_every if self.audit_every and step > 0 else 0

    def wall_time(self, step: int) -> float:
        """When step `step` was logged: its steps' compute and the audits before it."""
        return self.t0 + (step * self.ms + self.audits_before(step) * self.audit_ms) / 1000.0

    def step_line(self, step: int, **extra: object) -> str:
        loss = self.loss(step)
        entry = {
            "type": "step",
            "step": step,
            "loss": loss,
            "lr": round(6e-4 * min(1.0, step / 100.0) * (0.55 + 0.45 * math.cos(step / 50000.0)), 9),
            "grad_norm": round(
                0.5
                + 0.5 * math.exp(-step / 3000.0)
                + 0.2 * self.rng.random()
                + (5.0 if step % 9973 == 0 and step else 0.0),
                6,
            ),
            "tokens": step * self.tokens_per_step,
            "time": round(self.wall_time(step), 3),
            "ms": round(self.ms * (0.9 + 0.2 * self.rng.random()), 3),
            "arms": {a: round(loss + 0.1 * i, 6) for i, a in enumerate(self.arms)},
            "mixture": self.weights(step),
            "phase": self.phase,
            "segment": 1,
        }
        entry.update(extra)
        return encode_line(entry).decode()

    def eval_line(self, step: int) -> str:
        loss = self.loss(step) + 0.05
        entry = {
            "type": "eval",
            "step": step,
            "loss": round(loss, 6),
            "arms": {a: round(loss + 0.07 * i, 6) for i, a in enumerate(self.arms)},
            "time": round(self.wall_time(step) + 0.5, 3),
            "phase": self.phase,
            "segment": 1,
        }
        return encode_line(entry).decode()

    def append_text(self, text: str) -> None:
        with open(self.root / LOSS_LOG, "a") as f:
            f.write(text)

    def append_steps(self, n: int, eval_every: int = 0) -> int:
        """Append the next n steps (and evals every `eval_every`); the last step written."""
        parts = []
        for _ in range(n):
            self.step += 1
            parts.append(self.step_line(self.step))
            if eval_every and self.step % eval_every == 0:
                parts.append(self.eval_line(self.step))
        self.append_text("".join(parts))
        return self.step

    def write_state(self, status: str = "running", max_steps: int = 200000) -> None:
        remaining = max(0, max_steps - self.step)
        wall_s = self.wall_time(self.step) - self.t0
        step_s = self.step * self.ms / 1000.0
        audits = {k: AuditTime() for k in AUDIT_KINDS}
        audits["eval"] = AuditTime(count=self.audits_before(self.step), s=wall_s - step_s)
        goodput = Goodput(
            wall_s=wall_s,
            step_s=step_s,
            steps=self.step,
            tokens=self.step * self.tokens_per_step,
            audits=audits,
            other_s=0.0,
            overhead=1.0 - step_s / wall_s if wall_s > 0 else None,
            tokens_per_s=self.step * self.tokens_per_step / wall_s if wall_s > 0 else None,
        )
        write_state(
            self.root / STATE,
            RunState(
                step=self.step,
                phase=self.phase,
                policy="ucb1",
                status=status,
                arms={
                    a: ArmStatus(pulls=self.step, ema=2.0, reward=0.01, weight=w, cap=1.0, floor=0.05)
                    for a, w in self.weights(self.step).items()
                },
                tokens=self.step * self.tokens_per_step,
                tokens_per_s=goodput.tokens_per_s,
                engine_tokens_per_s=self.tokens_per_step / (self.ms / 1000.0),
                eta_s=remaining * self.ms / 1000.0,
                last_checkpoint=relative_checkpoint(self.step),
                engine=dataclasses.replace(
                    EngineStatus(
                        kind="cpu",
                        device="synthetic CPU",
                        pid=os.getpid(),
                        alive=status == "running",
                        rss_bytes=123 << 20,
                        cpu_percent=95.0,
                        mem_bytes=45 << 20,
                        version="synthetic",
                        source="synthetic",
                    ),
                    **self.engine_extra,
                ),
                experiment=self.name,
                max_steps=max_steps,
                goodput=goodput,
            ),
        )

    def add_phase(self, start_step: int, policy: str = "ucb1", caps: dict | None = None) -> None:
        if not self.phases:
            self.phases.append(
                {
                    "phase": 0,
                    "start_step": 0,
                    "policy": "ucb1",
                    "caps": {a: 1.0 for a in self.arms},
                    "floors": {a: 0.05 for a in self.arms},
                    "time": self.t0,
                    "checkpoint": None,
                }
            )
        if start_step > 0:
            self.phase = len(self.phases)
            self.phases.append(
                {
                    "phase": self.phase,
                    "start_step": start_step,
                    "policy": policy,
                    "caps": caps or {self.arms[0]: 0.5},
                    "floors": {},
                    "time": time.time(),
                    "checkpoint": relative_checkpoint(start_step),
                }
            )
        atomic_write_json(self.root / PHASES, self.phases)

    def write_samples(self, steps: list[int]) -> None:
        audits = [
            {
                "step": s,
                "time": self.t0 + s,
                "samples": [
                    {
                        "prompt": "def ",
                        "completion": f"fib(n):  # step {s}\n    return n if n < 2 else fib(n-1)+fib(n-2)",
                        "tokens": [1, 2, 3],
                    },
                    {"prompt": "<b>not html</b>", "completion": "<script>alert(1)</script> stays text", "tokens": [4]},
                ],
            }
            for s in steps
        ]
        atomic_write_json(self.root / SAMPLES, audits)

    def write_checkpoint(self, step: int, size: int = 4096) -> None:
        """A stand-in file under a checkpoint's name (the dashboard lists checkpoints, never reads them)."""
        atomic_write_bytes(checkpoint_path(self.root / CHECKPOINTS, step), b"\0" * size)


def build(root: Path, steps: int, eval_every: int = 500, pivots: Iterable[int] = (), seed: int = 0) -> SyntheticRun:
    """A finished-looking run of `steps` steps, written in bulk."""
    run = SyntheticRun(root, seed=seed, t0=time.time() - steps * 0.25)
    run.write_experiment(max_steps=max(steps * 2, 1000))
    run.add_phase(0)
    chunk = 20000
    pivots = sorted(pivots)
    while run.step < steps:
        nxt = min(steps, run.step + chunk)
        for p in pivots:
            if run.step < p <= nxt:
                nxt = p
        run.append_steps(nxt - run.step, eval_every=eval_every)
        if run.step in pivots:
            run.add_phase(run.step + 1, policy="polish")
    for s in range(max(1000, steps // 5), steps + 1, max(1000, steps // 5)):
        run.write_checkpoint(s)
    run.write_samples([s for s in (steps // 2, steps) if s > 0])
    run.write_state(max_steps=max(steps * 2, 1000))
    return run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="write a synthetic microgpt run directory")
    p.add_argument("root", type=Path)
    p.add_argument("--steps", type=int, default=5000)
    p.add_argument("--live", action="store_true", help="keep appending steps (Ctrl-C to stop)")
    p.add_argument("--rate", type=float, default=20.0, help="live steps per second")
    args = p.parse_args(argv)
    run = build(args.root, args.steps, pivots=(args.steps // 2,) if args.steps > 1000 else ())
    print(f"wrote {args.steps} steps to {args.root}")
    try:
        while args.live:
            time.sleep(1.0 / args.rate)
            run.append_steps(1, eval_every=500)
            if run.step % 100 == 0:
                run.write_state()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

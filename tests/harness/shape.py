"""The one shape type of the suites that start engines: a model, its batch and its optimizer.

Every setting is passed to the engine explicitly (no engine default decides a test's run), and the
engine's command line is built by proxy/formats/engine_cli.py, as the proxy builds its own. The
defaults are the engine suite's tiny model (a step in about a millisecond on the CPU engine); a
suite that wants another base shape says so once (`BASE = Shape(...)`) and derives with `but()`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from proxy.formats.engine_cli import engine_args, setting_flags
from proxy.formats.parameters import ModelShape


@dataclass(frozen=True)
class Shape(ModelShape):
    """ModelShape (what fixes the parameter layout) plus the batch, schedule and optimizer settings."""

    vocab: int = 64
    ctx: int = 16
    dim: int = 32
    layers: int = 2
    heads: int = 4
    batch: int = 4
    grad_accum: int = 1
    steps: int = 10
    lr: float = 3e-3
    min_lr: float = 3e-4
    lr_schedule: str = "cosine"
    decay_fraction: float = 0.2
    warmup: int = 3
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 1337
    threads: int | None = None  # the CPU engine's --threads; None: not passed (all cores)

    @property
    def rows(self) -> int:
        """Token rows per optimizer step (a TRAIN frame's rows)."""
        return self.batch * self.grad_accum

    def but(self, **changes) -> Shape:
        return replace(self, **changes)

    def flags(self) -> list[str]:
        """`--vocab 64 --ctx 16 ...`: every setting, in engine_cli.SETTINGS order."""
        return setting_flags(**asdict(self))

    def tensors(self) -> list[tuple[str, int, int]]:
        """(name, begin, end) of every parameter tensor in the flat order (proxy/formats/parameters.py)."""
        out, at = [], 0
        for name, dims in self.layout():
            size = int(np.prod(dims))
            out.append((name, at, at + size))
            at += size
        assert at == self.n_params
        return out


def proxy_args(shape: Shape, ckpt_dir: Path, *extra) -> list[str]:
    """Proxy mode (frames on stdin), no periodic checkpoints unless `extra` asks for them."""
    return engine_args(ckpt_dir, ckpt_every=0, settings=shape.flags(), extra=extra)


def standalone_args(
    shape: Shape, shard: Path, ckpt_dir: Path, ckpt_every: int, *extra, resume: str | Path | None = None
) -> list[str]:
    """Standalone mode: the engine reads `shard` itself and trains steps 1..shape.steps."""
    return engine_args(ckpt_dir, data=shard, resume=resume, ckpt_every=ckpt_every, settings=shape.flags(), extra=extra)

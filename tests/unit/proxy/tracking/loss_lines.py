"""`.loss.json` lines for the tracker's unit tests, written with the log's own encoder."""

from __future__ import annotations

from pathlib import Path

from proxy.formats.loss_log import EvalEntry, StepEntry, encode_line


def step(n: int, phase: int = 0, loss: float | None = None, inherited: bool = False) -> bytes:
    return encode_line(
        StepEntry(
            step=n,
            loss=loss if loss is not None else 10.0 / n,
            lr=0.001,
            grad_norm=1.0,
            tokens=512 * n,
            time=1000.0 + n,
            ms=10.0,
            arms={"a": 1.0},
            mixture={"a": 1.0},
            phase=phase,
            segment=0,
            inherited=inherited,
        ).to_dict()
    )


def evaluation(n: int, phase: int = 0) -> bytes:
    return encode_line(EvalEntry(step=n, loss=5.0, arms={"a": 5.0}, time=1000.0 + n, phase=phase, segment=0).to_dict())


def append(run_root: Path, *lines: bytes) -> None:
    with open(run_root / ".loss.json", "ab") as f:
        f.write(b"".join(lines))

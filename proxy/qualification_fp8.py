"""Whether a run's `train.precision: fp8` is used (docs/ENGINE.md, "FP8"; docs/CUDA.md, "Qualification").

The CPU engine's FP8 is tested in CI (tests/engine/test_fp8_engine.py, tests/proxy_e2e/test_fp8_run.py): it
is always used when asked for. On the CUDA engine FP8 is used only after it passes a check on this GPU at
the run's shape: two check processes (qualification_checks.run_check: the run's shape and optimizer, the
same fixed tokens, CHECK_STEPS steps at the run's peak learning rate), one at the engine's default precision
(bf16) and one with --precision fp8, both on the verified paths. FP8 passes when its engine reports running
fp8 and every step's loss is finite and within FP8_LOSS_BOUND (relative) of bf16's; otherwise one line says
why and the run trains in bf16. The check is deterministic (the engine is, on one GPU and build), so a
relaunch of the run decides the same. It catches a broken FP8 path (a wrong cast or scale, overflow, NaN);
the loss gap over a long run is a benchmark's figure, not this check's.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .formats.engine_cli import PRECISION_FLAGS, VERIFIED_FLAGS
from .qualification_checks import CHECK_STEPS, CHECK_TIMEOUT_S, CheckRun, run_check

# The target for FP8 against bf16 is the validation loss within 1% after 1,000 steps; the check's
# first steps must not already be further apart than that.
FP8_LOSS_BOUND = 0.01

Say = Callable[[str], None]
Runner = Callable[..., CheckRun]


@dataclass(frozen=True)
class Fp8Verdict:
    passed: bool
    detail: str  # one line: the worst relative gap, or why there is none


def judge_fp8(base: CheckRun, fp8: CheckRun) -> Fp8Verdict:
    """FP8's check run against bf16's: the engine ran fp8, and every step's loss within FP8_LOSS_BOUND."""
    if base.crashed:
        return Fp8Verdict(False, f"the bf16 check failed ({base.crashed})")
    if fp8.crashed:
        return Fp8Verdict(False, f"the fp8 check failed ({fp8.crashed})")
    if fp8.precision != "fp8":
        return Fp8Verdict(False, f"the engine ran {fp8.precision or 'an unnamed precision'}, not fp8")
    gaps = [abs(a - b) / abs(b) if b else math.inf for a, b in zip(fp8.losses, base.losses, strict=True)]
    worst = max(gaps) if all(math.isfinite(g) for g in gaps) else math.inf  # a NaN loss never passes
    if not worst <= FP8_LOSS_BOUND:
        return Fp8Verdict(
            False, f"loss off by {worst:.3g} of bf16's within {CHECK_STEPS} steps (bound {FP8_LOSS_BOUND:g})"
        )
    return Fp8Verdict(True, f"loss within {worst:.3g} of bf16's over {CHECK_STEPS} steps (bound {FP8_LOSS_BOUND:g})")


def check_fp8(
    binary: Path, settings: list[str], model: dict, runner: Runner = run_check, timeout: float = CHECK_TIMEOUT_S
) -> Fp8Verdict:
    """The two check processes of the CUDA engine at `binary`, and their verdict."""
    with tempfile.TemporaryDirectory(prefix="microgpt-fp8-") as tmp:
        base = runner(binary, settings, list(VERIFIED_FLAGS), model, Path(tmp) / "bf16", timeout=timeout)
        if base.crashed:
            return judge_fp8(base, CheckRun())
        flags = [*VERIFIED_FLAGS, *PRECISION_FLAGS["fp8"]]
        fp8 = runner(binary, settings, flags, model, Path(tmp) / "fp8", timeout=timeout)
    return judge_fp8(base, fp8)


def precision_flags(
    precision: str,
    engine_kind: str,
    binary: Path,
    settings: list[str],
    model: dict,
    say: Say,
    warn: Say,
    runner: Runner = run_check,
    timeout: float = CHECK_TIMEOUT_S,
) -> list[str]:
    """The engine's precision flags for a run's `train.precision`: none for auto; fp8's on the CPU engine;
    on the CUDA engine fp8's only when check_fp8 passes, else none (bf16) and one line saying why."""
    if precision == "auto":
        return []
    if engine_kind != "cuda":
        return list(PRECISION_FLAGS[precision])
    say(f"checking FP8 against bf16 on this GPU at the run's shape ({CHECK_STEPS} steps each)")
    verdict = check_fp8(binary, settings, model, runner, timeout)
    if not verdict.passed:
        warn(f"train.precision fp8 failed its check: {verdict.detail}; training in bf16")
        return []
    say(f"precision: fp8 ({verdict.detail})")
    return list(PRECISION_FLAGS[precision])

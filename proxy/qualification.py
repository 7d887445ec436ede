"""Qualifying the CUDA engine's fast paths on the user's GPU (docs/CUDA.md, "Qualification").

CI has no GPU, so a fast path (cuDNN or flash attention, the fused step
kernels, the step as one CUDA graph, sampling with the KV cache, the
asynchronous checkpoint snapshot) that has never run on this GPU, driver,
engine build, cuDNN and shape is checked here before a run uses it: short
engine processes, separate from the run's, train the same steps on the same
tokens with the verified path and with the fast path, and
qualification_compare.py judges what they wrote. A path that fails,
crashes, hangs or is not in this build is not used; one line says which and
by how much.

The verdict names paths (FastPath) and holds figures, never flags: the
engine's command line gets the flags of engine_cli.PATH_SWITCHES for the
paths that passed, and only where the verdict's environment (GPU, driver,
build, cuDNN, shape: read without starting an engine, gpu_identity.py)
matches this one. It is cached per environment under the cache directory and
recorded in the run directory (`.qualification.json`), so every relaunch of
the run keeps its paths (and its bits) while the environment is the same.
"""

from __future__ import annotations

import hashlib
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from .formats.engine_cli import VERIFIED_FLAGS, FastPath, path_flags
from .formats.qualification_record import (
    Check,
    Environment,
    Qualification,
    QualificationFileError,
    Verdict,
    read_qualification,
    write_qualification,
)
from .gpu_identity import GpuIdentityError, cudnn_version, read_gpu_identity
from .qualification_checks import CHECK_STEPS, CHECK_TIMEOUT_S, CheckRun, run_check
from .qualification_compare import (  # noqa: F401
    COSINE_MIN,
    LOSS_TOLERANCE,
    judge_kv_cache,
    judge_snapshot,
    judge_training,
    tensor_cosines,
)
from .rundir.layout import RunDir
from .safe_fs import UnsafeFileError, file_sha256

__all__ = ["COSINE_MIN", "LOSS_TOLERANCE", "VERIFIED_FLAGS", "tensor_cosines", "qualify", "run_engine_paths"]

# What the engine's ready event `paths` says when it runs a training path (a path it cannot run here,
# it replaces with the verified one after a warning: the check then calls it unavailable).
READY_PATHS: dict[FastPath, dict[str, str | bool]] = {
    FastPath.ATTENTION_CUDNN: {"attention": "cudnn"},
    FastPath.ATTENTION_FLASH: {"attention": "flash"},
    FastPath.FUSED: {"fused": True},
    FastPath.CUDA_GRAPH: {"cuda_graph": True, "fused": True},
}
SHAPE_KEYS = ("vocab", "ctx", "dim", "layers", "heads", "batch", "grad_accum")
OPTIMIZER_FLAGS = {"lr": "--lr", "min_lr": "--min-lr", "beta1": "--beta1", "beta2": "--beta2"}
# The most engine processes one qualification starts: the verified run, two runs of each training path
# (flash only if cuDNN fails), one each for the KV cache and the snapshot, two of the chosen paths together.
MAX_CHECK_PROCESSES = 1 + 2 * 4 + 1 + 1 + 2

Say = Callable[[str], None]
Runner = Callable[..., CheckRun]


def environment(binary: Path, model: dict) -> Environment:
    """This machine's GPU, driver, cuDNN, the engine build and the run's shape; GpuIdentityError when NVML
    cannot say which GPU."""
    gpu = read_gpu_identity()
    return Environment(
        gpu=gpu.gpu,
        driver=gpu.driver,
        build=file_sha256(binary)[1],
        cudnn=cudnn_version(),
        shape={k: int(model[k]) for k in SHAPE_KEYS},
    )


def cache_path(cache_dir: Path, env: Environment) -> Path:
    key = env.model_dump_json().encode()
    return cache_dir / "qualification" / f"{hashlib.sha256(key).hexdigest()[:32]}.json"


def optimizer_of(settings: list[str]) -> dict[str, float]:
    """The run's lr, min_lr and betas from its engine settings (`--flag value` pairs)."""
    given = dict(zip(settings[::2], settings[1::2], strict=False))
    return {name: float(given[flag]) for name, flag in OPTIMIZER_FLAGS.items()}


def describe(paths: list[FastPath]) -> str:
    """The paths a verdict chose, for a person."""
    return ", ".join(p.value for p in paths) if paths else "none (the verified path)"


def changed(old: Environment, new: Environment) -> str:
    """Which parts of the environment differ, for a person."""
    names = {"gpu": "GPU", "driver": "driver", "build": "engine build", "cudnn": "cuDNN", "shape": "shape"}
    return ", ".join(label for key, label in names.items() if getattr(old, key) != getattr(new, key))


# ------------------------------------------------------------------ the whole qualification


class _Checker:
    """The check runs of one qualification, against one verified run."""

    def __init__(
        self, binary: Path, settings: list[str], model: dict, tmp: Path, say: Say, runner: Runner, timeout: float
    ):
        self.binary, self.settings, self.model, self.tmp = binary, settings, model, tmp
        self.say, self.runner, self.timeout = say, runner, timeout
        self.optimizer = optimizer_of(settings)
        self.base = CheckRun()

    def run(self, paths: tuple[FastPath, ...], label: str, initial: bool = False, repeat: bool = False) -> CheckRun:
        """One check run; a `repeat` is compared with the first by its losses and checkpoint hashes only."""
        return self.runner(
            self.binary,
            self.settings,
            path_flags(paths),
            self.model,
            self.tmp / label,
            timeout=self.timeout,
            initial=initial,
            read_state=not repeat,
        )

    def training(self, path: FastPath, on_top: tuple[FastPath, ...] = ()) -> Check:
        """A training path's two runs (one, if the first crashed or ran another path) against the verified."""
        first = self.run((*on_top, path), f"{path.value}-1")
        if first.crashed is None and any(first.paths.get(k) != v for k, v in READY_PATHS[path].items()):
            check = Check(
                verdict=Verdict.UNAVAILABLE,
                detail=f"the engine ran {first.paths or 'no named paths'} instead (see its warning)",
            )
        else:
            runs = [first] if first.crashed else [first, self.run((*on_top, path), f"{path.value}-2", repeat=True)]
            check = judge_training(self.model, self.optimizer, runs, self.base)
        self.say(f"  {path.value}: {check.verdict.value}: {check.detail}")
        return check

    def single(self, path: FastPath, judge: Callable[[CheckRun, CheckRun], Check]) -> Check:
        check = judge(self.run((path,), path.value), self.base)
        self.say(f"  {path.value}: {check.verdict.value}: {check.detail}")
        return check

    def together(self, paths: list[FastPath]) -> Check:
        runs = [self.run(tuple(paths), "together-1")]
        if not runs[0].crashed:
            runs.append(self.run(tuple(paths), "together-2", repeat=True))
        check = judge_training(self.model, self.optimizer, runs, self.base)
        self.say(f"  together ({describe(paths)}): {check.verdict.value}: {check.detail}")
        return check


def qualify(
    binary: Path,
    settings: list[str],
    model: dict,
    cache_dir: Path,
    say: Say,
    runner: Runner = run_check,
    timeout: float = CHECK_TIMEOUT_S,
    env: Environment | None = None,
) -> Qualification | None:
    """The fast paths this engine build runs at this shape on this GPU: cached, else checked now. None
    when the verified path's own check fails or runs on another GPU than NVML named: nothing is qualified.

    `settings` are the run's engine flags (shape and optimizer); `model` its shape (vocab, ctx, dim,
    layers, heads, batch, grad_accum); `timeout` each check process's limit. Raises GpuIdentityError
    when `env` is not given and NVML cannot name the GPU. A path's failure is a verdict, never raised."""
    env = env or environment(binary, model)
    cached_at = cache_path(cache_dir, env)
    try:
        cached = read_qualification(cached_at)
        if cached.environment == env:
            say(
                f"fast paths: {describe(cached.chosen())} (checked on this GPU, driver, build, cuDNN and shape "
                f"before: {cached_at})"
            )
            return cached
        say(f"ignoring the cached verdict {cached_at}: made for another {changed(cached.environment, env)}")
    except FileNotFoundError:
        pass
    except QualificationFileError as exc:
        say(f"ignoring the cached verdict: {exc}")
    say(
        f"checking the CUDA engine's fast paths on {env.gpu} (once per GPU, driver, build, cuDNN and shape: "
        f"up to {MAX_CHECK_PROCESSES} engine processes of {CHECK_STEPS} steps)"
    )
    with tempfile.TemporaryDirectory(prefix="microgpt-qualify-") as tmp:
        checker = _Checker(binary, settings, model, Path(tmp), say, runner, timeout)
        base = checker.base = checker.run((), "verified", initial=True)
        if base.crashed:
            say(f"the verified path's check failed ({base.crashed}); running the verified path")
            return None
        if not base.device.startswith(env.gpu):
            say(
                f"the engine runs on {base.device.split(', attention ')[0]!r}, not on {env.gpu!r} that NVML "
                "names (CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER?); running the verified path"
            )
            return None
        paths: dict[FastPath, Check] = {}
        for attention in (FastPath.ATTENTION_CUDNN, FastPath.ATTENTION_FLASH):
            paths[attention] = checker.training(attention)
            if paths[attention].verdict == Verdict.PASSED:
                break
        paths[FastPath.FUSED] = checker.training(FastPath.FUSED)
        if paths[FastPath.FUSED].verdict == Verdict.PASSED:
            paths[FastPath.CUDA_GRAPH] = checker.training(FastPath.CUDA_GRAPH, on_top=(FastPath.FUSED,))
        paths[FastPath.KV_CACHE] = checker.single(FastPath.KV_CACHE, judge_kv_cache)
        paths[FastPath.ASYNC_SNAPSHOT] = checker.single(FastPath.ASYNC_SNAPSHOT, judge_snapshot)
        passed = [p for p in FastPath if p in paths and paths[p].verdict == Verdict.PASSED]
        together = checker.together(passed) if len(passed) > 1 else None
    q = Qualification(environment=env, paths=paths, together=together, created=time.time())
    try:
        write_qualification(cached_at, q)
    except OSError as exc:
        say(f"cannot cache the verdict at {cached_at}: {exc}")
    return q


def failure_lines(q: Qualification) -> list[str]:
    """One line per fast path that failed or crashed its check: which, and by how much."""
    bad = (Verdict.FAILED, Verdict.CRASHED)
    lines = [
        f"fast path {p.value} failed its check on {q.environment.gpu}: {c.detail}; using the verified path for it"
        for p, c in q.paths.items()
        if c.verdict in bad
    ]
    if q.together is not None and q.together.verdict in bad:
        lines.append(
            f"the fast paths that passed failed together on {q.environment.gpu}: {q.together.detail}; "
            "using the verified path"
        )
    return lines


# ------------------------------------------------------------------ a run's choice


def run_engine_paths(
    run: RunDir,
    binary: Path,
    settings: list[str],
    model: dict,
    cache_dir: Path,
    say: Say,
    warn: Say,
    runner: Runner = run_check,
    timeout: float = CHECK_TIMEOUT_S,
) -> list[str]:
    """The path flags a run's engine is launched with: those of the paths the run's recorded verdict passed,
    when it was made in this environment (a resume keeps its paths, whatever the cache says since), else of a
    qualification (cached or run now), recorded in the run directory; the verified path when none can be made."""
    try:
        env = environment(binary, model)
    except GpuIdentityError as exc:
        warn(f"cannot tell which GPU the engine will use ({exc}); running the verified path")
        return list(VERIFIED_FLAGS)
    except (OSError, UnsafeFileError) as exc:  # the binary's hash: it was there a moment ago
        warn(f"cannot hash the engine {binary} ({exc}); running the verified path")
        return list(VERIFIED_FLAGS)
    try:
        recorded = read_qualification(run.qualification, within=run.root)
    except FileNotFoundError:
        recorded = None
    except QualificationFileError as exc:
        warn(f"{exc}; checking the fast paths again")
        recorded = None
    if recorded is not None:
        if recorded.environment == env:
            say(f"fast paths: {describe(recorded.chosen())} (recorded in {run.qualification.name})")
            return recorded.engine_flags()
        warn(
            f"the {changed(recorded.environment, env)} changed since {run.qualification.name} was recorded; "
            "checking the fast paths again"
        )
    q = qualify(binary, settings, model, cache_dir, say, runner, timeout, env)
    if q is None:
        return list(VERIFIED_FLAGS)
    for line in failure_lines(q):
        warn(line)
    write_qualification(run.qualification, q)
    say(f"fast paths: {describe(q.chosen())}")
    return q.engine_flags()

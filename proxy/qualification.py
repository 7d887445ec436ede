"""Qualifying the CUDA engine's fast paths on the user's GPU (docs/CUDA.md, "Qualification").

CI has no GPU, so a fast path (cuDNN or flash attention, the fused step
kernels, the step as one CUDA graph) that has never run on this GPU model,
engine build and shape is checked here before a run uses it: short engine
processes, separate from the run's, train the same few steps on the same
tokens with the verified path (naive attention, the verified kernels, no
graph) and with the fast path, and compare the loss and every parameter
tensor's gradient at the last step within the GPU suite's bf16 tolerances
(LOSS_TOLERANCE, COSINE_MIN: tests/gpu uses these), and the fast path's two
runs bit for bit. A path that fails, crashes, hangs or is not in this build
is not used; one line says which and by how much.

The verdict is cached per (GPU, engine build, shape) under the cache
directory, and the choice is recorded in the run directory
(`.qualification.json`): every relaunch of the run uses the recorded choice
while the GPU and the build are the same, so a resumed run keeps its paths
(and its bits).
"""
from __future__ import annotations

import hashlib
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from .formats import frames
from .formats.engine_cli import engine_args
from .formats.parameters import param_layout
from .processes import signal_group
from .safe_fs import file_sha256
from .formats.qualification_record import (PathVerdict, Qualification, QualificationFileError, read_qualification,
                                           write_qualification)
from .rundir.layout import RunDir

# The GPU suite's bf16 tolerances (tests/gpu/test_flash.py, test_bf16.py): the
# loss within LOSS_TOLERANCE of the reference, every parameter tensor's
# gradient at cosine above COSINE_MIN.
LOSS_TOLERANCE = 2e-2
COSINE_MIN = 0.99

# The verified path: what every fast path is compared with, and what a run
# uses where no fast path qualifies.
VERIFIED_FLAGS = ["--attention", "naive", "--fused", "off", "--cuda-graph", "off"]
CHECK_STEPS = 3  # steps each check trains; the gradients of the last are compared
CHECK_TIMEOUT_S = 600.0  # one check process; past it, the path counts as crashed


@dataclass(frozen=True)
class FastPath:
    name: str
    flags: tuple[str, ...]  # replacing the verified value of the same switch
    paths: dict  # what the engine's ready event `paths` says when it runs it


ATTENTION_PATHS = (FastPath("attention cudnn", ("--attention", "cudnn"), {"attention": "cudnn"}),
                   FastPath("attention flash", ("--attention", "flash"), {"attention": "flash"}))
FUSED = FastPath("fused kernels", ("--fused", "on"), {"fused": True})
GRAPH = FastPath("CUDA graph", ("--cuda-graph", "on"), {"cuda_graph": True, "fused": True})


def with_paths(*paths: FastPath) -> list[str]:
    """The verified flags with these paths' switches set instead."""
    flags = list(VERIFIED_FLAGS)
    for p in paths:
        i = flags.index(p.flags[0])
        flags[i + 1] = p.flags[1]
    return flags


# ------------------------------------------------------------------ one check process

@dataclass
class CheckRun:
    """What one short engine process gave: the last step's loss and gradients, or why not."""
    loss: float | None = None
    grads: np.ndarray | None = None
    device: str = ""
    precision: str = ""
    paths: dict = field(default_factory=dict)
    crashed: str | None = None  # one line: how it ended without gradients


def check_tokens(vocab: int, ctx: int, rows: int, steps: int) -> list[np.ndarray]:
    """The tokens of each check step: fixed pseudo-random rows, the same for every path."""
    rng = np.random.default_rng(20261124)
    return [rng.integers(0, vocab, size=(rows, ctx + 1), dtype=np.uint16) for _ in range(steps)]


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


def run_check(binary: Path, settings: list[str], flags: list[str], shape: dict, workdir: Path,
              timeout: float = CHECK_TIMEOUT_S) -> CheckRun:
    """The engine at `binary` trains CHECK_STEPS steps from its initial weights (proxy mode) and
    writes the gradients of the last (--dump-grads-step); its own session, killed past `timeout`."""
    workdir.mkdir(parents=True, exist_ok=True)
    grads_path = workdir / "grads.bin"
    args = engine_args(workdir / "ckpt", ckpt_every=0, settings=settings,
                       extra=["--dump-grads", str(grads_path), "--dump-grads-step", str(CHECK_STEPS), *flags])
    rows = int(shape["batch"]) * int(shape["grad_accum"])
    payload = b"".join(frames.train_frame(s + 1, tokens, np.zeros(rows, dtype=np.uint16))
                       for s, tokens in enumerate(check_tokens(int(shape["vocab"]), int(shape["ctx"]), rows,
                                                               CHECK_STEPS)))
    try:
        proc = subprocess.Popen([str(binary), *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
    except OSError as exc:
        return CheckRun(crashed=f"cannot start {binary}: {exc.strerror}")
    try:
        out, err = proc.communicate(payload, timeout=timeout)
    except subprocess.TimeoutExpired:
        signal_group(proc.pid, signal.SIGKILL)  # our unreaped child: its group is still ours
        proc.communicate()
        return CheckRun(crashed=f"no gradients within {timeout:.0f} s (killed)")
    run = CheckRun()
    for line in out.splitlines():
        try:
            ev = frames.parse_event(line)
        except ValueError:
            continue
        if ev.kind == "ready":
            run.device = str(ev.get("device") or "")
            run.precision = str(ev.get("precision") or "")
            run.paths = dict(ev.get("paths") or {})
        elif ev.kind == "grads":
            run.loss = float(ev["loss"])
    text = err.decode("utf-8", "replace")
    if proc.returncode != 0 or run.loss is None:
        how = f"exit {proc.returncode}" if proc.returncode >= 0 else f"signal {-proc.returncode}"
        run.crashed = f"{how}: {_last_line(text)}"
        return run
    try:
        run.grads = np.fromfile(grads_path, dtype="<f4")
    except OSError as exc:
        run.crashed = f"no gradients file ({exc.strerror})"
    return run


# ------------------------------------------------------------------ comparing

def tensor_cosines(shape: dict, got: np.ndarray, ref: np.ndarray) -> list[tuple[str, float]]:
    """(name, cosine) of every parameter tensor's gradient, in the flat order."""
    out, at = [], 0
    for name, dims in param_layout(int(shape["vocab"]), int(shape["ctx"]), int(shape["dim"]), int(shape["layers"])):
        n = int(np.prod(dims))
        x, y = got[at:at + n].astype(np.float64), ref[at:at + n].astype(np.float64)
        at += n
        denom = np.linalg.norm(x) * np.linalg.norm(y)
        cos = float(np.dot(x, y) / denom) if denom > 0 else (1.0 if np.array_equal(x, y) else 0.0)
        out.append((name, cos if np.isfinite(cos) else -1.0))
    return out


def judge(path: FastPath, flags: list[str], shape: dict, runs: list[CheckRun], base: CheckRun) -> PathVerdict:
    """The verdict on a fast path's two runs against the verified run."""
    verdict = PathVerdict(path=path.name, flags=flags, status="failed", detail="")
    first = runs[0]
    if first.crashed is None and any(first.paths.get(k) != v for k, v in path.paths.items()):
        verdict.status = "unavailable"
        verdict.detail = f"the engine ran {first.paths or 'no named paths'} instead (see its warning)"
        return verdict
    crashed = next((r.crashed for r in runs if r.crashed), None)
    if crashed:
        verdict.status = "crashed"
        verdict.detail = f"the check crashed: {crashed}"
        return verdict
    n = base.grads.size
    if any(r.grads.size != n for r in runs):
        verdict.detail = f"gradients of {runs[0].grads.size} values, the verified path gave {n}"
        return verdict
    verdict.bitwise = all(r.loss == first.loss and np.array_equal(r.grads.view(np.uint32), first.grads.view(np.uint32))
                          for r in runs[1:])
    verdict.loss_diff = abs(first.loss - base.loss) if np.isfinite(first.loss) else float("inf")
    cosines = tensor_cosines(shape, first.grads, base.grads)
    worst, low = min(cosines, key=lambda nc: nc[1])
    verdict.min_cosine, verdict.worst_tensor = low, worst
    problems = []
    if not np.isfinite(first.loss) or not np.all(np.isfinite(first.grads)):
        problems.append("non-finite loss or gradients")
    if not verdict.loss_diff <= LOSS_TOLERANCE:
        problems.append(f"loss {first.loss:.6g} vs {base.loss:.6g} (off by {verdict.loss_diff:.3g}, "
                        f"tolerance {LOSS_TOLERANCE:g})")
    bad = [(name, c) for name, c in cosines if not c > COSINE_MIN]
    if bad:
        problems.append(f"gradient of {worst} at cosine {low:.5f} (minimum {COSINE_MIN:g}"
                        + (f"; {len(bad)} tensors below" if len(bad) > 1 else "") + ")")
    if not verdict.bitwise:
        problems.append("two runs differ")
    if problems:
        verdict.detail = "; ".join(problems)
        return verdict
    verdict.status = "passed"
    verdict.detail = (f"loss off by {verdict.loss_diff:.3g}, lowest gradient cosine {low:.6f} ({worst}), "
                      "two runs bit-identical")
    return verdict


# ------------------------------------------------------------------ the whole qualification

def device_name(ready_device: str) -> str:
    """The GPU of a ready event's `device`, less the attention path the engine appended."""
    return ready_device.split(", attention ")[0]


def shape_of(settings: dict, precision: str) -> dict:
    keys = ("vocab", "ctx", "dim", "layers", "heads", "batch", "grad_accum")
    return {**{k: int(settings[k]) for k in keys}, "precision": precision}


def cache_path(cache_dir: Path, device: str, build: str, shape: dict) -> Path:
    key = repr((device, build, sorted(shape.items()))).encode()
    return cache_dir / "qualification" / f"{hashlib.sha256(key).hexdigest()[:32]}.json"


Say = Callable[[str], None]


def qualify(binary: Path, settings: list[str], model: dict, cache_dir: Path, say: Say,
            runner: Callable[..., CheckRun] = run_check) -> Qualification:
    """The paths this engine build runs at this shape on this GPU: cached, else checked now.

    `settings` are the run's engine flags (shape and optimizer); `model` the same as a dict (vocab, ctx,
    dim, layers, heads, batch, grad_accum). Never raises for a path's failure: a failure is a verdict."""
    build = file_sha256(binary)[1]
    with tempfile.TemporaryDirectory(prefix="microgpt-qualify-") as tmp:
        tmp = Path(tmp)
        base = runner(binary, settings, VERIFIED_FLAGS, model, tmp / "verified")
        shape = shape_of(model, base.precision or "unknown")
        device = device_name(base.device)
        now = time.time()
        if base.crashed:
            say(f"the verified path's check failed ({base.crashed}); running the verified path")
            return Qualification(device=device or "unknown", build=build, shape=shape, flags=list(VERIFIED_FLAGS),
                                 verdicts=[PathVerdict(path="verified", flags=list(VERIFIED_FLAGS), status="crashed",
                                                       detail=base.crashed)],
                                 loss_tolerance=LOSS_TOLERANCE, cosine_min=COSINE_MIN, created=now)
        cached_at = cache_path(cache_dir, device, build, shape)
        try:
            cached = read_qualification(cached_at)
            if cached.device == device and cached.build == build and cached.shape == shape:
                say(f"fast paths: {describe(cached)} (checked on this GPU, build and shape before: {cached_at})")
                return cached
        except FileNotFoundError:
            pass
        except QualificationFileError as exc:
            say(f"ignoring the cached verdict: {exc}")
        say(f"checking the CUDA engine's fast paths on {device} (once per GPU, build and shape)")

        def check(path: FastPath, flags: list[str], label: str) -> PathVerdict:
            runs = [runner(binary, settings, flags, model, tmp / f"{label}-{i}") for i in range(2)]
            if runs[0].crashed is None and any(runs[0].paths.get(k) != v for k, v in path.paths.items()):
                runs = runs[:1]  # not in this build or shape: no second run needed
            v = judge(path, flags, shape, runs, base)
            say(f"  {v.path}: {v.status}: {v.detail}")
            return v

        verdicts, chosen = [], []
        for p in ATTENTION_PATHS:
            v = check(p, with_paths(p), p.name.replace(" ", "-"))
            verdicts.append(v)
            if v.status == "passed":
                chosen.append(p)
                break
        v = check(FUSED, with_paths(FUSED), "fused")
        verdicts.append(v)
        if v.status == "passed":
            chosen.append(FUSED)
            v = check(GRAPH, with_paths(GRAPH), "graph")
            verdicts.append(v)
            if v.status == "passed":
                chosen.append(GRAPH)
        flags = with_paths(*chosen)
        if len(chosen) > 1:  # what the run will actually run, together
            together = FastPath("all chosen paths", tuple(flags), {k: v for p in chosen for k, v in p.paths.items()})
            v = check(together, flags, "together")
            verdicts.append(v)
            if v.status != "passed":
                flags = list(VERIFIED_FLAGS)
        q = Qualification(device=device, build=build, shape=shape, flags=flags, verdicts=verdicts,
                          loss_tolerance=LOSS_TOLERANCE, cosine_min=COSINE_MIN, created=now)
    try:
        write_qualification(cached_at, q)
    except OSError as exc:
        say(f"cannot cache the verdict at {cached_at}: {exc}")
    return q


def describe(q: Qualification) -> str:
    """The paths a verdict chose, for a person."""
    f = dict(zip(q.flags[::2], q.flags[1::2]))
    parts = [f"attention {f.get('--attention', 'naive')}"]
    if f.get("--cuda-graph") == "on":
        parts.append("fused kernels in a CUDA graph")
    elif f.get("--fused") == "on":
        parts.append("fused kernels")
    else:
        parts.append("verified kernels")
    return ", ".join(parts)


def failure_lines(q: Qualification) -> list[str]:
    """One line per fast path that failed or crashed its check: which, and by how much."""
    return [f"fast path {v.path} failed its check on {q.device}: {v.detail}; using the verified path for it"
            for v in q.verdicts if v.status in ("failed", "crashed")]


# ------------------------------------------------------------------ a run's choice

def run_engine_paths(run: RunDir, binary: Path, settings: list[str], model: dict, cache_dir: Path,
                     say: Say, warn: Say, runner: Callable[..., CheckRun] = run_check) -> list[str]:
    """The path flags a run's engine is launched with: the run's recorded choice when it was made with
    this engine build (a resume keeps its paths, whatever the cache says since), else a qualification
    (cached or run now), recorded in the run directory."""
    try:
        recorded = read_qualification(run.qualification, within=run.root)
    except FileNotFoundError:
        recorded = None
    except QualificationFileError as exc:
        warn(f"{exc}; checking the fast paths again")
        recorded = None
    build = file_sha256(binary)[1]
    if recorded is not None:
        if recorded.build == build:
            say(f"fast paths: {describe(recorded)} (recorded in {run.qualification.name})")
            return list(recorded.flags)
        warn(f"the engine build changed since {run.qualification.name} was recorded; checking the fast paths again")
    q = qualify(binary, settings, model, cache_dir, say, runner)
    for line in failure_lines(q):
        warn(line)
    write_qualification(run.qualification, q)
    say(f"fast paths: {describe(q)}")
    return list(q.flags)

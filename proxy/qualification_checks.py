"""One check process of the qualification (docs/CUDA.md, "Qualification"): the CUDA engine, with one
set of path flags, trains CHECK_STEPS steps of the run's shape on fixed tokens, samples, and writes
checkpoints; what it gave is read back here (CheckRun) for qualification_compare.py to judge.

The check's schedule is the run's optimizer at the run's peak learning rate:
`--lr-schedule cosine --warmup 1 --steps CHECK_STEPS` puts the peak at step 1
and decays it along a cosine to the run's min_lr at the last step, whatever
the run's own schedule (a wsd or constant one would hold the rate still), so
every step has its own learning rate (a path that keeps a stale one is seen)
and the steps move the weights as far as the run's own steps do.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from .formats import frames
from .formats.checkpoint import CheckpointError, checkpoint_path, read_checkpoint
from .formats.engine_cli import engine_args
from .processes import signal_group
from .safe_fs import UnsafeFileError, file_sha256

CHECK_SCHEDULE = "cosine"  # every check step at its own rate (see above), whatever the run's schedule
CHECK_STEPS = 12  # steps each check trains: enough for Adam's moments to hold several steps' gradients
MID_STEP = CHECK_STEPS // 2  # a checkpoint here is written while the next steps train (the async snapshot)
CHECK_TIMEOUT_S = 120.0  # one check process; past it the process group is killed and the path failed
SAMPLE_NEW = 16  # tokens each sampled completion draws
SAMPLE_SEEDS = (11, 12)  # a fixed seed per prompt: the KV cache and the recompute path draw the same


@dataclass
class CheckRun:
    """What one check process gave, or why not."""

    losses: list[float] = field(default_factory=list)  # per step, 1..CHECK_STEPS
    weights: np.ndarray | None = None  # the final checkpoint's state
    m: np.ndarray | None = None
    v: np.ndarray | None = None
    initial: np.ndarray | None = None  # step 0's weights, where the check wrote them
    digests: dict[int, str] = field(default_factory=dict)  # step -> SHA-256 of its checkpoint file
    tokens: object = None  # the `sample` event's tokens
    device: str = ""
    precision: str = ""
    paths: dict = field(default_factory=dict)  # the ready event's `paths`: what the engine runs
    crashed: str | None = None  # one line: how it ended without a result


def check_settings(settings: list[str]) -> list[str]:
    """The run's engine settings with the check's schedule (later flags win in the engine)."""
    return [*settings, "--lr-schedule", CHECK_SCHEDULE, "--warmup", "1", "--steps", str(CHECK_STEPS)]


def check_tokens(vocab: int, ctx: int, rows: int) -> list[np.ndarray]:
    """The tokens of each check step: fixed pseudo-random rows, the same for every path."""
    rng = np.random.default_rng(20261124)
    return [rng.integers(0, vocab, size=(rows, ctx + 1), dtype=np.uint16) for _ in range(CHECK_STEPS)]


def sample_prompts(vocab: int) -> list[frames.SamplePrompt]:
    rng = np.random.default_rng(20261128)
    return [
        frames.SamplePrompt(rng.integers(0, vocab, size=n).tolist(), 2, seed)
        for n, seed in zip((3, 5), SAMPLE_SEEDS, strict=False)
    ]


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


def run_check(
    binary: Path,
    settings: list[str],
    flags: list[str],
    shape: dict,
    workdir: Path,
    timeout: float = CHECK_TIMEOUT_S,
    initial: bool = False,
    read_state: bool = True,
) -> CheckRun:
    """The engine at `binary` (its own session, killed past `timeout`) trains the check's steps with
    `flags`, samples, and ends at EOF; `initial` also checkpoints step 0. The checkpoints at MID_STEP
    and CHECK_STEPS are hashed, the final (and step 0's) state read back unless not `read_state` (a
    repeat run is compared by its hashes: at GPT-2 124M a state is 1.5 GB of memory)."""
    workdir.mkdir(parents=True, exist_ok=True)
    ckpt = workdir / "ckpt"
    args = engine_args(ckpt, ckpt_every=MID_STEP, settings=check_settings(settings), extra=flags)
    rows = int(shape["batch"]) * int(shape["grad_accum"])
    vocab = int(shape["vocab"])
    payload = [frames.checkpoint_frame()] if initial else []
    payload += [
        frames.train_frame(s + 1, t, np.zeros(rows, dtype=np.uint16))
        for s, t in enumerate(check_tokens(vocab, int(shape["ctx"]), rows))
    ]
    payload.append(frames.sample_batch_frame(1, sample_prompts(vocab), SAMPLE_NEW, 1.0, 0))
    try:
        proc = subprocess.Popen(
            [str(binary), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:
        return CheckRun(crashed=f"cannot start {binary}: {exc.strerror}")
    try:
        out, err = proc.communicate(b"".join(payload), timeout=timeout)
    except subprocess.TimeoutExpired:
        signal_group(proc.pid, signal.SIGKILL)  # our unreaped child leads its own session: its group is ours
        proc.communicate()
        return CheckRun(crashed=f"no result within {timeout:.0f} s (killed)")
    run = _events(out)
    if proc.returncode != 0 or len(run.losses) != CHECK_STEPS or run.tokens is None:
        how = f"exit {proc.returncode}" if proc.returncode >= 0 else f"signal {-proc.returncode}"
        run.crashed = f"{how}: {_last_line(err.decode('utf-8', 'replace'))}"
        return run
    run = _read_checkpoints(run, ckpt, initial, read_state)
    shutil.rmtree(workdir, ignore_errors=True)  # read into memory: at GPT-2 124M each checkpoint is 1.5 GB
    return run


def _events(out: bytes) -> CheckRun:
    run = CheckRun()
    for line in out.splitlines():
        try:
            ev = frames.parse_event(line)
        except ValueError:
            continue
        if ev.kind == "ready":
            run.device = str(ev.get("device") or "")
            run.precision = str(ev.get("precision") or "")
            paths = ev.get("paths")
            run.paths = dict(paths) if isinstance(paths, dict) else {}
        elif ev.kind == "step":
            run.losses.append(float(ev["loss"]))
        elif ev.kind == "sample":
            run.tokens = json.dumps(ev.get("tokens"))
    return run


def _read_checkpoints(run: CheckRun, ckpt: Path, initial: bool, read_state: bool) -> CheckRun:
    """`run` with its checkpoints' digests (and states), or crashed when one cannot be read."""
    try:
        steps = ((0,) if initial else ()) + (MID_STEP, CHECK_STEPS)
        digests = {step: file_sha256(checkpoint_path(ckpt, step))[1] for step in steps}
        start = read_checkpoint(checkpoint_path(ckpt, 0)).weights if initial else None
        final = read_checkpoint(checkpoint_path(ckpt, CHECK_STEPS)) if read_state else None
    except (OSError, UnsafeFileError, CheckpointError) as exc:
        return replace(run, crashed=f"no readable checkpoint ({str(exc)[:200]})")
    run = replace(run, digests=digests, initial=start)
    return replace(run, weights=final.weights, m=final.m, v=final.v) if final is not None else run

"""Shared fixtures for the engine suite (tests/engine/).

The engine is `build/microgpt_cpu`, or what MICROGPT_TEST_ENGINE names
(tests/harness/engines.py; `make test-gpu` does not run this suite: the CUDA
engine is checked against the CPU one in tests/gpu). A missing binary is a
test failure with a clear message, never a skip: CI must not go green without
an engine.

Everything speaks the wire formats through proxy/formats/ (frames, shards,
checkpoints, the engine's command line), so this suite never re-implements a
format.
"""
from __future__ import annotations

import os
import queue
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import pytest

from harness.engines import engine_under_test
from proxy.formats import frames
from proxy.formats.engine_cli import engine_args, setting_flags
from proxy.formats.parameters import n_params
from proxy.formats.shard import write_shard

ENGINE = engine_under_test()
TIMEOUT = 60.0  # seconds any single engine interaction may take on a busy 2-core box


# ---------------------------------------------------------------------------
# configuration


@dataclass(frozen=True)
class Cfg:
    """A model + optimizer configuration; every setting is passed explicitly."""
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
    warmup: int = 3
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 1337

    @property
    def n_params(self) -> int:
        return n_params(self.vocab, self.ctx, self.dim, self.layers)

    @property
    def rows(self) -> int:
        return self.batch * self.grad_accum

    def but(self, **kw) -> "Cfg":
        return replace(self, **kw)

    def flags(self) -> list[str]:
        return setting_flags(**asdict(self))

    def lr_at(self, s: int) -> float:
        """ENGINE.md's schedule for the update producing step s (1-based)."""
        from .torch_reference import lr_at
        return lr_at(s, self.lr, self.min_lr, self.warmup, self.steps)


TINY = Cfg()


@pytest.fixture(scope="session")
def engine_bin() -> Path:
    if ENGINE.problem:
        pytest.fail(f"{ENGINE.problem} (tests/engine needs an engine: `make cpu`)", pytrace=False)
    return ENGINE.path


@pytest.fixture
def cfg() -> Cfg:
    return TINY


# ---------------------------------------------------------------------------
# data


def random_rows(cfg: Cfg, n_rows: int, seed: int) -> np.ndarray:
    """[n_rows, T+1] uint16 token rows, uniform in [0, vocab)."""
    return np.random.default_rng(seed).integers(0, cfg.vocab, size=(n_rows, cfg.ctx + 1), dtype=np.uint16)


def random_groups(n_rows: int, seed: int, n_groups: int = 3) -> np.ndarray:
    return np.random.default_rng(seed + 10_000).integers(0, n_groups, size=n_rows, dtype=np.uint16)


def make_shard(path: Path, cfg: Cfg, n_tokens: int = 20_000, seed: int = 0) -> Path:
    """A random token shard for `cfg.vocab` (written by proxy.formats.shard)."""
    tokens = np.random.default_rng(seed).integers(0, cfg.vocab, size=n_tokens, dtype=np.uint16)
    write_shard(path, tokens, cfg.vocab)
    return path


def train_frames(cfg: Cfg, first_step: int, n: int, seed: int = 7) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """(step, tokens, groups) for steps first_step .. first_step+n-1; data depends on the step only."""
    return [(s, random_rows(cfg, cfg.rows, seed * 100_003 + s), random_groups(cfg.rows, seed * 100_003 + s))
            for s in range(first_step, first_step + n)]


# ---------------------------------------------------------------------------
# slow or failing checkpoint writes (tests/engine/fsync_shim.c, preloaded into the engine)


@pytest.fixture(scope="session")
def fsync_shim(tmp_path_factory) -> Path:
    """The fsync shim, built once per session with the C compiler that builds the engine."""
    out = tmp_path_factory.mktemp("shim") / "fsync_shim.so"
    src = Path(__file__).with_name("fsync_shim.c")
    res = subprocess.run([os.environ.get("CC", "cc"), "-shared", "-fPIC", "-O2", "-o", str(out), str(src), "-ldl"],
                         capture_output=True, text=True)
    assert res.returncode == 0, f"cannot build {src}: {res.stderr}"
    return out


def shim_env(shim: Path, delay_ms: int, fail: bool = False) -> dict:
    """An environment in which every fsync of the engine sleeps delay_ms (then fails with EIO if `fail`)."""
    env = {**os.environ, "LD_PRELOAD": str(shim), "MG_TEST_FSYNC_DELAY_MS": str(delay_ms)}
    if fail:
        env["MG_TEST_FSYNC_FAIL"] = "1"
    return env


# ---------------------------------------------------------------------------
# running the engine


class EngineError(AssertionError):
    pass


@dataclass
class Engine:
    """A running engine: events from stdout on a reader thread, stderr to a file."""
    proc: subprocess.Popen
    args: list[str]
    stderr_path: Path
    cwd: Path
    events: list = field(default_factory=list)  # every event seen so far, in order
    _q: "queue.Queue" = field(default_factory=queue.Queue)
    _eof: bool = False

    def _reader(self) -> None:
        for line in self.proc.stdout:
            self._q.put(line)
        self._q.put(None)

    # -- stdin ----------------------------------------------------------
    def send(self, data: bytes) -> None:
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def train(self, step: int, tokens: np.ndarray, groups: np.ndarray | None = None) -> None:
        if groups is None:
            groups = np.zeros(tokens.shape[0], np.uint16)
        self.send(frames.train_frame(step, tokens, groups))

    def close_stdin(self) -> None:
        try:
            self.proc.stdin.close()
        except BrokenPipeError:
            pass

    # -- stdout ---------------------------------------------------------
    def next_event(self, timeout: float = TIMEOUT):
        """The next event, or None at end of stdout. Non-JSON stdout lines fail the test."""
        if self._eof:
            return None
        try:
            line = self._q.get(timeout=timeout)
        except queue.Empty:
            raise EngineError(f"no event from the engine within {timeout}s; stderr: {self.stderr()!r}") from None
        if line is None:
            self._eof = True
            return None
        try:
            ev = frames.parse_event(line)
        except ValueError as exc:
            raise EngineError(f"engine wrote a stdout line that is not an event: {line!r} ({exc})") from None
        self.events.append(ev)
        return ev

    def wait_for(self, kind: str, timeout: float = TIMEOUT, **match):
        """Read events until one of `kind` (whose fields equal `match`); fail on `error` or EOF."""
        deadline = time.monotonic() + timeout
        while True:
            ev = self.next_event(max(0.01, deadline - time.monotonic()))
            if ev is None:
                raise EngineError(f"stdout ended before a {kind!r} event {match}; rc={self.proc.poll()} "
                                  f"stderr: {self.stderr()!r}")
            if ev.kind == kind and all(ev.get(k) == v for k, v in match.items()):
                return ev
            if ev.kind == "error" and kind != "error":
                raise EngineError(f"engine error while waiting for {kind!r}: {ev.fields}; stderr: {self.stderr()!r}")

    def drain(self, timeout: float = TIMEOUT) -> list:
        """Read the remaining events until stdout closes."""
        deadline = time.monotonic() + timeout
        while self.next_event(max(0.01, deadline - time.monotonic())) is not None:
            pass
        return self.events

    def finish(self, timeout: float = TIMEOUT) -> int:
        """Close stdin (if still open), read to end, wait; return the exit code."""
        self.drain(timeout)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise EngineError(f"engine did not exit within {timeout}s") from None

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=TIMEOUT)

    def stderr(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")
        except OSError:
            return ""

    def of(self, kind: str) -> list:
        return [e for e in self.events if e.kind == kind]

    def losses(self) -> dict[int, float]:
        return {e["step"]: e["loss"] for e in self.of("step")}


_counter = iter(range(1_000_000))


def start_engine(engine_bin: Path, args: list[str], workdir: Path, env: dict | None = None) -> Engine:
    """Start the engine with `args` (and `env`, else ours); stdin is a pipe (proxy mode) and stays open."""
    workdir.mkdir(parents=True, exist_ok=True)
    stderr_path = workdir / f"engine-{next(_counter)}.stderr"
    with open(stderr_path, "wb") as err:
        proc = subprocess.Popen([str(engine_bin), *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=err, cwd=workdir, env=env)
    eng = Engine(proc, args, stderr_path, workdir)
    threading.Thread(target=eng._reader, daemon=True).start()
    return eng


@pytest.fixture
def run_engine(engine_bin, tmp_path):
    """Factory: run_engine(args) -> Engine; every engine started is killed at teardown."""
    started: list[Engine] = []

    def _start(args: list[str], workdir: Path | None = None, env: dict | None = None) -> Engine:
        eng = start_engine(engine_bin, [str(a) for a in args], workdir or tmp_path, env)
        started.append(eng)
        return eng

    yield _start
    for eng in started:
        if eng.proc.poll() is None:
            eng.proc.kill()
            eng.proc.wait(timeout=TIMEOUT)
        for stream in (eng.proc.stdin, eng.proc.stdout):
            try:
                stream.close()
            except Exception:
                pass


def run_once(engine_bin: Path, args: list[str], cwd: Path, stdin: bytes = b"", timeout: float = TIMEOUT,
             env: dict | None = None):
    """Run the engine to completion with `stdin` bytes; CompletedProcess with text stdout/stderr."""
    return subprocess.run([str(engine_bin), *[str(a) for a in args]], input=stdin, capture_output=True,
                          cwd=cwd, timeout=timeout, env=env)


def parse_events(stdout: bytes) -> list:
    return [frames.parse_event(line) for line in stdout.decode().splitlines() if line.strip()]


def proxy_args(cfg: Cfg, ckpt_dir: Path, *extra) -> list[str]:
    return engine_args(ckpt_dir, ckpt_every=0, settings=cfg.flags(), extra=extra)


def initial_checkpoint(run_engine, cfg: Cfg, ckpt_dir: Path) -> Path:
    """step_000000.bin for `cfg`: start fresh in proxy mode, CHECKPOINT frame, STOP."""
    eng = run_engine(proxy_args(cfg, ckpt_dir))
    eng.wait_for("ready", step=0)
    eng.send(frames.checkpoint_frame())
    ck = eng.wait_for("ckpt")
    eng.send(frames.stop_frame())
    assert eng.finish() == 0, eng.stderr()
    path = event_path(ck, eng)
    assert path.resolve() == (ckpt_dir / "step_000000.bin").resolve(), ck.fields
    return path


def event_path(ev, eng: Engine) -> Path:
    """The file an event's `path` names (absolute, or relative to the engine's working directory)."""
    path = Path(ev["path"])
    return path if path.is_absolute() else eng.cwd / path


def dir_snapshot(directory: Path) -> dict[str, tuple[bytes, int]]:
    """name -> (bytes, mtime_ns) of every file in a directory."""
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(directory.iterdir()) if p.is_file()}


"""The one wrapper of a running child process in the suites: an engine, or a proxy or script.

`Child` starts a child with its stdout lines on a reader thread (each parsed as an engine event
when it reads as one) and its stderr collected through a pipe, so an RLIMIT_FSIZE set on the child
never truncates what it says. `Engine` is a Child that is an engine: frames go to its stdin, and
its stdout must be events only (a line that is not one fails the test).

Two ways to wait, for two kinds of test:
- `Engine.wait_for(kind, **fields)` fails the test on an `error` event, at the end of stdout or past
  the timeout (the engine and GPU suites: every step is expected);
- `Child.wait_event(kind, pred)` returns None at the end of stdout and raises `Hang` past the
  timeout (the fault suite, which counts what survived rather than failing at the first surprise).

Every frame and event is spoken through proxy/formats/frames.py.
"""

from __future__ import annotations

import os
import queue
import re
import select
import signal
import subprocess
import threading
import time
from pathlib import Path

import numpy as np

from proxy.formats import frames

from .shape import Shape, proxy_args

TIMEOUT = 120.0  # seconds one interaction may take on a busy 2-core box before it counts as hung

# Every child started, in order: tests/conftest.py kills those a test left running.
LIVE: list[Child] = []


class EngineError(AssertionError):
    """The child did not do what the test waited for (a failed assertion, with its stderr)."""


class Hang(EngineError):
    """Nothing came within the timeout."""


class Child:
    """A child process: stdout lines on a queue, parsed as engine events where they are; stderr kept."""

    def __init__(
        self,
        argv,
        cwd,
        *,
        env: dict | None = None,
        stdin_pipe: bool = False,
        preexec_fn=None,
        new_session: bool = False,
        parse_events: bool = True,
        timeout: float = TIMEOUT,
    ):
        """`env` is the child's whole environment (None: ours); `timeout` the default of every wait."""
        self.argv = [str(a) for a in argv]
        self.cwd = Path(cwd)
        self.cwd.mkdir(parents=True, exist_ok=True)
        self.parse = parse_events
        self.timeout = timeout
        stdin = subprocess.PIPE if stdin_pipe else subprocess.DEVNULL
        self.proc = subprocess.Popen(
            self.argv,
            cwd=self.cwd,
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=preexec_fn,
            start_new_session=new_session,
            env=env,
        )
        self.pid = self.proc.pid
        LIVE.append(self)
        self.lines: list[str] = []
        self.events: list[frames.Event] = []
        self.bad_lines: list[str] = []  # stdout lines that are not events (when parsing)
        self._q: queue.Queue = queue.Queue()
        self._eof = False
        self._err = bytearray()
        self._err_lock = threading.Lock()
        self._err_open = True
        self._t_out = threading.Thread(target=self._read_out, daemon=True)
        self._t_err = threading.Thread(target=self._read_err, daemon=True)
        self._t_out.start()
        self._t_err.start()

    # -- the reader threads
    def _read_out(self) -> None:
        try:
            for raw in self.proc.stdout:
                self._q.put(raw)
        except (OSError, ValueError):
            pass
        self._q.put(None)

    def _read_err(self) -> None:
        fd = self.proc.stderr.fileno()
        while self._err_open:
            try:
                select.select([fd], [], [])
            except (OSError, ValueError):
                break
            self._take_err()

    def _take_err(self) -> None:
        """Append what the stderr pipe holds now. `stderr` calls it too, so text the child wrote
        before an event the test has read is never still in the pipe when the test looks."""
        with self._err_lock:
            if not self._err_open or self.proc.stderr.closed:
                return
            fd = self.proc.stderr.fileno()
            while select.select([fd], [], [], 0)[0]:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:
                    chunk = b""
                if not chunk:
                    self._err_open = False
                    return
                self._err += chunk

    @property
    def stderr(self) -> str:
        self._take_err()
        return bytes(self._err).decode("utf-8", "replace")

    def stderr_lines(self) -> list[str]:
        return [ln for ln in self.stderr.splitlines() if ln.strip()]

    # -- stdout
    def next_line(self, timeout: float | None = None) -> str | None:
        """The next stdout line (None at EOF); raises Hang after `timeout` seconds."""
        timeout = self.timeout if timeout is None else timeout
        if self._eof:
            return None
        try:
            raw = self._q.get(timeout=max(0.0, timeout))
        except queue.Empty:
            raise Hang(
                f"no output from {Path(self.argv[0]).name} within {timeout:.0f}s; stderr tail: {self.stderr[-2000:]!r}"
            ) from None
        if raw is None:
            self._eof = True
            return None
        line = raw.decode("utf-8", "replace").rstrip("\n")
        self.lines.append(line)
        if self.parse and line.strip():
            try:
                self.events.append(frames.parse_event(line))
            except ValueError:
                self.bad_lines.append(line)
        return line

    def poll_lines(self) -> None:
        """Consume whatever stdout is already there, without blocking."""
        try:
            while self.next_line(0.0) is not None:
                pass
        except Hang:
            pass

    def wait_event(self, kind: str, timeout: float | None = None, pred=None):
        """Read until an event of `kind` (matching `pred`); None at EOF."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            n = len(self.events)
            line = self.next_line(deadline - time.monotonic())
            if line is None:
                return None
            for ev in self.events[n:]:
                if ev.kind == kind and (pred is None or pred(ev)):
                    return ev

    def wait_line(self, pattern: re.Pattern, timeout: float | None = None):
        """Read until a stdout line matches; the match, or None at EOF."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            line = self.next_line(deadline - time.monotonic())
            if line is None:
                return None
            m = pattern.search(line)
            if m:
                return m

    def of(self, kind: str) -> list:
        return [e for e in self.events if e.kind == kind]

    def last_step(self, default: int = 0) -> int:
        steps = [int(e["step"]) for e in self.events if e.kind == "step"]
        return max(steps) if steps else default

    # -- stdin
    def send(self, data: bytes) -> None:
        """Write to stdin; a child that has gone is not an error here (its exit code says why)."""
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass

    def close_stdin(self) -> None:
        try:
            if self.proc.stdin:
                self.proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass

    # -- the end
    def finish(self, timeout: float | None = None) -> int:
        """Read stdout to its end and wait; the exit code. Past `timeout` the child is killed and
        Hang raised. Stdin stays open: a test that wants the engine's EOF closes it first."""
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        try:
            while self.next_line(deadline - time.monotonic()) is not None:
                pass
            rc = self.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except (Hang, subprocess.TimeoutExpired):
            self.kill_all()
            raise Hang(
                f"{Path(self.argv[0]).name} did not finish within {timeout:.0f}s; stderr tail: {self.stderr[-2000:]!r}"
            ) from None
        self.close()
        return rc

    def wait(self, timeout: float | None = None) -> int:
        """Wait for exit (after a kill), then drain the pipes."""
        timeout = self.timeout if timeout is None else timeout
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill_all()
            raise Hang(f"{Path(self.argv[0]).name} did not exit within {timeout:.0f}s") from None
        end = time.monotonic() + 10
        while self.next_line(max(0.0, end - time.monotonic())) is not None:
            pass
        self.close()
        return rc

    def close(self) -> None:
        """Close our ends of the pipes, once stderr has been read to its end."""
        self._t_err.join(timeout=10)
        with self._err_lock:
            self._err_open = False  # a grandchild may hold stderr open still: stop reading it
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                if stream:
                    stream.close()
            except OSError:
                pass

    # -- signals (to this child only: its pid, or its own process group)
    def send_signal(self, sig: int) -> bool:
        if self.proc.returncode is not None:
            return False  # reaped: the pid may be someone else's now
        try:
            os.kill(self.pid, sig)
            return True
        except ProcessLookupError:
            return False

    def killpg(self, sig: int = signal.SIGKILL) -> None:
        """Signal the child's process group (a child started with `new_session` leads its own, which
        outlives it while its children live); the child alone if there is no such group."""
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            self.send_signal(sig)

    def kill_all(self) -> None:
        """SIGKILL the child (its group, when it leads one) and reap it."""
        if self.proc.poll() is None:
            self.killpg() if self._own_group() else self.send_signal(signal.SIGKILL)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass

    def kill(self) -> None:
        """SIGKILL the child, reap it and close the pipes."""
        self.kill_all()
        self.close()

    def _own_group(self) -> bool:
        try:
            return os.getpgid(self.pid) == self.pid
        except ProcessLookupError:
            return False

    def cpu_seconds(self) -> float:
        """CPU time the child has used (user + system, all its threads), from /proc: readable until it is
        reaped, so also just after it exited. What it did, however busy the machine is."""
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def alive(self) -> bool:
        return self.proc.poll() is None


class Engine(Child):
    """A running engine: frames to stdin (a pipe unless `stdin_pipe=False`), events from stdout."""

    def __init__(
        self,
        binary: Path,
        args,
        cwd: Path,
        *,
        env: dict | None = None,
        stdin_pipe: bool = True,
        preexec_fn=None,
        timeout: float = TIMEOUT,
    ):
        super().__init__([binary, *args], cwd, env=env, stdin_pipe=stdin_pipe, preexec_fn=preexec_fn, timeout=timeout)

    def train(self, step: int, tokens: np.ndarray, groups: np.ndarray | None = None) -> None:
        if groups is None:
            groups = np.zeros(tokens.shape[0], np.uint16)
        self.send(frames.train_frame(step, tokens, groups))

    def next_event(self, timeout: float | None = None):
        """The next event, or None at the end of stdout. A line that is not an event fails the test."""
        n = len(self.bad_lines)
        while True:
            before = len(self.events)
            line = self.next_line(timeout)
            if len(self.bad_lines) > n:
                raise EngineError(f"the engine wrote a stdout line that is not an event: {self.bad_lines[n]!r}")
            if line is None:
                return None
            if len(self.events) > before:
                return self.events[-1]

    def wait_for(self, kind: str, timeout: float | None = None, **match):
        """Read events until one of `kind` whose fields equal `match`; fail on an `error` event or EOF."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            ev = self.next_event(max(0.01, deadline - time.monotonic()))
            if ev is None:
                raise EngineError(
                    f"stdout ended before a {kind!r} event {match}; rc={self.proc.poll()} stderr: {self.stderr!r}"
                )
            if ev.kind == kind and all(ev.get(k) == v for k, v in match.items()):
                return ev
            if ev.kind == "error" and kind != "error":
                raise EngineError(f"engine error while waiting for {kind!r}: {ev.fields}; stderr: {self.stderr!r}")

    def drain(self, timeout: float | None = None) -> list:
        """Read the remaining events until stdout closes."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while self.next_event(max(0.01, deadline - time.monotonic())) is not None:
            pass
        return self.events

    def finish(self, timeout: float | None = None) -> int:
        """Read the remaining events (each must be one) and wait; the exit code."""
        try:
            self.drain(timeout)
        except Hang:
            self.kill_all()
            raise
        return super().finish(timeout)

    def losses(self) -> dict[int, float]:
        return {e["step"]: e["loss"] for e in self.of("step")}


def run_once(
    binary: Path, args, cwd: Path, stdin: bytes = b"", timeout: float = TIMEOUT, env: dict | None = None
) -> subprocess.CompletedProcess:
    """Run the engine to completion on `stdin` bytes; stdout and stderr as bytes."""
    return subprocess.run(
        [str(binary), *[str(a) for a in args]], input=stdin, capture_output=True, cwd=cwd, timeout=timeout, env=env
    )


def parse_events(stdout: bytes) -> list:
    return [frames.parse_event(line) for line in stdout.decode().splitlines() if line.strip()]


def event_path(ev, eng: Child) -> Path:
    """The file an event's `path` names (absolute, or relative to the engine's working directory)."""
    path = Path(ev["path"])
    return path if path.is_absolute() else eng.cwd / path


def initial_checkpoint(binary: Path, shape: Shape, ckpt_dir: Path) -> Path:
    """step_000000.bin for `shape`: a fresh engine in proxy mode, a CHECKPOINT frame, STOP."""
    eng = Engine(binary, proxy_args(shape, ckpt_dir), ckpt_dir.parent)
    try:
        eng.wait_for("ready", step=0)
        eng.send(frames.checkpoint_frame())
        ck = eng.wait_for("ckpt", step=0)
        eng.send(frames.stop_frame())
        assert eng.finish() == 0, eng.stderr
    finally:
        eng.kill()
    path = event_path(ck, eng)
    assert path.resolve() == (ckpt_dir / "step_000000.bin").resolve(), ck.fields
    return path

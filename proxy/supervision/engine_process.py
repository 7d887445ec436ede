"""One engine process: choosing the binary, launching it, reading its events, writing frames.

The engine runs in its own session and process group (so a Ctrl-C at the
terminal reaches only the proxy, and a hung engine is killed with its whole
group). Its stderr is appended to RUN/engine.log. A reader thread turns stdout
lines into events on a queue; a writer thread feeds frames to stdin so the
supervisor never blocks on a full pipe. The record of a launched engine, and
reaping one a killed proxy left behind, are supervision/engine_record.py's.
"""

from __future__ import annotations

import fcntl
import os
import queue
import shlex
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from ..atomic import append_whole, open_append
from ..errors import EXIT_USAGE, ProxyError
from ..formats.frames import parse_event
from ..processes import cpu_seconds, send, signal_group

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_DIR = REPO_ROOT / "build"
_F_SETPIPE_SZ = 1031
# How long the rest of an ended engine's session (a launcher's ranks) may take to end before it is killed:
# mpirun SIGKILLs its ranks about 2 s after one fails.
SESSION_GRACE_S = 10.0


class EngineError(ProxyError):
    """The engine cannot be chosen or started; the message is one line."""

    code = EXIT_USAGE


def _listed_gpus() -> int:
    """The GPUs `nvidia-smi -L` lists (one `GPU i: ...` line each); 0 without it or when it fails."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU ")) if out.returncode == 0 else 0


def gpu_visible() -> bool:
    """An NVIDIA GPU is visible: /dev/nvidia0 exists or `nvidia-smi -L` lists one."""
    return os.path.exists("/dev/nvidia0") or _listed_gpus() > 0


def visible_gpu_count() -> int:
    """The NVIDIA GPUs this process may use: those `nvidia-smi -L` lists, no more than CUDA_VISIBLE_DEVICES
    names where it is set (an empty value or -1 hides them all); 0 without nvidia-smi."""
    listed = _listed_gpus()
    named = os.environ.get("CUDA_VISIBLE_DEVICES")
    if named is None:
        return listed
    entries = [e.strip() for e in named.split(",")]
    # CUDA stops at the first invalid entry (-1 hides every GPU from there on).
    valid = 0
    for e in entries:
        if not e or e.startswith("-"):
            break
        valid += 1
    return min(listed, valid)


@dataclass(frozen=True)
class EngineChoice:
    path: Path
    kind: str  # "cpu", "cuda" or "custom" (an explicit path)
    ranks: int = 1  # data-parallel ranks (proxy/ranks.py)
    launcher: tuple[str, ...] = ()  # what starts the ranks (mpirun -np N, or --launcher); () for the engine alone

    def argv(self, args: list[str]) -> list[str]:
        """The launched command: the launcher's words, then the engine's."""
        return [*self.launcher, str(self.path), *args]


def engine_binary(choice: str, build_dir: Path = BUILD_DIR) -> Path:
    """The binary `--engine cpu|cuda|PATH` names, whether or not it exists."""
    return build_dir / f"microgpt_{choice}" if choice in ("cpu", "cuda") else Path(choice)


def choose_engine(choice: str | None, build_dir: Path = BUILD_DIR) -> EngineChoice:
    """`--engine cpu|cuda|PATH`, or None: CUDA when a GPU is visible and built, else CPU."""
    if choice in (None, "", "auto"):
        cuda = engine_binary("cuda", build_dir)
        if cuda.is_file() and gpu_visible():
            return EngineChoice(cuda, "cuda")
        choice = "cpu"
    if choice in ("cpu", "cuda"):
        path = engine_binary(choice, build_dir)
        if not path.is_file():
            raise EngineError(f"engine {path} not found; build it with `make {choice}`")
        return EngineChoice(path, choice)
    path = Path(choice)
    if not path.is_file() or not os.access(path, os.X_OK):
        raise EngineError(f"--engine {choice}: not cpu, cuda or an executable file")
    return EngineChoice(path.resolve(), "custom")


# Items on the event queue: (kind, payload)
EVENT, NOISE, EOF, WRITE_FAILED = "event", "noise", "eof", "write_failed"


class EngineProcess:
    """A launched engine: `events` queue, `send(frame)`, `close_input()`, `kill_group()`."""

    def __init__(self, argv: list[str], log_path: Path, header: str = "", env: dict[str, str] | None = None):
        self.argv = argv
        self._env = dict(env or {})  # what the proxy added to the engine's environment: its proof of ownership
        self.events: queue.Queue = queue.Queue()
        self._frames: queue.Queue = queue.Queue()
        log = open_append(log_path)  # the engine's stderr: a regular file, never a FIFO or a symlink
        try:
            append_whole(
                log, f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {header}\n=== {shlex.join(argv)}\n".encode(), log_path
            )
            try:
                self.proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    start_new_session=True,
                    bufsize=0,
                    close_fds=True,
                    env=dict(os.environ, **env) if env else None,
                )
            except OSError as exc:
                raise EngineError(f"cannot start engine {argv[0]}: {exc.strerror}") from None
        finally:
            os.close(log)
        self.pid = self.proc.pid
        if self.proc.stdin is None or self.proc.stdout is None:  # both PIPE: never
            raise EngineError(f"cannot start engine {argv[0]}: no pipes")
        self._stdin, self._stdout = self.proc.stdin, self.proc.stdout
        for pipe in (self._stdin, self._stdout):
            try:
                fcntl.fcntl(pipe.fileno(), _F_SETPIPE_SZ, 1 << 20)
            except OSError:
                pass
        self._ps: psutil.Process | None = None
        self.create_time: float | None = None
        try:
            ps = psutil.Process(self.pid)
            ps.cpu_percent(None)
            self._ps, self.create_time = ps, ps.create_time()
        except psutil.Error:
            pass
        self.write_error: str | None = None
        self.events_read = 0  # events the reader thread has queued (the watchdog: one not yet handled is no hang)
        self._reader = threading.Thread(target=self._read, name=f"engine-{self.pid}-reader", daemon=True)
        self._writer = threading.Thread(target=self._write, name=f"engine-{self.pid}-writer", daemon=True)
        self._reader.start()
        self._writer.start()

    # -- threads
    def _read(self) -> None:
        try:
            for raw in self._stdout:
                line = raw.strip()
                if not line:
                    continue
                try:  # stamped here, not when the loop gets to it: the time the engine finished the work
                    self.events.put((EVENT, parse_event(line, received=time.monotonic())))
                    self.events_read += 1  # only this thread writes it
                except ValueError:
                    self.events.put((NOISE, line.decode("utf-8", errors="replace")))
        except (OSError, ValueError):
            pass
        self.events.put((EOF, None))

    def _write(self) -> None:
        stdin = self._stdin
        while True:
            item = self._frames.get()
            if item is None:
                break
            if self.write_error:
                continue
            try:
                view = memoryview(item)
                while view:
                    n = stdin.write(view)
                    view = view[n:]
            except (BrokenPipeError, OSError, ValueError) as exc:
                self.write_error = str(exc) or type(exc).__name__
                self.events.put((WRITE_FAILED, self.write_error))
        try:
            stdin.close()
        except OSError:
            pass

    # -- control
    def send(self, frame: bytes) -> None:
        self._frames.put(frame)

    def close_input(self) -> None:
        """EOF on the engine's stdin once the queued frames are written."""
        self._frames.put(None)

    def signal(self, sig: int) -> None:
        """`sig` to the engine, while it is our unreaped child (Popen checks)."""
        try:
            self.proc.send_signal(sig)
        except ProcessLookupError:
            pass

    def kill_group(self) -> None:
        """SIGKILL the engine's process group. Only while the engine is our unreaped child: its pid, and so
        its group, cannot have passed to another process."""
        if self.proc.poll() is None:
            signal_group(self.pid, signal.SIGKILL)

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait(self, timeout: float | None = None) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def usage(self) -> tuple[int | None, float | None]:
        """(RSS bytes, CPU percent since the last call) of the engine, or Nones."""
        if self._ps is None or not self.alive():
            return None, None
        try:
            return self._ps.memory_info().rss, self._ps.cpu_percent(None)
        except psutil.Error:
            return None, None

    def cpu_seconds(self) -> float | None:
        """CPU seconds the engine (its threads and live descendants) used so far, or None."""
        if self._ps is None or not self.alive():
            return None
        return cpu_seconds(self._ps)

    def session_rest(self) -> list[psutil.Process]:
        """The processes left in the engine's session after it ended, that carry the environment the proxy gave
        it: a launcher's ranks (mpirun puts each in a process group of its own, which kill_group does not reach;
        one may outlive mpirun by seconds, finishing a checkpoint write). The session is the one the proxy
        created for the engine, and the environment proves descent from it; with none given, nothing is proven."""
        if not self._env:
            return []
        rest = []
        for proc in psutil.process_iter():
            try:
                if proc.pid != os.getpid() and os.getsid(proc.pid) == self.pid:
                    environ = proc.environ()
                    if all(environ.get(k) == v for k, v in self._env.items()):
                        rest.append(proc)
            except (psutil.Error, OSError):
                continue
        return rest

    def reap_session(self, grace_s: float = SESSION_GRACE_S) -> None:
        """After the engine ended: wait up to grace_s for the rest of its session to end, then SIGKILL it, so
        that no process of this launch writes into the run while the next one starts."""
        rest = self.session_rest()
        if not rest:
            return
        _gone, alive = psutil.wait_procs(rest, timeout=grace_s)
        for proc in alive:
            send(proc, signal.SIGKILL)
        psutil.wait_procs(alive, timeout=grace_s)

    def finish(self) -> None:
        """After the process ended: the rest of its session gone, let the threads finish and release the pipes."""
        if self.proc.poll() is not None:
            self.reap_session()
        self._frames.put(None)
        self._reader.join(timeout=5)
        self._writer.join(timeout=5)
        try:
            self._stdout.close()
        except OSError:
            pass

"""Fault-injection scenarios: shared by tests/faults/test_*.py and scripts/reliability_report.py.

Every scenario attacks real processes (the engine binary, `python -m proxy run`)
and returns an `Outcome`: how many faults it injected, how many the system
survived (every invariant checked after that fault held), how many training
steps had to be redone (work lost, allowed), and how much data was lost
(checkpoints that were valid and vanished or changed, log entries or final
weights that differ from an uninterrupted run: must be zero). The tests assert
on the outcome; the report script turns the recorded outcomes into the table
in docs/RELIABILITY.md.

Randomness: every random choice comes from `rng_for(name)`, seeded by
FAULT_SEED (default DEFAULT_SEED), so a run is reproducible by seed as far as
the choices go (which step to kill at, which offset, which bit to flip). The
exact instant a SIGKILL lands still depends on the machine's timing.

Formats are never re-implemented here: frames, shards, checkpoint verification
and engine command lines come from proxy/formats/.

The engine is the CPU one unless MICROGPT_TEST_ENGINE names another
(harness/engines.py). The proxy-level scenarios that act mid-run (kill
storms, hangs, the SIGUSR1 storm, the stopped template) drive it through a
frame gate (harness/gate.py) that holds it at the step the scenario aims
at, so a fast engine can neither finish first nor outrun the scenario.
"""
from __future__ import annotations

import json
import os
import queue
import random
import re
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from harness.engines import engine_under_test
from proxy.formats import frames
from proxy.formats.checkpoint import checkpoint_step, list_checkpoints, verify_checkpoint
from proxy.formats.engine_cli import engine_args, setting_flags
from proxy.formats.parameters import ModelShape
from proxy.formats.shard import write_shard

REPO = Path(__file__).resolve().parents[2]
ENGINE = engine_under_test()
DEFAULT_SEED = 20251122
RESULTS_ENV = "FAULT_RESULTS"
DEFAULT_RESULTS = REPO / "test-artifacts" / "faults" / "results.json"
TIMEOUT = 120.0  # any single process may take this long on a busy 2-core box before it counts as hung


def fault_seed() -> int:
    """FAULT_SEED from the environment (decimal or 0x...), else DEFAULT_SEED."""
    text = os.environ.get("FAULT_SEED", "").strip()
    if not text:
        return DEFAULT_SEED
    try:
        return int(text, 0)
    except ValueError:
        raise ValueError(f"FAULT_SEED={text!r} is not an integer") from None


def results_path() -> Path:
    """$FAULT_RESULTS, else test-artifacts/faults/results.json, or results-<kind>.json when the engine
    under test is not the CPU one (`make test-gpu` leaves results-cuda.json beside the CPU results)."""
    if os.environ.get(RESULTS_ENV):
        return Path(os.environ[RESULTS_ENV])
    kind = ENGINE.kind
    return DEFAULT_RESULTS if kind == "cpu" else DEFAULT_RESULTS.with_name(f"results-{kind}.json")


def rng_for(name: str) -> random.Random:
    """The random stream of one scenario: independent of test order and of other scenarios."""
    return random.Random(f"{fault_seed()}:{name}")


# ---------------------------------------------------------------------------
# outcomes


@dataclass
class Outcome:
    """What one scenario injected and what survived. `failures` lists every broken invariant."""
    fault_class: str
    scenario: str
    seed: int = field(default_factory=fault_seed)
    injected: int = 0
    survived: int = 0
    steps_lost: int = 0
    data_lost: int = 0
    failures: list = field(default_factory=list)
    notes: dict = field(default_factory=dict)
    seconds: float = 0.0
    _t0: float = field(default_factory=time.monotonic, repr=False)
    _open: int | None = field(default=None, repr=False)

    def fail(self, message: str, data_lost: int = 0) -> None:
        self.failures.append(message)
        self.data_lost += data_lost

    def begin_fault(self) -> None:
        """One more fault injected; it survives if no failure is added before end_fault()."""
        self.end_fault()
        self.injected += 1
        self._open = len(self.failures)

    def end_fault(self) -> None:
        if self._open is not None:
            self.survived += len(self.failures) == self._open
            self._open = None

    def note(self, key: str, value) -> None:
        self.notes[key] = value

    def bump(self, key: str, by: int = 1) -> None:
        self.notes[key] = self.notes.get(key, 0) + by

    def close(self) -> "Outcome":
        self.end_fault()
        self.seconds = round(time.monotonic() - self._t0, 2)
        return self

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("_t0", None)
        d.pop("_open", None)
        return d

    def summary(self) -> str:
        head = (f"{self.scenario}: injected {self.injected}, survived {self.survived}, steps lost "
                f"{self.steps_lost}, data lost {self.data_lost} (FAULT_SEED={self.seed})")
        if not self.failures:
            return head
        shown = self.failures[:15]
        more = f"\n  ... and {len(self.failures) - 15} more" if len(self.failures) > 15 else ""
        return head + "\n  " + "\n  ".join(shown) + more

    def check(self) -> None:
        """Assert the outcome: every fault survived, no data lost, no failure."""
        self.close()
        assert self.injected > 0, f"{self.scenario}: no fault was injected (FAULT_SEED={self.seed})"
        assert not self.failures and self.survived == self.injected and self.data_lost == 0, self.summary()


KILL_CLASS = "kill -9"  # the fault classes of the kill storms start with it


def is_kill(outcome: dict) -> bool:
    return outcome["fault_class"].startswith(KILL_CLASS)


def kill_counts(outcomes: list[dict]) -> dict:
    """`kill -9` faults injected and survived over recorded outcomes (Outcome.to_dict())."""
    kills = [o for o in outcomes if is_kill(o)]
    return {"injected": sum(o["injected"] for o in kills), "survived": sum(o["survived"] for o in kills)}


# ---------------------------------------------------------------------------
# processes


class Hang(AssertionError):
    pass


class Proc:
    """A child process with stdout lines on a queue (parsed as engine events when `events`) and
    stderr collected through a pipe (so RLIMIT_FSIZE on the child never truncates it)."""

    def __init__(self, argv, cwd, *, stdin_pipe: bool = False, preexec_fn=None, new_session: bool = False,
                 env: dict | None = None, events: bool = True):
        self.argv = [str(a) for a in argv]
        self.parse = events
        self.p = subprocess.Popen(self.argv, cwd=str(cwd), stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=preexec_fn,
                                  start_new_session=new_session, env=env)
        self.pid = self.p.pid
        self.lines: list[str] = []
        self.events: list[frames.Event] = []
        self.bad_lines: list[str] = []
        self._q: queue.Queue = queue.Queue()
        self._err = bytearray()
        self._eof = False
        self._t_out = threading.Thread(target=self._read_out, daemon=True)
        self._t_err = threading.Thread(target=self._read_err, daemon=True)
        self._t_out.start()
        self._t_err.start()

    def _read_out(self) -> None:
        try:
            for raw in self.p.stdout:
                self._q.put(raw)
        except (OSError, ValueError):
            pass
        self._q.put(None)

    def _read_err(self) -> None:
        fd = self.p.stderr.fileno()
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            self._err += chunk

    # -- reading
    def next_line(self, timeout: float) -> str | None:
        """The next stdout line (None at EOF); raises Hang after `timeout` seconds."""
        if self._eof:
            return None
        try:
            raw = self._q.get(timeout=max(0.0, timeout))
        except queue.Empty:
            raise Hang(f"no output from {Path(self.argv[0]).name} within {timeout:.0f}s") from None
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

    def wait_event(self, kind: str, timeout: float = TIMEOUT, pred=None):
        """Read until an event of `kind` (matching `pred`); None at EOF."""
        deadline = time.monotonic() + timeout
        while True:
            n = len(self.events)
            line = self.next_line(deadline - time.monotonic())
            if line is None:
                return None
            for ev in self.events[n:]:
                if ev.kind == kind and (pred is None or pred(ev)):
                    return ev

    def wait_line(self, pattern: re.Pattern, timeout: float = TIMEOUT):
        """Read until a stdout line matches; the match, or None at EOF."""
        deadline = time.monotonic() + timeout
        while True:
            line = self.next_line(deadline - time.monotonic())
            if line is None:
                return None
            m = pattern.search(line)
            if m:
                return m

    def finish(self, timeout: float = TIMEOUT) -> int:
        """Read to EOF and wait; the exit code. Raises Hang (after killing it) past `timeout`."""
        deadline = time.monotonic() + timeout
        try:
            while self.next_line(deadline - time.monotonic()) is not None:
                pass
            rc = self.p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except (Hang, subprocess.TimeoutExpired):
            self.kill_all()
            raise Hang(f"{Path(self.argv[0]).name} did not finish within {timeout:.0f}s; "
                       f"stderr tail: {self.stderr[-500:]!r}") from None
        self._t_err.join(timeout=10)
        self.close()
        return rc

    def wait(self, timeout: float = TIMEOUT) -> int:
        """Wait for exit (after a kill), then drain the pipes."""
        try:
            rc = self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill_all()
            raise Hang(f"{Path(self.argv[0]).name} did not exit within {timeout:.0f}s") from None
        end = time.monotonic() + 10
        while self.next_line(max(0.0, end - time.monotonic())) is not None:
            pass
        self._t_err.join(timeout=10)
        self.close()
        return rc

    # -- control
    def send(self, data: bytes) -> None:
        try:
            self.p.stdin.write(data)
            self.p.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass

    def send_signal(self, sig: int) -> bool:
        try:
            os.kill(self.pid, sig)
            return True
        except ProcessLookupError:
            return False

    def killpg(self, sig: int = signal.SIGKILL) -> None:
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            self.send_signal(sig)

    def kill_all(self) -> None:
        if self.p.poll() is None:
            self.killpg() if self._own_group() else self.send_signal(signal.SIGKILL)
            try:
                self.p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass

    def _own_group(self) -> bool:
        try:
            return os.getpgid(self.pid) == self.pid
        except ProcessLookupError:
            return False

    def alive(self) -> bool:
        return self.p.poll() is None

    def close(self) -> None:
        for stream in (self.p.stdin, self.p.stdout, self.p.stderr):
            try:
                if stream:
                    stream.close()
            except OSError:
                pass

    @property
    def stderr(self) -> str:
        return bytes(self._err).decode("utf-8", "replace")

    def stderr_lines(self) -> list[str]:
        return [ln for ln in self.stderr.splitlines() if ln.strip()]

    def of(self, kind: str) -> list:
        return [e for e in self.events if e.kind == kind]

    def last_step(self, default: int = 0) -> int:
        steps = [int(e["step"]) for e in self.events if e.kind == "step"]
        return max(steps) if steps else default


def fsize_limit(limit: int):
    """preexec_fn: RLIMIT_FSIZE = limit bytes (the engine ignores SIGXFSZ, so writes fail with EFBIG)."""
    def apply():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


# ---------------------------------------------------------------------------
# engine models and runs


@dataclass(frozen=True)
class Model(ModelShape):
    """An engine configuration; every setting is passed explicitly."""
    batch: int
    steps: int
    warmup: int = 4
    lr: float = 3e-3
    min_lr: float = 3e-4
    seed: int = 1337

    def but(self, **kw) -> "Model":
        return replace(self, **kw)

    def flags(self) -> list[str]:
        return setting_flags(**asdict(self), threads=1)


# Tiny: a checkpoint of ~180 KB, a step in about a millisecond: many kills are cheap.
TINY = Model(vocab=64, ctx=16, dim=32, layers=1, heads=4, batch=4, steps=200)
# Large: a 22 MB checkpoint whose write takes tens of milliseconds, to be killed inside.
LARGE = Model(vocab=4096, ctx=16, dim=256, layers=1, heads=4, batch=2, steps=14)


def make_shard(path: Path, vocab: int, n_tokens: int = 20_000, seed: int = 0) -> Path:
    tokens = np.random.default_rng(seed).integers(0, vocab, size=n_tokens, dtype=np.uint16)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_shard(path, tokens, vocab)
    return path


def standalone_argv(model: Model, shard: Path, ckpt_dir: Path, ckpt_every: int, resume: str | Path | None = "latest",
                    extra=()) -> list[str]:
    return [str(ENGINE.path), *engine_args(ckpt_dir, data=shard, resume=resume, ckpt_every=ckpt_every,
                                           settings=model.flags(), extra=extra)]


def start_standalone(model, shard, ckpt_dir, ckpt_every, resume="latest", extra=(), preexec_fn=None) -> Proc:
    return Proc(standalone_argv(model, shard, ckpt_dir, ckpt_every, resume, extra), cwd=Path(ckpt_dir).parent,
                preexec_fn=preexec_fn)


def run_standalone(model, shard, ckpt_dir, ckpt_every, resume="latest", extra=(), preexec_fn=None,
                   timeout: float = TIMEOUT) -> tuple[int, Proc]:
    p = start_standalone(model, shard, ckpt_dir, ckpt_every, resume, extra, preexec_fn)
    return p.finish(timeout), p


def step_record(ev) -> tuple:
    """What must be bit-identical between runs for one step event (floats as printed: %.9g)."""
    return (ev["loss"], ev["lr"], ev["grad_norm"], json.dumps(ev.get("group_loss"), sort_keys=True))


def temps_in(directory: Path) -> list[str]:
    try:
        return sorted(p.name for p in Path(directory).iterdir()
                      if p.name.startswith(".step_") and p.name.endswith(".bin.tmp"))
    except FileNotFoundError:
        return []


class CkptWatch:
    """Watches step_*.bin in a directory across faults.

    check(): every step_*.bin must verify (no partial file a loader would take) and no
    checkpoint once seen valid may vanish or change. A file whose (inode, size, mtime)
    is unchanged since it verified is not read again.
    """

    def __init__(self, directory: Path):
        self.dir = Path(directory)
        self.valid: dict[str, tuple] = {}

    @staticmethod
    def _key(p: Path) -> tuple:
        st = p.stat()
        return st.st_ino, st.st_size, st.st_mtime_ns

    def check(self, out: Outcome, when: str) -> None:
        current = {p.name: p for p in list_checkpoints(self.dir)}
        for name in sorted(set(self.valid) - set(current)):
            out.fail(f"{when}: valid checkpoint {name} disappeared", data_lost=1)
            del self.valid[name]
        for name, p in current.items():
            try:
                key = self._key(p)
            except FileNotFoundError:
                continue
            if self.valid.get(name) == key:
                continue
            reason = verify_checkpoint(p)
            if reason is not None:
                lost = 1 if name in self.valid else 0
                out.fail(f"{when}: {name} does not verify ({reason})" +
                         (" although it was valid before" if lost else ": a partial file a loader could take"),
                         data_lost=lost)
                self.valid.pop(name, None)
                continue
            if name in self.valid:
                out.bump("valid checkpoints rewritten in place")
            self.valid[name] = key

    def newest_valid(self) -> tuple[Path | None, int]:
        for p in list_checkpoints(self.dir):
            if verify_checkpoint(p) is None:
                return p, checkpoint_step(p)
        return None, 0


def compare_files(ref_dir: Path, run_dir: Path, out: Outcome, names=None, what: str = "") -> int:
    """Byte-compare checkpoints of the same name; each difference is data lost. Returns how many compared."""
    ref = {p.name: p for p in list_checkpoints(ref_dir)}
    got = {p.name: p for p in list_checkpoints(run_dir)}
    names = sorted(set(ref) & set(got)) if names is None else names
    for name in names:
        if name not in got:
            out.fail(f"{what}{name} missing (the uninterrupted run has it)", data_lost=1)
        elif name not in ref:
            out.fail(f"{what}{name}: no reference to compare with")
        elif ref[name].read_bytes() != got[name].read_bytes():
            out.fail(f"{what}{name} differs from the uninterrupted run's", data_lost=1)
    return len(names)


def same_path(a, b: Path | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return Path(a).resolve() == Path(b).resolve()


def free_port() -> int:
    """A TCP port of 127.0.0.1 that was free when asked."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_dashboard(run: Path, workdir: Path) -> tuple[subprocess.Popen, int]:
    """`python -m dashboard` serving `run` (polling every 0.5 s), its output in workdir/dashboard.log: the
    process and its port."""
    port = free_port()
    log = open(workdir / "dashboard.log", "wb")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen([sys.executable, "-m", "dashboard", "--run-dir", str(run), "--port", str(port),
                             "--poll", "0.5"], cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env)
    log.close()
    return proc, port


def stop_process(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after 10 s; reaped."""
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def tail_lines(text: str, n: int = 3) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return " / ".join(lines[-n:])

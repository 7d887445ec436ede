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
import shutil
import signal
import subprocess
import sys
import threading
import time
import zlib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from harness.engines import engine_under_test
from harness.gate import KILL_SLACK, Gate
from harness.reaction import react
from proxy.formats import frames
from proxy.formats.checkpoint import (FOOTER_BYTES as FOOTER, TRAILER_FIXED_BYTES as TRAILER_FIXED, body_bytes,
                                     checkpoint_files, checkpoint_step, list_checkpoints, verify_checkpoint)
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


# ---------------------------------------------------------------------------
# engine scenarios


def engine_kill_storm(workdir: Path, model: Model, ckpt_every: int, n_kills: int, modes: dict[str, float],
                      name: str, fault_class: str, ref_every: int | None = None) -> Outcome:
    """SIGKILL a standalone engine at seeded random moments, relaunch with `--resume latest`.

    Modes: "startup" (a few ms after exec: loading, stale-temp cleanup), "step" (right after a
    step event), "ckpt" (right after a ckpt event), "write" (after the step event of a
    checkpointing step, at a random offset within the measured write time: inside the write).
    After every kill: every step_*.bin verifies, no valid one vanished. At every launch: it
    resumes from the newest valid checkpoint and no temp file survives. Every step event
    (including replays) equals the uninterrupted run's; at the end the checkpoints are
    byte-identical to the uninterrupted run's.
    """
    out = Outcome(fault_class, name)
    rng = rng_for(name)
    shard = make_shard(workdir / "data.tok", model.vocab)
    ref_dir = workdir / "ref"
    rc, ref = run_standalone(model, shard, ref_dir, ckpt_every if ref_every is None else ref_every, resume=None)
    if rc != 0:
        out.fail(f"uninterrupted run exited {rc}: {tail_lines(ref.stderr)}")
        return out.close()
    ref_steps = {int(e["step"]): step_record(e) for e in ref.of("step")}
    write_ms = max([float(e["ms"]) for e in ref.of("ckpt")] + [5.0])
    ck = workdir / "ck"
    watch = CkptWatch(ck)
    kills = launches = 0
    stale: set[str] = set()
    mode_names, weights = zip(*modes.items())
    while True:
        expect_path, expect_step = watch.newest_valid()
        p = start_standalone(model, shard, ck, ckpt_every)
        launches += 1
        mode = rng.choices(mode_names, weights)[0] if kills < n_kills and expect_step < model.steps - 1 else None
        if mode == "startup":
            time.sleep(rng.uniform(0.0, 0.03))
        else:
            ready = p.wait_event("ready", TIMEOUT)
            if ready is None:
                out.fail(f"launch {launches}: no ready event (rc {p.wait()}): {tail_lines(p.stderr)}")
                return out.close()
            if int(ready["step"]) != expect_step or not same_path(ready["resumed_from"], expect_path):
                out.fail(f"launch {launches}: resumed at step {ready['step']} from {ready['resumed_from']}, "
                         f"expected the newest valid checkpoint {expect_path} (step {expect_step})")
            out.end_fault()  # the previous kill is judged once this launch resumed correctly
        if mode is None:
            try:
                rc = p.finish(TIMEOUT)
            except Hang as exc:
                out.fail(f"final launch: {exc}")
                return out.close()
            if rc != 0 or not p.of("exit") or p.of("exit")[-1]["reason"] != "done":
                out.fail(f"final launch exited {rc} (events {[e.kind for e in p.events[-3:]]}): {tail_lines(p.stderr)}")
            _check_steps(p, ref_steps, out, f"launch {launches}")
            _check_temps_removed(p, stale, out, f"launch {launches}")
            break
        if mode == "step":
            target = min(model.steps - 1, expect_step + rng.randint(1, 2 * ckpt_every))
            p.wait_event("step", TIMEOUT, lambda e: int(e["step"]) >= target)
            time.sleep(rng.uniform(0.0, 0.004))
        elif mode == "ckpt":
            p.wait_event("ckpt", TIMEOUT, lambda e: int(e["step"]) > expect_step)
        elif mode == "write":
            first = (expect_step // ckpt_every + 1 + rng.randint(0, 1)) * ckpt_every
            target = min(first, (model.steps - 1) // ckpt_every * ckpt_every)
            if target <= expect_step:
                target = expect_step + 1
            p.wait_event("step", TIMEOUT, lambda e: int(e["step"]) >= target)
            time.sleep(rng.uniform(0.0, 1.3 * write_ms / 1000.0))
        killed = p.send_signal(signal.SIGKILL)
        rc = p.wait()
        for e in p.of("ckpt"):
            write_ms = max(write_ms, float(e["ms"]))
        _check_steps(p, ref_steps, out, f"launch {launches}")
        if mode != "startup":
            _check_temps_removed(p, stale, out, f"launch {launches}")
        stale = set(temps_in(ck))  # no engine runs now: every temp file is stale
        if rc != -signal.SIGKILL or not killed:
            out.bump("launches that ended before the kill landed")
            if rc != 0:
                out.fail(f"launch {launches} exited {rc} before it was killed: {tail_lines(p.stderr)}")
            continue
        kills += 1
        out.begin_fault()
        out.bump(f"kills: {mode}")
        if stale:
            out.bump("kills that landed inside a checkpoint write (temp file left)")
        watch.check(out, f"after kill {kills} ({mode})")
        _, newest = watch.newest_valid()
        out.steps_lost += max(0, p.last_step(expect_step) - newest)
    out.note("launches", launches)
    compared = compare_files(ref_dir, ck, out, what="final: ")
    final = f"step_{model.steps:06d}.bin"
    if not (ck / final).exists():
        out.fail(f"final checkpoint {final} missing", data_lost=1)
    elif ref_every is not None:
        compare_files(ref_dir, ck, out, names=[final], what="final: ")
    if ref_every is None:
        ref_names = sorted(p.name for p in list_checkpoints(ref_dir))
        got_names = sorted(p.name for p in list_checkpoints(ck))
        if ref_names != got_names:
            out.fail(f"final: checkpoint set differs from the uninterrupted run's: "
                     f"missing {sorted(set(ref_names) - set(got_names))}, extra {sorted(set(got_names) - set(ref_names))}",
                     data_lost=len(set(ref_names) - set(got_names)))
    out.note("checkpoints compared byte for byte", compared)
    return out.close()


def _check_temps_removed(p: Proc, stale: set, out: Outcome, where: str) -> None:
    """An engine that got as far as `ready` removed every stale temp file (and said so on stderr)."""
    for name in sorted(stale):
        if not any("removed stale temp file" in ln and ln.endswith("/" + name) for ln in p.stderr_lines()):
            out.fail(f"{where}: stale temp file {name} was not removed at startup (stderr: {tail_lines(p.stderr)!r})")


def _check_steps(p: Proc, ref_steps: dict, out: Outcome, where: str) -> None:
    if p.bad_lines:
        out.fail(f"{where}: stdout lines that are not events: {p.bad_lines[:3]}")
    for e in p.of("step"):
        s = int(e["step"])
        if ref_steps.get(s) != step_record(e):
            out.fail(f"{where}: step {s} differs from the uninterrupted run: {step_record(e)} != {ref_steps.get(s)}",
                     data_lost=1)


# ---------------------------------------------------------------------------
# corrupted checkpoints


def checkpoint_regions(raw: bytes) -> dict[str, tuple[int, int]]:
    """Byte ranges [begin, end) of every region of a checkpoint with a trailer (docs/FORMATS.md)."""
    n = int(np.frombuffer(raw, "<i4", 1, 4)[0])
    body = body_bytes(n)
    size = len(raw)
    return {
        "step": (0, 4), "n_params": (4, 8),
        "weights": (8, 8 + 4 * n), "adam_m": (8 + 4 * n, 8 + 8 * n), "adam_v": (8 + 8 * n, body),
        "trailer fixed part": (body, body + TRAILER_FIXED), "trailer meta JSON": (body + TRAILER_FIXED, size - FOOTER),
        "footer trailer_bytes": (size - FOOTER, size - FOOTER + 8), "footer crc": (size - 16, size - 12),
        "footer end magic": (size - 8, size),
    }


# The reasons a rejection may give for each corruption (the engine's and proxy.formats.checkpoint's wording).
SIZE_REASONS = ("truncated", "does not match", "not a microgpt checkpoint", "no end magic", "trailer truncated")
REGION_REASONS = {
    "step": ("checksum mismatch", "not a microgpt checkpoint"),  # the sign bit makes the step negative
    "n_params": SIZE_REASONS,
    "weights": ("checksum mismatch",), "adam_m": ("checksum mismatch",), "adam_v": ("checksum mismatch",),
    "trailer fixed part": ("checksum mismatch",), "trailer meta JSON": ("checksum mismatch",),
    "footer trailer_bytes": ("does not match",), "footer crc": ("checksum mismatch",),
    "footer end magic": ("no end magic",),
}


def flip_bit(raw: bytes, bit: int) -> bytes:
    b = bytearray(raw)
    b[bit // 8] ^= 1 << (bit % 8)
    return bytes(b)


def with_crc(raw: bytes) -> bytes:
    """Recompute the footer CRC (so that only a size or shape check can catch a change)."""
    b = bytearray(raw)
    b[-16:-12] = (zlib.crc32(bytes(b[:-16])) & 0xFFFFFFFF).to_bytes(4, "little")
    return bytes(b)


@dataclass
class Corruption:
    name: str
    data: bytes
    reasons: tuple  # expected reason words; empty: loads as a bare ANDREA file (with a warning)
    latest_fallback: bool = True  # under --resume latest the engine skips it and loads the older one


def corruptions(valid: bytes, other_shape: bytes, rng: random.Random, flips_per_region: int = 2,
                truncations: int = 3) -> list[Corruption]:
    """Every corruption of `valid` (a step-4 checkpoint of TINY) the scenario tries."""
    regions = checkpoint_regions(valid)
    n = int(np.frombuffer(valid, "<i4", 1, 4)[0])
    body = body_bytes(n)
    cases = []
    for region, (begin, end) in regions.items():
        for _ in range(flips_per_region):
            bit = rng.randrange(begin * 8, end * 8)
            cases.append(Corruption(f"bit {bit - begin * 8} of {region} flipped", flip_bit(valid, bit),
                                    REGION_REASONS[region]))
    lengths = {0, 7, body - 1, body + 1, len(valid) - 1}
    while len(lengths) < 5 + truncations:
        cut = rng.randrange(0, len(valid))
        if cut != body:  # exactly the body is a bare ANDREA file, which loads by design
            lengths.add(cut)
    for cut in sorted(lengths):
        cases.append(Corruption(f"truncated to {cut} of {len(valid)} bytes", valid[:cut], SIZE_REASONS))
    # n_params one more, CRC recomputed: only the size check can catch it
    wrong_n = bytearray(valid)
    wrong_n[4:8] = (n + 1).to_bytes(4, "little")
    cases.append(Corruption("n_params + 1 (CRC recomputed)", with_crc(bytes(wrong_n)), SIZE_REASONS))
    # n_params 32 fewer and every region cut to match, CRC recomputed: the trailer's shape disagrees
    k = n - 32
    f = np.frombuffer(valid, "<f4", 3 * n, 8)
    short = (np.array([4, k], "<i4").tobytes() + f[:k].tobytes() + f[n:n + k].tobytes() + f[2 * n:2 * n + k].tobytes()
             + valid[body:])
    cases.append(Corruption("n_params 32 fewer, consistent sizes (CRC recomputed)", with_crc(short),
                            ("does not match the shape",)))
    cases.append(Corruption("a checkpoint of another model shape (dim 16)", other_shape, ("shape mismatch",),
                            latest_fallback=False))
    cases.append(Corruption("bare ANDREA file of another model shape", other_shape[:body_bytes(int(
        np.frombuffer(other_shape, "<i4", 1, 4)[0]))], ("shape mismatch",), latest_fallback=False))
    foreign_rng = np.random.default_rng(rng.randrange(2**32))
    cases.append(Corruption("foreign file: empty", b"", SIZE_REASONS))
    cases.append(Corruption("foreign file: text", b"this is not a checkpoint\n" * 20, SIZE_REASONS))
    cases.append(Corruption("foreign file: 4 KiB of random bytes", foreign_rng.bytes(4096), SIZE_REASONS))
    cases.append(Corruption("foreign file: a PNG header", b"\x89PNG\r\n\x1a\n" + foreign_rng.bytes(600), SIZE_REASONS))
    shard = b"MGPTTOKS" + (1).to_bytes(4, "little") + (64).to_bytes(4, "little") + (100).to_bytes(8, "little") \
        + bytes(8) + foreign_rng.integers(0, 64, 100, dtype="<u2").tobytes()
    cases.append(Corruption("foreign file: a token shard", shard, SIZE_REASONS))
    cases.append(Corruption("bare ANDREA file (no trailer)", valid[:body], ()))
    return cases


def engine_corruption(workdir: Path, name: str = "engine-corrupt-checkpoints",
                      fault_class: str = "corrupted checkpoint (engine loader)") -> Outcome:
    """Corrupt the newest of two checkpoints in every documented way; resume explicitly and with latest.

    Rejected files: exit 3 with one line naming the reason, the file untouched, nothing written;
    `--resume latest` skips it with a warning and resumes from the older one, and the run ends
    byte-identical to the uninterrupted run. A bare ANDREA file loads with a warning. The Python
    verifier (the proxy's) rejects the same files.
    """
    out = Outcome(fault_class, name)
    rng = rng_for(name)
    model = TINY.but(steps=6)
    shard = make_shard(workdir / "data.tok", model.vocab)
    ref_dir = workdir / "ref"
    rc, ref = run_standalone(model, shard, ref_dir, 2, resume=None)
    other_dir = workdir / "other"
    rc2, _ = run_standalone(model.but(dim=16, steps=4), shard, other_dir, 0, resume=None)
    if rc or rc2:
        out.fail(f"reference runs failed: {rc} {rc2} {tail_lines(ref.stderr)}")
        return out.close()
    valid = (ref_dir / "step_000004.bin").read_bytes()
    final_ref = (ref_dir / "step_000006.bin").read_bytes()
    cases = corruptions(valid, (other_dir / "step_000004.bin").read_bytes(), rng)
    kinds: dict[str, int] = {}
    for case in cases:
        kind = ("bit flip" if case.name.startswith("bit ") else "truncation" if case.name.startswith("truncated")
                else "foreign file" if case.name.startswith("foreign") else case.name)
        kinds[kind] = kinds.get(kind, 0) + 1
    out.note("cases", kinds)
    out.note("regions with bit flips", sorted(checkpoint_regions(valid)))
    for i, case in enumerate(cases):
        out.begin_fault()
        where = f"[{case.name}]"
        # the proxy's verifier
        d = workdir / f"case{i:02d}"
        reason = verify_checkpoint(_plant(d / "ck", ref_dir, case.data))
        if case.reasons and (reason is None or not any(r in reason for r in case.reasons)) \
                and case.latest_fallback:
            out.fail(f"{where} proxy.formats.checkpoint.verify_checkpoint said {reason!r}, expected one of {case.reasons}")
        # explicit --resume FILE
        target = d / "ck" / "step_000004.bin"
        rc, p = run_standalone(model, shard, d / "ck", 2, resume=target)
        lines = p.stderr_lines()
        if case.reasons:
            if rc != 3:
                out.fail(f"{where} --resume FILE exited {rc}, expected 3; stderr {lines[-3:]}")
            errors = [ln for ln in lines if ln.startswith("microgpt: error:")]
            others = [ln for ln in lines if ln not in errors and not ln.startswith("microgpt: warning:")]
            if others or len(errors) != 1 or not any(r in errors[0] for r in case.reasons):
                out.fail(f"{where} --resume FILE: expected one error line naming one of {case.reasons}; got {lines}")
            if target.read_bytes() != case.data:
                out.fail(f"{where} the rejected file was modified")
            if (d / "ck" / "step_000006.bin").exists() or len(p.of("error")) != 1:
                out.fail(f"{where} a rejected resume wrote a checkpoint or did not emit one error event")
        else:
            ready = p.of("ready")
            if rc != 0 or not ready or int(ready[0]["step"]) != 4 or "no trailer" not in p.stderr:
                out.fail(f"{where} bare file: exit {rc}, ready {ready[:1]}, stderr {lines}")
            elif (d / "ck" / "step_000006.bin").read_bytes() != final_ref:
                out.fail(f"{where} run resumed from the bare file differs from the uninterrupted run", data_lost=1)
        # --resume latest: skip and fall back to step 2 (or load the bare file)
        if not case.latest_fallback:
            continue
        d2 = workdir / f"case{i:02d}-latest"
        _plant(d2 / "ck", ref_dir, case.data)
        rc, p = run_standalone(model, shard, d2 / "ck", 2, resume="latest")
        ready = p.of("ready")
        want = 4 if not case.reasons else 2
        if rc != 0 or not ready or int(ready[0]["step"]) != want or \
                not same_path(ready[0]["resumed_from"], d2 / "ck" / f"step_{want:06d}.bin"):
            out.fail(f"{where} --resume latest: exit {rc}, ready {ready[0].fields if ready else None}, expected "
                     f"a resume from step {want}; stderr {p.stderr_lines()[-3:]}")
            continue
        if case.reasons and not any("skipping" in ln and any(r in ln for r in case.reasons) for ln in p.stderr_lines()):
            out.fail(f"{where} --resume latest skipped the file without a warning naming the reason: "
                     f"{p.stderr_lines()}")
        out.steps_lost += 4 - want
        got = d2 / "ck" / "step_000006.bin"
        if not got.exists() or got.read_bytes() != final_ref:
            out.fail(f"{where} --resume latest: the run's final checkpoint differs from the uninterrupted run's",
                     data_lost=1)
        shutil.rmtree(d, ignore_errors=True)
        shutil.rmtree(d2, ignore_errors=True)
    return out.close()


def _plant(ck: Path, ref_dir: Path, newest: bytes) -> Path:
    """A checkpoint dir holding the reference step 2 and `newest` as step 4."""
    ck.mkdir(parents=True, exist_ok=True)
    shutil.copy(ref_dir / "step_000002.bin", ck / "step_000002.bin")
    target = ck / "step_000004.bin"
    target.write_bytes(newest)
    return target


# ---------------------------------------------------------------------------
# full disk and write errors


def try_mount_tmpfs(mountpoint: Path, size_bytes: int) -> str | None:
    """Mount a tmpfs of `size_bytes`; None on success, else why not."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or not shutil.which("mount"):
        return "not root, or no mount(8)"
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(mountpoint)],
                       capture_output=True, text=True)
    return None if r.returncode == 0 else (r.stderr.strip() or f"mount exited {r.returncode}")


def umount(mountpoint: Path) -> None:
    subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True)


def _check_failed_save(p: Proc, rc: int, ck: Path, before: dict, out: Outcome, where: str, strerror: str) -> None:
    """A checkpoint save that failed: exit 5, one clear line, old checkpoints intact, nothing partial."""
    lines = p.stderr_lines()
    if rc != 5:
        out.fail(f"{where}: exit {rc}, expected 5 (I/O); stderr {lines[-3:]}")
    if len(lines) != 1 or not lines[0].startswith("microgpt: error: checkpoint at step") or strerror not in lines[0]:
        out.fail(f"{where}: expected one line 'microgpt: error: checkpoint at step N failed (... {strerror})'; "
                 f"got {lines}")
    errors = p.of("error")
    if len(errors) != 1 or int(errors[0]["code"]) != 5:
        out.fail(f"{where}: expected one error event with code 5; got {[e.fields for e in errors]}")
    now = {q.name: q.read_bytes() for q in list_checkpoints(ck)}
    for name, data in before.items():
        if now.get(name) != data:
            out.fail(f"{where}: {name} changed or vanished after the failed save", data_lost=1)
    extra = sorted(set(now) - set(before))
    if extra:
        out.fail(f"{where}: a failed save left step files a loader would take: {extra}")
    if temps_in(ck):
        out.fail(f"{where}: temp files left behind: {temps_in(ck)}")


def engine_disk_full_tmpfs(workdir: Path, name: str = "engine-disk-full-tmpfs",
                           fault_class: str = "full disk during a checkpoint (engine)") -> Outcome | str:
    """The checkpoint directory on a tmpfs that holds five checkpoints: the sixth save fails with
    ENOSPC. Then the files are copied to a roomy disk and the run resumes to the end, byte-identical."""
    out = Outcome(fault_class, name)
    model = TINY.but(steps=10)
    shard = make_shard(workdir / "data.tok", model.vocab)
    ref_dir = workdir / "ref"
    rc, ref = run_standalone(model, shard, ref_dir, 1, resume=None)
    if rc:
        out.fail(f"uninterrupted run exited {rc}")
        return out.close()
    size = (ref_dir / "step_000001.bin").stat().st_size
    pages = -(-size // 4096)
    mnt = workdir / "mnt"
    why = try_mount_tmpfs(mnt, (5 * pages + 1) * 4096)
    if why is not None:
        return f"cannot mount a tmpfs here ({why})"
    try:
        ck = mnt / "ck"
        ck.mkdir()
        out.begin_fault()
        rc, p = run_standalone(model, shard, ck, 1, resume="latest")
        saved = [int(e["step"]) for e in p.of("ckpt")]
        before = {q.name: q.read_bytes() for q in list_checkpoints(ck)}
        if not saved or set(before) != {f"step_{s:06d}.bin" for s in saved}:
            out.fail(f"checkpoints on disk {sorted(before)} do not match the ckpt events {saved}")
        _check_failed_save(p, rc, ck, before, out, "save on a full tmpfs", "No space left on device")
        out.steps_lost += max(0, p.last_step() - max(saved, default=0))
        out.note("checkpoints that fit before the disk was full", len(saved))
        compare_files(ref_dir, ck, out, what="before the full disk: ")
        roomy = workdir / "roomy"
        shutil.copytree(ck, roomy)
    finally:
        umount(mnt)
    rc, p = run_standalone(model, shard, roomy, 1, resume="latest")
    ready = p.of("ready")
    if rc != 0 or not ready or int(ready[0]["step"]) != max(saved, default=0):
        out.fail(f"resume after freeing space: exit {rc}, ready {ready[:1]}; {p.stderr_lines()[-3:]}")
    compare_files(ref_dir, roomy, out, names=[f"step_{model.steps:06d}.bin"], what="after freeing space: ")
    return out.close()


def engine_write_error_rlimit(workdir: Path, n_trials: int = 3, name: str = "engine-write-error-rlimit",
                              fault_class: str = "write error during a checkpoint (engine, EFBIG)") -> Outcome:
    """RLIMIT_FSIZE below one checkpoint: the next save fails with EFBIG partway (seeded limits,
    including 0). Exit 5, one line, the previous checkpoints intact, no partial file; a relaunch
    without the limit resumes from the newest valid checkpoint and ends byte-identical."""
    out = Outcome(fault_class, name)
    rng = rng_for(name)
    model = TINY.but(steps=8)
    shard = make_shard(workdir / "data.tok", model.vocab)
    ref_dir = workdir / "ref"
    rc, _ = run_standalone(model, shard, ref_dir, 2, resume=None)
    size = (ref_dir / "step_000002.bin").stat().st_size
    limits = [0] + [rng.randrange(1, size) for _ in range(n_trials - 1)]
    for i, limit in enumerate(limits):
        ck = workdir / f"trial{i}"
        ck.mkdir()
        for s in (2, 4):
            shutil.copy(ref_dir / f"step_{s:06d}.bin", ck)
        before = {q.name: q.read_bytes() for q in list_checkpoints(ck)}
        out.begin_fault()
        rc, p = run_standalone(model, shard, ck, 2, resume="latest", preexec_fn=fsize_limit(limit))
        _check_failed_save(p, rc, ck, before, out, f"RLIMIT_FSIZE={limit}", "File too large")
        out.steps_lost += max(0, p.last_step(4) - 4)
        rc, p = run_standalone(model, shard, ck, 2, resume="latest")
        ready = p.of("ready")
        if rc != 0 or not ready or int(ready[0]["step"]) != 4:
            out.fail(f"RLIMIT_FSIZE={limit}: relaunch without the limit: exit {rc}, ready {ready[:1]}")
        compare_files(ref_dir, ck, out, names=["step_000006.bin", "step_000008.bin"], what=f"limit {limit}: ")
    out.note("RLIMIT_FSIZE values (bytes)", limits)
    out.note("checkpoint size (bytes)", size)
    return out.close()


# ---------------------------------------------------------------------------
# signals


def engine_sigterm_in_write(workdir: Path, n_trials: int = 4, name: str = "engine-sigterm-in-write",
                            fault_class: str = "SIGTERM during a checkpoint write (engine)") -> Outcome:
    """SIGTERM at a random offset inside a 22 MB checkpoint write: the write completes, the engine
    exits 0 with `exit` reason signal and a valid checkpoint of its last step; the relaunches end
    byte-identical to the uninterrupted run."""
    out = Outcome(fault_class, name)
    rng = rng_for(name)
    model = LARGE.but(steps=2 * n_trials + 2)
    shard = make_shard(workdir / "data.tok", model.vocab)
    ref_dir = workdir / "ref"
    rc, ref = run_standalone(model, shard, ref_dir, 0, resume=None)
    ref_steps = {int(e["step"]): step_record(e) for e in ref.of("step")}
    write_ms = max([float(e["ms"]) for e in ref.of("ckpt")] + [20.0])
    ck = workdir / "ck"
    watch = CkptWatch(ck)
    for trial in range(n_trials):
        _, start = watch.newest_valid()
        p = start_standalone(model, shard, ck, 1)
        target = start + rng.randint(1, 2)
        p.wait_event("step", TIMEOUT, lambda e: int(e["step"]) >= target)
        time.sleep(rng.uniform(0.0, 0.9 * write_ms / 1000.0))
        in_write = bool(temps_in(ck))
        out.begin_fault()
        p.send_signal(signal.SIGTERM)
        try:
            rc = p.finish(TIMEOUT)
        except Hang as exc:
            out.fail(f"trial {trial}: {exc}")
            continue
        out.bump("SIGTERMs that landed inside a checkpoint write (temp file present)", int(in_write))
        exits = p.of("exit")
        last = p.last_step(start)
        if rc != 0 or not exits or exits[-1]["reason"] != "signal" or int(exits[-1]["step"]) != last:
            out.fail(f"trial {trial}: exit {rc}, exit events {[e.fields for e in exits]}, last step {last}; "
                     f"{p.stderr_lines()[-3:]}")
        ckpts = [int(e["step"]) for e in p.of("ckpt")]
        if not ckpts or ckpts[-1] != last:
            out.fail(f"trial {trial}: the last checkpoint event is for step {ckpts[-1:]} but step {last} was trained")
        watch.check(out, f"after SIGTERM {trial}")
        if watch.newest_valid()[1] != last:
            out.fail(f"trial {trial}: newest valid checkpoint is step {watch.newest_valid()[1]}, not {last}")
        if temps_in(ck):
            out.fail(f"trial {trial}: temp files left after a clean exit: {temps_in(ck)}")
        _check_steps(p, ref_steps, out, f"trial {trial}")
    write_ms = max([write_ms] + [float(e["ms"]) for e in p.of("ckpt")])
    out.note("checkpoint write time (ms, max seen)", round(write_ms, 1))
    rc, p = run_standalone(model, shard, ck, 1)
    if rc != 0:
        out.fail(f"final relaunch exited {rc}: {p.stderr_lines()[-3:]}")
    _check_steps(p, ref_steps, out, "final relaunch")
    compare_files(ref_dir, ck, out, names=[f"step_{model.steps:06d}.bin"], what="final: ")
    return out.close()


def engine_sigusr1_storm(workdir: Path, n_signals: int = 200, name: str = "engine-sigusr1-storm",
                         fault_class: str = "SIGUSR1 storm (engine)") -> Outcome:
    """200 SIGUSR1 at random short intervals while training: training goes on, every checkpoint
    verifies, every step's loss equals an unsignalled run's, the final checkpoint is byte-identical,
    and a run resumed from a randomly chosen SIGUSR1 checkpoint ends byte-identical too."""
    out = Outcome(fault_class, name)
    rng = rng_for(name)
    model = TINY.but(steps=800)  # long enough that the storm ends well before training does
    shard = make_shard(workdir / "data.tok", model.vocab)
    ref_dir = workdir / "ref"
    rc, ref = run_standalone(model, shard, ref_dir, 0, resume=None)
    ref_steps = {int(e["step"]): step_record(e) for e in ref.of("step")}
    ck = workdir / "ck"
    p = start_standalone(model, shard, ck, 0, resume=None)
    p.wait_event("step", TIMEOUT)
    sent = 0
    while sent < n_signals and p.alive():
        if not p.send_signal(signal.SIGUSR1):
            break
        sent += 1
        out.begin_fault()
        time.sleep(rng.uniform(0.0, 0.002))
    try:
        rc = p.finish(TIMEOUT)
    except Hang as exc:
        out.fail(str(exc))
        return out.close()
    if sent < n_signals:
        out.fail(f"only {sent} signals were delivered before the run ended (the run is too short for the storm)")
    if rc != 0 or not p.of("exit") or p.of("exit")[-1]["reason"] != "done":
        out.fail(f"exit {rc}, last events {[e.kind for e in p.events[-3:]]}; {p.stderr_lines()[-3:]}")
    steps = [int(e["step"]) for e in p.of("step")]
    if steps != list(range(1, model.steps + 1)):
        out.fail(f"training did not go on step by step: {len(steps)} step events")
    _check_steps(p, ref_steps, out, "signalled run")
    ckpts = [e for e in p.of("ckpt") if e["reason"] == "sigusr1"]
    out.note("SIGUSR1 sent", sent)
    out.note("checkpoints written for them", len(ckpts))
    watch = CkptWatch(ck)
    watch.check(out, "after the storm")
    compare_files(ref_dir, ck, out, names=[f"step_{model.steps:06d}.bin"], what="final: ")
    if ckpts:
        pick = rng.choice(ckpts)
        d = workdir / "resumed"
        d.mkdir()
        shutil.copy(ck / f"step_{int(pick['step']):06d}.bin", d)
        rc, p2 = run_standalone(model, shard, d, 0)
        _check_steps(p2, ref_steps, out, f"resumed from SIGUSR1 checkpoint {pick['step']}")
        compare_files(ref_dir, d, out, names=[f"step_{model.steps:06d}.bin"], what="resumed: ")
        out.note("SIGUSR1 checkpoint resumed and compared", int(pick["step"]))
    # The storm counts as one fault per signal; any failure above fails them all.
    if out.failures:
        out.survived = 0
    return out.close()


def engine_sigstop(workdir: Path, n_stops: int = 3, name: str = "engine-sigstop",
                   fault_class: str = "hung engine (SIGSTOP)") -> Outcome:
    """SIGSTOP a standalone engine for a while, then SIGCONT: training resumes where it was and the
    result is byte-identical (the proxy-level scenario is the one that detects and kills a hang)."""
    out = Outcome(fault_class, name)
    rng = rng_for(name)
    model = TINY.but(steps=60)
    shard = make_shard(workdir / "data.tok", model.vocab)
    ref_dir = workdir / "ref"
    rc, ref = run_standalone(model, shard, ref_dir, 5, resume=None)
    ref_steps = {int(e["step"]): step_record(e) for e in ref.of("step")}
    ck = workdir / "ck"
    p = start_standalone(model, shard, ck, 5, resume=None)
    targets = sorted(rng.sample(range(2, model.steps - 5), n_stops))
    for t in targets:
        p.wait_event("step", TIMEOUT, lambda e: int(e["step"]) >= t)
        out.begin_fault()
        p.send_signal(signal.SIGSTOP)
        time.sleep(rng.uniform(0.1, 0.4))
        p.send_signal(signal.SIGCONT)
    rc = p.finish(TIMEOUT)
    if rc != 0:
        out.fail(f"exit {rc} after SIGSTOP/SIGCONT: {p.stderr_lines()[-3:]}")
    _check_steps(p, ref_steps, out, "stopped and continued")
    compare_files(ref_dir, ck, out, what="final: ")
    if out.failures:
        out.survived = 0
    return out.close()


# ---------------------------------------------------------------------------
# frames sent straight to the engine


FUZZ_MODEL = Model(vocab=64, ctx=8, dim=16, layers=1, heads=2, batch=2, steps=10)


def proxy_mode_argv(model: Model, ckpt_dir: Path) -> list[str]:
    return [str(ENGINE.path), *engine_args(ckpt_dir, ckpt_every=0, settings=model.flags())]


def feed_engine(workdir: Path, data: bytes, timeout: float = 20.0) -> tuple[int | None, list[str]]:
    """Send `data` to a fresh engine in proxy mode, then EOF. Returns (exit code, broken rules).

    Rules: it ends within `timeout` (no hang), by exit and not by a signal (no crash), with 0 or 4;
    every stdout line is an event; on 4: exactly one stderr line ('microgpt: error: ...') and one
    `error` event; on 0: no error line; every checkpoint file it left verifies and was announced.
    """
    ck = workdir / "ck"
    shutil.rmtree(ck, ignore_errors=True)
    proc = subprocess.Popen(proxy_mode_argv(FUZZ_MODEL, ck), cwd=str(workdir), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        stdout, stderr = proc.communicate(data, timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return None, [f"hang: no exit within {timeout:.0f}s"]
    rc = proc.returncode
    problems = []
    lines = [ln for ln in stderr.decode("utf-8", "replace").splitlines() if ln.strip()]
    events = []
    for ln in stdout.decode("utf-8", "replace").splitlines():
        if not ln.strip():
            continue
        try:
            events.append(frames.parse_event(ln))
        except ValueError:
            problems.append(f"stdout line is not an event: {ln[:120]!r}")
    if rc < 0:
        problems.append(f"killed by signal {-rc} (a crash)")
    elif rc not in (0, 4):
        problems.append(f"exit {rc}, expected 0 or 4; stderr {lines[-3:]}")
    if any("Traceback" in ln or "core dumped" in ln for ln in lines):
        problems.append(f"stderr shows a crash: {lines[-3:]}")
    errors = [e for e in events if e.kind == "error"]
    if rc == 4:
        if len(lines) != 1 or not lines[0].startswith("microgpt: error:"):
            problems.append(f"exit 4 without exactly one 'microgpt: error:' line: {lines}")
        if len(errors) != 1 or events[-1].kind != "error":
            problems.append(f"exit 4 with {len(errors)} error events (the last event: "
                            f"{events[-1].kind if events else None})")
    elif rc == 0:
        if errors or any("error" in ln for ln in lines):
            problems.append(f"exit 0 but errors reported: {lines}")
    announced = {Path(e["path"]).name for e in events if e.kind == "ckpt"}
    for f in list_checkpoints(ck):
        if f.name not in announced:
            problems.append(f"{f.name} written without a ckpt event")
        reason = verify_checkpoint(f)
        if reason:
            problems.append(f"{f.name} does not verify: {reason}")
    return rc, problems


# ---------------------------------------------------------------------------
# the proxy: a tiny experiment, its uninterrupted reference run, and helpers


FAULT_EXPERIMENT = {
    "name": "FAULTS-TINY",
    "model": {"vocab": 300, "ctx": 16, "dim": 16, "layers": 1, "heads": 2},
    "train": {"batch": 4, "grad_accum": 1, "max_steps": 48, "lr": 0.003, "min_lr": 0.0003, "warmup": 4,
              "seed": 1337, "ckpt_every": 4, "eval_every": 16, "eval_rows": 4, "sample_every": 16, "lag": 2,
              "keep_last": 1000, "milestone_every": 0, "threads": 1},
    "bandit": {"policy": "ucb1"},
    "arms": [{"name": "dots", "sources": [{"file": "dots.txt"}]},
             {"name": "semis", "sources": [{"file": "semis.txt"}], "floor": 0.1}],
    "samples": {"prompts": ["alpha "], "max_new": 8, "temperature": 0.8, "top_k": 10, "count": 1},
}
WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau "
         "upsilon phi chi psi omega").split()


def write_fault_experiment(directory: Path, **train_overrides) -> Path:
    """The experiment file and its two small text corpora (fixed, not seeded: the data never varies)."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(7)
    for fname, end in (("dots.txt", ".\n"), ("semis.txt", ";\n")):
        path = directory / fname
        if not path.exists():
            path.write_text("".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) + end
                                    for _ in range(3000)))
    exp = json.loads(json.dumps(FAULT_EXPERIMENT))
    exp["train"].update(train_overrides)
    path = directory / "experiment.json"
    path.write_text(json.dumps(exp, indent=1))
    return path


@dataclass
class ProxyEnv:
    root: Path
    experiment: Path
    cache: Path
    ref: Path  # the uninterrupted run directory
    max_steps: int = FAULT_EXPERIMENT["train"]["max_steps"]
    ckpt_every: int = FAULT_EXPERIMENT["train"]["ckpt_every"]
    ref_seconds: float = 0.0

    def argv(self, run_dir: Path, *extra, experiment: Path | None = None, engine: str | None = None) -> list[str]:
        return [sys.executable, "-m", "proxy", "run", str(experiment or self.experiment), "--run-dir", str(run_dir),
                "--no-dashboard", "--cache-dir", str(self.cache), "--engine", engine or ENGINE.flag,
                "--restart-backoff", "0.05", *map(str, extra)]

    def start(self, run_dir: Path, *extra, preexec_fn=None, **kw) -> Proc:
        """`python -m proxy run` in its own process group (so the whole group can be killed)."""
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        return Proc(self.argv(run_dir, *extra, **kw), cwd=REPO, new_session=True, events=False, env=env,
                    preexec_fn=preexec_fn)

    def run(self, run_dir: Path, *extra, timeout: float = 300.0, **kw) -> tuple[int, Proc]:
        p = self.start(run_dir, *extra, **kw)
        return p.finish(timeout), p


def prepare_proxy_env(root: Path) -> ProxyEnv:
    """Write the experiment, prepare its data (cached) and run it once, uninterrupted."""
    root.mkdir(parents=True, exist_ok=True)
    exp = write_fault_experiment(root / "exp")
    env = ProxyEnv(root=root, experiment=exp, cache=root / "cache", ref=root / "reference-run")
    t0 = time.monotonic()
    rc, p = env.run(env.ref)
    env.ref_seconds = time.monotonic() - t0
    if rc != 0:
        raise AssertionError(f"the uninterrupted reference run `{' '.join(p.argv)}` exited {rc}:\n"
                             f"{p.stderr[-2000:]}\n{chr(10).join(p.lines[-20:])}")
    return env


@dataclass
class LogView:
    """`.loss.json` read the way FORMATS.md says: complete JSON objects only, last entry per step wins."""
    steps: dict
    evals: dict
    raw: bytes
    bad_lines: list

    @property
    def max_step(self) -> int:
        return max(self.steps, default=0)


def read_log(path: Path, max_segment: int | None = None) -> LogView:
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raw = b""
    steps, evals, bad = {}, {}, []
    for line in raw.split(b"\n"):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            bad.append(line)
            continue
        if not isinstance(obj, dict) or obj.get("type") not in ("step", "eval"):
            bad.append(line)
            continue
        try:
            if max_segment is not None and int(obj.get("segment", 0)) > max_segment:
                continue
            (steps if obj["type"] == "step" else evals)[int(obj["step"])] = obj
        except (KeyError, TypeError, ValueError):
            bad.append(line)
    return LogView(steps, evals, raw, bad)


class LogTail:
    """Follows `.loss.json` by byte offset; `max_step` of complete step entries seen so far."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.offset = 0
        self.partial = b""
        self.max_step = 0
        self.by_segment: dict[int, int] = {}  # segment -> highest step logged
        self.first: dict[int, int] = {}  # segment -> first step logged (its resume step + 1)

    def poll(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        for line in lines:
            try:
                obj = json.loads(line)
                if obj.get("type") == "step":
                    s, seg = int(obj["step"]), int(obj.get("segment", 0))
                    self.max_step = max(self.max_step, s)
                    self.by_segment[seg] = max(self.by_segment.get(seg, 0), s)
                    self.first.setdefault(seg, s)
            except (ValueError, AttributeError, TypeError, KeyError):
                pass

    def wait_new_segment(self, after: int, proc: Proc, timeout: float = TIMEOUT) -> tuple[int, int] | None:
        """(segment, resume step) of the first segment > `after` that logged a step: a segment's first
        entry is the step after the checkpoint it resumed from (.loss.json's `segment` field).
        None if the proxy exits first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.poll()
            new = sorted(seg for seg in self.first if seg > after)
            if new:
                react()
                return new[0], self.first[new[0]] - 1
            if not proc.alive():
                self.poll()
                new = sorted(seg for seg in self.first if seg > after)
                return (new[0], self.first[new[0]] - 1) if new else None
            time.sleep(0.004)
        raise Hang(f"no new engine segment in the log within {timeout:.0f}s")

    def wait_step(self, target: int, proc: Proc, segment: int | None = None, timeout: float = TIMEOUT) -> bool:
        """Until a step entry >= target (of `segment`, if given) is in the log; False if the proxy exits first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            exited = not proc.alive()  # looked at before the log, so that what it logged before exiting counts
            self.poll()
            got = self.by_segment.get(segment, 0) if segment is not None else self.max_step
            if got >= target:
                react()
                return True
            if exited:
                return False
            time.sleep(0.004)
        raise Hang(f"the log did not reach step {target} within {timeout:.0f}s")


def engine_record(run_dir: Path) -> tuple[int, float | None] | None:
    """(pid, create_time) of the engine the proxy launched last (.engine.json)."""
    try:
        rec = json.loads((run_dir / ".engine.json").read_text())
        return int(rec["pid"]), rec.get("create_time")
    except (OSError, ValueError, KeyError, TypeError):
        return None


def engine_alive(rec) -> bool:
    import psutil
    if rec is None:
        return False
    pid, created = rec
    try:
        p = psutil.Process(pid)
        if created is not None and abs(p.create_time() - float(created)) > 0.01:
            return False
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def kill_engine(rec) -> bool:
    """SIGKILL the engine recorded in .engine.json if it is still that process."""
    if not engine_alive(rec):
        return False
    try:
        os.kill(rec[0], signal.SIGKILL)
        return True
    except ProcessLookupError:
        return False


def wait_engine_gone(rec, timeout: float = 90.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not engine_alive(rec):
            return True
        time.sleep(0.02)
    return False


def expected_resume(run_dir: Path, max_segment: int | None = None, phase: int = 0,
                    among: set[str] | None = None) -> int:
    """ARCHITECTURE.md: the newest checkpoint that verifies and whose steps are all in the log. `among`:
    only checkpoints of these names count (those on disk when the proxy chose; by the time a test looks,
    the relaunched engine may have written newer ones)."""
    log = read_log(run_dir / ".loss.json", max_segment)
    for p in list_checkpoints(run_dir / "checkpoints"):
        if among is not None and p.name not in among:
            continue
        s = checkpoint_step(p)
        if verify_checkpoint(p) is None and all(t in log.steps and int(log.steps[t].get("phase", 0)) == phase
                                                for t in range(1, s + 1)):
            return s
    return 0


def first_resume(run_dir: Path, after_segment: int) -> int | None:
    """The step the first segment after `after_segment` resumed from (its first logged step - 1)."""
    firsts: dict[int, int] = {}
    for line in (run_dir / ".loss.json").read_bytes().split(b"\n"):
        try:
            obj = json.loads(line)
            if obj.get("type") == "step" and int(obj.get("segment", 0)) > after_segment:
                seg = int(obj["segment"])
                firsts[seg] = min(firsts.get(seg, 1 << 62), int(obj["step"]))
        except (ValueError, AttributeError, TypeError, KeyError):
            continue
    return firsts[min(firsts)] - 1 if firsts else None


COMPARED_STEP_FIELDS = ("loss", "lr", "grad_norm", "tokens", "arms", "mixture")


def compare_with_reference(env: ProxyEnv, run_dir: Path, out: Outcome, samples_after: int = 0,
                           where: str = "final") -> None:
    """The finished run equals the uninterrupted one: every step entry, every eval, the samples,
    the final checkpoint and every checkpoint both have; no replay mismatch reported."""
    ref, got = read_log(env.ref / ".loss.json"), read_log(run_dir / ".loss.json")
    for s in range(1, env.max_steps + 1):
        a, b = ref.steps.get(s), got.steps.get(s)
        if b is None:
            out.fail(f"{where}: step {s} missing from .loss.json", data_lost=1)
        elif a is None or any(a.get(k) != b.get(k) for k in COMPARED_STEP_FIELDS):
            diff = [k for k in COMPARED_STEP_FIELDS if a is None or a.get(k) != b.get(k)]
            out.fail(f"{where}: step {s} differs from the uninterrupted run in {diff}", data_lost=1)
    for s, a in ref.evals.items():
        b = got.evals.get(s)
        if b is None or (a["loss"], a.get("arms")) != (b["loss"], b.get("arms")):
            out.fail(f"{where}: eval at step {s} {'missing' if b is None else 'differs'}", data_lost=1)
    try:
        state = json.loads((run_dir / ".state.json").read_text())
    except (OSError, ValueError) as exc:
        out.fail(f"{where}: .state.json unreadable after the run: {exc}")
        state = {}
    if state and (state.get("status") != "finished" or int(state.get("replay_mismatch_count") or 0)):
        out.fail(f"{where}: .state.json status {state.get('status')!r}, replay mismatches "
                 f"{state.get('replay_mismatch_count')} {state.get('replay_mismatches', [])[:2]}")
    ref_samples = _samples(env.ref)
    got_samples = _samples(run_dir)
    for s, toks in ref_samples.items():
        if s > samples_after and got_samples.get(s) != toks:
            out.fail(f"{where}: sample audit at step {s} {'missing' if s not in got_samples else 'differs'}",
                     data_lost=1)
    final = f"step_{env.max_steps:06d}.bin"
    if not (run_dir / "checkpoints" / final).exists():
        out.fail(f"{where}: final checkpoint {final} missing", data_lost=1)
    compare_files(env.ref / "checkpoints", run_dir / "checkpoints", out, what=f"{where}: ")


def _samples(run_dir: Path) -> dict:
    try:
        audits = json.loads((run_dir / ".samples.json").read_text())
        return {int(a["step"]): [s["tokens"] for s in a["samples"]] for a in audits}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def no_traceback(p: Proc, out: Outcome, where: str) -> None:
    text = p.stderr
    if "Traceback (most recent call last)" in text:
        tb = text[text.rindex("Traceback (most recent call last)"):].splitlines()
        files = [ln.strip() for ln in tb if ln.strip().startswith("File ")]
        out.fail(f"{where}: the proxy printed a traceback: {tb[-1].strip()} (at {files[-1] if files else '?'})")


def tail_lines(text: str, n: int = 3) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return " / ".join(lines[-n:])


# ---------------------------------------------------------------------------
# proxy scenarios


PROXY_KILL_KINDS = {
    "proxy": "kill -9 of the proxy's process group",
    "engine": "kill -9 of the engine under the proxy",
    "both": "kill -9 of the proxy and the engine together",
}


SHIM_SOURCE = REPO / "tests" / "engine" / "fsync_shim.c"


def build_fsync_shim(directory: Path) -> Path:
    """tests/engine/fsync_shim.c as an LD_PRELOAD library: each fsync of a process that preloads it first
    sleeps MG_TEST_FSYNC_DELAY_MS milliseconds."""
    out = Path(directory) / "fsync_shim.so"
    res = subprocess.run([os.environ.get("CC", "cc"), "-shared", "-fPIC", "-O2", "-o", str(out), str(SHIM_SOURCE),
                          "-ldl"], capture_output=True, text=True)
    if res.returncode != 0:
        raise AssertionError(f"cannot build {SHIM_SOURCE}: {res.stderr}")
    return out


def slow_write_engine(directory: Path, shim: Path, delay_ms: int) -> Path:
    """An executable the proxy can run as its engine (`--engine PATH`): the engine, exec'd (so its pid is
    the one the proxy records and kills) with every fsync delayed, so that a checkpoint's background write
    lasts at least 2 x delay_ms (the file's fsync, then its directory's) while training goes on."""
    path = Path(directory) / "engine-slow-writes.sh"
    path.write_text(f"#!/bin/sh\nexport LD_PRELOAD='{shim}' MG_TEST_FSYNC_DELAY_MS={int(delay_ms)}\n"
                    f"exec '{ENGINE.path}' \"$@\"\n")
    path.chmod(0o755)
    return path


def unannounced_checkpoint(run: Path) -> bool:
    """A step_*.bin newer than the last checkpoint .state.json names (the proxy writes it at every ckpt
    event): a write between its rename and its ckpt event, or an event the proxy never handled."""
    newest = list_checkpoints(run / "checkpoints")
    try:
        announced = checkpoint_step(json.loads((run / ".state.json").read_text()).get("last_checkpoint") or "")
    except (OSError, ValueError, AttributeError):
        announced = None
    return bool(newest) and (checkpoint_step(newest[0]) or 0) > (announced or 0)


def proxy_kill_storm(env: ProxyEnv, workdir: Path, kind: str, n_kills: int, engine: str | None = None,
                     write_s: float | None = None, name: str | None = None, fault_class: str | None = None) -> Outcome:
    """SIGKILL the proxy (its process group), the engine, or both, at seeded random moments (40% of
    them right after a checkpointing step, in or around the write); relaunch the same command when the
    proxy died. Every relaunch resumes from the newest valid checkpoint whose steps are all in
    .loss.json; no valid checkpoint is ever lost; the finished run equals the uninterrupted one.

    The engine runs behind a frame gate: every launch waits at its first step until the storm has
    aimed the next kill (its target depends on where the launch resumed), then trains to at most
    KILL_SLACK steps past the target. However fast the engine, each kill lands at its target or a
    little after, and the run cannot finish before the storm has landed its kills.

    With `write_s` (an engine whose checkpoint writes take about that long, e.g. slow_write_engine),
    every kill lands at a random moment within write_s after a checkpointing step was logged: inside
    the background write, while the engine trains on and before its ckpt event."""
    name = name or f"proxy-kill-{kind}"
    out = Outcome(fault_class or PROXY_KILL_KINDS[kind], name)
    rng = rng_for(name)
    run = workdir / "run"
    watch = CkptWatch(run / "checkpoints")
    tail = LogTail(run / ".loss.json")
    gate = Gate(workdir / "gate", engine or ENGINE.path)
    gate.hold_after(0)
    extra = ("--max-failures", "50")  # kills of the engine are not a crash loop here
    p = env.start(run, *extra, engine=gate.engine_flag)
    procs = [p]
    seen, expected, lost_from, kills, launches = 0, 0, 0, 0, 0
    on_disk: set[str] | None = None  # checkpoints left by the engine just killed (the proxy chooses among them)
    while True:
        launch = gate.wait_launch(launches, p.alive, TIMEOUT)
        if launch is None:
            out.fail(f"the proxy exited {p.wait()} without launching an engine: {tail_lines(p.stderr)}")
            return out.close()
        launches += 1
        target = None
        if kills < n_kills:
            resume, ce = launch.first_step - 1, env.ckpt_every
            # Delays are a few steps' worth at most: a step of this model takes about a
            # millisecond, and the gate holds the engine KILL_SLACK steps past the target.
            if write_s is not None:
                target, delay = (resume // ce + rng.randint(1, 2)) * ce, rng.uniform(0.0, write_s)
            elif rng.random() < 0.4:
                target, delay = (resume // ce + rng.randint(1, 2)) * ce, rng.uniform(0.0, 0.003)
            else:
                target, delay = resume + rng.randint(1, 2 * ce), rng.uniform(0.0, 0.006)
            if target >= env.max_steps - 1:
                out.bump("kills skipped: too close to the end")
                target = None
        if target is None:
            gate.open()
        else:
            gate.hold_after(target + KILL_SLACK)
        got = tail.wait_new_segment(seen, p)
        if got is None:
            out.fail(f"the proxy exited {p.wait()} without training a new segment: {tail_lines(p.stderr)}")
            return out.close()
        seg, resume = got
        if resume != launch.first_step - 1:
            out.fail(f"segment {seg} logged step {resume + 1} first; its engine's first frame was step "
                     f"{launch.first_step}")
        if kind == "engine" and kills:
            expected = expected_resume(run, max_segment=seen, among=on_disk)
            lost_from = read_log(run / ".loss.json", max_segment=seen).max_step
        if resume != expected:
            out.fail(f"segment {seg} resumed from step {resume}; the newest valid checkpoint covered by "
                     f".loss.json is step {expected}")
        out.steps_lost += max(0, lost_from - resume)
        out.end_fault()
        seen = seg
        if target is None:
            break
        if not tail.wait_step(target, p, segment=seg):
            out.fail(f"the proxy exited {p.wait()} before step {target}: {tail_lines(p.stderr)}")
            return out.close()
        time.sleep(delay)
        rec = engine_record(run)
        if not engine_alive(rec):
            out.fail(f".engine.json names {rec}, not a running engine")
            return out.close()
        gate.hold_after(0)  # the next launch waits at its first step for its own target
        kills += 1
        out.begin_fault()
        if kind in ("proxy", "both"):
            p.killpg()
            if kind == "both":
                kill_engine(rec)
            p.wait()
            if not wait_engine_gone(rec):
                out.fail(f"kill {kills}: the orphaned engine pid {rec[0]} did not exit within 90s")
            if temps_in(run / "checkpoints"):
                out.bump("kills that left a checkpoint temp file (inside a write)")
            elif unannounced_checkpoint(run):
                out.bump("kills that left a checkpoint the proxy had not seen announced")
            watch.check(out, f"after kill {kills}")
            no_traceback(p, out, f"killed proxy {kills}")
            lost_from = read_log(run / ".loss.json").max_step
            expected = expected_resume(run)
            p = env.start(run, *extra, engine=gate.engine_flag)
            procs.append(p)
        else:
            kill_engine(rec)
            time.sleep(0.01)
            on_disk = {c.name for c in list_checkpoints(run / "checkpoints")}
            if temps_in(run / "checkpoints"):
                out.bump("kills that left a checkpoint temp file (inside a write)")
            elif unannounced_checkpoint(run):
                out.bump("kills that left a checkpoint the proxy had not seen announced")
            watch.check(out, f"after kill {kills}")
    try:
        rc = p.finish(300)
    except Hang as exc:
        out.fail(str(exc))
        return out.close()
    if rc != 0:
        out.fail(f"the last launch exited {rc}: {tail_lines(p.stderr)}")
    no_traceback(p, out, "last launch")
    watch.check(out, "at the end")
    out.note("proxy launches", len(procs))
    out.note("engine segments", seen)
    compare_with_reference(env, run, out)
    return out.close()


def make_partial_run(env: ProxyEnv, dest: Path, stop_at: int = 20) -> Path:
    """A run stopped halfway with SIGTERM to the proxy (the documented stop): the sidecar template.
    The engine is held at `stop_at` by a frame gate until the stop (whose STOP frame passes it)."""
    gate = Gate(dest.parent / "gate", ENGINE.path)
    gate.hold_after(stop_at)
    p = env.start(dest, engine=gate.engine_flag)
    if not LogTail(dest / ".loss.json").wait_step(stop_at, p):
        raise AssertionError(f"proxy exited early: {tail_lines(p.stderr)}")
    p.send_signal(signal.SIGTERM)
    rc = p.finish(TIMEOUT)
    state = json.loads((dest / ".state.json").read_text())
    if rc != 0 or state.get("status") != "stopped":
        raise AssertionError(f"SIGTERM to the proxy: exit {rc}, status {state.get('status')}: {tail_lines(p.stderr)}")
    return dest


def copy_run(template: Path, dest: Path) -> Path:
    shutil.copytree(template, dest, symlinks=True)
    for name in (".lock",):
        (dest / name).unlink(missing_ok=True)
    return dest


def _snapshot(run: Path) -> dict:
    return {p.name: p.read_bytes() for p in list_checkpoints(run / "checkpoints")}


def relaunch_and_compare(env: ProxyEnv, run: Path, out: Outcome, where: str, samples_after: int = 0,
                         *extra, expect_resume: int | None = None) -> Proc | None:
    """Relaunch the same command on `run`; it must resume where documented, finish with exit 0, keep
    every byte `.loss.json` had (append-only), and equal the uninterrupted run."""
    before_log = (run / ".loss.json").read_bytes() if (run / ".loss.json").exists() else b""
    newest = max((checkpoint_step(p) for p in checkpoint_files(run / "checkpoints")), default=0)
    expected = expected_resume(run) if expect_resume is None else expect_resume
    old_segments = max((int(e.get("segment", 0)) for e in read_log(run / ".loss.json").steps.values()), default=0)
    try:
        rc, p = env.run(run, *extra, timeout=300)
    except Hang as exc:
        out.fail(f"{where}: {exc}")
        return None
    no_traceback(p, out, where)
    if rc != 0:
        out.fail(f"{where}: relaunch exited {rc}: {tail_lines(p.stderr)}")
        return p
    resumed = first_resume(run, old_segments)
    if resumed != expected:
        out.fail(f"{where}: resumed from step {resumed}, expected step {expected}")
    else:
        out.steps_lost += max(0, newest - resumed)
    after = (run / ".loss.json").read_bytes()
    prefix = before_log if before_log.endswith(b"\n") or not before_log else before_log + b"\n"
    if not after.startswith(prefix):
        out.fail(f"{where}: .loss.json was rewritten, not appended to (earlier bytes changed)", data_lost=1)
    compare_with_reference(env, run, out, samples_after, where)
    return p


def _garbage_lines(rng: random.Random) -> list[bytes]:
    pool = [b"{", b"}", b"[1, 2, 3]", b'"a string"', b"null", b"42", b'{"type": "unknown", "step": 3}',
            b'{"type": "step"}', b'{"type": "step", "step": "seven", "loss": 1.0}', b"\x00" * 17,
            b"\xff\xfe\xfd not utf-8 \xc3\x28", b'{"type": "step", "step": 9, "lo', b"   ", b"\t",
            bytes(rng.randrange(1, 255) for _ in range(40)).replace(b"\n", b" ")]
    return rng.sample(pool, 6)


def _mut_loss_torn(run: Path, rng) -> str:
    log = run / ".loss.json"
    raw = log.read_bytes()
    start = raw.rstrip(b"\n").rfind(b"\n") + 1
    cut = rng.randint(start + 1, len(raw) - 2)
    log.write_bytes(raw[:cut])
    return f"last line cut after {cut - start} of {len(raw) - start} bytes"


def _mut_loss_garbage(run: Path, rng) -> str:
    log = run / ".loss.json"
    lines = log.read_bytes().split(b"\n")[:-1]
    junk = _garbage_lines(rng)
    for g in junk:
        lines.insert(rng.randrange(0, len(lines) + 1), g)
    log.write_bytes(b"\n".join(lines) + b"\n")
    return f"{len(junk)} garbage lines inserted"


def _mut_delete(fname):
    def mutate(run: Path, rng) -> str:
        (run / fname).unlink()
        return f"{fname} deleted"
    return mutate


def _mut_bytes(fname):
    def mutate(run: Path, rng) -> str:
        (run / fname).write_bytes(bytes(rng.randrange(256) for _ in range(300)))
        return f"{fname} replaced by 300 random bytes"
    return mutate


def _mut_truncate(fname):
    def mutate(run: Path, rng) -> str:
        raw = (run / fname).read_bytes()
        (run / fname).write_bytes(raw[: rng.randint(1, max(1, len(raw) - 2))])
        return f"{fname} truncated"
    return mutate


def _mut_json(fname, obj):
    def mutate(run: Path, rng) -> str:
        (run / fname).write_text(json.dumps(obj))
        return f"{fname} = {json.dumps(obj)[:80]}"
    return mutate


# (case name, mutation, "resume" | "refuse")
LOSS_LOG_CASES = [
    ("torn last line", _mut_loss_torn, "resume"),
    ("garbage lines", _mut_loss_garbage, "resume"),
]
SIDECAR_CASES = [
    (".state.json missing", _mut_delete(".state.json"), "resume"),
    (".state.json random bytes", _mut_bytes(".state.json"), "resume"),
    (".state.json wrong types", _mut_json(".state.json", {"arms": "x", "replay_mismatches": 7,
                                                           "replay_mismatch_count": "many", "status": 5,
                                                           "step": "x", "engine": [], "best": 3}), "resume"),
    (".samples.json missing", _mut_delete(".samples.json"), "resume"),
    (".samples.json truncated", _mut_truncate(".samples.json"), "resume"),
    (".samples.json wrong types", _mut_json(".samples.json", [{"step": "x"}, 5, {"samples": 3}, None]), "resume"),
    ("phases.json missing", _mut_delete("phases.json"), "resume"),
    ("phases.json random bytes", _mut_bytes("phases.json"), "refuse"),
    ("phases.json wrong types", _mut_json("phases.json", [{"phase": 0, "start_step": "zero", "policy": 1}]),
     "refuse"),
]


def sidecar_cases(env: ProxyEnv, template: Path, workdir: Path, cases, name: str, fault_class: str) -> Outcome:
    """Damage one run-directory file of a stopped run, relaunch the same command.

    "resume" cases: the run resumes where documented, finishes, appends to .loss.json without
    changing a byte, and equals the uninterrupted run. "refuse" cases (an unreadable phases.json:
    the phase history cannot be guessed): one clear line, non-zero exit, no traceback, nothing in the
    run directory changed; restoring the file and relaunching loses nothing.
    """
    out = Outcome(fault_class, name)
    rng = rng_for(name)
    newest = max(checkpoint_step(p) for p in list_checkpoints(template / "checkpoints"))
    for i, (case, mutate, expect) in enumerate(cases):
        run = copy_run(template, workdir / f"case{i}")
        what = mutate(run, rng)
        where = f"[{case}: {what}]"
        out.begin_fault()
        # audits in a deleted or damaged .samples.json are gone by the user's hand; compare the later ones
        samples_after = newest if case.startswith(".samples.json") else 0
        if expect == "resume":
            relaunch_and_compare(env, run, out, where, samples_after=samples_after)
            continue
        fname = case.split()[0]
        damaged = (run / fname).read_bytes()
        log, ckpts = (run / ".loss.json").read_bytes(), _snapshot(run)
        try:
            rc, p = env.run(run, timeout=TIMEOUT)
        except Hang as exc:
            out.fail(f"{where}: {exc}")
            continue
        lines = p.stderr_lines()
        no_traceback(p, out, where)
        if rc != 2 or len(lines) != 1 or fname not in lines[0]:  # docs/CLI.md: 2 is a bad run directory
            out.fail(f"{where}: expected exit 2 and one line naming {fname}; exit {rc}, stderr {lines}")
        out.note(f"{case}: message", lines[-1] if lines else None)
        if (run / fname).read_bytes() != damaged or (run / ".loss.json").read_bytes() != log or _snapshot(run) != ckpts:
            out.fail(f"{where}: the refused relaunch changed the run directory", data_lost=1)
        shutil.copy(template / fname, run / fname)
        relaunch_and_compare(env, run, out, f"{where} after restoring {fname}")
    return out.close()


def proxy_disk_full(env: ProxyEnv, template: Path, workdir: Path, name: str = "proxy-disk-full",
                    fault_class: str = "write error during a checkpoint (proxy run, EFBIG)") -> Outcome:
    """A stopped run relaunched under RLIMIT_FSIZE of half a checkpoint (inherited by the engine): the
    next checkpoint fails with EFBIG (engine exit 5). The proxy restarts it like any crash and stops as
    a crash loop (exit 3) with a last line naming the failed write; every checkpoint stays as it was,
    no partial file, .loss.json only appended to; relaunched without the limit it finishes equal to
    the uninterrupted run."""
    out = Outcome(fault_class, name)
    run = copy_run(template, workdir / "run")
    ckpts = _snapshot(run)
    log = (run / ".loss.json").read_bytes()
    limit = len(next(iter(ckpts.values()))) // 2
    newest = max(checkpoint_step(workdir / n) for n in ckpts)
    out.begin_fault()
    try:
        rc, p = env.run(run, preexec_fn=fsize_limit(limit), timeout=TIMEOUT)
    except Hang as exc:
        out.fail(str(exc))
        return out.close()
    lines = p.stderr_lines()
    no_traceback(p, out, "under RLIMIT_FSIZE")
    # docs/OPERATIONS.md: an engine exit is a crash; five without progress are a crash loop (exit 3)
    if rc != 3 or not lines or "crash loop" not in lines[-1] or "File too large" not in lines[-1]:
        out.fail(f"expected exit 3 and a last line about the crash loop naming the failed write "
                 f"(File too large); exit {rc}, {lines[-3:]}")
    out.note("exit code", rc)
    out.note("last line", lines[-1] if lines else None)
    out.note("RLIMIT_FSIZE (bytes)", limit)
    if _snapshot(run) != ckpts:
        out.fail("the checkpoints changed while every save failed", data_lost=1)
    if temps_in(run / "checkpoints"):
        out.fail(f"temp files left: {temps_in(run / 'checkpoints')}")
    if not (run / ".loss.json").read_bytes().startswith(log):
        out.fail(".loss.json was rewritten", data_lost=1)
    out.steps_lost += max(0, read_log(run / ".loss.json").max_step - newest)
    relaunch_and_compare(env, run, out, "relaunch without the limit")
    return out.close()


def proxy_corrupt_checkpoint(env: ProxyEnv, template: Path, workdir: Path, name: str = "proxy-corrupt-checkpoint",
                             fault_class: str = "corrupted newest checkpoint (proxy falls back)") -> Outcome:
    """The newest checkpoint of a stopped run (1) has a bit flipped in its weights: the proxy skips
    it, saying why, and resumes from the next older one; (2) is a valid checkpoint of another model
    shape: the engine rejects it (exit 3) and the proxy falls back to the next older one. Both runs
    finish equal to the uninterrupted run."""
    out = Outcome(fault_class, name)
    rng = rng_for(name)
    newest = list_checkpoints(template / "checkpoints")[0]
    step = checkpoint_step(newest)
    # (1) a flipped bit
    run = copy_run(template, workdir / "flip")
    raw = (run / "checkpoints" / newest.name).read_bytes()
    begin, end = checkpoint_regions(raw)["weights"]
    (run / "checkpoints" / newest.name).write_bytes(flip_bit(raw, rng.randrange(begin * 8, end * 8)))
    out.begin_fault()
    p = relaunch_and_compare(env, run, out, "[bit flip in the newest checkpoint]")
    if p is not None and not any("not resuming from" in ln and "checksum mismatch" in ln for ln in p.stderr_lines()):
        out.fail(f"the proxy skipped the corrupt checkpoint without saying why: {p.stderr_lines()[-5:]}")
    # (2) another model's checkpoint under the newest name
    run = copy_run(template, workdir / "shape")
    other = Model(vocab=300, ctx=16, dim=8, layers=1, heads=2, batch=4, steps=step)
    shard = make_shard(workdir / "other.tok", other.vocab)
    rc, q = run_standalone(other, shard, workdir / "other", 0, resume=None)
    if rc != 0:
        out.fail(f"could not make the other-shape checkpoint: {tail_lines(q.stderr)}")
        return out.close()
    shutil.copy(workdir / "other" / newest.name, run / "checkpoints" / newest.name)
    out.begin_fault()
    view = copy_run(template, workdir / "older-view")
    (view / "checkpoints" / newest.name).unlink()
    older = expected_resume(view)
    p = relaunch_and_compare(env, run, out, "[another model's checkpoint as the newest]", expect_resume=older)
    if p is not None:
        log = (run / "engine.log").read_text(errors="replace")
        if "shape mismatch" not in log:
            out.fail(f"the engine never got (and rejected) the other model's checkpoint: engine.log tail "
                     f"{tail_lines(log)}")
        out.note("another model's checkpoint: stderr", tail_lines(p.stderr, 2))
    return out.close()


def proxy_hung_engine(env: ProxyEnv, template: Path, workdir: Path, n_hangs: int = 2, hang_timeout: float = 2.0,
                      name: str = "proxy-hung-engine", fault_class: str = "hung engine (SIGSTOP)") -> Outcome:
    """SIGSTOP the engine at seeded moments under `--hang-timeout 2`: the proxy notices, kills its
    process group, restarts from the newest valid checkpoint; the run finishes equal to the
    uninterrupted one. A frame gate holds each launch at its first step until its target is set,
    then at the target, so the SIGSTOP finds the engine there however fast it is."""
    out = Outcome(fault_class, name)
    rng = rng_for(name)
    run = copy_run(template, workdir / "run")
    tail = LogTail(run / ".loss.json")
    gate = Gate(workdir / "gate", ENGINE.path)
    gate.hold_after(0)
    p = env.start(run, "--hang-timeout", hang_timeout, engine=gate.engine_flag)
    seen = max((int(e.get("segment", 0)) for e in read_log(run / ".loss.json").steps.values()), default=0)
    expected = expected_resume(run)
    detect = []
    stopped_at = None
    for i in range(n_hangs + 1):
        launch = gate.wait_launch(i, p.alive, TIMEOUT)
        if launch is None:
            out.fail(f"the proxy exited {p.wait()} instead of launching an engine: {tail_lines(p.stderr)}")
            return out.close()
        target = None if i == n_hangs else min(env.max_steps - 2, launch.first_step - 1 + rng.randint(1, 6))
        if target is None:
            gate.open()
        else:
            gate.hold_after(target)
        got = tail.wait_new_segment(seen, p)
        if got is None:
            out.fail(f"the proxy exited {p.wait()} instead of restarting the hung engine: {tail_lines(p.stderr)}")
            return out.close()
        seg, resume = got
        if i:
            detect.append(round(time.monotonic() - stopped_at, 2))
            expected = expected_resume(run, max_segment=seen)
            out.steps_lost += max(0, read_log(run / ".loss.json", max_segment=seen).max_step - resume)
        if resume != expected:
            out.fail(f"segment {seg} resumed from {resume}, expected {expected}")
        out.end_fault()
        seen = seg
        if target is None:
            break
        if not tail.wait_step(target, p, segment=seg):
            out.fail(f"the proxy exited early: {tail_lines(p.stderr)}")
            return out.close()
        rec = engine_record(run)
        gate.hold_after(0)  # the restarted engine waits at its first step for its own target
        out.begin_fault()
        os.kill(rec[0], signal.SIGSTOP)
        stopped_at = time.monotonic()
    rc = p.finish(300)
    no_traceback(p, out, "hung engine run")
    if rc != 0:
        out.fail(f"exit {rc}: {tail_lines(p.stderr)}")
    hung_lines = [ln for ln in p.stderr_lines() if "sent nothing for" in ln]
    if len(hung_lines) < n_hangs:
        out.fail(f"expected {n_hangs} hang reports on stderr, got {hung_lines}")
    out.note("seconds from SIGSTOP to the restarted segment", detect)
    out.note("--hang-timeout", hang_timeout)
    compare_with_reference(env, run, out)
    return out.close()


CRASHING_ENGINES = {
    "segfaults at once": "#!/bin/sh\nulimit -c 0\necho 'engine: about to crash' >&2\nkill -SEGV $$\n",
    "prints junk and exits 1": "#!/bin/sh\necho 'this is not an event'\necho '{\"event\": 5}'\n"
                               "echo 'engine exploded' >&2\nexit 1\n",
}


def proxy_crash_loop(env: ProxyEnv, template: Path, workdir: Path, name: str = "proxy-crash-loop",
                     fault_class: str = "crash loop (engine dies at every start)") -> Outcome:
    """An engine that dies at every start: the proxy gives up after --max-failures with exit 3 and a
    clear message, records status crashloop, changes no checkpoint and no logged step; relaunched
    with a working engine the run finishes equal to the uninterrupted one."""
    out = Outcome(fault_class, name)
    run = copy_run(template, workdir / "run")
    for i, (case, script) in enumerate(CRASHING_ENGINES.items()):
        wrapper = workdir / f"engine{i}.sh"
        wrapper.write_text(script)
        wrapper.chmod(0o755)
        ckpts, log = _snapshot(run), (run / ".loss.json").read_bytes()
        out.begin_fault()
        try:
            rc, p = env.run(run, "--max-failures", 3, engine=str(wrapper), timeout=TIMEOUT)
        except Hang as exc:
            out.fail(f"[{case}] {exc}")
            continue
        lines = p.stderr_lines()
        no_traceback(p, out, case)
        if rc != 3 or not lines or "crash loop" not in lines[-1]:
            out.fail(f"[{case}] expected exit 3 with a last line about the crash loop; exit {rc}, {lines[-3:]}")
        out.note(f"{case}: last line", lines[-1] if lines else None)
        try:
            status = json.loads((run / ".state.json").read_text()).get("status")
        except (OSError, ValueError):
            status = None
        if status != "crashloop":
            out.fail(f"[{case}] .state.json status {status!r}, expected 'crashloop'")
        if _snapshot(run) != ckpts:
            out.fail(f"[{case}] checkpoints changed", data_lost=1)
        after = read_log(run / ".loss.json")
        if not (run / ".loss.json").read_bytes().startswith(log) or after.max_step != read_log(template / ".loss.json").max_step:
            out.fail(f"[{case}] .loss.json changed", data_lost=1)
    relaunch_and_compare(env, run, out, "relaunch with a working engine")
    return out.close()


def proxy_sigusr1_storm(env: ProxyEnv, workdir: Path, n_signals: int = 200, name: str = "proxy-sigusr1-storm",
                        fault_class: str = "SIGUSR1 storm (proxy)") -> Outcome:
    """200 SIGUSR1 to the proxy while it trains (each asks for a checkpoint): training goes on, every
    checkpoint verifies, and the finished run equals the uninterrupted one. A frame gate paces the
    engine by the storm (one more step every few signals, up to `last`), so the storm and training
    interleave whatever the engine's speed, and the storm ends before the last steps (where the proxy
    restores the default handlers)."""
    out = Outcome(fault_class, name)
    rng = rng_for(name)
    run = workdir / "run"
    tail = LogTail(run / ".loss.json")
    gate = Gate(workdir / "gate", ENGINE.path)
    last = env.max_steps - 7
    limit = 1
    gate.hold_after(limit)
    p = env.start(run, engine=gate.engine_flag)
    if not tail.wait_step(1, p):
        out.fail(f"the proxy exited early: {tail_lines(p.stderr)}")
        return out.close()
    sent = 0
    while sent < n_signals and p.alive():
        paced = 1 + sent * (last - 1) // n_signals
        if paced != limit:
            limit = paced
            gate.hold_after(limit)
        p.send_signal(signal.SIGUSR1)
        sent += 1
        out.begin_fault()
        time.sleep(rng.uniform(0.0, 0.0008))
    gate.open()
    rc = p.finish(300)
    no_traceback(p, out, "storm")
    if rc != 0:
        out.fail(f"exit {rc}: {tail_lines(p.stderr)}")
    if sent < n_signals:
        out.fail(f"only {sent} signals went out while the proxy trained")
    CkptWatch(run / "checkpoints").check(out, "after the storm")
    out.note("SIGUSR1 sent", sent)
    out.note("checkpoint files", len(list_checkpoints(run / "checkpoints")))
    compare_with_reference(env, run, out)
    if out.failures:
        out.survived = 0
    return out.close()


def proxy_keep_all(env: ProxyEnv, workdir: Path, name: str = "proxy-keep-last-0",
                   fault_class: str = "checkpoint retention with keep_last 0 (keep all)") -> Outcome:
    """docs/EXPERIMENTS.md: `keep_last` 0 keeps all checkpoints. A run with it must still hold every
    periodic checkpoint at the end (a deleted one is a lost valid checkpoint)."""
    out = Outcome(fault_class, name)
    exp = write_fault_experiment(workdir / "exp", keep_last=0)
    run = workdir / "run"
    out.begin_fault()
    rc, p = env.run(run, experiment=exp)
    no_traceback(p, out, "keep_last 0 run")
    if rc != 0:
        out.fail(f"exit {rc}: {tail_lines(p.stderr)}")
    have = {p.name for p in list_checkpoints(run / "checkpoints")}
    want = {f"step_{s:06d}.bin" for s in range(env.ckpt_every, env.max_steps + 1, env.ckpt_every)}
    missing = sorted(want - have)
    if missing:
        out.fail(f"keep_last 0 deleted {len(missing)} periodic checkpoints: {missing}", data_lost=len(missing))
    compare_files(env.ref / "checkpoints", run / "checkpoints", out)
    return out.close()

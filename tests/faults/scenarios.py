"""Fault-injection scenarios: shared by tests/faults/test_*.py and scripts/reliability_report.py.

Every scenario attacks real processes (the engine binary, `python -m proxy run`)
and returns an `Outcome`: how many faults it injected, how many the system
survived (every invariant checked after that fault held), how many training
steps had to be redone (work lost, allowed), and how much data was lost
(checkpoints that were valid and vanished or changed, log entries or final
weights that differ from an uninterrupted run: must be zero). Each check is an
assertion: `Outcome.fail` records the broken invariant and raises
FaultCheckFailed there, so the test fails at the check that found it. The
report script turns the recorded outcomes (conftest.py's `record`, which also
keeps an outcome a failed check ended early) into the table in
docs/RELIABILITY.md.

Randomness: every random choice comes from `rng_for(name)`, seeded by
FAULT_SEED (default DEFAULT_SEED), so a run is reproducible by seed as far as
the choices go (which step to kill at, which offset, which bit to flip). The
exact instant a SIGKILL lands still depends on the machine's timing.

Formats are never re-implemented here: frames, shards, checkpoint verification
and engine command lines come from proxy/formats/. The child-process wrapper
(`Child`), the shape type and the test data are the harness's
(tests/harness/engine.py, shape.py, data.py).

The engine is the CPU one unless MICROGPT_TEST_ENGINE names another
(harness/engines.py). The proxy-level scenarios that act mid-run (kill
storms, hangs, the SIGUSR1 storm, the stopped template) drive it through a
frame gate (harness/gate.py) that holds it at the step the scenario aims
at, so a fast engine can neither finish first nor outrun the scenario.
"""

from __future__ import annotations

import json
import os
import random
import resource
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NoReturn

from harness.data import make_shard
from harness.engine import TIMEOUT, Child
from harness.engines import engine_under_test
from harness.shape import Shape, standalone_args
from proxy.formats.checkpoint import checkpoint_step, list_checkpoints, verify_checkpoint

REPO = Path(__file__).resolve().parents[2]
ENGINE = engine_under_test()
DEFAULT_SEED = 20251122
RESULTS_ENV = "FAULT_RESULTS"
DEFAULT_RESULTS = REPO / "test-artifacts" / "faults" / "results.json"


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


class FaultCheckFailed(AssertionError):
    """A broken invariant, raised by the check that found it; `outcome` is the scenario's, as it stood."""

    def __init__(self, outcome: Outcome, message: str):
        super().__init__(f"{outcome.scenario}: {message} (FAULT_SEED={outcome.seed})")
        self.outcome = outcome


# The outcomes made since the running test began (conftest.py clears it): a failed check ends its scenario
# before the scenario returns its outcome, and the report still records it.
MADE: list[Outcome] = []


@dataclass
class Outcome:
    """What one scenario injected and what survived. `failures` holds the broken invariant (one: the first
    fails the test). In `one_storm` the checks after the storm judge all its faults: a failure fails them
    all."""

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
    one_storm: bool = False
    _t0: float = field(default_factory=time.monotonic, repr=False)
    _open: int | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        MADE.append(self)

    def fail(self, message: str, data_lost: int = 0) -> NoReturn:
        """The check failed: record it and fail the test here."""
        self.failures.append(message)
        self.data_lost += data_lost
        self.close()
        if self.one_storm:
            self.survived = 0
        raise FaultCheckFailed(self, message)

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

    def close(self) -> Outcome:
        self.end_fault()
        self.seconds = round(time.monotonic() - self._t0, 2)
        return self

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("_t0", None)
        d.pop("_open", None)
        return d

    def summary(self) -> str:
        head = (
            f"{self.scenario}: injected {self.injected}, survived {self.survived}, steps lost "
            f"{self.steps_lost}, data lost {self.data_lost} (FAULT_SEED={self.seed})"
        )
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


def fsize_limit(limit: int):
    """preexec_fn: RLIMIT_FSIZE = limit bytes (the engine ignores SIGXFSZ, so writes fail with EFBIG)."""

    def apply():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


# ---------------------------------------------------------------------------
# engine models and runs


# Every setting explicit, one thread (bit-exact results do not depend on it; one thread is fastest
# for these tiny models on a shared box).
# Tiny: a checkpoint of ~180 KB, a step in about a millisecond: many kills are cheap.
TINY = Shape(vocab=64, ctx=16, dim=32, layers=1, heads=4, batch=4, steps=200, warmup=4, threads=1)
# Large: a 22 MB checkpoint whose write takes tens of milliseconds, to be killed inside.
LARGE = Shape(vocab=4096, ctx=16, dim=256, layers=1, heads=4, batch=2, steps=14, warmup=4, threads=1)


def standalone_argv(
    model: Shape, shard: Path, ckpt_dir: Path, ckpt_every: int, resume: str | Path | None = "latest", extra=()
) -> list[str]:
    return [str(ENGINE.path), *standalone_args(model, shard, ckpt_dir, ckpt_every, *extra, resume=resume)]


def start_standalone(model, shard, ckpt_dir, ckpt_every, resume="latest", extra=(), preexec_fn=None) -> Child:
    """The engine under test in standalone mode; its stdout lines kept, the events among them parsed."""
    return Child(
        standalone_argv(model, shard, ckpt_dir, ckpt_every, resume, extra),
        cwd=Path(ckpt_dir).parent,
        preexec_fn=preexec_fn,
    )


def run_standalone(
    model, shard, ckpt_dir, ckpt_every, resume="latest", extra=(), preexec_fn=None, timeout: float = TIMEOUT
) -> tuple[int, Child]:
    p = start_standalone(model, shard, ckpt_dir, ckpt_every, resume, extra, preexec_fn)
    return p.finish(timeout), p


def reference_run(workdir: Path, model: Shape, ckpt_every: int) -> tuple[Path, Path, int, Child]:
    """The uninterrupted run a scenario compares with: a new shard at workdir/data.tok, the engine trained
    from scratch into workdir/ref. (shard, ref_dir, exit code, the run)."""
    shard = make_shard(workdir / "data.tok", model.vocab)
    ref_dir = workdir / "ref"
    rc, ref = run_standalone(model, shard, ref_dir, ckpt_every, resume=None)
    return shard, ref_dir, rc, ref


def step_record(ev) -> tuple:
    """What must be bit-identical between runs for one step event (floats as printed: %.9g)."""
    return (ev["loss"], ev["lr"], ev["grad_norm"], json.dumps(ev.get("group_loss"), sort_keys=True))


def temps_in(directory: Path) -> list[str]:
    try:
        return sorted(
            p.name for p in Path(directory).iterdir() if p.name.startswith(".step_") and p.name.endswith(".bin.tmp")
        )
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
                out.fail(
                    f"{when}: {name} does not verify ({reason})"
                    + (" although it was valid before" if lost else ": a partial file a loader could take"),
                    data_lost=lost,
                )
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
    proc = subprocess.Popen(
        [sys.executable, "-m", "dashboard", "--run-dir", str(run), "--port", str(port), "--poll", "0.5"],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
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

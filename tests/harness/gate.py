"""A frame-level gate: a test holds the engine at a step, so a fast engine cannot finish first.

A test that must act mid-run (kill, stop, pivot, SIGSTOP the engine at step s) waits for step s
in the log and then acts; an engine fast enough would have finished the run in between. Through a
gate it cannot: `proxy run --engine <gate.engine_flag>` launches the engine behind a relay that
lets TRAIN frames through up to a limit the test sets and holds the rest (gate_process.py says
exactly what passes). The engine is the real binary with its own pid and process group; only its
stdin comes through the relay.

    gate = Gate(tmp_path / "gate", engine.path)
    gate.hold_after(30)            # the engine may train up to step 30, then waits
    ... start the proxy with --engine gate.engine_flag, wait for step 30, SIGSTOP the engine ...
    gate.open()                    # everything passes

On N ranks (`Gate(directory, engine, ranks=N)`, N > 1) the relay sits in front of mpirun instead: the
proxy runs the MPI CPU engine (`--engine cpu --ranks N`) behind `--launcher` naming the gate's wrapper, which
execs mpirun with the proxy's default launcher words, and mpirun forwards the gated stdin to rank 0. The
launcher's pid is then the one the gate records and .engine.json names (`run_args(..., *gate.rank_flags,
engine=gate.engine_flag)` builds either launch).

`hold_after(0)` holds every launch at its first step; `wait_launch(n)` then says where the n-th
launch resumes (its first TRAIN step), before it trains. `wait_frame(kind)` waits until a frame of
that kind (a CHECKPOINT the proxy was asked for) reached the gate: raising the limit then lets it
through with the steps ahead of it. A stop (a STOP frame) and a proxy that went away (EOF) pass
everything: the gate only holds an engine the proxy wants to keep training.
"""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from proxy.atomic import atomic_write_text
from proxy.formats import frames

from .ranks import launcher_words, mpirun_path
from .reaction import react

TESTS = Path(__file__).resolve().parents[1]

KILL_SLACK = 2  # steps a gated engine may train past a kill's target before the kill lands

WRAPPER = """#!{python} -S
# Written by tests/harness/gate.py: {engine} behind a frame gate whose files are in this directory.
import sys
sys.path[:0] = [{tests!r}]
from harness.gate_process import exec_engine
exec_engine({engine!r}, {directory!r}, {header!r}, {magic!r}, {train}, {stop})
"""


@dataclass(frozen=True)
class Received:
    """One line of the relay's record: a launch's first TRAIN frame, or a frame that is not TRAIN."""

    pid: int  # the engine's
    relay_pid: int
    kind: int  # frames.TRAIN, frames.CHECKPOINT, ...
    frame_id: int  # for TRAIN the step: the engine resumed from step frame_id - 1

    @property
    def first_step(self) -> int:
        return self.frame_id


class Gate:
    def __init__(self, directory: Path, engine: Path, ranks: int = 1):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.ranks = ranks
        # on N ranks the gate execs the launcher, which starts the MPI engine the proxy names after it
        self.engine = Path(engine) if ranks == 1 else mpirun_path()
        self.limit_path = self.directory / "limit"
        self.record_path = self.directory / "frames"
        self.wrapper = self.directory / "gated-engine"
        self.open()
        self.wrapper.write_text(
            WRAPPER.format(
                python=sys.executable,
                engine=str(self.engine),
                tests=str(TESTS),
                directory=str(self.directory),
                header=frames.HEADER.format,
                magic=frames.FRAME_MAGIC,
                train=frames.TRAIN,
                stop=frames.STOP,
            )
        )
        self.wrapper.chmod(0o755)

    @property
    def engine_flag(self) -> str:
        """The `proxy run --engine` value: the wrapper, or on N ranks the CPU engine (its MPI build)."""
        return str(self.wrapper) if self.ranks == 1 else "cpu"

    @property
    def rank_flags(self) -> list[str]:
        """The `proxy run` flags of a launch on N ranks through the gate (none on 1 rank)."""
        if self.ranks == 1:
            return []
        launcher = shlex.join([str(self.wrapper), *launcher_words(self.ranks)])
        return ["--ranks", str(self.ranks), "--launcher", launcher]

    def hold_after(self, step: int) -> None:
        """From now on TRAIN frames for steps above `step` wait (the engine trains up to `step`)."""
        atomic_write_text(self.limit_path, f"{int(step)}\n")

    def open(self) -> None:
        atomic_write_text(self.limit_path, "open\n")

    def received(self, kind: int) -> list[Received]:
        """What the relays recorded of `kind`, in order of arrival (for TRAIN: one per launch)."""
        try:
            whole = self.record_path.read_text().split("\n")[:-1]  # a line still being written is not read
        except FileNotFoundError:
            return []
        records = [Received(*map(int, line.split())) for line in whole if line.strip()]
        return [r for r in records if r.kind == kind]

    def launches(self) -> list[Received]:
        return self.received(frames.TRAIN)

    def wait_launch(self, seen: int, alive: Callable[[], bool], timeout: float) -> Received | None:
        """The launch after the first `seen`, once its first TRAIN frame reached the gate; None if the
        proxy exits first. Raises TimeoutError after `timeout` seconds."""
        return self._wait(frames.TRAIN, seen, alive, timeout)

    def wait_frame(self, kind: int, seen: int, alive: Callable[[], bool], timeout: float) -> Received | None:
        """The frame of `kind` after the first `seen` that reached the gate (None if the proxy exits first)."""
        return self._wait(kind, seen, alive, timeout)

    def _wait(self, kind: int, seen: int, alive: Callable[[], bool], timeout: float) -> Received | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.received(kind)
            if len(got) > seen:
                react()
                return got[seen]
            if not alive():
                got = self.received(kind)
                return got[seen] if len(got) > seen else None
            time.sleep(0.004)
        raise TimeoutError(f"no frame of kind {kind} reached the gate in {self.directory} within {timeout:.0f}s")

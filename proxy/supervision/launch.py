"""One engine launch, as the supervisor tracks it: what was sent, what came back, how it ended.

A run is a sequence of launches (`segment` in `.loss.json` and `.state.json`
numbers them): the first, and one after every crash, hang or pivot, each
resuming from a checkpoint (launcher.py starts one, feeding.py sends its
frames, events.py handles its events, loop.py runs it). Step s's mixture is
the launch's MixtureSchedule's (proxy/bandit/schedule.py), rebuilt from
`.loss.json` at every launch.
"""

from __future__ import annotations

import signal
import time
from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple

from ..bandit.schedule import MixtureSchedule
from ..formats import frames
from ..formats.loss_log import LossLogIndex
from ..rundir.resume import ResumePoint
from .engine_process import EngineProcess


class Outcome(Enum):
    """How an engine launch ended, as the restart loop acts on it (loop.py)."""

    FINISHED = "finished"  # max_steps trained
    STOPPED = "stopped"  # a stop asked for: the run ends cleanly
    DIVERGED = "diverged"  # a loss not sane, or the engine's non-finite check: never retried
    HUNG = "hung"  # the watchdog killed a silent engine: restarted
    FAILED = "failed"  # the engine crashed or exited early: restarted
    FATAL = "fatal"  # the engine cannot run at all (it rejected its command line): not retried
    PIVOTED = "pivoted"  # a pivot was applied: the next launch starts the new phase
    RESUME = "resume"  # a pivot not applied: the next launch goes on in the same phase


class Outstanding(NamedTuple):
    """Something sent to the engine whose event has not come back."""

    kind: str  # "step", "eval", "sample", "stop"
    key: int  # the step, or the request id
    work: float = 1.0  # relative cost, in train steps (the watchdog's allowance)


class Request(NamedTuple):
    """What an EVAL or SAMPLE request id stands for: the evaluation or the sample audit of `step`."""

    kind: str  # "eval" or "sample"
    step: int


@dataclass
class EngineLaunch:
    number: int  # `segment` in .loss.json: the run's engine launches so far, this one included
    engine: EngineProcess
    resume: ResumePoint
    next_step: int  # the next TRAIN frame to send
    last_step: int  # the last step the engine reported
    schedule: MixtureSchedule  # the mixture of each step, rebuilt from the log at launch
    replay_index: LossLogIndex  # the log as it was at launch: steps re-trained are compared with it
    replay_through: int  # the last step of the phase the log held at launch
    # the engine runs under a launcher (mpirun, srun): never signalled but to kill it (mpirun SIGKILLs its ranks
    # 2 s after a SIGTERM, mid-checkpoint); a stop is a STOP frame
    through_launcher: bool = False
    outstanding: deque = field(default_factory=deque)
    requests: dict[int, Request] = field(default_factory=dict)  # request id -> what it asked
    next_request: int = 1
    last_activity: float = field(default_factory=time.monotonic)
    events_heard: int = 0  # the engine's events the loop has handled
    started: float = field(default_factory=time.monotonic)
    step_walls: deque = field(default_factory=lambda: deque(maxlen=64))  # seconds between step events
    last_step_wall: float | None = None  # monotonic time of the last step event
    ready_at: float | None = None  # monotonic time of the `ready` event
    ckpt_pending: bool = False
    ckpt_pending_step: int = 0  # the step it is pending for: an older step's ckpt event (they come late) leaves it
    stop_sent: bool = False  # nothing more is fed: a STOP frame went out, or the engine was told to stop
    stop_signalled: bool = False  # a stop request reached the engine as SIGTERM
    signals_forwarded: int = 0
    exit_reason: str | None = None
    last_error: str | None = None
    hung: bool = False
    killed: bool = False
    ready: dict | None = None

    # Every field changes only through these methods, each named for what happened: feeding (feeding.py), the
    # event handlers (events.py) and the loop (loop.py) call them.

    def sent_step(self, step: int) -> None:
        """The TRAIN frame of `step` went out (its mixture stays in the schedule until the step is observed)."""
        self.outstanding.append(Outstanding("step", step))
        self.next_step = step + 1

    def heard_at(self, now: float) -> None:
        """An event came from the engine at monotonic time `now` (the watchdog counts from the last)."""
        self.last_activity = now
        self.events_heard += 1

    def excuse_silence(self, seconds: float) -> None:
        """The proxy itself did not run for `seconds` of the engine's silence (watchdog.py): not the engine's
        fault, so not counted."""
        self.last_activity += seconds

    def became_ready(self, fields: dict, at: float) -> None:
        """The engine's `ready` event (its fields), read at monotonic time `at`."""
        self.ready, self.ready_at = fields, at

    def stepped(self, step: int, at: float) -> None:
        """The event of `step`, read at monotonic time `at`, is logged: the step is no longer outstanding."""
        self.settle("step", step)
        if self.last_step_wall is not None:
            self.step_walls.append(at - self.last_step_wall)
        self.last_step, self.last_step_wall = step, at

    def checkpoint_due(self, step: int) -> None:
        """A checkpoint of `step` is coming (the cadence, or one asked for)."""
        self.ckpt_pending, self.ckpt_pending_step = True, step

    def checkpoint_written(self, step: int) -> None:
        """The engine announced the checkpoint of `step`: one pending for `step` or an older step is done."""
        if step >= self.ckpt_pending_step:
            self.ckpt_pending = False

    def exited(self, reason: str | None) -> None:
        """The engine's `exit` event: it answers the STOP, if one was sent."""
        self.exit_reason = reason
        self.settle("stop", 0)

    def errored(self, message: str | None) -> None:
        """Why the engine failed: its `error` event, its last words in engine.log, or why the proxy gave up
        on it."""
        self.last_error = message

    def stop_repeated(self) -> int:
        """Another stop request for the engine, after the one it already has: returns how many such (1: the
        second request, 2: the third)."""
        self.signals_forwarded += 1
        return self.signals_forwarded

    def send_stop(self) -> None:
        """STOP: the engine trains what is in flight, checkpoints and exits; nothing more is fed."""
        self.stop_sent = True
        self.outstanding.append(Outstanding("stop", 0))
        self.engine.send(frames.stop_frame())

    def stop_now(self) -> None:
        """A stop request (Ctrl-C, SIGTERM, `proxy stop`): SIGTERM, so the engine finishes the step it is
        computing, not the frames queued behind it (a STOP frame would wait behind them), abandons an eval or
        a sample audit in flight, checkpoints and exits. What it drops is sent again after the resume, as
        after a crash: a step's batch depends only on the seed, the step and the mixture. Under a launcher, a
        STOP frame instead: the ranks train the frames queued before it (at most the lag), then checkpoint."""
        if self.through_launcher:
            if not self.stop_sent:
                self.send_stop()
            self.stop_signalled = True
            return
        if not self.stop_sent:
            self.outstanding.append(Outstanding("stop", 0))
        self.stop_sent = self.stop_signalled = True
        self.engine.signal(signal.SIGTERM)

    def in_flight(self) -> str:
        """What the engine is busy with, as a stop request describes it."""
        head = self.outstanding[0] if self.outstanding else None
        if head is None or head.kind == "stop":
            return f"checkpoints step {self.last_step}"
        if head.kind == "step":
            queued = sum(1 for item in self.outstanding if item.kind == "step") - 1
            # the oldest step sent and not reported: the engine may not have begun it yet (a signal between two
            # steps), and then it checkpoints the step before; the stopped-at line names the one it wrote
            return f"finishes step {head.key} if it has begun it, checkpoints" + (
                f" (the {queued} step(s) queued behind it are sent again on resume)" if queued else ""
            )
        request = self.requests.get(head.key)
        what = "sample audit" if head.kind == "sample" else "evaluation"
        at = f" of step {request.step}" if request is not None else ""
        return f"abandons the {what}{at} (done again on resume), checkpoints step {self.last_step}"

    def kill(self) -> None:
        """SIGKILL the engine's group; its remaining events are ignored."""
        self.killed = True
        self.engine.kill_group()

    def kill_hung(self) -> None:
        """The watchdog heard nothing in time: the engine counts as hung, and is killed."""
        self.hung = True
        self.kill()

    def settle(self, kind: str, key: int) -> None:
        """The event for (kind, key) came back."""
        for i, item in enumerate(self.outstanding):
            if item.kind == kind and item.key == key:
                del self.outstanding[i]
                return

    def answered(self, kind: str, rid: int) -> Request | None:
        """An eval or sample event for request `rid` came back: what it asked, or None when it is not one of
        this launch's requests of `kind`."""
        self.settle(kind, rid)
        request = self.requests.pop(rid, None)
        return request if request is not None and request.kind == kind else None

    def add_request(self, request: Request, work: float) -> int:
        """An EVAL or SAMPLE frame about to go out: its request id, and what it costs (in train steps, the
        watchdog's allowance)."""
        rid = self.next_request
        self.next_request += 1
        self.requests[rid] = request
        self.outstanding.append(Outstanding(request.kind, rid, work))
        return rid

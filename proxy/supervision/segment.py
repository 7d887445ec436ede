"""One engine launch (a segment): where it resumes, the bandit rebuilt from the log, and feeding it frames.

Determinism of the whole run (docs/ARCHITECTURE.md): the batch for step s is
a pure function of (seed, s, W(s)), and W(s), the mixture, is the bandit
after observing the per-arm losses of steps <= s - lag of the current phase.
So at most `lag` TRAIN frames are in flight, W(s) is taken right after
observing step s - lag whatever the timing, and at every launch the bandit
is rebuilt from `.loss.json` (the phase's steps up to the checkpoint the
engine resumes from), never from `.state.json`.
"""
from __future__ import annotations

import hashlib
import signal
import time
from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple

import numpy as np

from ..bandit import Bandit
from ..formats import frames
from ..formats.checkpoint import read_trailer
from ..formats.engine_cli import engine_args
from ..formats.loss_log import LossLogIndex
from ..formats.state import EngineStatus
from ..rundir.frozen import experiment_changed
from ..rundir.resume import ResumePoint, choose_resume
from .context import RunContext
from .engine_process import EngineProcess
from .engine_record import TOKEN_ENV, new_token, record_engine


class Outcome(Enum):
    """How a segment (one engine launch) ended, as the restart loop acts on it (loop.py)."""
    FINISHED = "finished"  # max_steps trained
    STOPPED = "stopped"    # a stop asked for: the run ends cleanly
    DIVERGED = "diverged"  # a loss not sane, or the engine's non-finite check: never retried
    HUNG = "hung"          # the watchdog killed a silent engine: restarted
    FAILED = "failed"      # the engine crashed or exited early: restarted
    FATAL = "fatal"        # the engine cannot run at all (it rejected its command line): not retried
    PIVOTED = "pivoted"    # a pivot was applied: the next segment starts the new phase
    RESUME = "resume"      # a pivot not applied: the next segment goes on in the same phase


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
class Segment:
    number: int
    engine: EngineProcess
    resume: ResumePoint
    next_step: int  # the next TRAIN frame to send
    last_step: int  # the last step the engine reported
    pending_weights: dict[int, np.ndarray]  # step -> the mixture it will be drawn from, once known
    replay_index: LossLogIndex  # the log as it was at launch: steps re-trained are compared with it
    replay_through: int  # the last step of the phase the log held at launch
    mixtures: dict[int, np.ndarray] = field(default_factory=dict)  # sent, not yet logged
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

    # Every field changes only through these methods, each named for what happened: feeding (below), the
    # event handlers (events.py) and the loop (loop.py) call them.

    def sent_step(self, step: int) -> None:
        """The TRAIN frame of `step` went out: its mixture is kept until its event is logged."""
        self.mixtures[step] = self.pending_weights.pop(step)
        self.outstanding.append(Outstanding("step", step))
        self.next_step = step + 1

    def mixture_known(self, step: int, weights: np.ndarray) -> None:
        """The mixture `step` will be drawn from (the bandit's weights once step - lag is observed)."""
        self.pending_weights[step] = weights

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
        """The event of `step`, read at monotonic time `at`, is logged: the step is no longer outstanding and
        its mixture no longer kept."""
        self.settle("step", step)
        del self.mixtures[step]
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
        after a crash: a step's batch depends only on the seed, the step and the mixture."""
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
            return (f"finishes step {head.key} if it has begun it, checkpoints" +
                    (f" (the {queued} step(s) queued behind it are sent again on resume)" if queued else ""))
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
        this segment's requests of `kind`."""
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


def sample_seed(seed: int, step: int, index: int) -> int:
    """The SAMPLE seed for prompt `index` at `step`: a pure function of (seed, step, index)."""
    digest = hashlib.sha256(f"microgpt-sample:{seed}:{step}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def due(every: int, step: int, max_steps: int) -> bool:
    """An eval or a sample audit every `every` steps (0: never) and at the last step."""
    return bool(every) and (step == max_steps or step % every == 0)


# ------------------------------------------------------------ launching

def _replay_eval(ctx: RunContext, bandit: Bandit, index: LossLogIndex, step: int) -> None:
    """The evaluation of `step` as logged, if there is one, to the bandit (as events.py gives it live).
    Past the phase's start step only this phase's: one a phase before the pivot logged there was never
    given to this phase's bandit live."""
    entry = index.eval(step)
    if entry is not None and (step == ctx.phase.start_step or entry.phase == ctx.phase.phase):
        bandit.observe_eval(step, {a: v for a, v in entry.arms.items() if a in ctx.arm_names})


def _rebuild_bandit(ctx: RunContext, index: LossLogIndex, c: int) -> dict[int, np.ndarray]:
    """A fresh bandit for the phase, fed the phase's logged steps up to `c`, each evaluation after the
    step it belongs to (from the phase's first step on; the one at its start step first), as the live
    run fed them; the mixtures of the steps c+1..c+lag, which depend only on those (the earliest on
    none: the initial weights)."""
    phase = ctx.phase
    bandit = ctx.new_bandit()
    init = np.array(bandit.weights(), dtype=np.float64, copy=True)
    pending = {s: init for s in range(c + 1, c + ctx.lag + 1) if s - ctx.lag <= phase.start_step}
    known = set(ctx.arm_names)
    _replay_eval(ctx, bandit, index, phase.start_step)
    for t, entry in index.iter_steps(phase.start_step + 1, c):
        arms = {a: v for a, v in entry.arms.items() if a in known}
        extra = set(entry.arms) - known
        if extra - ctx.report.dropped_arms:
            ctx.warn(f".loss.json names arm(s) {', '.join(sorted(extra))} that the experiment does not "
                     "define; dropped from the bandit's replay")
            ctx.report.drop_arms(extra)
        # the mixture step t was drawn from (exp3 weights its rewards by it), as logged
        bandit.observe(t, arms, mixture=entry.mixture)
        if t + ctx.lag > c:
            pending[t + ctx.lag] = np.array(bandit.weights(), dtype=np.float64, copy=True)
        _replay_eval(ctx, bandit, index, t)
    return pending


def launch_segment(ctx: RunContext) -> Segment:
    """Choose where to resume, rebuild the bandit, start the engine."""
    ctx.writer.fsync()
    index = LossLogIndex.load(ctx.run.loss_log)
    phase = ctx.phase
    resume = choose_resume(ctx.run.checkpoints, index, ctx.phases, ctx.rejected, vocab=int(ctx.experiment.model.vocab))
    for reason in resume.skipped:
        ctx.warn(f"not resuming from {reason}")
    c = resume.step
    ctx.next_segment(index.max_segment)
    pending = _rebuild_bandit(ctx, index, c)

    tokens, loss = 0, None
    if c > 0:
        entry = index.step(c)
        trailer = read_trailer(resume.path) if entry is None else None
        tokens = int((entry.tokens if entry is not None else trailer.tokens_seen if trailer else None) or 0)
        loss = entry.loss if entry is not None else None
    ctx.report.resumed(c, str(resume.path) if resume.path is not None else None, tokens, loss)
    replay_through = max((s for s, (_o, p) in index.steps.items() if s > c and p == phase.phase), default=c)

    meta = {"experiment": ctx.experiment.name, "phase": phase.phase}
    settings = list(ctx.experiment.engine_flags()) + list(ctx.engine_paths)
    if experiment_changed(ctx.run) or (resume.path is not None and c == 0):
        # the run went on under a changed experiment: its older checkpoints carry the old
        # optimizer settings, and the frozen experiment (not the checkpoint) is the truth; so at
        # step 0 (imported weights, moments zero), where the settings have acted on nothing yet
        settings.append("--allow-hparam-change")
    choice = ctx.engine_choice
    args = engine_args(ctx.run.checkpoints, resume=resume.path, ckpt_every=int(ctx.train.ckpt_every),
                       ckpt_every_seconds=float(ctx.train.ckpt_every_seconds), meta=meta, settings=settings)
    argv = [str(choice.path), *args]
    where = f"from {resume.path.name} (step {c})" if resume.path else "from scratch"
    token = new_token()
    engine = EngineProcess(argv, ctx.run.engine_log, header=f"segment {ctx.segment_number}, {where}",
                           env={TOKEN_ENV: token})
    try:
        record_engine(ctx.run, ctx.identity, engine.pid, engine.create_time, argv, token)
    except BaseException:  # a full disk: the engine is not yet the loop's to stop; EOF stops it before any step
        engine.close_input()
        if engine.wait(60) is None:
            engine.kill_group()
        engine.finish()
        raise
    ctx.say(f"segment {ctx.segment_number}: engine pid {engine.pid} ({choice.kind}) starting {where}"
            + (f"; steps {c + 1}..{replay_through} will be replayed and compared" if replay_through > c else ""))
    ctx.report.engine_started(EngineStatus(kind=choice.kind, pid=engine.pid, alive=True, path=str(choice.path)))
    return Segment(number=ctx.segment_number, engine=engine, resume=resume, next_step=c + 1, last_step=c,
                   pending_weights=pending, replay_index=index, replay_through=replay_through)


# ------------------------------------------------------------ feeding

def send_evals(ctx: RunContext, seg: Segment, step: int) -> None:
    """One EVAL frame holding every arm's fixed validation rows (group id = arm), so the engine runs them
    in the fewest forward passes; its event carries each arm's mean loss."""
    rows = int(ctx.train.eval_rows)
    if rows <= 0:
        return
    tokens, groups = ctx.sampler.eval_batch_all(rows)
    rid = seg.add_request(Request("eval", step), max(1.0, len(groups) / ctx.train.rows))
    seg.engine.send(frames.eval_frame(rid, tokens, groups))


def send_samples(ctx: RunContext, seg: Segment, step: int) -> None:
    """The audit: every prompt in one SAMPLE frame, each with its own seed (one batch in the engine)."""
    cfg = ctx.experiment.samples
    prompts = [frames.SamplePrompt(ids, int(cfg.count), sample_seed(int(ctx.train.seed), step, i))
               for i, (_prompt, ids) in enumerate(ctx.prompts)]
    work = max(1.0, len(prompts) * int(cfg.count) * int(cfg.max_new) / ctx.train.rows)
    rid = seg.add_request(Request("sample", step), work)
    seg.engine.send(frames.sample_batch_frame(rid, prompts, int(cfg.max_new), float(cfg.temperature),
                                              int(cfg.top_k or 0)))


def catch_up(ctx: RunContext, seg: Segment) -> None:
    """An eval or a sample audit due at the resume step that a crash lost: do it now (the
    engine holds exactly that step's weights, so the result is the one the crash lost)."""
    c = seg.resume.step
    if c <= 0 or c > ctx.max_steps:
        return
    if due(int(ctx.train.eval_every), c, ctx.max_steps) and seg.replay_index.eval(c) is None:
        send_evals(ctx, seg, c)
    pivot_point = ctx.phase.phase > 0 and c == ctx.phase.start_step  # audits there were archived
    if ctx.prompts and due(int(ctx.train.sample_every), c, ctx.max_steps) and not pivot_point \
            and all(a.step != c for a in ctx.samples.audits):
        send_samples(ctx, seg, c)


def feed(ctx: RunContext, seg: Segment) -> None:
    """Send every TRAIN frame whose mixture is known (at most `lag` ahead), with the evals and samples due."""
    while not seg.stop_sent and seg.next_step <= ctx.max_steps and seg.next_step in seg.pending_weights:
        s = seg.next_step
        tokens, groups = ctx.sampler.train_batch(s, seg.pending_weights[s], ctx.train.rows)
        seg.engine.send(frames.train_frame(s, tokens, groups))
        seg.sent_step(s)
        if due(int(ctx.train.eval_every), s, ctx.max_steps):
            send_evals(ctx, seg, s)
        if ctx.prompts and due(int(ctx.train.sample_every), s, ctx.max_steps):
            send_samples(ctx, seg, s)
        if s == ctx.max_steps:
            seg.send_stop()

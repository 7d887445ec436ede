"""The supervisor: feeds one engine after another, keeps the run directory, survives anything.

Determinism of the whole run (DESIGN.md): the batch for step s is a pure
function of (seed, s, W(s)), and W(s), the mixture, is the bandit after
observing the per-arm losses of steps <= s - lag of the current phase. So:

- at most `lag` TRAIN frames are in flight, and W(s) is taken right after
  observing step s - lag, whatever the timing;
- at every (re)start the bandit is rebuilt from `.loss.json` (the steps of the
  phase up to the checkpoint the engine resumes from), never from .state.json;
- the checkpoint chosen is the newest valid one whose steps are all in the
  log, so a proxy killed between the engine's checkpoint and the log append
  falls back to an older checkpoint rather than guessing;
- steps re-trained after a restart are compared with the crashed segment's
  entries; a difference is a determinism bug, reported on stderr and in
  .state.json.
"""
from __future__ import annotations

import hashlib
import math
import os
import queue
import signal
import statistics
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..bandit import bandit_for_phase
from ..config.caps import check_request
from ..config.errors import ExperimentError
from ..formats import frames
from ..formats.checkpoint import (checkpoint_path, checkpoint_step, header_step, list_checkpoints, read_trailer,
                                  verify_checkpoint)
from ..formats.engine_cli import EXIT_CHECKPOINT, EXIT_USAGE as ENGINE_EXIT_USAGE, engine_args, exit_description
from .engine_process import (EOF, EVENT, NOISE, WRITE_FAILED, EngineChoice, EngineError, EngineProcess,
                             reap_orphan, record_engine)
from ..formats.loss_log import EvalEntry, LossLogIndex, LossLogWriter, StepEntry, compare_replayed
from ..rundir.retention import RetentionPolicy, apply_retention, best_is_better, copy_best, protected_by_phases
from ..rundir.layout import Phase, RunDir, experiment_changed, read_phases
from ..formats.samples import Sample, SampleAudit, SamplesFile
from ..formats.state import ArmStatus, EngineStatus, RunState, read_state, write_state

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_CRASHLOOP = 0, 1, 2, 3


class SupervisorError(Exception):
    """Stops the run with one line for the user and an exit code."""

    def __init__(self, message: str, code: int = EXIT_FAILURE):
        super().__init__(message)
        self.code = code


@dataclass
class SupervisorOptions:
    hang_timeout: float | None = None  # seconds without an event before the engine counts as hung
    max_failures: int = 5  # consecutive engine failures without progress before giving up
    backoff_s: float = 1.0  # first restart delay; doubles per failure
    backoff_max_s: float = 60.0
    orphan_grace_s: float = 60.0  # how long an engine left by a killed proxy may take to exit
    state_every_s: float = 2.0
    fsync_every_s: float = 5.0
    samples_kept: int = 50


# ------------------------------------------------------------ small pure helpers

def sample_seed(seed: int, step: int, index: int) -> int:
    """The SAMPLE seed for prompt `index` at `step`: a pure function of (seed, step, index)."""
    digest = hashlib.sha256(f"microgpt-sample:{seed}:{step}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def _count_field(snapshot: dict, key: str, default: int) -> int:
    """A non-negative count carried over from an old .state.json; anything else (a
    hand-edited or corrupt value) is ignored, since the snapshot is never trusted."""
    value = snapshot.get(key)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return default


def current_phase(phases: list[Phase]) -> Phase:
    return phases[-1]


@dataclass
class ResumePoint:
    path: Path | None  # None: start fresh
    step: int
    skipped: list[str] = field(default_factory=list)  # why newer checkpoints were passed over


def choose_resume(checkpoint_dir: Path, index: LossLogIndex, phase: Phase, rejected: set[str],
                  at_most: int | None = None) -> ResumePoint:
    """The newest checkpoint that verifies and whose phase steps are all in the log
    (with `at_most`: the newest such one at or before that step; `proxy pivot --at`)."""
    skipped = []
    for path in list_checkpoints(checkpoint_dir):
        step = checkpoint_step(path)
        if at_most is not None and step > at_most:
            continue
        if str(path) in rejected:
            skipped.append(f"{path.name}: rejected by the engine earlier")
            continue
        if step < phase.start_step:
            skipped.append(f"{path.name}: before the start of phase {phase.phase} (step {phase.start_step})")
            continue
        reason = verify_checkpoint(path)
        if reason is not None:
            skipped.append(reason)
            continue
        missing = index.missing(phase.phase, phase.start_step, step)
        if missing:
            skipped.append(f"{path.name}: .loss.json lacks {len(missing)} of its steps (first {missing[0]})")
            continue
        return ResumePoint(path, step, skipped)
    if rejected:
        raise SupervisorError(f"the engine rejected every checkpoint it was offered ({'; '.join(skipped)}); "
                              f"see the engine's reason in its log", EXIT_FAILURE)
    if phase.start_step > 0:
        upto = f" and at or before step {at_most}" if at_most is not None else ""
        raise SupervisorError(f"no valid checkpoint at or after step {phase.start_step}, where phase "
                              f"{phase.phase} starts{upto} ({'; '.join(skipped) or 'none found'})")
    return ResumePoint(None, 0, skipped)


def _fmt_duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "?"
    seconds = int(seconds)
    if seconds >= 86400:
        return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"


def _fmt_rate(x: float | None) -> str:
    if x is None:
        return "?"
    return f"{x / 1e6:.2f}M" if x >= 1e6 else f"{x / 1e3:.1f}k" if x >= 1e3 else f"{x:.0f}"


# ------------------------------------------------------------ per-segment bookkeeping

@dataclass
class Outstanding:
    """Something sent to the engine whose event has not come back."""
    kind: str  # "step", "eval", "sample", "stop"
    key: int
    work: float = 1.0  # relative cost, in train steps


@dataclass
class Segment:
    number: int
    engine: EngineProcess
    resume: ResumePoint
    next_step: int
    last_step: int
    pending_weights: dict[int, np.ndarray]
    replay_index: LossLogIndex
    replay_through: int
    mixtures: dict[int, np.ndarray] = field(default_factory=dict)  # sent, not yet logged
    outstanding: deque = field(default_factory=deque)
    requests: dict[int, tuple] = field(default_factory=dict)  # request id -> ("eval", step, arm) | ("sample", step, prompt)
    next_request: int = 1
    last_activity: float = field(default_factory=time.monotonic)
    started: float = field(default_factory=time.monotonic)
    step_walls: deque = field(default_factory=lambda: deque(maxlen=64))
    last_step_wall: float | None = None
    ckpt_pending: bool = False
    stop_sent: bool = False
    signals_forwarded: int = 0
    exit_reason: str | None = None
    last_error: str | None = None
    hung: bool = False
    killed: bool = False
    ready: dict | None = None


class Supervisor:
    def __init__(self, experiment, run: RunDir, data, engine: EngineChoice, options: SupervisorOptions,
                 out=None, err=None):
        from ..data.batches import BatchSampler

        self.experiment = experiment
        self.run = run
        self.data = data
        self.engine_choice = engine
        self.opts = options
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        train = experiment.train
        self.train = train
        self.arm_names = [a.name for a in experiment.arms]
        self.arm_index = {n: i for i, n in enumerate(self.arm_names)}
        self.lag = int(train.lag)
        if self.lag < 1:
            raise SupervisorError("train.lag must be at least 1", EXIT_USAGE)
        self.rows = int(train.batch) * int(train.grad_accum)
        self.row_len = int(experiment.model.ctx) + 1
        self.max_steps = int(train.max_steps)
        self.retention = RetentionPolicy(int(train.keep_last), int(train.milestone_every))
        self.sampler = BatchSampler(data.train_shards, data.val_shards, self.arm_names, int(train.seed), self.row_len)
        self.prompts = self._encode_prompts()
        self.phases = read_phases(run)
        self.phase = current_phase(self.phases)

        self.writer = LossLogWriter(run.loss_log, options.fsync_every_s)
        self.samples = SamplesFile(run.samples, options.samples_kept)
        self.rejected: set[str] = set()
        self.segment: Segment | None = None
        self.segment_number = 0
        self.failures = 0
        self.high_water = 0
        self.restarts = 0
        self.bandit = None
        self.caps: dict = {}
        self.floors: dict = {}
        self.tokens = 0
        self.last_loss: float | None = None
        self.smoothed: float | None = None
        self.rate_window: deque = deque(maxlen=50)  # (wall time, tokens, step)
        self.last_ckpt_step: int | None = None
        self.last_ckpt_path: str | None = None
        self.ckpt_ms: float = 0.0
        self.evals: dict[int, dict] = {}  # step -> {arm index: (loss, tokens)}
        self.eval_loss: dict[int, float] = {}
        self.sample_parts: dict[int, dict] = {}
        self.best_step: int | None = None
        self.best_loss: float | None = None
        self.stop_requests = 0
        self.ckpt_requests = 0
        self.pivot_signals = 0  # SIGUSR2: `proxy pivot` left a request in RUN/.pivot_request.json
        self.pivot_job: tuple | None = None  # (request, caps, floors, policy) while a pivot is under way
        self.last_state_write = 0.0
        self.status = "running"
        self.message: str | None = None
        self.dropped_arms: set[str] = set()
        self.mismatches: list[dict] = []
        self.mismatch_count = 0
        self.engine_status = EngineStatus(kind=engine.kind, path=str(engine.path))
        self._carry_forward_reports()
        self._load_best()

    # ------------------------------------------------------------ setup helpers
    def say(self, line: str) -> None:
        print(line, file=self.out, flush=True)

    def warn(self, line: str) -> None:
        print(f"proxy: {line}", file=self.err, flush=True)

    def _encode_prompts(self) -> list[tuple[str, list[int]]]:
        out = []
        ctx = int(self.experiment.model.ctx)
        for prompt in self.experiment.samples.prompts:
            ids = list(self.data.tokenizer.encode(prompt))
            if not ids:
                self.warn(f"sample prompt {prompt!r} encodes to no tokens; skipped")
                continue
            out.append((prompt, ids[-ctx:]))
        return out

    def _carry_forward_reports(self) -> None:
        prev = read_state(self.run.state) or {}
        mismatches = prev.get("replay_mismatches")
        if isinstance(mismatches, list):
            self.mismatches = [m for m in mismatches if isinstance(m, dict)][-50:]
        self.mismatch_count = _count_field(prev, "replay_mismatch_count", len(self.mismatches))
        self.restarts = _count_field(prev, "restarts", 0)
        arms = prev.get("arms")
        if isinstance(arms, dict):
            unknown = sorted(set(arms) - set(self.arm_names))
            if unknown:
                self.warn(f".state.json names arm(s) {', '.join(unknown)} that the experiment does not "
                          "define; dropped")
                self.dropped_arms |= set(unknown)
        unknown_caps = sorted((set(self.phase.caps) | set(self.phase.floors)) - set(self.arm_names))
        if unknown_caps:
            self.warn(f"phases.json phase {self.phase.phase} names arm(s) {', '.join(unknown_caps)} that the "
                      "experiment does not define; dropped")
            self.dropped_arms |= set(unknown_caps)

    def _load_best(self) -> None:
        if not self.run.best.exists():
            return
        self.best_step = header_step(self.run.best)
        if self.best_step is not None:
            entry = LossLogIndex.load(self.run.loss_log).eval(self.best_step)
            self.best_loss = entry.loss if entry else None

    # ------------------------------------------------------------ signals
    def _on_stop_signal(self, signum, _frame) -> None:
        self.stop_requests += 1

    def _on_checkpoint_signal(self, signum, _frame) -> None:
        self.ckpt_requests += 1

    def _on_pivot_signal(self, signum, _frame) -> None:
        self.pivot_signals += 1

    def _install_signals(self) -> dict:
        old = {}
        for sig, handler in ((signal.SIGTERM, self._on_stop_signal), (signal.SIGINT, self._on_stop_signal),
                             (signal.SIGUSR1, self._on_checkpoint_signal), (signal.SIGUSR2, self._on_pivot_signal)):
            old[sig] = signal.signal(sig, handler)
        # requests that came while the run was starting (start_run catches them early)
        self.ckpt_requests += _EARLY_SIGNALS.pop(signal.SIGUSR1, 0)
        self.pivot_signals += _EARLY_SIGNALS.pop(signal.SIGUSR2, 0)
        return old

    # ------------------------------------------------------------ pivots (proxy/pivot.py)
    def _take_pivot_requests(self, refuse: str | None = None) -> bool:
        """Claim the request SIGUSR2 announced and accept it (True) or refuse it (`refuse`: why)."""
        from ..commands.pivot import answer_request, claim_request

        accepted = False
        while self.pivot_signals:
            self.pivot_signals -= 1
            request = claim_request(self.run)
            if request is None:
                self.warn("SIGUSR2 but no pivot request in the run directory; ignored")
                continue
            why = refuse
            if why is None and self.pivot_job is not None:
                why = f"another pivot (request {self.pivot_job[0].get('id')}) is being applied"
            if why is None:
                try:
                    caps, floors, policy = check_request(request, self.experiment)
                except ExperimentError as exc:
                    why = str(exc)
            if why is not None:
                self.warn(f"pivot refused: {why}")
                answer_request(self.run, request, False, f"{why}; nothing changed")
                continue
            self.pivot_job = (request, caps, floors, policy)
            accepted = True
        return accepted

    def _refuse_pivots(self, why: str) -> None:
        from ..commands.pivot import answer_request

        if self.pivot_job is not None:
            answer_request(self.run, self.pivot_job[0], False, f"{why}; nothing changed")
            self.pivot_job = None
        if self.pivot_signals:
            self._take_pivot_requests(refuse=why)

    def _start_pivot(self, seg: Segment) -> None:
        """Stop feeding; STOP makes the engine train what is in flight, checkpoint and exit."""
        if seg.stop_sent or self.stop_requests:
            request = self.pivot_job[0]
            self.pivot_job = None
            from ..commands.pivot import answer_request
            why = ("the run is finishing (its last step is in flight)" if seg.next_step > self.max_steps
                   else "the run is stopping")
            self.warn(f"pivot refused: {why}")
            answer_request(self.run, request, False, f"{why}; nothing changed")
            return
        seg.stop_sent = True
        seg.outstanding.append(Outstanding("stop", 0))
        seg.engine.send(frames.stop_frame())
        self.say(f"pivot requested: the engine finishes step {seg.next_step - 1}, checkpoints and exits; "
                 "the new phase starts from that checkpoint")

    def _finish_pivot(self, seg: Segment, outcome: str) -> str:
        """After the segment a pivot stopped: apply it at the engine's last checkpoint."""
        from ..commands.pivot import answer_request, apply_pivot, relative_checkpoint

        request, caps, floors, policy = self.pivot_job
        self.pivot_job = None
        if outcome != "stopped":  # a clean exit checkpoints its last step, whatever asked for it
            why = {"finished": "the run reached max_steps first"}.get(
                outcome, f"the engine failed before its pivot checkpoint ({seg.last_error or outcome})")
            self.warn(f"pivot not applied: {why}")
            answer_request(self.run, request, False, f"{why}; nothing changed")
            return outcome
        k = seg.last_step
        path = checkpoint_path(self.run.checkpoints, k)
        reason = verify_checkpoint(path) if path.exists() else f"{path.name}: missing"
        if reason is not None:
            self.warn(f"pivot not applied: the checkpoint at step {k} does not verify ({reason})")
            answer_request(self.run, request, False, f"the checkpoint at step {k} does not verify ({reason}); "
                           "nothing changed")
            return "stopped" if self.stop_requests else "resume"
        self.last_ckpt_step, self.last_ckpt_path = k, str(path)
        self._write_state(force=True)  # the state archived is the old phase's, at the pivot step
        before = len(self.phases)
        try:
            result = apply_pivot(self.run, k, caps, floors, policy, relative_checkpoint(k))
        except OSError as exc:
            applied = len(read_phases(self.run)) > before
            self.warn(f"pivot at step {k}: {exc}" + ("" if applied else "; not applied"))
            answer_request(self.run, request, applied, f"pivot at step {k}: {exc}"
                           + ("" if applied else "; nothing changed"))
            if applied:
                self.adopt_phases()
            return "stopped" if self.stop_requests else "resume"
        self.adopt_phases()
        self.samples = SamplesFile(self.run.samples, self.opts.samples_kept)
        self.bandit, self.caps, self.floors = bandit_for_phase(self.experiment, self.phase)
        self.message = None
        self._write_state(force=True)
        self._apply_retention()
        answer_request(self.run, request, True, result.message(self.run),
                       **{k2: v for k2, v in result.response(self.run, request.get("id")).items()
                          if k2 not in ("id", "ok", "message")})
        self.say(result.message(self.run))
        return "stopped" if self.stop_requests else "pivoted"

    def adopt_phases(self) -> Phase:
        """Re-read phases.json and make its last phase current (the seam `proxy pivot` uses
        between segments: the next segment starts a fresh bandit for that phase and resumes from
        the newest checkpoint at or after its start step)."""
        self.phases = read_phases(self.run)
        self.phase = current_phase(self.phases)
        return self.phase

    # ------------------------------------------------------------ the run
    def run_forever(self) -> int:
        """Train to max_steps, restarting the engine as needed. Returns the exit code."""
        old = self._install_signals()
        try:
            return self._loop()
        except SupervisorError as exc:
            self.status = "stopped" if self.status == "running" else self.status
            self.message = str(exc)
            self.warn(str(exc))
            return exc.code
        finally:
            if self.segment is not None and self.segment.engine.alive():
                self._shutdown_engine(self.segment)
            self.writer.close()
            self._write_state(force=True)
            self._refuse_pivots("the proxy is exiting")
            for sig, handler in old.items():
                signal.signal(sig, handler)

    def _loop(self) -> int:
        while True:
            if self.stop_requests:
                self.status = "stopped"
                self.say(f"stopped at step {self._last_step()} (no engine running)")
                return EXIT_OK
            outcome = self._run_segment()
            if self.pivot_job is not None:
                outcome = self._finish_pivot(self.segment, outcome)
            if outcome in ("pivoted", "resume"):  # a new segment: the new phase, or the same one again
                continue
            if outcome == "finished":
                self.status = "finished"
                self.message = f"finished at step {self.max_steps}"
                self.say(f"run {self.run.root} finished: step {self.max_steps}, "
                         f"last checkpoint {self.last_ckpt_path}")
                return EXIT_OK
            if outcome == "stopped":
                self.status = "stopped"
                self.message = f"stopped at step {self._last_step()}"
                self.say(f"stopped at step {self._last_step()}; checkpoint {self.last_ckpt_path}; "
                         "relaunch the same command to resume")
                return EXIT_OK
            seg = self.segment
            if outcome == "fatal":
                self.status = "crashloop"
                raise SupervisorError(f"engine cannot run: {seg.last_error or 'see ' + str(self.run.engine_log)}",
                                      EXIT_FAILURE)
            # a crash or a hang
            if seg.last_step > self.high_water:
                self.high_water = seg.last_step
                self.failures = 1
            else:
                self.failures += 1
            what = "hung (no event in time; killed)" if seg.hung else exit_description(seg.engine.poll())
            detail = f": {seg.last_error}" if seg.last_error else ""
            if self.failures >= self.opts.max_failures:
                self.status = "crashloop"
                self.message = (f"engine failed {self.failures} times without progress past step "
                                f"{self.high_water} (last: {what}{detail}); see {self.run.engine_log}")
                raise SupervisorError(f"crash loop: {self.message}; stopping", EXIT_CRASHLOOP)
            delay = min(self.opts.backoff_max_s, self.opts.backoff_s * 2 ** (self.failures - 1))
            self.restarts += 1
            self.warn(f"engine {what}{detail} at step {seg.last_step}; restarting from the newest valid "
                      f"checkpoint in {delay:.1f}s (failure {self.failures} of {self.opts.max_failures})")
            self._write_state(force=True)
            end = time.monotonic() + delay
            while time.monotonic() < end and not self.stop_requests:
                if self.pivot_signals:
                    self._take_pivot_requests(refuse=f"the engine is restarting after a failure (failure "
                                              f"{self.failures} of {self.opts.max_failures}); try again once "
                                              "it is training")
                time.sleep(min(0.1, max(0.0, end - time.monotonic())))

    def _last_step(self) -> int:
        return self.segment.last_step if self.segment else 0

    # ------------------------------------------------------------ one engine launch
    def _start_segment(self) -> Segment:
        self.writer.fsync()
        index = LossLogIndex.load(self.run.loss_log)
        phase = self.phase
        resume = choose_resume(self.run.checkpoints, index, phase, self.rejected)
        for reason in resume.skipped:
            self.warn(f"not resuming from {reason}")
        c = resume.step
        if self.segment_number == 0:
            self.segment_number = index.max_segment
            self.high_water = c
        self.segment_number += 1

        bandit, self.caps, self.floors = bandit_for_phase(self.experiment, phase)
        init = np.array(bandit.weights(), dtype=np.float64, copy=True)
        pending = {s: init for s in range(c + 1, c + self.lag + 1) if s - self.lag <= phase.start_step}
        known = set(self.arm_names)
        for t, entry in index.iter_steps(phase.start_step + 1, c):
            arms = {a: v for a, v in entry.arms.items() if a in known}
            extra = set(entry.arms) - known
            if extra - self.dropped_arms:
                self.warn(f".loss.json names arm(s) {', '.join(sorted(extra))} that the experiment does not "
                          "define; dropped from the bandit's replay")
                self.dropped_arms |= extra
            # the mixture step t was drawn from (exp3 weights its rewards by it), as logged
            bandit.observe(t, arms, mixture=entry.mixture)
            if t + self.lag > c:
                pending[t + self.lag] = np.array(bandit.weights(), dtype=np.float64, copy=True)
        self.bandit = bandit

        if c > 0:
            entry = index.step(c)
            trailer = read_trailer(resume.path) if entry is None else None
            tokens = entry.tokens if entry is not None else trailer.tokens_seen if trailer else None
            self.tokens = int(tokens or 0)
            if entry is not None:
                self.last_loss = entry.loss
        else:
            self.tokens = 0
        if resume.path is not None:
            self.last_ckpt_step, self.last_ckpt_path = c, str(resume.path)
        self.rate_window.clear()
        replay_through = max((s for s, (_o, p) in index.steps.items() if s > c and p == phase.phase), default=c)

        meta = {"experiment": self.experiment.name, "phase": phase.phase}
        flags = list(self.experiment.engine_flags())
        if experiment_changed(self.run):
            # the run went on under a changed experiment: its older checkpoints carry the old
            # optimizer settings, and the frozen experiment (not the checkpoint) is the truth
            flags.append("--allow-hparam-change")
        argv = [str(self.engine_choice.path),
                *engine_args(self.run.checkpoints, resume=resume.path, ckpt_every=int(self.train.ckpt_every),
                             meta=meta, settings=flags)]
        where = f"from {resume.path.name} (step {c})" if resume.path else "from scratch"
        engine = EngineProcess(argv, self.run.engine_log, header=f"segment {self.segment_number}, {where}")
        record_engine(self.run.engine_record, engine)
        self.say(f"segment {self.segment_number}: engine pid {engine.pid} ({self.engine_choice.kind}) "
                 f"starting {where}" + (f"; steps {c + 1}..{replay_through} will be replayed and compared"
                                        if replay_through > c else ""))
        self.engine_status = EngineStatus(kind=self.engine_choice.kind, pid=engine.pid, alive=True,
                                          path=str(self.engine_choice.path))
        return Segment(number=self.segment_number, engine=engine, resume=resume, next_step=c + 1, last_step=c,
                       pending_weights=pending, replay_index=index, replay_through=replay_through)

    def _run_segment(self) -> str:
        seg = self.segment = self._start_segment()
        self._catch_up(seg)
        self._write_state(force=True)
        engine = seg.engine
        while True:
            self._handle_requests(seg)
            self._feed(seg)
            try:
                kind, payload = engine.events.get(timeout=0.2)
            except queue.Empty:
                kind, payload = None, None
            if kind == EVENT:
                seg.last_activity = time.monotonic()
                self._on_event(seg, payload)
            elif kind == NOISE:
                self.warn(f"engine stdout: {payload[:300]}")
            elif kind == WRITE_FAILED:
                pass  # the engine is gone or going; EOF follows
            elif kind == EOF:
                break
            self._periodic(seg)
            if self._hung(seg):
                seg.hung = True
                self.warn(f"engine pid {engine.pid} sent nothing for {time.monotonic() - seg.last_activity:.0f}s "
                          f"(limit {self._allowance(seg):.0f}s); killing its process group")
                self._kill(seg)
        code = engine.wait(30)
        if code is None:
            engine.kill_group()
            code = engine.wait(30)
        engine.finish()
        self.engine_status.alive = False
        self.writer.fsync()
        self._apply_retention()
        if seg.last_error is None and code not in (0, None):
            seg.last_error = self._engine_log_tail()
        return self._classify(seg, code)

    def _classify(self, seg: Segment, code: int | None) -> str:
        if seg.hung:
            return "hung"
        if code == 0:
            if seg.last_step >= self.max_steps:
                return "finished"
            if self.stop_requests or seg.stop_sent:
                return "stopped"
            if seg.exit_reason == "signal":
                self.warn("the engine was stopped by a signal sent to it directly; stopping the run")
                return "stopped"
            seg.last_error = f"engine exited with reason {seg.exit_reason!r} before step {self.max_steps}"
            return "failed"
        if self.stop_requests:
            self.warn(f"engine {exit_description(code)} while stopping")
            return "stopped"
        if code == ENGINE_EXIT_USAGE:
            return "fatal"
        if code == EXIT_CHECKPOINT and seg.resume.path is not None:
            self.rejected.add(str(seg.resume.path))
        return "failed"

    def _engine_log_tail(self) -> str | None:
        try:
            with open(self.run.engine_log, "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
                lines = [ln for ln in f.read().decode("utf-8", "replace").splitlines()
                         if ln.strip() and not ln.startswith("===")]
        except OSError:
            return None
        return lines[-1].strip()[:300] if lines else None

    def _catch_up(self, seg: Segment) -> None:
        """An eval or a sample audit due at the resume step that a crash lost: do it now (the
        engine holds exactly that step's weights, so the result is the one the crash lost)."""
        c = seg.resume.step
        if c <= 0 or c > self.max_steps:
            return
        final = c == self.max_steps
        every_eval, every_sample = int(self.train.eval_every), int(self.train.sample_every)
        if every_eval and (final or c % every_eval == 0) and seg.replay_index.eval(c) is None:
            self._send_evals(seg, c)
        pivot_point = self.phase.phase > 0 and c == self.phase.start_step  # audits there were archived
        if self.prompts and every_sample and (final or c % every_sample == 0) and not pivot_point \
                and all(a.step != c for a in self.samples.audits):
            self._send_samples(seg, c)

    # ------------------------------------------------------------ feeding
    def _handle_requests(self, seg: Segment) -> None:
        if self.stop_requests and not seg.stop_sent:
            seg.stop_sent = True
            seg.outstanding.append(Outstanding("stop", 0))
            seg.engine.send(frames.stop_frame())
            self.say("stop requested: the engine finishes the steps in flight, checkpoints and exits")
        elif self.stop_requests >= 2 + seg.signals_forwarded and seg.signals_forwarded < 2:
            seg.signals_forwarded += 1
            if seg.signals_forwarded == 1:
                self.warn("second stop request: sending SIGTERM to the engine")
                seg.engine.signal(signal.SIGTERM)
            else:
                self.warn("third stop request: killing the engine")
                self._kill(seg)
        if self.pivot_signals and self._take_pivot_requests():
            self._start_pivot(seg)
        while self.ckpt_requests:
            self.ckpt_requests -= 1
            if not seg.stop_sent:
                seg.engine.send(frames.checkpoint_frame())
                seg.ckpt_pending = True

    def _feed(self, seg: Segment) -> None:
        while not seg.stop_sent and seg.next_step <= self.max_steps and seg.next_step in seg.pending_weights:
            s = seg.next_step
            weights = seg.pending_weights.pop(s)
            tokens, groups = self.sampler.train_batch(s, weights, self.rows)
            seg.engine.send(frames.train_frame(s, tokens, groups))
            seg.outstanding.append(Outstanding("step", s))
            seg.mixtures[s] = weights  # kept until the step's event is logged
            final = s == self.max_steps
            every_eval, every_sample = int(self.train.eval_every), int(self.train.sample_every)
            if every_eval and (final or s % every_eval == 0):
                self._send_evals(seg, s)
            if self.prompts and every_sample and (final or s % every_sample == 0):
                self._send_samples(seg, s)
            seg.next_step += 1
            if final:
                seg.stop_sent = True
                seg.outstanding.append(Outstanding("stop", 0))
                seg.engine.send(frames.stop_frame())

    def _send_evals(self, seg: Segment, step: int) -> None:
        rows = int(self.train.eval_rows)
        if rows <= 0:
            return
        self.evals[step] = {}
        for arm in range(len(self.arm_names)):
            tokens, groups = self.sampler.eval_batch(arm, rows)
            rid = seg.next_request
            seg.next_request += 1
            seg.requests[rid] = ("eval", step, arm)
            seg.engine.send(frames.eval_frame(rid, tokens, groups))
            seg.outstanding.append(Outstanding("eval", rid, max(1.0, len(groups) / self.rows)))

    def _send_samples(self, seg: Segment, step: int) -> None:
        cfg = self.experiment.samples
        self.sample_parts[step] = {}
        for i, (_prompt, ids) in enumerate(self.prompts):
            rid = seg.next_request
            seg.next_request += 1
            seg.requests[rid] = ("sample", step, i)
            seg.engine.send(frames.sample_frame(rid, ids, int(cfg.count), int(cfg.max_new),
                                                float(cfg.temperature), int(cfg.top_k or 0),
                                                sample_seed(int(self.train.seed), step, i)))
            work = max(1.0, int(cfg.count) * int(cfg.max_new) / self.rows)
            seg.outstanding.append(Outstanding("sample", rid, work))

    # ------------------------------------------------------------ events
    def _settle(self, seg: Segment, kind: str, key: int) -> None:
        for i, item in enumerate(seg.outstanding):
            if item.kind == kind and item.key == key:
                del seg.outstanding[i]
                return

    def _kill(self, seg: Segment) -> None:
        """SIGKILL the engine's group; its remaining events are ignored."""
        seg.killed = True
        seg.engine.kill_group()

    def _on_event(self, seg: Segment, ev: frames.Event) -> None:
        if seg.killed:
            return
        handler = getattr(self, f"_ev_{ev.kind}", None)
        if handler is not None:
            handler(seg, ev)

    def _ev_ready(self, seg: Segment, ev) -> None:
        seg.ready = ev.fields
        st = self.engine_status
        st.kind = ev.get("engine", st.kind)
        st.device, st.threads = ev.get("device"), ev.get("threads")
        st.precision, st.mem_bytes = ev.get("precision"), ev.get("mem_bytes")
        if int(ev.get("step", -1)) != seg.resume.step:
            seg.last_error = (f"engine resumed at step {ev.get('step')} (from {ev.get('resumed_from')}), "
                              f"expected {seg.resume.step}")
            self.warn(seg.last_error + "; killing it")
            self._kill(seg)
        else:
            self.say(f"engine ready: {st.kind} on {st.device}, step {seg.resume.step}, "
                     f"{ev.get('n_params')} parameters")

    def _ev_step(self, seg: Segment, ev) -> None:
        t = int(ev["step"])
        now = time.time()
        if t != seg.last_step + 1:
            seg.last_error = f"engine reported step {t}, expected {seg.last_step + 1}"
            self.warn(seg.last_error + "; killing it")
            self._kill(seg)
            return
        weights = seg.mixtures[t]
        arms = {}
        for group, loss in dict(ev.get("group_loss") or {}).items():
            i = int(group)
            if 0 <= i < len(self.arm_names):
                arms[self.arm_names[i]] = float(loss)
        values = [float(ev["loss"]), float(ev.get("grad_norm", 0.0)), *arms.values()]
        if not all(math.isfinite(v) for v in values):
            seg.last_error = f"engine reported a non-finite loss or gradient norm at step {t}"
            self.warn(seg.last_error + "; killing it")
            self._kill(seg)
            return
        self._settle(seg, "step", t)
        del seg.mixtures[t]
        self.tokens += int(ev.get("tokens", 0))
        entry = StepEntry(step=t, loss=float(ev["loss"]), lr=float(ev.get("lr", 0.0)),
                          grad_norm=float(ev.get("grad_norm", 0.0)), tokens=self.tokens, time=now,
                          ms=float(ev.get("ms", 0.0)), arms=arms,
                          mixture={n: float(w) for n, w in zip(self.arm_names, weights)},
                          phase=self.phase.phase, segment=seg.number)
        self.writer.append(entry)
        if t <= seg.replay_through:
            self._compare(seg, entry)
        seg.last_step = t
        self.bandit.observe(t, arms, mixture=entry.mixture)  # the same floats replay reads back
        seg.pending_weights[t + self.lag] = np.array(self.bandit.weights(), dtype=np.float64, copy=True)
        self.last_loss = entry.loss
        self.smoothed = entry.loss if self.smoothed is None else 0.9 * self.smoothed + 0.1 * entry.loss
        self.rate_window.append((now, self.tokens, t))
        mono = time.monotonic()
        if seg.last_step_wall is not None:
            seg.step_walls.append(mono - seg.last_step_wall)
        seg.last_step_wall = mono
        every = int(self.train.ckpt_every)
        if every > 0 and t % every == 0:
            seg.ckpt_pending = True

    def _compare(self, seg: Segment, entry: StepEntry) -> None:
        recorded = seg.replay_index.step(entry.step)
        if recorded is None or recorded.phase != entry.phase or recorded.segment == entry.segment:
            return
        mismatch = compare_replayed(recorded, entry)
        if mismatch is None:
            return
        self.mismatch_count += 1
        self.mismatches = (self.mismatches + [mismatch.to_dict()])[-50:]
        self.warn(mismatch.message())
        self._write_state(force=True)

    def _ev_eval(self, seg: Segment, ev) -> None:
        rid = int(ev.get("id", 0))
        self._settle(seg, "eval", rid)
        what = seg.requests.pop(rid, None)
        if not what or what[0] != "eval":
            return
        _, step, arm = what
        group_loss = dict(ev.get("group_loss") or {})
        group_tokens = dict(ev.get("group_tokens") or {})
        loss = float(group_loss.get(str(arm), ev["loss"]))
        tokens = float(group_tokens.get(str(arm), 1) or 1)
        parts = self.evals.setdefault(step, {})
        parts[arm] = (loss, tokens)
        if len(parts) < len(self.arm_names):
            return
        del self.evals[step]
        total = sum(t for _, t in parts.values())
        mean = sum(l * t for l, t in parts.values()) / total
        entry = EvalEntry(step=step, loss=mean, arms={self.arm_names[a]: l for a, (l, _t) in sorted(parts.items())},
                          time=time.time(), phase=self.phase.phase, segment=seg.number)
        self.writer.append(entry)
        self.eval_loss[step] = mean
        self.say(f"eval step {step}: val loss {mean:.4f} (" +
                 ", ".join(f"{n} {v:.3f}" for n, v in entry.arms.items()) + ")")
        self._maybe_best(step)

    def _ev_sample(self, seg: Segment, ev) -> None:
        rid = int(ev.get("id", 0))
        self._settle(seg, "sample", rid)
        what = seg.requests.pop(rid, None)
        if not what or what[0] != "sample":
            return
        _, step, i = what
        parts = self.sample_parts.setdefault(step, {})
        prompt = self.prompts[i][0]
        outs = []
        for ids in ev.get("tokens") or []:
            ids = [int(x) for x in ids]
            try:
                text = self.data.tokenizer.decode(ids)
            except Exception as exc:  # a tokenizer failure must not stop training
                text = f"<decode failed: {exc}>"
            outs.append(Sample(prompt=prompt, completion=text, tokens=ids))
        parts[i] = outs
        if len(parts) < len(self.prompts):
            return
        del self.sample_parts[step]
        samples = [s for k in sorted(parts) for s in parts[k]]
        self.samples.add(SampleAudit(step=step, time=time.time(), samples=samples))

    def _ev_ckpt(self, seg: Segment, ev) -> None:
        step = int(ev["step"])
        seg.ckpt_pending = False
        self.ckpt_ms = max(self.ckpt_ms, float(ev.get("ms", 0.0)))
        path = Path(str(ev.get("path") or checkpoint_path(self.run.checkpoints, step)))
        if not path.is_absolute():
            path = checkpoint_path(self.run.checkpoints, step)
        self.writer.fsync()  # the log now covers this checkpoint durably
        self.last_ckpt_step, self.last_ckpt_path = step, str(path)
        self._apply_retention()
        self._maybe_best(step)
        self._write_state(force=True)
        self._progress(seg, f"checkpoint {path.name} ({ev.get('reason')}, {float(ev.get('ms', 0)):.0f} ms)")

    def _ev_exit(self, seg: Segment, ev) -> None:
        seg.exit_reason = ev.get("reason")
        self._settle(seg, "stop", 0)

    def _ev_error(self, seg: Segment, ev) -> None:
        seg.last_error = str(ev.get("message"))
        self.warn(f"engine error: {seg.last_error} (code {ev.get('code')})")

    # ------------------------------------------------------------ checkpoints
    def _maybe_best(self, step: int) -> None:
        loss = self.eval_loss.get(step)
        path = checkpoint_path(self.run.checkpoints, step)
        if loss is None or not path.exists() or not best_is_better(loss, self.best_loss):
            return
        if self.best_step == step and self.best_loss == loss:
            return
        try:
            copy_best(path, self.run.best)
        except OSError as exc:
            self.warn(f"cannot update {self.run.best}: {exc}")
            return
        self.best_step, self.best_loss = step, loss

    def _apply_retention(self) -> None:
        protected = protected_by_phases(self.phases)
        if self.last_ckpt_step is not None:
            protected.add(self.last_ckpt_step)
        if self.segment is not None and self.segment.resume.path is not None:
            protected.add(self.segment.resume.step)
        try:
            apply_retention(self.run.checkpoints, self.retention, protected)
        except OSError as exc:
            self.warn(f"retention: {exc}")

    # ------------------------------------------------------------ time
    def _base_timeout(self, seg: Segment) -> float:
        if self.opts.hang_timeout:
            return float(self.opts.hang_timeout)
        if len(seg.step_walls) < 3:
            return 300.0
        return max(30.0, 20.0 * statistics.median(seg.step_walls))

    def _allowance(self, seg: Segment) -> float:
        base = self._base_timeout(seg)
        head = seg.outstanding[0] if seg.outstanding else None
        allowance = base * (head.work if head else 1.0)
        if seg.ckpt_pending or (head is not None and head.kind == "stop"):
            allowance += base if self.opts.hang_timeout else max(60.0, 10.0 * self.ckpt_ms / 1000.0)
        if seg.ready is None or seg.last_step_wall is None:  # loading, first step
            allowance = max(allowance, 3 * base if self.opts.hang_timeout else 600.0)
        return allowance

    def _hung(self, seg: Segment) -> bool:
        if seg.hung or seg.killed:
            return False
        quiet = time.monotonic() - seg.last_activity
        if seg.exit_reason is not None:  # said goodbye but its stdout stays open
            return quiet > 60.0
        return bool(seg.outstanding) and quiet > self._allowance(seg)

    def _periodic(self, seg: Segment) -> None:
        self.writer.maybe_fsync()
        if time.monotonic() - self.last_state_write >= self.opts.state_every_s:
            self._write_state()

    def _rates(self) -> tuple[float | None, float | None]:
        if len(self.rate_window) < 2:
            return None, None
        (t0, k0, s0), (t1, k1, s1) = self.rate_window[0], self.rate_window[-1]
        if t1 <= t0 or s1 <= s0:
            return None, None
        return (k1 - k0) / (t1 - t0), (self.max_steps - s1) * (t1 - t0) / (s1 - s0)

    def _progress(self, seg: Segment, what: str) -> None:
        rate, eta = self._rates()
        loss = f"loss {self.last_loss:.4f} (smoothed {self.smoothed:.4f})" if self.smoothed is not None else ""
        self.say(f"step {seg.last_step}/{self.max_steps} {loss} | {_fmt_rate(rate)} tok/s | "
                 f"ETA {_fmt_duration(eta)} | {what}")

    # ------------------------------------------------------------ state
    def _arm_status(self) -> dict[str, ArmStatus]:
        """Per-arm figures for .state.json: the bandit's own (pulls, EMA, reward), our weights/caps."""
        weights = list(self.bandit.weights()) if self.bandit is not None else [0.0] * len(self.arm_names)
        raw = self.bandit.state() if self.bandit is not None else {}
        per_arm = raw.get("arms") if isinstance(raw, dict) and isinstance(raw.get("arms"), dict) else {}
        out = {}
        for i, name in enumerate(self.arm_names):
            info = per_arm.get(name) if isinstance(per_arm.get(name), dict) else {}
            out[name] = ArmStatus(pulls=int(info.get("pulls") or 0), ema=info.get("ema"), reward=info.get("reward"),
                                  weight=float(weights[i]), cap=float(self.caps.get(name, 1.0)),
                                  floor=float(self.floors.get(name, 0.0)))
        return out

    def _write_state(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last_state_write < self.opts.state_every_s:
            return
        self.last_state_write = now
        seg = self.segment
        if seg is not None:
            alive = seg.engine.alive()
            rss, cpu = seg.engine.usage() if alive else (None, None)
            self.engine_status.alive = alive
            self.engine_status.rss_bytes, self.engine_status.cpu_percent = rss, cpu
        rate, eta = self._rates()
        try:
            bandit_state = self.bandit.state() if self.bandit is not None else {}
        except Exception:
            bandit_state = {}
        state = RunState(step=self._last_step(), phase=self.phase.phase, policy=self.phase.policy,
                         status=self.status, arms=self._arm_status(), tokens=self.tokens, tokens_per_s=rate,
                         eta_s=eta if self.status == "running" else None, last_checkpoint=self.last_ckpt_path,
                         engine=self.engine_status, experiment=self.experiment.name, max_steps=self.max_steps,
                         segment=self.segment_number, loss=self.last_loss, loss_smoothed=self.smoothed,
                         best={"step": self.best_step, "loss": self.best_loss, "path": str(self.run.best)}
                         if self.best_step is not None else None,
                         restarts=self.restarts, message=self.message, proxy_pid=os.getpid(),
                         replay_mismatch_count=self.mismatch_count, replay_mismatches=self.mismatches,
                         dropped_arms=sorted(self.dropped_arms), bandit=bandit_state)
        try:
            write_state(self.run.state, state)
        except (OSError, ValueError, TypeError) as exc:
            self.warn(f"cannot write {self.run.state}: {exc}")

    # ------------------------------------------------------------ shutdown
    def _shutdown_engine(self, seg: Segment) -> None:
        """On an unexpected error in the proxy: EOF makes the engine checkpoint and exit."""
        seg.engine.close_input()
        if seg.engine.wait(60) is None:
            self._kill(seg)
            seg.engine.wait(10)
        seg.engine.finish()
        self.engine_status.alive = False


# ------------------------------------------------------------ `proxy run`

@dataclass
class RunRequest:
    experiment_path: Path
    run_dir: Path | None = None
    engine: str | None = None
    allow_experiment_change: bool = False
    cache_dir: Path | None = None
    options: SupervisorOptions = field(default_factory=SupervisorOptions)


_EARLY_SIGNALS: dict[int, int] = {}


def _early_signal(signum, _frame) -> None:
    _EARLY_SIGNALS[signum] = _EARLY_SIGNALS.get(signum, 0) + 1


def start_run(request: RunRequest, on_started=None, out=None, err=None) -> int:
    """`proxy run` (see _start_run). SIGUSR1 and SIGUSR2 (`proxy checkpoint`, `proxy pivot`) may come
    as soon as the lock names this process: until the supervisor takes them over they are counted,
    never fatal (their default action would end the process)."""
    _EARLY_SIGNALS.clear()
    old = {sig: signal.signal(sig, _early_signal) for sig in (signal.SIGUSR1, signal.SIGUSR2)}
    try:
        return _start_run(request, on_started, out, err)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        _EARLY_SIGNALS.clear()  # a pivot request left unclaimed: `proxy pivot` sees the lock go and withdraws it


def _start_run(request: RunRequest, on_started=None, out=None, err=None) -> int:
    """`proxy run`: everything from the experiment file to the exit code.

    `on_started(run_dir)` is called once the run directory is locked and the
    data are ready (the CLI starts the dashboard there). Raises SupervisorError
    for anything the user must fix; returns the exit code otherwise.
    """
    from ..data.prepare import DataError, default_cache_dir, prepare_data
    from ..config.experiment import ExperimentError, load_experiment
    from ..rundir.layout import (RunDirError, RunLock, default_run_dir, ensure_phases, freeze_experiment)
    from ..data.batches import BatchError
    from .engine_process import choose_engine

    out, err = out or sys.stdout, err or sys.stderr
    try:
        experiment = load_experiment(request.experiment_path)
    except ExperimentError as exc:
        raise SupervisorError(str(exc), EXIT_USAGE) from None
    try:
        engine = choose_engine(request.engine)
    except EngineError as exc:
        raise SupervisorError(str(exc), EXIT_USAGE) from None
    run = RunDir(Path(request.run_dir) if request.run_dir else default_run_dir(experiment.name))
    try:
        run.create()
    except RunDirError as exc:
        raise SupervisorError(str(exc), EXIT_USAGE) from None
    try:
        lock = RunLock(run).acquire()
    except RunDirError as exc:
        raise SupervisorError(str(exc), EXIT_FAILURE) from None
    try:
        try:
            changed = freeze_experiment(run, Path(request.experiment_path), experiment,
                                        request.allow_experiment_change)
            phases = ensure_phases(run, experiment)
        except RunDirError as exc:
            raise SupervisorError(str(exc), EXIT_USAGE) from None
        if changed:
            print(f"proxy: experiment changed ({', '.join(changed)}); continuing with the new one "
                  "(--allow-experiment-change)", file=err, flush=True)
        reaped = reap_orphan(run.engine_record, request.options.orphan_grace_s)
        if reaped:
            print(f"proxy: {reaped}", file=err, flush=True)

        index = LossLogIndex.load(run.loss_log)
        resume = choose_resume(run.checkpoints, index, current_phase(phases), set())
        if resume.step >= experiment.train.max_steps:
            print(f"run {run.root} already finished at step {resume.step} (max_steps "
                  f"{experiment.train.max_steps}); nothing to do", file=out, flush=True)
            _mark_finished(run)
            return EXIT_OK
        try:
            data = prepare_data(experiment, Path(request.experiment_path).parent,
                                request.cache_dir or default_cache_dir())
        except (DataError, ExperimentError) as exc:
            raise SupervisorError(str(exc), EXIT_USAGE) from None
        try:
            supervisor = Supervisor(experiment, run, data, engine, request.options, out=out, err=err)
        except BatchError as exc:
            raise SupervisorError(str(exc), EXIT_USAGE) from None
        if on_started is not None:
            on_started(run)
        return supervisor.run_forever()
    finally:
        lock.release()


def _mark_finished(run: RunDir) -> None:
    state = read_state(run.state)
    if state is not None and state.get("status") != "finished":
        from ..atomic import atomic_write_json
        state["status"] = "finished"
        state["updated"] = time.time()
        if isinstance(state.get("engine"), dict):
            state["engine"]["alive"] = False
        atomic_write_json(run.state, state)

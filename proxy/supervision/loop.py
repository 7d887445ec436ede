"""The supervisor's loop: one engine launch (segment) after another until the run finishes, stops or gives up.

Each segment is pumped here: signals turned into frames, frames fed, events
dispatched, `.state.json` kept fresh, a hung engine killed. How a segment
ended decides what comes next (the restart policy): finished or stopped ends
the run with exit 0; a crash or a hang restarts the engine from the newest
valid checkpoint after a back-off that doubles per consecutive failure, and
--max-failures failures without progress past the highest step reached end
the run as a crash loop (exit 3); an engine that rejects its command line
ends it at once (exit 1); a run that diverged (a step's loss not sane, or the
engine's exit 6: the same frames would diverge again) ends at once (exit 6),
naming the newest sane checkpoint; a run directory moved or replaced under the
proxy ends it at once (exit 1), its engine killed, nothing written by path.
"""
from __future__ import annotations

import os
import queue
import signal
import time

from ..errors import EXIT_CRASHLOOP, EXIT_DIVERGED, EXIT_FAILURE, EXIT_OK, ProxyError, StorageError, one_line
from ..formats import frames
from ..formats.checkpoint import checkpoint_path
from ..formats.engine_cli import EXIT_CHECKPOINT, EXIT_NUMERICS, EXIT_USAGE as ENGINE_EXIT_USAGE, exit_description
from ..rundir.layout import ENGINE_LOG_TAIL
from ..rundir.lock import RunDirReplaced
from ..safe_fs import UnsafeFileError, open_regular
from .checkpoints import retain
from .context import RunContext
from .engine_process import EOF, EVENT, NOISE, WRITE_FAILED
from .events import EventHandlers
from .pivot_desk import PivotDesk
from .segment import Outcome, Segment, catch_up, feed, launch_segment
from .signals import SignalCounts
from .storage_stop import EngineStorageError, engine_full_disk, resume_line
from .live_status import last_step, say_progress_on_clock, write_run_state
from .watchdog import Watchdog

POLL_S = 0.2  # how long the loop waits for an event before it looks at signals and the clock
PAUSE_NOTICE_S = 5.0  # a pause of the proxy this long is said on stderr (a shorter one, a busy machine's, is not)


class Supervisor:
    def __init__(self, ctx: RunContext):
        self.ctx = ctx
        self.events = EventHandlers(ctx)
        self.desk = PivotDesk(ctx)
        self.watchdog = Watchdog(ctx.opts.hang_timeout, POLL_S)
        self.segment: Segment | None = None
        self.failures = 0  # consecutive, without progress past high_water
        self.high_water = 0  # the highest step an engine of this process reached

    def run_forever(self) -> int:
        """Train to max_steps, restarting the engine as needed. Returns the exit code.

        A ProxyError (a crash loop, an engine that cannot run, a write that failed for lack of space or
        an I/O error, a run-directory file that is not a regular file) ends the run cleanly: the engine
        gets EOF (it checkpoints and exits), the log is synced, `.state.json` says why, and the one
        line for the user comes last."""
        ctx = self.ctx
        old = ctx.signals.install()
        failure: ProxyError | None = None
        try:
            return self._loop()
        except RunDirReplaced as exc:  # nothing more is written by path: it leads elsewhere now
            failure = exc
            self._abandon()
            return exc.code
        except (ProxyError, UnsafeFileError) as exc:  # each carries its exit code
            failure = exc
            self._record_failure(exc)
            return exc.code
        finally:
            unwritten = [] if isinstance(failure, RunDirReplaced) else self._wind_down()
            SignalCounts.restore(old)
            if failure is not None:
                ctx.warn(self._failure_line(failure, unwritten))

    def _record_failure(self, exc: ProxyError) -> None:
        self.ctx.report.failed(one_line(exc), {"path": exc.path, "errno": exc.errno_name, "error": exc.strerror}
                               if isinstance(exc, StorageError) else None)

    def _wind_down(self) -> list[str]:
        """Stop the engine (EOF: it checkpoints), finish the best.bin copy in flight, close the log, write
        `.state.json`, refuse pending pivots. Returns the files that could not be written meanwhile (a full
        disk stays full)."""
        ctx = self.ctx
        if self.segment is not None and self.segment.engine.alive():
            self._shutdown_engine(self.segment)
        unwritten: list[str] = []
        for finish in (lambda: ctx.best_copier.wait(ctx.report, ctx.warn), ctx.writer.close,
                       lambda: write_run_state(ctx, self.segment, force=True),
                       lambda: self.desk.refuse_all("the proxy is exiting")):
            try:
                finish()
            except StorageError as exc:
                unwritten.append(exc.path)
        return unwritten

    def _abandon(self) -> None:
        """The run directory was replaced: kill the engine (an EOF checkpoint would be written by path into
        whatever now has the directory's name), finish the copy in flight, close the log (its descriptor is
        the old directory's). Nothing is written by path."""
        seg = self.segment
        if seg is not None and seg.engine.alive():
            seg.kill()
            seg.engine.wait(30)
            seg.engine.finish()
        self.ctx.best_copier.wait(self.ctx.report, lambda _line: None)
        try:
            self.ctx.writer.close()
        except StorageError:
            pass

    def _failure_line(self, exc: ProxyError, unwritten: list[str]) -> str:
        """The one line that ends a failed run; for a failed write, what became of the engine's checkpoint."""
        if not isinstance(exc, StorageError):
            return one_line(exc)
        seg = self.segment
        engine = ("" if seg is None or isinstance(exc, EngineStorageError) else
                  "; the engine stopped and wrote its checkpoint" if seg.engine.poll() == 0 else
                  "; the engine's own checkpoint failed too")
        also = f"; could not update {', '.join(sorted(set(unwritten) - {exc.path}))} either" \
            if set(unwritten) - {exc.path} else ""
        return (f"stopped at step {last_step(seg)}: {one_line(exc)}{engine}{also}; {resume_line(self.ctx)}; every "
                "complete line of .loss.json is kept; then relaunch the same command to resume")

    def _loop(self) -> int:
        ctx, report = self.ctx, self.ctx.report
        while True:
            if ctx.signals.stop:
                report.set_status("stopped")
                ctx.say(f"stopped at step {last_step(self.segment)} (no engine running)")
                return EXIT_OK
            outcome = self._run_segment()
            if self.desk.job is not None:
                outcome = self.desk.finish(self.segment, outcome)
            if outcome in (Outcome.PIVOTED, Outcome.RESUME):  # a new segment: the new phase, or the same one again
                continue
            if outcome == Outcome.FINISHED:
                report.set_status("finished", f"finished at step {ctx.max_steps}")
                ctx.say(f"run {ctx.run.root} finished: step {ctx.max_steps}, "
                        f"last checkpoint {report.last_ckpt_path}")
                return EXIT_OK
            if outcome == Outcome.STOPPED:
                report.set_status("stopped", f"stopped at step {last_step(self.segment)}")
                saved = (f"checkpoint {report.last_ckpt_path}" if report.last_ckpt_path
                         else "no checkpoint written (a relaunch starts from scratch)")
                ctx.say(f"stopped at step {last_step(self.segment)}; {saved}; relaunch the same command to resume")
                return EXIT_OK
            seg = self.segment
            if outcome == Outcome.DIVERGED:
                report.set_status("diverged", self._divergence_line())
                raise ProxyError(report.message, EXIT_DIVERGED)
            if outcome == Outcome.FATAL:
                report.set_status("crashloop")
                raise ProxyError(f"engine cannot run: {seg.last_error or 'see ' + str(ctx.run.engine_log)}",
                                 EXIT_FAILURE)
            self._restart_after_failure(seg)

    def _divergence_line(self) -> str:
        """The one line that ends a diverged run: where, why, and the newest sane checkpoint to go back to."""
        ctx, report = self.ctx, self.ctx.report
        sane = report.last_sane_ckpt_step
        back = (f"the newest sane checkpoint is {checkpoint_path(ctx.run.checkpoints, sane)} (step {sane}): a "
                "relaunch resumes there" if sane is not None else "no sane checkpoint: a relaunch starts from scratch")
        return (f"the run diverged at step {report.diverged_step}: {report.diverged_why}; {back} and, unchanged, "
                "diverges again the same way: lower train.lr (relaunch with --allow-experiment-change) or pivot")

    def _restart_after_failure(self, seg: Segment) -> None:
        """A crash or a hang: count it, give up on a crash loop, else wait the back-off (refusing pivots)."""
        ctx, opts, report = self.ctx, self.ctx.opts, self.ctx.report
        if seg.last_step > self.high_water:
            self.high_water = seg.last_step
            self.failures = 1
        else:
            self.failures += 1
        what = "hung (no event in time; killed)" if seg.hung else exit_description(seg.engine.poll())
        detail = f": {seg.last_error}" if seg.last_error else ""
        if self.failures >= opts.max_failures:
            report.set_status("crashloop", f"engine failed {self.failures} times without progress past step "
                                           f"{self.high_water} (last: {what}{detail}); see {ctx.run.engine_log}")
            raise ProxyError(f"crash loop: {report.message}; stopping", EXIT_CRASHLOOP)
        delay = min(opts.backoff_max_s, opts.backoff_s * 2 ** (self.failures - 1))
        report.restarted()
        ctx.warn(f"engine {what}{detail} at step {seg.last_step}; restarting from the newest valid "
                 f"checkpoint in {delay:.1f}s (failure {self.failures} of {opts.max_failures})")
        write_run_state(ctx, seg, force=True)
        end = time.monotonic() + delay
        while time.monotonic() < end and not ctx.signals.stop:
            if ctx.signals.pivot:
                self.desk.take(refuse=f"the engine is restarting after a failure (failure "
                                      f"{self.failures} of {opts.max_failures}); try again once it is training")
            time.sleep(min(0.1, max(0.0, end - time.monotonic())))

    # ------------------------------------------------------------ one engine launch
    def _run_segment(self) -> Outcome:
        ctx = self.ctx
        ctx.lock.check()
        first = ctx.segment_number == 0
        seg = self.segment = launch_segment(ctx)
        if first:
            self.high_water = seg.resume.step
        catch_up(ctx, seg)
        write_run_state(ctx, seg, force=True)
        engine = seg.engine
        self.watchdog.begin()
        while True:
            ctx.lock.check()
            self._handle_signals(seg)
            feed(ctx, seg)
            try:
                kind, payload = engine.events.get(timeout=POLL_S)
            except queue.Empty:
                kind, payload = None, None
            if kind == EVENT:
                seg.heard_at(time.monotonic())
                self.events.dispatch(seg, payload)
            elif kind == NOISE:
                ctx.warn(f"engine stdout: {payload[:300]}")
            elif kind == WRITE_FAILED:
                pass  # the engine is gone or going; EOF follows
            elif kind == EOF:
                break
            ctx.best_copier.collect(ctx.report, ctx.warn)
            ctx.writer.maybe_fsync()
            write_run_state(ctx, seg)
            if not seg.stop_sent:
                say_progress_on_clock(ctx, seg, POLL_S)
            self._watch(seg)
        code = engine.wait(30)
        if code is None:
            engine.kill_group()
            code = engine.wait(30)
        engine.finish()
        ctx.report.engine_exited()
        ctx.best_copier.wait(ctx.report, ctx.warn)  # a new phase, a restart or the exit starts from here
        ctx.writer.fsync()
        retain(ctx, seg)
        if seg.last_error is None and code not in (0, None):
            seg.errored(self._engine_log_tail())
        return self._classify(seg, code)

    def _watch(self, seg: Segment) -> None:
        """The hang watchdog's look of this iteration (watchdog.py): the proxy's own pause is said and not
        counted; a confirmed hang kills the engine's process group."""
        ctx, watchdog, engine = self.ctx, self.watchdog, seg.engine
        paused = watchdog.look(seg, time.monotonic())
        if paused >= PAUSE_NOTICE_S:
            ctx.warn(f"the proxy itself did not run for {paused:.0f}s (stopped or starved); not counted as the "
                     f"engine's silence")
        if watchdog.hung(seg, ctx.report.ckpt_ms, engine.events_read > seg.events_heard, engine.cpu_seconds):
            ctx.warn(f"engine pid {engine.pid} sent nothing for {watchdog.quiet(seg, time.monotonic()):.0f}s of the "
                     f"proxy's running time (limit {watchdog.allowance(seg, ctx.report.ckpt_ms):.0f}s), "
                     f"{watchdog.verdict}; killing its process group")
            seg.kill_hung()

    def _handle_signals(self, seg: Segment) -> None:
        """Stop requests (the second SIGTERMs the engine, the third kills it), pivot requests, checkpoints."""
        ctx, signals = self.ctx, self.ctx.signals
        if signals.stop and not seg.stop_signalled:
            what = seg.in_flight()
            seg.stop_now()
            ctx.say(f"stop requested: the engine {what} and exits")
        elif signals.stop >= 2 + seg.signals_forwarded and seg.signals_forwarded < 2:
            if seg.stop_repeated() == 1:
                ctx.warn("second stop request: the engine is still finishing its step or writing its checkpoint; "
                         "a third stop kills it (losing the steps since the last checkpoint)")
                seg.engine.signal(signal.SIGTERM)
            else:
                ctx.warn("third stop request: killing the engine")
                seg.kill()
        if signals.pivot and self.desk.take():
            self.desk.start(seg)
        while signals.take_checkpoint():
            if not seg.stop_sent:
                seg.engine.send(frames.checkpoint_frame())
                seg.checkpoint_due(seg.next_step - 1)

    def _classify(self, seg: Segment, code: int | None) -> Outcome:
        """How the segment ended: finished, stopped, hung, failed, or fatal (the engine cannot run at all)."""
        ctx, report = self.ctx, self.ctx.report
        if report.diverged_step is None and code == EXIT_NUMERICS:  # the engine's own check: never retried,
            # the same frames diverge the same way
            report.diverged(seg.last_step + 1, f"the engine stopped: {seg.last_error or exit_description(code)}")
        if report.diverged_step is not None:
            return Outcome.DIVERGED
        if seg.hung:
            return Outcome.HUNG
        if code == 0:
            if seg.last_step >= ctx.max_steps:
                return Outcome.FINISHED
            if ctx.signals.stop or seg.stop_sent:
                return Outcome.STOPPED
            if seg.exit_reason == "signal":
                ctx.warn("the engine was stopped by a signal sent to it directly; stopping the run")
                return Outcome.STOPPED
            seg.errored(f"engine exited with reason {seg.exit_reason!r} before step {ctx.max_steps}")
            return Outcome.FAILED
        if ctx.signals.stop:
            ctx.warn(f"engine {exit_description(code)} while stopping")
            return Outcome.STOPPED
        full_disk = engine_full_disk(ctx, code, seg.last_error)
        if full_disk is not None:  # a restart would fail the same way until space is freed
            raise full_disk
        if code == ENGINE_EXIT_USAGE:
            return Outcome.FATAL
        if code == EXIT_CHECKPOINT and seg.resume.path is not None:
            ctx.reject_checkpoint(seg.resume.path)
        return Outcome.FAILED

    def _engine_log_tail(self) -> str | None:
        """The engine's last words in engine.log (a crash's reason)."""
        run = self.ctx.run
        try:
            with open_regular(run.engine_log, None, within=run.root) as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - ENGINE_LOG_TAIL))
                lines = [ln for ln in f.read(ENGINE_LOG_TAIL).decode("utf-8", "replace").splitlines()
                         if ln.strip() and not ln.startswith("===")]
        except (OSError, UnsafeFileError):
            return None
        return lines[-1].strip()[:300] if lines else None

    def _shutdown_engine(self, seg: Segment) -> None:
        """On an unexpected error in the proxy: EOF makes the engine checkpoint and exit."""
        seg.engine.close_input()
        if seg.engine.wait(60) is None:
            seg.kill()
            seg.engine.wait(10)
        seg.engine.finish()
        self.ctx.report.engine_exited()

"""The supervisor's loop: one engine launch after another until the run finishes, stops or gives up.

Each launch is pumped here: signals turned into frames, frames fed, events
dispatched, `.state.json` kept fresh, a hung engine killed. How a launch
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
from ..formats.engine_cli import EXIT_CHECKPOINT, EXIT_NUMERICS, exit_description
from ..formats.engine_cli import EXIT_USAGE as ENGINE_EXIT_USAGE
from ..rundir.layout import ENGINE_LOG_TAIL
from ..rundir.lock import RunDirReplaced
from ..safe_fs import UnsafeFileError, open_regular
from .checkpoints import retain
from .context import RunContext
from .engine_process import EOF, EVENT, NOISE, WRITE_FAILED
from .events import EventHandlers
from .feeding import FrameFeeder
from .launch import EngineLaunch, Outcome
from .launcher import start_launch
from .live_status import last_step, say_progress_on_clock, write_run_state
from .pivot_desk import PivotDesk
from .signals import SignalCounts
from .stop_notice import stop_notice
from .storage_stop import EngineStorageError, engine_full_disk, resume_line
from .watchdog import Watchdog

POLL_S = 0.2  # how long the loop waits for an event before it looks at signals and the clock
PAUSE_NOTICE_S = 5.0  # a pause of the proxy this long is said on stderr (a shorter one, a busy machine's, is not)


class Supervisor:
    def __init__(self, ctx: RunContext):
        self.ctx = ctx
        self.events = EventHandlers(ctx)
        self.feeder = FrameFeeder(ctx.sampler, ctx.train, ctx.experiment.samples, ctx.prompts)
        self.desk = PivotDesk(ctx)
        self.watchdog = Watchdog(ctx.opts.hang_timeout, POLL_S)
        self.launch: EngineLaunch | None = None
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
        failure: ProxyError | UnsafeFileError | None = None
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

    def _record_failure(self, exc: ProxyError | UnsafeFileError) -> None:
        self.ctx.report.failed(
            one_line(exc),
            {"path": exc.path, "errno": exc.errno_name, "error": exc.strerror}
            if isinstance(exc, StorageError)
            else None,
        )

    def _wind_down(self) -> list[str]:
        """Stop the engine (EOF: it checkpoints), finish the best.bin copy in flight, close the log, write
        `.state.json`, refuse pending pivots. Returns the files that could not be written meanwhile (a full
        disk stays full)."""
        ctx = self.ctx
        if self.launch is not None and self.launch.engine.alive():
            self._shutdown_engine(self.launch)
        unwritten: list[str] = []
        for finish in (
            lambda: ctx.best_copier.wait(ctx.report, ctx.warn),
            ctx.writer.close,
            lambda: write_run_state(ctx, self.launch, force=True),
            lambda: self.desk.refuse_all("the proxy is exiting"),
        ):
            try:
                finish()
            except StorageError as exc:
                unwritten.append(exc.path)
        return unwritten

    def _abandon(self) -> None:
        """The run directory was replaced: kill the engine (an EOF checkpoint would be written by path into
        whatever now has the directory's name), finish the copy in flight, close the log (its descriptor is
        the old directory's). Nothing is written by path."""
        launch = self.launch
        if launch is not None and launch.engine.alive():
            launch.kill()
            launch.engine.wait(30)
            launch.engine.finish()
        self.ctx.best_copier.wait(self.ctx.report, lambda _line: None)
        try:
            self.ctx.writer.close()
        except StorageError:
            pass

    def _failure_line(self, exc: ProxyError | UnsafeFileError, unwritten: list[str]) -> str:
        """The one line that ends a failed run; for a failed write, what became of the engine's checkpoint."""
        if not isinstance(exc, StorageError):
            return one_line(exc)
        launch = self.launch
        engine = (
            ""
            if launch is None or isinstance(exc, EngineStorageError)
            else "; the engine stopped and wrote its checkpoint"
            if launch.engine.poll() == 0
            else "; the engine's own checkpoint failed too"
        )
        also = (
            f"; could not update {', '.join(sorted(set(unwritten) - {exc.path}))} either"
            if set(unwritten) - {exc.path}
            else ""
        )
        return (
            f"stopped at step {last_step(launch)}: {one_line(exc)}{engine}{also}; {resume_line(self.ctx)}; every "
            "complete line of .loss.json is kept; then relaunch the same command to resume"
        )

    def _loop(self) -> int:
        ctx, report = self.ctx, self.ctx.report
        while True:
            if ctx.signals.stop:
                report.set_status("stopped")
                ctx.say(f"stopped at step {last_step(self.launch)} (no engine running)")
                return EXIT_OK
            launch, outcome = self._run_launch()
            if self.desk.job is not None:
                outcome = self.desk.finish(launch, outcome)
            if outcome in (Outcome.PIVOTED, Outcome.RESUME):  # a new launch: the new phase, or the same one again
                continue
            if outcome == Outcome.FINISHED:
                report.set_status("finished", f"finished at step {ctx.max_steps}")
                ctx.say(f"run {ctx.run.root} finished: step {ctx.max_steps}, last checkpoint {report.last_ckpt_path}")
                return EXIT_OK
            if outcome == Outcome.STOPPED:
                report.set_status("stopped", f"stopped at step {last_step(launch)}")
                saved = (
                    f"checkpoint {report.last_ckpt_path}"
                    if report.last_ckpt_path
                    else "no checkpoint written (a relaunch starts from scratch)"
                )
                ctx.say(f"stopped at step {last_step(launch)}; {saved}; relaunch the same command to resume")
                return EXIT_OK
            if outcome == Outcome.DIVERGED:
                report.set_status("diverged", self._divergence_line())
                raise ProxyError(report.message or "the run diverged", EXIT_DIVERGED)
            if outcome == Outcome.FATAL:
                report.set_status("crashloop")
                raise ProxyError(
                    f"engine cannot run: {launch.last_error or 'see ' + str(ctx.run.engine_log)}", EXIT_FAILURE
                )
            self._restart_after_failure(launch)

    def _divergence_line(self) -> str:
        """The one line that ends a diverged run: where, why, and the newest sane checkpoint to go back to."""
        ctx, report = self.ctx, self.ctx.report
        sane = report.last_sane_ckpt_step
        back = (
            f"the newest sane checkpoint is {checkpoint_path(ctx.run.checkpoints, sane)} (step {sane}): a "
            "relaunch resumes there"
            if sane is not None
            else "no sane checkpoint: a relaunch starts from scratch"
        )
        return (
            f"the run diverged at step {report.diverged_step}: {report.diverged_why}; {back} and, unchanged, "
            "diverges again the same way: lower train.lr (relaunch with --allow-experiment-change) or pivot"
        )

    def _restart_after_failure(self, launch: EngineLaunch) -> None:
        """A crash or a hang: count it, give up on a crash loop, else wait the back-off (refusing pivots)."""
        ctx, opts, report = self.ctx, self.ctx.opts, self.ctx.report
        if launch.last_step > self.high_water:
            self.high_water = launch.last_step
            self.failures = 1
        else:
            self.failures += 1
        what = "hung (no event in time; killed)" if launch.hung else exit_description(launch.engine.poll())
        detail = f": {launch.last_error}" if launch.last_error else ""
        if self.failures >= opts.max_failures:
            report.set_status(
                "crashloop",
                f"engine failed {self.failures} times without progress past step "
                f"{self.high_water} (last: {what}{detail}); see {ctx.run.engine_log}",
            )
            raise ProxyError(f"crash loop: {report.message}; stopping", EXIT_CRASHLOOP)
        delay = min(opts.backoff_max_s, opts.backoff_s * 2 ** (self.failures - 1))
        report.restarted()
        ctx.warn(
            f"engine {what}{detail} at step {launch.last_step}; restarting from the newest valid "
            f"checkpoint in {delay:.1f}s (failure {self.failures} of {opts.max_failures})"
        )
        write_run_state(ctx, launch, force=True)
        end = time.monotonic() + delay
        while time.monotonic() < end and not ctx.signals.stop:
            if ctx.signals.pivot:
                self.desk.take(
                    refuse=f"the engine is restarting after a failure (failure "
                    f"{self.failures} of {opts.max_failures}); try again once it is training"
                )
            time.sleep(min(0.1, max(0.0, end - time.monotonic())))

    # ------------------------------------------------------------ one engine launch
    def _run_launch(self) -> tuple[EngineLaunch, Outcome]:
        ctx = self.ctx
        ctx.lock.check()
        first = ctx.launch_number == 0
        launch = self.launch = start_launch(ctx)
        if first:
            self.high_water = launch.resume.step
        self.feeder.catch_up(launch, ctx.phase, {audit.step for audit in ctx.samples.audits})
        write_run_state(ctx, launch, force=True)
        engine = launch.engine
        self.watchdog.begin()
        while True:
            ctx.lock.check()
            self._handle_signals(launch)
            self.feeder.feed(launch)
            try:
                kind, payload = engine.events.get(timeout=POLL_S)
            except queue.Empty:
                kind, payload = None, None
            if kind == EVENT:
                launch.heard_at(time.monotonic())
                self.events.dispatch(launch, payload)
            elif kind == NOISE:
                ctx.warn(f"engine stdout: {payload[:300]}")
            elif kind == WRITE_FAILED:
                pass  # the engine is gone or going; EOF follows
            elif kind == EOF:
                break
            ctx.best_copier.collect(ctx.report, ctx.warn)
            ctx.writer.maybe_fsync()
            write_run_state(ctx, launch)
            if not launch.stop_sent:
                say_progress_on_clock(ctx.console, ctx.report, launch, ctx.max_steps, POLL_S)
            self._watch(launch)
        code = engine.wait(30)
        if code is None:
            engine.kill_group()
            code = engine.wait(30)
        engine.finish()
        ctx.report.engine_exited()
        ctx.best_copier.wait(ctx.report, ctx.warn)  # a new phase, a restart or the exit starts from here
        ctx.writer.fsync()
        retain(ctx, launch)
        if launch.last_error is None and code not in (0, None):
            launch.errored(self._engine_log_tail())
        return launch, self._classify(launch, code)

    def _watch(self, launch: EngineLaunch) -> None:
        """The hang watchdog's look of this iteration (watchdog.py): the proxy's own pause is said and not
        counted; a confirmed hang kills the engine's process group."""
        ctx, watchdog, engine = self.ctx, self.watchdog, launch.engine
        paused = watchdog.look(launch, time.monotonic())
        if paused >= PAUSE_NOTICE_S:
            ctx.warn(
                f"the proxy itself did not run for {paused:.0f}s (stopped or starved); not counted as the "
                f"engine's silence"
            )
        if watchdog.hung(launch, ctx.report.ckpt_ms, engine.events_read > launch.events_heard, engine.cpu_seconds):
            ctx.warn(
                f"engine pid {engine.pid} sent nothing for {watchdog.quiet(launch, time.monotonic()):.0f}s of the "
                f"proxy's running time (limit {watchdog.allowance(launch, ctx.report.ckpt_ms):.0f}s), "
                f"{watchdog.verdict}; killing its process group"
            )
            launch.kill_hung()

    def _handle_signals(self, launch: EngineLaunch) -> None:
        """Stop requests (the second SIGTERMs the engine, the third kills it), pivot requests, checkpoints."""
        ctx, signals = self.ctx, self.ctx.signals
        if signals.stop and not launch.stop_signalled:
            notice = stop_notice(launch, ctx.report.ckpt_ms, time.monotonic())
            launch.stop_now()
            ctx.say(notice)
        elif signals.stop >= 2 + launch.signals_forwarded and launch.signals_forwarded < 2:
            if launch.stop_repeated() == 1:
                ctx.warn(
                    "second stop request: the engine is still finishing its step or writing its checkpoint; "
                    "a third stop kills it (losing the steps since the last checkpoint)"
                )
                if not launch.through_launcher:  # a launcher's ranks finish their STOP frame
                    launch.engine.signal(signal.SIGTERM)
            else:
                ctx.warn("third stop request: killing the engine")
                launch.kill()
        if signals.pivot and self.desk.take():
            self.desk.start(launch)
        while signals.take_checkpoint():
            if not launch.stop_sent:
                launch.engine.send(frames.checkpoint_frame())
                launch.checkpoint_due(launch.next_step - 1)

    def _classify(self, launch: EngineLaunch, code: int | None) -> Outcome:
        """How the launch ended: finished, stopped, hung, failed, or fatal (the engine cannot run at all)."""
        ctx, report = self.ctx, self.ctx.report
        if report.diverged_step is None and code == EXIT_NUMERICS:  # the engine's own check: never retried,
            # the same frames diverge the same way
            report.diverged(launch.last_step + 1, f"the engine stopped: {launch.last_error or exit_description(code)}")
        if report.diverged_step is not None:
            return Outcome.DIVERGED
        if launch.hung:
            return Outcome.HUNG
        if code == 0:
            if launch.last_step >= ctx.max_steps:
                return Outcome.FINISHED
            if ctx.signals.stop or launch.stop_sent:
                return Outcome.STOPPED
            if launch.exit_reason == "signal":
                ctx.warn("the engine was stopped by a signal sent to it directly; stopping the run")
                return Outcome.STOPPED
            launch.errored(f"engine exited with reason {launch.exit_reason!r} before step {ctx.max_steps}")
            return Outcome.FAILED
        if ctx.signals.stop:
            ctx.warn(f"engine {exit_description(code)} while stopping")
            return Outcome.STOPPED
        full_disk = engine_full_disk(ctx, code, launch.last_error)
        if full_disk is not None:  # a restart would fail the same way until space is freed
            raise full_disk
        if code == ENGINE_EXIT_USAGE:
            return Outcome.FATAL
        if code == EXIT_CHECKPOINT and launch.resume.path is not None:
            ctx.reject_checkpoint(launch.resume.path)
        return Outcome.FAILED

    def _engine_log_tail(self) -> str | None:
        """The engine's last words in engine.log (a crash's reason)."""
        run = self.ctx.run
        try:
            with open_regular(run.engine_log, None, within=run.root) as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - ENGINE_LOG_TAIL))
                lines = [
                    ln
                    for ln in f.read(ENGINE_LOG_TAIL).decode("utf-8", "replace").splitlines()
                    if ln.strip() and not ln.startswith("===")
                ]
        except (OSError, UnsafeFileError):
            return None
        return lines[-1].strip()[:300] if lines else None

    def _shutdown_engine(self, launch: EngineLaunch) -> None:
        """On an unexpected error in the proxy: EOF makes the engine checkpoint and exit."""
        launch.engine.close_input()
        if launch.engine.wait(60) is None:
            launch.kill()
            launch.engine.wait(10)
        launch.engine.finish()
        self.ctx.report.engine_exited()

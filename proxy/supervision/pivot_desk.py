"""The running proxy's side of a live pivot (docs/OPERATIONS.md, "Pivot"; `proxy pivot` is commands/pivot.py).

SIGUSR2 says a request waits in the run directory. The desk claims it,
checks it again (a request file is input too), and refuses it (an answer
with `ok: false`, nothing changed) while the engine is restarting after a
failure, while another pivot is under way, or while the run is stopping or
finishing. Otherwise it sends STOP: the engine trains what is in flight,
checkpoints its last step k and exits; the pivot is applied at k
(rundir/apply_pivot.py), the next launch starts the new phase from that
checkpoint with a fresh bandit, and the desk answers.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config.caps import check_request
from ..config.config_file import ExperimentError
from ..formats.checkpoint import checkpoint_path, verify_checkpoint
from ..formats.loss_log import LossLogIndex
from ..rundir.apply_pivot import apply_pivot
from ..rundir.history import check_history
from ..rundir.layout import RunDirError, relative_checkpoint
from ..rundir.phases import read_phases
from ..rundir.pivot_request import answer_request, claim_request
from .checkpoints import retain
from .context import RunContext
from .launch import EngineLaunch, Outcome
from .live_status import write_run_state


@dataclass
class PivotJob:
    """An accepted request, until its launch has stopped and it is applied or refused."""

    request: dict
    caps: dict[str, float]
    floors: dict[str, float]
    policy: str


class PivotDesk:
    def __init__(self, ctx: RunContext):
        self.ctx = ctx
        self.job: PivotJob | None = None

    def _refuse(self, request: dict | None, why: str) -> None:
        self.ctx.warn(f"pivot refused: {why}")
        answer_request(self.ctx.run, request, False, f"{why}; nothing changed")

    def take(self, refuse: str | None = None) -> bool:
        """Claim the requests SIGUSR2 announced; accept one (True) or refuse them (`refuse`: why)."""
        ctx = self.ctx
        accepted = False
        while ctx.signals.take_pivot():
            request = claim_request(ctx.run)
            if request is None:
                ctx.warn("SIGUSR2 but no pivot request in the run directory; ignored")
                continue
            why = refuse
            if why is None and self.job is not None:
                why = f"another pivot (request {self.job.request.get('id')}) is being applied"
            if why is not None:
                self._refuse(request, why)
                continue
            try:
                caps, floors, policy = check_request(request, ctx.experiment)
            except ExperimentError as exc:
                self._refuse(request, str(exc))
                continue
            self.job = PivotJob(request, caps, floors, policy)
            accepted = True
        return accepted

    def refuse_all(self, why: str) -> None:
        """The proxy is exiting: refuse the job under way and every request still waiting."""
        if self.job is not None:
            answer_request(self.ctx.run, self.job.request, False, f"{why}; nothing changed")
            self.job = None
        if self.ctx.signals.pivot:
            self.take(refuse=why)

    def start(self, launch: EngineLaunch) -> None:
        """Stop feeding; STOP makes the engine train what is in flight, checkpoint and exit."""
        ctx = self.ctx
        if self.job is None:  # no pivot pending
            return
        if launch.stop_sent or ctx.signals.stop:
            request = self.job.request
            self.job = None
            why = (
                "the run is finishing (its last step is in flight)"
                if launch.next_step > ctx.max_steps
                else "the run is stopping"
            )
            self._refuse(request, why)
            return
        launch.send_stop()
        ctx.say(
            f"pivot requested: the engine finishes step {launch.next_step - 1}, checkpoints and exits; "
            "the new phase starts from that checkpoint"
        )

    def _same_phase(self) -> Outcome:
        """A pivot not applied: the run goes on in its phase, unless it was asked to stop meanwhile."""
        return Outcome.STOPPED if self.ctx.signals.stop else Outcome.RESUME

    def _history_problem(self) -> str | None:
        """Why the pivot must not be applied: phases.json changed on disk under the live run, or the
        history contradicts the run's records (rundir/history.py); None when all agree."""
        ctx = self.ctx
        try:
            on_disk = read_phases(ctx.run)
            if [p.to_dict() for p in on_disk] != [p.to_dict() for p in ctx.phases]:
                return f"{ctx.run.phases} changed on disk while the run was live; restore it"
            check_history(ctx.run, ctx.phases, LossLogIndex.load(ctx.run.loss_log))
        except RunDirError as exc:
            return str(exc)
        return None

    def finish(self, launch: EngineLaunch, outcome: Outcome) -> Outcome:
        """After the launch the pivot stopped: apply it at the engine's last checkpoint. Returns the
        launch's outcome as the loop sees it: PIVOTED (a new phase), RESUME, or the outcome given."""
        ctx = self.ctx
        job, self.job = self.job, None
        if job is None:  # no pivot was pending
            return outcome
        if outcome != Outcome.STOPPED:  # a clean exit checkpoints its last step, whatever asked for it
            why = {Outcome.FINISHED: "the run reached max_steps first"}.get(
                outcome, f"the engine failed before its pivot checkpoint ({launch.last_error or outcome.value})"
            )
            ctx.warn(f"pivot not applied: {why}")
            answer_request(ctx.run, job.request, False, f"{why}; nothing changed")
            return outcome
        k = launch.last_step
        path = checkpoint_path(ctx.run.checkpoints, k)
        reason = verify_checkpoint(path) if path.exists() else f"{path.name}: missing"
        if reason is not None:
            ctx.warn(f"pivot not applied: the checkpoint at step {k} does not verify ({reason})")
            answer_request(
                ctx.run, job.request, False, f"the checkpoint at step {k} does not verify ({reason}); nothing changed"
            )
            return self._same_phase()
        contradiction = self._history_problem()
        if contradiction is not None:
            ctx.warn(f"pivot not applied: {contradiction}")
            answer_request(ctx.run, job.request, False, f"{contradiction}; nothing changed")
            return self._same_phase()
        ctx.report.checkpointed(k, str(path))
        write_run_state(ctx, launch, force=True)  # the state archived is the old phase's, at the pivot step
        before = len(ctx.phases)
        try:
            result = apply_pivot(ctx.run, k, job.caps, job.floors, job.policy, relative_checkpoint(k))
        except (OSError, RunDirError) as exc:
            applied = len(read_phases(ctx.run)) > before
            ctx.warn(f"pivot at step {k}: {exc}" + ("" if applied else "; not applied"))
            answer_request(
                ctx.run, job.request, applied, f"pivot at step {k}: {exc}" + ("" if applied else "; nothing changed")
            )
            if applied:
                ctx.reload_phases()
            return self._same_phase()
        ctx.start_phase()
        ctx.report.pivoted()
        write_run_state(ctx, launch, force=True)
        retain(ctx, launch)
        response = result.response(ctx.run, job.request.get("id"))
        answer_request(
            ctx.run,
            job.request,
            True,
            result.message(ctx.run),
            **{k2: v for k2, v in response.items() if k2 not in ("id", "ok", "message")},
        )
        ctx.say(result.message(ctx.run))
        return Outcome.STOPPED if ctx.signals.stop else Outcome.PIVOTED

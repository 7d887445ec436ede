"""Starting an engine launch: where it resumes, the mixture schedule rebuilt from the log, the engine process.

Determinism of the whole run (docs/ARCHITECTURE.md): the batch for step s is
a pure function of (seed, s, W(s)), and W(s), the mixture, is the bandit
after observing the per-arm losses of steps <= s - lag of the current phase
(proxy/bandit/schedule.py). So at most `lag` TRAIN frames are in flight, and
at every launch the schedule is rebuilt from `.loss.json` (the phase's steps
up to the checkpoint the engine resumes from), never from `.state.json`.
"""

from __future__ import annotations

from ..bandit.schedule import MixtureSchedule
from ..formats.checkpoint import read_trailer
from ..formats.engine_cli import engine_args
from ..formats.loss_log import LossLogIndex
from ..formats.state import EngineStatus
from ..rundir.frozen import experiment_changed
from ..rundir.layout import RunDirError
from ..rundir.resume import choose_resume
from .context import RunContext
from .engine_process import EngineProcess
from .engine_record import TOKEN_ENV, new_token, record_engine
from .launch import EngineLaunch
from .throughput import SMOOTHING_MEMORY, smoothed_over


def _replay_eval(ctx: RunContext, schedule: MixtureSchedule, index: LossLogIndex, step: int) -> None:
    """The evaluation of `step` as logged, if there is one, to the schedule (as events.py gives it live).
    Past the phase's start step only this phase's: one a phase before the pivot logged there was never
    given to this phase's bandit live."""
    entry = index.eval(step)
    if entry is not None and (step == ctx.phase.start_step or entry.phase == ctx.phase.phase):
        schedule.observe_eval(step, {a: v for a, v in entry.arms.items() if a in ctx.arm_names})


def _rebuild_bandit(ctx: RunContext, index: LossLogIndex, c: int) -> MixtureSchedule:
    """A fresh bandit for the phase (RunContext.new_bandit) in a schedule whose next step is c + 1, fed the
    phase's logged steps up to `c`, each evaluation after the step it belongs to (from the phase's first step
    on; the one at its start step first), through the same MixtureSchedule calls the live run made: it then
    holds the mixtures of the steps c+1..c+lag, which depend only on those (the earliest on none: the initial
    weights)."""
    phase = ctx.phase
    schedule = MixtureSchedule(ctx.new_bandit(), ctx.lag, phase.start_step, c + 1)
    known = set(ctx.arm_names)
    _replay_eval(ctx, schedule, index, phase.start_step)
    for t, entry in index.iter_steps(phase.start_step + 1, c):
        if entry is None:  # choose_resume found every step through c logged: the log changed since it was read
            raise RunDirError(f"{ctx.run.loss_log}: the entry of step {t} is gone; cannot replay the bandit")
        arms = {a: v for a, v in entry.arms.items() if a in known}
        extra = set(entry.arms) - known
        if extra - ctx.report.dropped_arms:
            ctx.warn(
                f".loss.json names arm(s) {', '.join(sorted(extra))} that the experiment does not "
                "define; dropped from the bandit's replay"
            )
            ctx.report.drop_arms(extra)
        # the mixture step t was drawn from (exp3 weights its rewards by it), as logged
        schedule.observe(t, arms, mixture=entry.mixture)
        _replay_eval(ctx, schedule, index, t)
    return schedule


def start_launch(ctx: RunContext) -> EngineLaunch:
    """Choose where to resume, rebuild the mixture schedule, start the engine."""
    ctx.writer.fsync()
    index = LossLogIndex.load(ctx.run.loss_log)
    phase = ctx.phase
    resume = choose_resume(ctx.run.checkpoints, index, ctx.phases, ctx.rejected, vocab=int(ctx.experiment.model.vocab))
    for reason in resume.skipped:
        ctx.warn(f"not resuming from {reason}")
    c = resume.step
    ctx.next_launch(index.max_segment)
    schedule = _rebuild_bandit(ctx, index, c)

    tokens, loss, smoothed = 0, None, None
    if c > 0:
        entry = index.step(c)
        trailer = read_trailer(resume.path) if entry is None and resume.path is not None else None
        tokens = int((entry.tokens if entry is not None else trailer.tokens_seen if trailer else None) or 0)
        loss = entry.loss if entry is not None else None
        # the smoothed loss goes on from the logged steps, as `proxy status` computes it, not from step c's loss
        logged = index.iter_steps(max(1, c - SMOOTHING_MEMORY + 1), c)
        smoothed = smoothed_over(e.loss for _s, e in logged if e is not None)
    ctx.report.resumed(c, str(resume.path) if resume.path is not None else None, tokens, loss, smoothed)
    replay_through = max((s for s, (_o, p) in index.steps.items() if s > c and p == phase.phase), default=c)

    meta = {"experiment": ctx.experiment.name, "phase": phase.phase}
    settings = list(ctx.experiment.engine_flags()) + list(ctx.engine_paths)
    if experiment_changed(ctx.run) or (resume.path is not None and c == 0):
        # the run went on under a changed experiment: its older checkpoints carry the old
        # optimizer settings, and the frozen experiment (not the checkpoint) is the truth; so at
        # step 0 (imported weights, moments zero), where the settings have acted on nothing yet
        settings.append("--allow-hparam-change")
    choice = ctx.engine_choice
    args = engine_args(
        ctx.run.checkpoints,
        resume=resume.path,
        ckpt_every=int(ctx.train.ckpt_every),
        ckpt_every_seconds=float(ctx.train.ckpt_every_seconds),
        meta=meta,
        settings=settings,
    )
    argv = choice.argv(args)
    where = f"from {resume.path.name} (step {c})" if resume.path else "from scratch"
    token = new_token()
    engine = EngineProcess(
        argv, ctx.run.engine_log, header=f"launch {ctx.launch_number}, {where}", env={TOKEN_ENV: token}
    )
    try:
        record_engine(ctx.run, ctx.identity, engine.pid, engine.create_time, argv, token)
    except BaseException:  # a full disk: the engine is not yet the loop's to stop; EOF stops it before any step
        engine.close_input()
        if engine.wait(60) is None:
            engine.kill_group()
        engine.finish()
        raise
    ranks = f", {choice.ranks} ranks through {choice.launcher[0]}" if choice.launcher else ""
    ctx.say(
        f"launch {ctx.launch_number}: engine pid {engine.pid} ({choice.kind}{ranks}) starting {where}"
        + (f"; steps {c + 1}..{replay_through} will be replayed and compared" if replay_through > c else "")
    )
    ctx.report.engine_started(
        EngineStatus(kind=choice.kind, pid=engine.pid, alive=True, path=str(choice.path), ranks=choice.ranks)
    )
    return EngineLaunch(
        number=ctx.launch_number,
        engine=engine,
        resume=resume,
        next_step=c + 1,
        last_step=c,
        schedule=schedule,
        replay_index=index,
        replay_through=replay_through,
        through_launcher=bool(choice.launcher),
    )

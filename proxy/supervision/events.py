"""The engine's events (docs/FORMATS.md, "Engine events"), one handler each, dispatched by a table.

A step is logged to `.loss.json` with the mixture it was drawn from and fed
to the launch's mixture schedule, and so is an evaluation (which the engine
answers before the next step); a step re-trained after a restart is compared with the entry
the crashed launch left (a difference is a determinism bug, reported on
stderr and in `.state.json`). An evaluation (all arms in one EVAL frame) and a
sample audit (all prompts in one SAMPLE frame) each come back as one event.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from ..divergence import insanity, sane_loss
from ..formats.checkpoint import checkpoint_path
from ..formats.frames import Event, group_result
from ..formats.loss_log import EvalEntry, StepEntry, compare_replayed, eval_loss
from ..formats.samples import Sample, SampleAudit
from ..formats.step_fields import engine_metrics
from .checkpoints import maybe_best, retain
from .context import RunContext
from .goodput import checkpoint_stall_ms
from .launch import EngineLaunch
from .live_status import say_checkpoint, say_progress, write_run_state

MAX_ENGINE_TEXT = 200  # a version or source string of the ready event kept in .state.json


def _text(v: object) -> str | None:
    """A short string from the engine's ready event (None for anything else)."""
    return v[:MAX_ENGINE_TEXT] if isinstance(v, str) else None


def received_at(ev: Event) -> tuple[float, float]:
    """(monotonic, wall-clock) time the event was read from the engine: when the engine finished that work,
    however long the loop took to get to it (a burst of events after an audit must not look instantaneous)."""
    mono = time.monotonic()
    if ev.received is None:
        return mono, time.time()
    return ev.received, time.time() - (mono - ev.received)


class EventHandlers:
    def __init__(self, ctx: RunContext):
        self.ctx = ctx
        self.table = {
            "ready": self.on_ready,
            "step": self.on_step,
            "eval": self.on_eval,
            "sample": self.on_sample,
            "ckpt": self.on_ckpt,
            "exit": self.on_exit,
            "error": self.on_error,
        }

    def dispatch(self, launch: EngineLaunch, ev: Event) -> None:
        """Handle one event; a killed engine's leftovers and kinds the proxy does not use are ignored."""
        if launch.killed:
            return
        self.ctx.report.goodput.seen(received_at(ev)[0])
        handler = self.table.get(ev.kind)
        if handler is not None:
            handler(launch, ev)

    def _refuse(self, launch: EngineLaunch, error: str) -> None:
        """An engine that broke the protocol: say why and kill it (the launch counts as failed)."""
        launch.errored(error)
        self.ctx.warn(error + "; killing it")
        launch.kill()

    def on_ready(self, launch: EngineLaunch, ev: Event) -> None:
        report = self.ctx.report
        ready_at, ready_wall = received_at(ev)
        launch.became_ready(ev.fields, ready_at)
        report.goodput.ready(ready_at)
        report.progress.start(ready_wall, report.tokens, launch.resume.step)
        report.engine_ready(
            kind=ev.get("engine", report.engine.kind),
            device=ev.get("device"),
            threads=ev.get("threads"),
            precision=ev.get("precision"),
            mem_bytes=ev.get("mem_bytes"),
            version=_text(ev.get("version")),
            source=_text(ev.get("source")),
            n_params=ev.get("n_params") if type(ev.get("n_params")) is int else None,
            ranks=int(ev.get("ranks") or 1),
        )
        st = report.engine
        if int(ev.get("step", -1)) != launch.resume.step:
            self._refuse(
                launch,
                f"engine resumed at step {ev.get('step')} (from {ev.get('resumed_from')}), "
                f"expected {launch.resume.step}",
            )
        else:
            self.ctx.say(
                f"engine ready: {st.kind} on {st.device}"
                + (f" x {st.ranks} ranks" if st.ranks > 1 else "")
                + f", step {launch.resume.step}, {ev.get('n_params')} parameters"
            )

    def on_step(self, launch: EngineLaunch, ev: Event) -> None:
        ctx, report = self.ctx, self.ctx.report
        t = int(ev["step"])
        mono, now = received_at(ev)
        if t != launch.last_step + 1:
            self._refuse(launch, f"engine reported step {t}, expected {launch.last_step + 1}")
            return
        arms = {}
        for group, loss in dict(ev.get("group_loss") or {}).items():
            i = int(group)
            if 0 <= i < len(ctx.arm_names):
                arms[ctx.arm_names[i]] = float(loss)
        values = [float(ev["loss"]), float(ev.get("grad_norm", 0.0)), *arms.values()]
        if not all(math.isfinite(v) for v in values):
            self._refuse(launch, f"engine reported a non-finite loss or gradient norm at step {t}")
            return
        late = [r.step for r in launch.requests.values() if r.kind == "eval" and r.step < t]
        if late:  # the bandit takes an evaluation before the next step, in the replay as live
            self._refuse(launch, f"engine reported step {t} before the evaluation of step {min(late)}")
            return
        mixture = launch.schedule.named(t)
        tokens = report.record_step(
            t, int(ev.get("tokens", 0)), float(ev.get("ms", 0.0)), float(ev["loss"]), mixture, now
        )
        entry = StepEntry(
            step=t,
            **engine_metrics(ev.fields),
            tokens=tokens,
            time=now,
            arms=arms,
            mixture=mixture,
            phase=ctx.phase.phase,
            segment=launch.number,
        )
        ctx.writer.append(entry)
        if t <= launch.replay_through:
            self._compare(launch, entry)
        first_of_launch = launch.last_step_wall is None
        launch.stepped(t, mono)
        launch.schedule.observe(t, arms, mixture=entry.mixture)  # the same floats replay reads back
        every = int(ctx.train.ckpt_every)
        if every > 0 and t % every == 0:
            launch.checkpoint_due(t)
        log_every = int(ctx.train.log_every)
        if first_of_launch or (log_every > 0 and t % log_every == 0):  # the first: training has started
            say_progress(ctx.console, report, launch, ctx.max_steps)
        vocab = int(ctx.experiment.model.vocab)
        if report.diverged_step is None and not sane_loss(entry.loss, vocab):
            self._diverged(launch, t, insanity(entry.loss, vocab))

    def _diverged(self, launch: EngineLaunch, step: int, why: str) -> None:
        """The run diverged at `step`: stop it (STOP: the engine finishes what is in flight and exits; its
        checkpoint at `step` is not sane, so no relaunch resumes from it and retention keeps the newest
        sane one). The loop ends the run with one line (supervision/loop.py)."""
        self.ctx.report.diverged(step, why)
        if not launch.stop_sent:
            launch.send_stop()

    def _compare(self, launch: EngineLaunch, entry: StepEntry) -> None:
        """A step the crashed launch logged too: the two must be bit-identical."""
        recorded = launch.replay_index.step(entry.step)
        if recorded is None or recorded.phase != entry.phase or recorded.segment == entry.segment:
            return
        mismatch = compare_replayed(recorded, entry)
        if mismatch is None:
            return
        self.ctx.report.add_mismatch(mismatch.to_dict())
        self.ctx.warn(mismatch.message())
        write_run_state(self.ctx, launch, force=True)

    def on_eval(self, launch: EngineLaunch, ev: Event) -> None:
        self.ctx.report.goodput.audit("eval", float(ev.get("ms", 0.0)))
        request = launch.answered("eval", int(ev.get("id", 0)))
        if request is not None:
            self._eval_entry(launch, ev, request.step)

    def on_sample(self, launch: EngineLaunch, ev: Event) -> None:
        self.ctx.report.goodput.audit("sample", float(ev.get("ms", 0.0)))
        request = launch.answered("sample", int(ev.get("id", 0)))
        if request is not None:
            self._sample_audit(ev, request.step)

    def _eval_entry(self, launch: EngineLaunch, ev: Event, step: int) -> None:
        """Every arm's validation loss from one eval event (group id = arm); the entry's loss is their
        token-weighted mean, summed in arm order."""
        ctx = self.ctx
        named = dict(ev.get("group_loss") or {})
        parts = [group_result(ev, arm) for arm in range(len(ctx.arm_names))]
        bad = [
            name for arm, name in enumerate(ctx.arm_names) if str(arm) not in named or not math.isfinite(parts[arm][0])
        ]
        if bad:
            ctx.warn(
                f"eval at step {step}: no finite loss for arm(s) {', '.join(bad)} in the engine's event; not logged"
            )
            return
        mean = eval_loss(parts)
        entry = EvalEntry(
            step=step,
            loss=mean,
            arms={name: loss for name, (loss, _t) in zip(ctx.arm_names, parts, strict=False)},
            time=received_at(ev)[1],
            phase=ctx.phase.phase,
            segment=launch.number,
        )
        ctx.writer.append(entry)
        ctx.record_eval(step, mean)
        if step >= ctx.phase.start_step:  # the same floats the replay reads back (launcher._replay_eval)
            launch.schedule.observe_eval(step, entry.arms)
        # per arm where there are several (one arm's loss is the mean itself)
        per_arm = " (" + ", ".join(f"{n} {v:.3f}" for n, v in entry.arms.items()) + ")" if len(entry.arms) > 1 else ""
        ctx.say(f"eval step {step}: val loss {mean:.4f}{per_arm}")
        maybe_best(ctx, step)

    def _sample_audit(self, ev: Event, step: int) -> None:
        """The audit's completions, prompt by prompt (`count` each), written to `.samples.json`."""
        ctx = self.ctx
        count = int(ctx.experiment.samples.count)
        samples = []
        for k, ids in enumerate(list(ev.get("tokens") or [])[: count * len(ctx.prompts)]):
            ids = [int(x) for x in ids]
            try:
                text = ctx.data.tokenizer.decode(ids)
            except Exception as exc:  # a tokenizer failure must not stop training
                text = f"<decode failed: {exc}>"
            samples.append(Sample(prompt=ctx.prompts[k // count][0], completion=text, tokens=ids))
        ctx.samples.add(SampleAudit(step=step, time=received_at(ev)[1], samples=samples))

    def on_ckpt(self, launch: EngineLaunch, ev: Event) -> None:
        ctx, report = self.ctx, self.ctx.report
        step = int(ev["step"])
        launch.checkpoint_written(step)
        report.checkpoint_took(float(ev.get("ms", 0.0)))
        stall_ms = checkpoint_stall_ms(ev.fields)
        report.goodput.audit("checkpoint", stall_ms)
        path = Path(str(ev.get("path") or checkpoint_path(ctx.run.checkpoints, step)))
        if not path.is_absolute():
            path = checkpoint_path(ctx.run.checkpoints, step)
        ctx.writer.fsync()  # the log now covers this checkpoint durably
        report.checkpointed(step, str(path))
        retain(ctx, launch)
        maybe_best(ctx, step)
        write_run_state(ctx, launch, force=True)
        say_checkpoint(ctx, step, path.name, ev.get("reason"), float(ev.get("ms", 0)), stall_ms)

    def on_exit(self, launch: EngineLaunch, ev: Event) -> None:
        launch.exited(ev.get("reason"))

    def on_error(self, launch: EngineLaunch, ev: Event) -> None:
        launch.errored(str(ev.get("message")))
        self.ctx.warn(f"engine error: {launch.last_error} (code {ev.get('code')})")

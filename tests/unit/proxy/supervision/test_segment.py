"""One engine launch (supervision/segment.py): sample seeds, the bandit replay."""
from __future__ import annotations

from types import SimpleNamespace

from proxy.formats.loss_log import EvalEntry, LossLogIndex, LossLogWriter, StepEntry
from proxy.supervision.segment import sample_seed


def step(n: int, loss: float = 4.0, segment: int = 1, phase: int = 0) -> StepEntry:
    return StepEntry(step=n, loss=loss, lr=1e-3, grad_norm=1.5, tokens=512 * n, time=1.0 * n, ms=10.0,
                     arms={"a": loss, "b": loss + 0.5}, mixture={"a": 0.25, "b": 0.75}, phase=phase,
                     segment=segment)


def test_sample_seeds_are_pure_and_distinct():
    assert sample_seed(1337, 100, 0) == sample_seed(1337, 100, 0)
    seeds = {sample_seed(1337, s, i) for s in range(0, 1000, 100) for i in range(3)}
    assert len(seeds) == 30 and all(0 <= x < 2**64 for x in seeds)


def test_bandit_replay_feeds_each_evaluation_of_the_phase_after_its_step(tmp_path, monkeypatch):
    """The rebuilt bandit gets the evaluation at the phase's start step first (logged by the phase before),
    then every step, each evaluation of this phase right after its step; an evaluation left in the log by
    the phase before the pivot, past its start, is not this phase's and is not given (live, this phase
    never gave it)."""
    from proxy.supervision import context, segment  # noqa: PLC0415

    class Recorder:
        def __init__(self):
            self.calls = []

        def weights(self):
            return [0.5, 0.5]

        def observe(self, step, arms, mixture=None):
            self.calls.append(("step", step))

        def observe_eval(self, step, arms):
            self.calls.append(("eval", step, arms["a"]))

    log = tmp_path / ".loss.json"
    writer = LossLogWriter(log)

    def step(s, phase):
        writer.append(StepEntry(step=s, loss=1.0, lr=0.1, grad_norm=1.0, tokens=s, time=0.0, ms=1.0,
                                arms={"a": 1.0, "b": 1.0}, mixture={"a": 0.5, "b": 0.5}, phase=phase, segment=1))

    def evaluation(s, phase, value):
        writer.append(EvalEntry(step=s, loss=value, arms={"a": value, "b": value}, time=0.0, phase=phase, segment=1))

    for s in range(1, 31):  # phase 0 trained to step 30, evaluated at 10, 20, 30; the pivot went back to 20
        step(s, 0)
        if s % 10 == 0:
            evaluation(s, 0, float(s))
    for s in range(21, 41):  # phase 1 from step 20: its evaluation at 30 was not logged (not finite), 40 was
        step(s, 1)
        if s == 40:
            evaluation(s, 1, 40.5)
    writer.close()
    recorder = Recorder()
    monkeypatch.setattr(context, "bandit_for_phase",
                        lambda experiment, phase, row_spread, unigram_gap: (recorder, {}, {}))
    ctx = SimpleNamespace(phase=SimpleNamespace(phase=1, start_step=20), experiment=None, lag=2, arm_names=["a", "b"],
                          report=SimpleNamespace(dropped_arms=set()), warn=lambda line: None, row_spread={},
                          unigram_gap={})
    ctx.new_bandit = lambda: context.RunContext.new_bandit(ctx)  # the real method, on this stand-in
    segment._rebuild_bandit(ctx, LossLogIndex.load(log), 40)
    assert recorder.calls == [("eval", 20, 20.0)] + [("step", s) for s in range(21, 41)] + [("eval", 40, 40.5)]
    assert ctx.bandit is recorder

"""The supervising side's small pieces, without an engine: log, retention, lock, atomic writes."""
from __future__ import annotations

import json
import os
import struct
from types import SimpleNamespace

import numpy as np
import pytest

from proxy.atomic import atomic_copy, atomic_write_json
from proxy.formats.checkpoint import body_bytes
from proxy.formats.loss_log import EvalEntry, LossLogIndex, LossLogWriter, StepEntry, compare_replayed, read_tail
from proxy.rundir.retention import RetentionPolicy, apply_retention, plan_retention
from proxy.rundir.layout import RunDir, RunDirError
from proxy.rundir.lock import RunLock, run_lock_holder
from proxy.rundir.phases import append_phase, ensure_phases, read_phases
from proxy.formats.samples import Sample, SampleAudit, SamplesFile
from proxy.formats.state import AuditTime, EngineStatus, Goodput, RunState, read_state, write_state
from proxy.supervision.best_copier import BestCopier
from proxy.supervision.checkpoints import maybe_best
from proxy.supervision.goodput import GoodputMeter, checkpoint_stall_ms, overhead_summary
from proxy.supervision.throughput import ThroughputMeter
from proxy.supervision.report import RunReport
from proxy.supervision.segment import sample_seed


def step(n: int, loss: float = 4.0, segment: int = 1, phase: int = 0) -> StepEntry:
    return StepEntry(step=n, loss=loss, lr=1e-3, grad_norm=1.5, tokens=512 * n, time=1.0 * n, ms=10.0,
                     arms={"a": loss, "b": loss + 0.5}, mixture={"a": 0.25, "b": 0.75}, phase=phase,
                     segment=segment)


def test_torn_last_line_is_skipped_and_never_glued(tmp_path):
    path = tmp_path / ".loss.json"
    w = LossLogWriter(path)
    w.append(step(1))
    w.append(step(2))
    w.close()
    whole = path.read_bytes()
    path.write_bytes(whole + json.dumps(step(3).to_dict()).encode()[:40])  # a crash mid-line
    index = LossLogIndex.load(path)
    assert sorted(index.steps) == [1, 2] and index.skipped == 1

    w = LossLogWriter(path)  # reopening puts the fragment on a line of its own
    w.append(step(3, loss=3.0, segment=2))
    w.append(EvalEntry(step=3, loss=3.5, arms={"a": 3.4, "b": 3.6}, time=5.0, phase=0, segment=2))
    w.close()
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b"" and len(lines) == 6
    index = LossLogIndex.load(path)
    assert sorted(index.steps) == [1, 2, 3] and index.skipped == 1 and index.max_segment == 2
    assert index.step(3).loss == 3.0 and index.eval(3).loss == 3.5
    assert [e.step for e in read_tail(path)] == [1, 2, 3, 3]


def test_last_entry_per_step_wins_and_phase_coverage(tmp_path):
    path = tmp_path / ".loss.json"
    w = LossLogWriter(path)
    for n in range(1, 6):
        w.append(step(n, segment=1))
    for n in range(3, 5):
        w.append(step(n, loss=9.0, segment=2))
    w.close()
    index = LossLogIndex.load(path)
    assert [e.loss for _, e in index.iter_steps(1, 5)] == [4.0, 4.0, 9.0, 9.0, 4.0]
    assert index.gap(0, 0, 5) == (0, None) and index.gap(0, 0, 7) == (2, 6)
    assert index.gap(1, 2, 4) == (2, 3)  # entries of another phase do not cover a phase
    assert index.gap(0, 0, 3_000_000_000) == (3_000_000_000 - 5, 6)  # no list of three billion steps


def test_compare_replayed_is_exact():
    a = step(7)
    assert compare_replayed(a, step(7, segment=2)) is None
    b = step(7, segment=2)
    b.loss = float.fromhex(a.loss.hex()[:-1] + "1")  # one ulp away
    b.mixture = {"a": 0.25000000000000006, "b": 0.75}
    m = compare_replayed(a, b)
    assert m.fields == ["loss", "mixture"] and m.recorded_segment == 1 and m.replayed_segment == 2
    assert "step 7" in m.message()


def test_retention_plan():
    policy = RetentionPolicy(keep_last=3, milestone_every=1000)
    steps = [100 * i for i in range(1, 26)]
    delete = plan_retention(steps, policy, protected={700})
    kept = sorted(set(steps) - set(delete))
    assert kept == [700, 1000, 2000, 2300, 2400, 2500]
    # keep_last 0 means keep every checkpoint (docs/EXPERIMENTS.md), never "keep none"
    assert plan_retention(steps, RetentionPolicy(keep_last=0, milestone_every=0), protected={2500}) == []


def test_lock_is_exclusive_and_reports_the_owner(tmp_path):
    run = RunDir(tmp_path / "run")
    run.create()
    assert run_lock_holder(run) is None
    lock = RunLock(run).acquire()
    try:
        assert run_lock_holder(run).pid == os.getpid()
        # this test is no `python -m proxy run` of the run: the kernel names it, and it is no proxy
        assert not run_lock_holder(run).is_proxy
        with pytest.raises(RunDirError, match=f"in use by pid {os.getpid()}, which is not a proxy of this run"):
            RunLock(run).acquire()
        (run.root / ".lock").write_text("1\n")  # a file of the run names nobody: the kernel holds the lock
        assert run_lock_holder(run).pid == os.getpid()
    finally:
        lock.release()
    assert run_lock_holder(run) is None
    with RunLock(run):
        pass


def test_phases_are_appended(tmp_path):
    run = RunDir(tmp_path / "run")
    run.create()
    experiment = SimpleNamespace(bandit=SimpleNamespace(policy="ucb1"),
                                 arms=[SimpleNamespace(name="a", cap=1.0, floor=0.0),
                                       SimpleNamespace(name="b", cap=0.5, floor=0.1)])
    phases = ensure_phases(run, experiment)
    assert phases[0] == read_phases(run)[0] and phases[0].caps == {"a": 1.0, "b": 0.5}
    assert ensure_phases(run, experiment) == phases  # written once
    new = append_phase(run, 200, "exp3", {"a": 0.6, "b": 0.5}, {"a": 0.0, "b": 0.1}, "step_000200.bin")
    assert [p.phase for p in read_phases(run)] == [0, 1] and new.contains(201) and not new.contains(200)
    run.phases.write_text("[{\"phase\": 3}]")
    with pytest.raises(RunDirError):
        read_phases(run)


def test_atomic_writes_leave_no_temp_files(tmp_path):
    target = tmp_path / "x.json"
    atomic_write_json(target, {"a": 1})
    atomic_write_json(target, {"a": 2})
    assert json.loads(target.read_text()) == {"a": 2}
    atomic_copy(target, tmp_path / "y.json")
    assert (tmp_path / "y.json").read_bytes() == target.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json", "y.json"]
    with pytest.raises(ValueError):
        atomic_write_json(target, {"a": float("nan")})
    assert json.loads(target.read_text()) == {"a": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json", "y.json"]


def test_state_and_samples_files(tmp_path):
    st = RunState(step=5, tokens_per_s=float("nan"))
    write_state(tmp_path / ".state.json", st)
    back = read_state(tmp_path / ".state.json")
    assert back["step"] == 5 and back["tokens_per_s"] is None and back["engine"]["alive"] is False
    samples = SamplesFile(tmp_path / ".samples.json", keep=2)
    for s in (100, 200, 200, 300):
        samples.add(SampleAudit(step=s, time=float(s), samples=[Sample("def ", f"x{s}", [1, 2])]))
    on_disk = json.loads((tmp_path / ".samples.json").read_text())
    assert [a["step"] for a in on_disk] == [200, 300]
    assert [a.step for a in SamplesFile(tmp_path / ".samples.json").audits] == [200, 300]


def test_sample_seeds_are_pure_and_distinct():
    assert sample_seed(1337, 100, 0) == sample_seed(1337, 100, 0)
    seeds = {sample_seed(1337, s, i) for s in range(0, 1000, 100) for i in range(3)}
    assert len(seeds) == 30 and all(0 <= x < 2**64 for x in seeds)


def test_rates_count_the_wall_clock_and_the_engine_apart():
    """10 steps of 1000 tokens, 0.5 s of compute each, 1 s apart, and a 5 s audit after step 5: the wall
    clock sees 14 s for the 9 intervals, the engine 4.5 s."""
    p = ThroughputMeter()
    t = 100.0
    for s in range(1, 11):
        t += 1.0 + (5.0 if s == 6 else 0.0)
        p.observe(t, 1000 * s, s, 4.0, ms=500.0)
    rates = p.rates(max_steps=20)
    assert rates.tokens_per_s == pytest.approx(9000 / 14.0)
    assert rates.engine_tokens_per_s == pytest.approx(9000 / 4.5)
    assert rates.eta_s == pytest.approx(10 * 14.0 / 9)  # the ETA runs at the wall-clock rate


def test_rates_window_spans_the_last_minutes():
    p = ThroughputMeter(window_s=60.0, window_steps=1000)
    for s in range(1, 301):  # a step a second, 100 ms of compute; a 20 s stall every 50 steps
        p.observe(s + 20.0 * (s // 50), 10 * s, s, 4.0, ms=100.0)
    (t0, _k, s0, _ms), (t1, _k1, s1, _ms1) = p.window[0], p.window[-1]
    assert t1 - t0 >= 60.0 and p.window[1][0] > t1 - 60.0  # just over a minute, no more
    assert p.window_ms == pytest.approx(100.0 * (len(p.window) - 1))
    short = ThroughputMeter(window_s=1e9, window_steps=5)
    for s in range(1, 12):
        short.observe(float(s), 10 * s, s, 4.0, ms=float(s))
    assert [e[2] for e in short.window] == [7, 8, 9, 10, 11] and short.window_ms == pytest.approx(8 + 9 + 10 + 11)
    assert ThroughputMeter().rates(10) == (None, None, None)


def test_a_clock_jump_is_not_an_interval():
    """Steps 1 s apart (0.5 s of compute) with the wall clock set a year ahead after step 10 and back two
    years after step 20: each jump counts as the step's compute time, so the rates and the ETA are the
    steady ones (never days, never unknown); a real 5-minute audit still counts in full."""
    steady = ThroughputMeter()
    jumped = ThroughputMeter()
    t = year = 365 * 86400.0
    for s in range(1, 31):
        t += 1.0
        steady.observe(t, 1000 * s, s, 4.0, ms=500.0)
        jumped.observe(t + (year if 10 < s <= 20 else -year if s > 20 else 0.0), 1000 * s, s, 4.0, ms=500.0)
    want = steady.rates(max_steps=130)
    got = jumped.rates(max_steps=130)
    assert want.eta_s == pytest.approx(100 * 29 / 29)
    assert got.eta_s is not None and got.eta_s == pytest.approx(100 * 28.0 / 29)  # two intervals became 0.5 s
    assert got.tokens_per_s == pytest.approx(29000 / 28.0)
    audit = ThroughputMeter(window_s=1e9)
    for s in range(1, 5):
        audit.observe(1000.0 + s + (300.0 if s > 2 else 0.0), 1000 * s, s, 4.0, ms=500.0)
    assert audit.rates(max_steps=4 + 3).eta_s == pytest.approx(3 * 303.0 / 3)


def test_goodput_meter_splits_the_wall_time():
    m = GoodputMeter()
    m.seen(5.0)
    assert m.status() is None  # no engine ready yet
    m.ready(10.0)
    g = m.status()
    assert g.wall_s == 0.0 and g.overhead is None and g.tokens_per_s is None  # nothing to compare with yet
    assert overhead_summary(g) == "overhead ? (no step yet)"
    m.seen(19.0)  # an eval before any step (the catch-up of a resume): still no figure
    m.audit("eval", 2000.0)
    assert m.status().overhead is None and overhead_summary(m.status()) == "overhead ? (no step yet)"
    m.ready(20.0)  # a restarted engine: the clock keeps running from the first
    for _ in range(4):
        m.seen(17.0)  # read out of order: the account runs to the newest event
        m.step(1500.0, 2048)
    m.audit("sample", 1000.0)
    m.audit("checkpoint", checkpoint_stall_ms({"ms": 300.0, "snapshot_ms": 10.0, "wait_ms": 5.0}))
    m.audit("checkpoint", checkpoint_stall_ms({"ms": 120.0}))  # a synchronous write: all of it stalled
    g = m.status()  # up to the last event (20.0), not to now: a step in flight is no overhead yet
    assert (g.wall_s, g.step_s, g.steps, g.tokens) == (10.0, 6.0, 4, 8192)
    assert g.audits["eval"] == AuditTime(1, 2.0) and g.audits["sample"] == AuditTime(1, 1.0)
    assert g.audits["checkpoint"].count == 2 and g.audits["checkpoint"].s == pytest.approx(0.135)
    assert g.other_s == pytest.approx(10.0 - 6.0 - 3.135) and g.overhead == pytest.approx(0.4)
    assert overhead_summary(g) == "overhead 40.0% (sample 10.0%, eval 20.0%, checkpoint 1.4%, other 8.7%)"
    back = Goodput.from_dict(json.loads(json.dumps(RunState(goodput=g).to_dict()))["goodput"])
    assert back == g
    assert RunState.from_dict(RunState(goodput=g).to_dict()).goodput == g
    for bad in ({}, {"audits": []}, dict(RunState(goodput=g).to_dict()["goodput"], wall_s="long"),
                dict(RunState(goodput=g).to_dict()["goodput"], steps=None)):
        assert Goodput.from_dict(bad) is None  # a hand-edited snapshot is never trusted


def test_distinct_predicted_tokens_of_overlapping_rows():
    """`proxy eval` counts each position its rows predict once: a 1,041-token file (1,040 tokens and
    <|endoftext|>) in two rows of 1,025 at ctx 1024 predicts positions 1..1040, not 2,048."""
    from proxy.commands.evaluate import predicted_tokens
    from proxy.data.batches import evenly_spaced_starts
    assert predicted_tokens(evenly_spaced_starts(1041, 1025, 2), 1024) == 1040
    assert predicted_tokens(np.array([0, 64, 128]), 64) == 192  # rows end to end: no overlap
    assert predicted_tokens(np.array([0, 0]), 64) == 64  # the same row twice
    assert predicted_tokens(np.array([5]), 64) == 64


def test_retention_leaves_files_past_the_newest_announced(tmp_path):
    """A step_*.bin newer than the newest ckpt event may still be being written (the event comes once the
    file is durable): retention neither counts it among the last K nor deletes it."""
    run = RunDir(tmp_path / "run")
    run.create()
    for s in (10, 20, 30, 40, 50):  # bare bodies of a 1-parameter model: shaped like checkpoints
        (run.checkpoints / f"step_{s:06d}.bin").write_bytes(struct.pack("<ii", s, 1).ljust(body_bytes(1), b"\0"))
    deleted = apply_retention(run, RetentionPolicy(keep_last=2, milestone_every=0), {40}, durable_through=40)
    assert sorted(p.name for p in deleted) == ["step_000010.bin", "step_000020.bin"]
    assert sorted(p.name for p in run.checkpoints.iterdir()) == ["step_000030.bin", "step_000040.bin",
                                                                 "step_000050.bin"]


def test_best_bin_only_from_announced_checkpoints_copied_in_the_background(tmp_path):
    ck = tmp_path / "checkpoints"
    ck.mkdir()
    for s in (100, 200):
        (ck / f"step_{s:06d}.bin").write_bytes(bytes([s % 251]) * 4096)
    report, warnings = RunReport(engine=EngineStatus()), []
    ctx = SimpleNamespace(report=report, best_copier=BestCopier(), eval_loss={100: 3.0, 200: 2.5, 300: 1.0},
                          run=RunDir(tmp_path), lock=SimpleNamespace(check=lambda: None), warn=warnings.append)
    report.checkpointed(100, str(ck / "step_000100.bin"))
    maybe_best(ctx, 200)  # on disk, but its ckpt event has not come: it may still be being written
    assert ctx.best_copier.job is None and not ctx.run.best.exists()
    maybe_best(ctx, 100)
    assert ctx.best_copier.busy_step == 100 and report.best_step is None  # recorded once the copy is durable
    ctx.best_copier.wait(report, warnings.append)
    assert (report.best_step, report.best_loss) == (100, 3.0)
    assert ctx.run.best.read_bytes() == (ck / "step_000100.bin").read_bytes()
    report.checkpointed(200, str(ck / "step_000200.bin"))
    maybe_best(ctx, 200)
    maybe_best(ctx, 100)  # not better than the copy in flight: nothing
    assert ctx.best_copier.busy_step == 200
    ctx.best_copier.wait(report, warnings.append)
    assert report.best_step == 200 and ctx.run.best.read_bytes() == (ck / "step_000200.bin").read_bytes()
    (ck / "step_000300.bin").mkdir()  # a copy that fails: one warning, best.bin and the report unchanged
    report.checkpointed(300, str(ck / "step_000300.bin"))
    maybe_best(ctx, 300)
    ctx.best_copier.wait(report, warnings.append)
    assert report.best_step == 200 and len(warnings) == 1 and "best.bin" in warnings[0]
    assert ctx.run.best.read_bytes() == (ck / "step_000200.bin").read_bytes()


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


def test_the_index_names_the_first_diverged_step_of_a_phase_and_forgets_one_trained_again(tmp_path):
    """The resume rule passes over a checkpoint trained after a diverged step of its phase (a frame in flight
    when the proxy saw the loss): the index keeps the losses that may not be sane, by step, last entry wins."""
    from proxy.divergence import sane_loss  # noqa: PLC0415

    log = tmp_path / ".loss.json"
    writer = LossLogWriter(log)

    def step(s, loss, phase=0, segment=1):
        writer.append(StepEntry(step=s, loss=loss, lr=0.1, grad_norm=1.0, tokens=s, time=0.0, ms=1.0,
                                arms={"a": loss}, mixture={"a": 1.0}, phase=phase, segment=segment))

    for s, loss in enumerate([5.7, 5.6, 6.2, 8.2, 6.6, 10.3, 8.8, 15.79, 6.59], 1):
        step(s, loss)
    writer.fsync()
    sane = lambda loss: sane_loss(loss, 300)  # noqa: E731 - the bound 2 ln 300 = 11.41
    index = LossLogIndex.load(log)
    assert set(index.high_losses) == {8}
    assert index.first_diverged(0, 0, 9, sane) == 8 and index.first_diverged(0, 0, 7, sane) is None
    assert index.first_diverged(1, 0, 9, sane) is None  # another phase's steps are not this one's lineage
    assert index.first_diverged(0, 0, 9, lambda loss: sane_loss(loss, 65536)) is None  # 15.79 is sane at V=65536
    step(8, 7.5, segment=2)  # relaunched with a lower lr: step 8 trained again, sane
    step(9, 12.0, segment=2)
    writer.close()
    index = LossLogIndex.load(log)
    assert index.first_diverged(0, 0, 9, sane) == 9 and 8 not in index.high_losses

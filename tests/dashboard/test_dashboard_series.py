"""Downsampling and the block store: spikes survive, replays win, memory stays small."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dashboard import downsample
from dashboard.payload import WALL_WINDOW_S, WallWindow, round_sig, rows_payload
from dashboard.run_index import RunIndex
from dashboard.step_store import K
from proxy.formats.loss_log import step_fields


def line(step: int, loss: float, **kw) -> str:
    e = {
        "type": "step",
        "step": step,
        "loss": loss,
        "lr": 1e-3,
        "grad_norm": 1.0,
        "tokens": step * 100,
        "time": 1000.0 + step,
        "ms": 10.0,
        "mixture": {"a": 0.25, "b": 0.75},
    }
    e.update(kw)
    return json.dumps(e) + "\n"


def write_log(root, n: int, spike_at: int | None = None) -> None:
    with open(root / ".loss.json", "w") as f:
        for s in range(1, n + 1):
            f.write(line(s, 10.0 if s == spike_at else 2.0 + (s % 7) * 0.01))
            if s % 100 == 0:
                f.write(
                    json.dumps(
                        {"type": "eval", "step": s, "loss": 2.5, "arms": {"a": 2.4, "b": 2.6}, "time": 1000.0 + s}
                    )
                    + "\n"
                )


def test_merge_keeps_min_and_max_and_mean():
    n = 1000
    vals = np.full((n, 1), 2.0)
    vals[537, 0] = 9.0
    vals[10, 0] = np.nan
    agg = downsample.from_rows(np.arange(n), np.arange(n) * 10.0, np.arange(n) * 1.0, vals)
    m = downsample.merge(agg, 10)
    assert len(m) == 10 and m.rows.sum() == n
    assert np.nanmax(m.vmax) == 9.0 and np.nanmin(m.vmin) == 2.0
    assert m.vcnt.sum() == n - 1
    assert m.step0[0] == 0 and m.step1[-1] == n - 1
    assert abs(m.mean[5, 0] - (2.0 * 99 + 9.0) / 100) < 1e-12


def test_round_sig_is_short_and_json_safe():
    assert round_sig([4.103000164031982, 0.000600000028, float("nan"), float("inf"), 0.0, 123456789.0]) == [
        4.103,
        0.0006,
        None,
        None,
        0.0,
        123457000.0,
    ]


def test_spike_survives_every_zoom_level(tmp_path):
    write_log(tmp_path, 20000, spike_at=12345)
    run = RunIndex(0, "r", tmp_path)
    run.refresh_log()
    assert run.store.n_steps == 20000 and len(run.evals) == 200
    for first, last, width in [(None, None, 50), (None, None, 1000), (12000, 13000, 100), (12340, 12350, 100)]:
        p = run.series(first, last, width)
        assert p["n"] <= width
        top = p["loss"]["mean"] if p["raw"] else p["loss"]["max"]
        assert max(v for v in top if v is not None) == 10.0, (first, last, width)


def test_full_resolution_when_it_fits(tmp_path):
    write_log(tmp_path, 5000)
    run = RunIndex(0, "r", tmp_path)
    run.refresh_log()
    p = run.series(1000, 1399, 1000)
    assert p["raw"] and p["step"] == list(range(1000, 1400))
    assert p["mix"]["a"][0] == 0.25 and p["tok_s"][0] == 100 / 0.010


def test_replayed_steps_last_entry_wins(tmp_path):
    write_log(tmp_path, 3 * K + 5)
    with open(tmp_path / ".loss.json", "a") as f:  # a replay after a crash, in a closed block and the open one
        f.write(line(3, 7.5))
        f.write(line(3 * K + 2, 8.5))
    run = RunIndex(0, "r", tmp_path)
    run.refresh_log()
    assert run.store.n_steps == 3 * K + 5
    p = run.series(None, None, 1000)
    assert p["raw"]
    by_step = dict(zip(p["step"], p["loss"]["mean"], strict=False))
    assert by_step[3] == 7.5 and by_step[3 * K + 2] == 8.5 and len(p["step"]) == 3 * K + 5
    # summaries of the dirty block are recomputed from the log: the old value is gone
    p = run.series(None, None, 2)
    assert max(p["loss"]["max"]) == 8.5
    assert 7.5 <= max(p["loss"]["max"])


def test_store_memory_is_small_per_step(tmp_path):
    write_log(tmp_path, 40000)
    run = RunIndex(0, "r", tmp_path)
    run.refresh_log()
    # summaries only: well under 20 bytes per step
    assert run.store.nbytes() < 40000 * 20
    assert len(run.store.open) <= K


def test_garbage_types_and_values_are_skipped(tmp_path):
    with open(tmp_path / ".loss.json", "w") as f:
        f.write(line(1, 2.0))
        f.write('{"type": "step", "step": "x", "loss": 1}\n')
        f.write('{"type": "step", "step": -4, "loss": 1}\n')
        f.write('{"type": "step", "step": true, "loss": 1}\n')
        f.write('{"type": "step", "step": 2, "loss": "high", "mixture": {"a": "x", "": 1, "b": null}}\n')
        f.write('{"type": "mystery", "step": 3}\n')
        f.write("not json at all\n")
        f.write(line(4, 2.0))
    run = RunIndex(0, "r", tmp_path)
    run.refresh_log()
    p = run.series(None, None, 100)
    assert p["step"] == [1, 2, 4]
    assert p["loss"]["mean"][1] is None
    json.dumps(p, allow_nan=False)


def test_wall_clock_tokens_per_s(tmp_path):
    """wall_tok_s: the tokens added since the latest earlier point at least WALL_WINDOW_S (10 s) before, over
    the wall time between, so a stall between steps (an eval, a sample) counts; tok_s is the engine's alone."""
    assert WALL_WINDOW_S == 10.0
    with open(tmp_path / ".loss.json", "w") as f:  # 100 tokens and 10 ms per step, 1 s apart, a 50 s stall at 501
        for s in range(1, 1001):
            f.write(line(s, 2.0, time=1000.0 + s + (50.0 if s > 500 else 0.0)))
    run = RunIndex(0, "r", tmp_path)
    run.refresh_log()
    p = run.series(None, None, 16)
    assert not p["raw"]
    w, tok1, time1 = p["wall_tok_s"], p["tokens_end"], p["time_end"]
    # buckets of about 62 steps (62 s): each rated since the one before it (the first since its first step)
    assert w[0] == pytest.approx((tok1[0] - p["tokens"][0]) / (time1[0] - p["time"][0]))
    stalled = [i for i in range(len(w)) if p["step"][i] <= 501 <= p["step_end"][i]]
    for i in range(1, len(w)):
        rows = p["step_end"][i] - p["step_end"][i - 1]
        expected = 100 * rows / (rows + (50.0 if i in stalled else 0.0))
        assert w[i] == pytest.approx(expected), i
    assert all(v == pytest.approx(100 / 0.010) for v in p["tok_s"])
    # full resolution: steps 499 and 500 from the end of the block before (step 480, 19 and 20 s back), then
    # from step 500, the newest point at least 10 s back, across the 50 s stall
    raw = run.series(499, 503, 100)
    assert raw["raw"]
    assert raw["wall_tok_s"] == round_sig([1900 / 19, 2000 / 20, 100 / 51, 200 / 52, 300 / 53])
    start = run.series(1, 12, 100)  # the run's first 10 s: nothing that far back yet, no figure
    assert start["wall_tok_s"][:10] == [None] * 10 and start["wall_tok_s"][10:] == [100.0, 100.0]


def test_steps_logged_in_a_burst_are_no_spike(tmp_path):
    """Steps whose events the proxy logged together (it was busy with an audit's results) are 1 ms apart in
    the log: no pair of log lines makes a rate, so the wall clock never reads faster than the run went."""
    with open(tmp_path / ".loss.json", "w") as f:  # 100 tokens per 0.1 s; every 50 steps a 3 s audit, then a burst
        t = 1000.0
        for s in range(1, 301):
            t += 3.0 if s % 50 == 1 and s > 1 else 0.001 if s % 50 in (2, 3, 4, 5) and s > 50 else 0.1
            f.write(line(s, 2.0, time=t))
    run = RunIndex(0, "r", tmp_path)
    run.refresh_log()
    true_rate = 100 / 0.1
    for view in (run.series(None, None, 4000), run.series(120, 160, 100)):
        rates = [v for v in view["wall_tok_s"] if v is not None]
        assert rates and max(rates) <= true_rate, max(rates)


def test_live_rows_carry_the_wall_clock_rate():
    history = WallWindow([100.0 * s for s in range(390, 401)], [1000.0 + s for s in range(390, 401)])
    rows = [step_fields(json.loads(line(s, 2.0, time=t))) for s, t in ((401, 1402.0), (402, 1404.0), (403, 1404.0))]
    out, prev = rows_payload(rows, (400, 40000.0, 1400.0), history)
    # each from the newest point at least 10 s back (steps 392, 394, 394); step 403, logged with 402, is no spike
    assert out["wall_tok_s"] == [90.0, 80.0, 90.0]
    assert prev == (403, 40300.0, 1404.0)
    assert history.times[0] == 1394.0  # older points are no longer needed
    out, _ = rows_payload(rows[:1], None)
    assert out["wall_tok_s"] == [None] and out["tok_s"] == [pytest.approx(100 / 0.010)]


def test_arm_names_bounded_as_the_schema_bounds_them():
    """The dashboard reads `.loss.json` with the proxy's reader: arm names of at most the schema's MAX_NAME
    characters, at most MAX_ARMS arms (a forged longer name or more arms are dropped, never plotted)."""
    from proxy.config.experiment import MAX_ARMS, MAX_NAME

    longest, too_long = "a" * MAX_NAME, "b" * (MAX_NAME + 1)
    f = step_fields({"type": "step", "step": 1, "mixture": {longest: 0.5, too_long: 0.5}})
    assert f is not None and f.mixture == {longest: 0.5}
    many = {f"arm{i}": 1.0 / (MAX_ARMS + 5) for i in range(MAX_ARMS + 5)}
    assert len(step_fields({"type": "step", "step": 1, "mixture": many}).mixture) == MAX_ARMS

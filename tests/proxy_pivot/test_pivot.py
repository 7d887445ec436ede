"""The polish pivot on real processes: live, offline, bad caps files, refusals.

The live test pivots a TINY run at a random (seeded) step, kills the proxy
later and relaunches it, then builds a reference that reaches the same step,
stops, pivots offline at exactly the step the live pivot landed on and
continues: the two runs must agree bit for bit (per-step entries and final
weights, Adam m and v), which proves both that replay respects phases and
that a live pivot means the same as an offline one. The live run trains on the rank count under test
(MICROGPT_TEST_RANKS) and, whatever it is, once more on 2 ranks; the reference always on 1, so the 2-rank
run is also compared bit for bit with a 1-rank one.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import signal
import threading
import time

import pytest

from harness.gate import KILL_SLACK
from harness.ranks import with_two_ranks

from .conftest import (
    ARMS,
    COMPARED,
    RANKS,
    Proxy,
    assert_same_checkpoint,
    check_new_phase_steps,
    last_steps,
    make_experiment,
    max_logged_step,
    one_line_error,
    phases,
    ranked_gate,
    read_entries,
    rows_per_batch,
    run_args,
    run_cmd,
    state,
    tree_hashes,
    wait_for,
    write_caps,
)

MAX_STEPS = 200
# grad_accum: one micro-batch per rank (1 rank trains the same experiment to the same bits)
TRAIN = dict(
    max_steps=MAX_STEPS, ckpt_every=20, eval_every=40, sample_every=25, keep_last=2, milestone_every=0, grad_accum=RANKS
)


class Poller:
    """Records every distinct content of a file, polling fast (to see what was on disk when)."""

    def __init__(self, path):
        self.path, self.versions, self._stop = path, [], threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self._stop.is_set():
            try:
                data = self.path.read_bytes()
            except OSError:
                data = None
            if data is not None and (not self.versions or self.versions[-1] != data):
                self.versions.append(data)
            time.sleep(0.001)

    def stop(self):
        self._stop.set()
        self.thread.join(5)
        return self.versions


@pytest.mark.parametrize("ranks", with_two_ranks())
def test_live_pivot_kill_relaunch_matches_offline_reference(engine, data_cache, tmp_path, ranks):
    rng = random.Random(20251122)
    request_at = rng.randrange(30, 60)  # after the first sample audit (step 25)
    kill_after = rng.randrange(5, 30)
    caps = write_caps(tmp_path)
    train = {**TRAIN, "grad_accum": ranks}
    exp = make_experiment(tmp_path / "live", "PIVOT", **train)
    rows = rows_per_batch(exp)
    live = tmp_path / "live" / "run"
    gate = ranked_gate(engine, tmp_path / "gate", ranks)
    args = run_args(exp, live, *gate.rank_flags, engine=gate.engine_flag)
    # the gate holds the engine at the step the pivot is requested at (the pivot's STOP passes it),
    # and the new phase's engine at its first step until the test sets where it is killed
    gate.hold_after(request_at)
    proxy = Proxy(args, data_cache).start()
    samples = Poller(live / ".samples.json")
    try:
        wait_for(lambda: max_logged_step(live) >= request_at, 240, f"step {request_at}", proxy, poll=0.005)
        before = (live / ".loss.json").read_bytes()
        pivot = run_cmd(["pivot", "--caps", str(caps), "--run-dir", str(live)], data_cache)
    finally:
        versions = samples.stop()
    assert pivot.returncode == 0, pivot.stdout + pivot.stderr
    ph = phases(live)
    assert len(ph) == 2, ph
    k = ph[1]["start_step"]
    assert request_at <= k < MAX_STEPS
    assert f"pivoted {live} at step {k}" in pivot.stdout
    assert ph[1] == {
        **ph[1],
        "phase": 1,
        "policy": "exp3",
        "checkpoint": f"checkpoints/step_{k:06d}.bin",
        "caps": {"code": 0.25, "docstrings": 1.0, "topics": 1.0},
        "floors": {"code": 0.0, "docstrings": 0.45, "topics": 0.1},
    }
    assert ph[0]["start_step"] == 0 and ph[0]["policy"] == "ucb1" and ph[1]["time"] >= ph[0]["time"]

    # the archive: the samples and the state as they were on disk when the pivot landed
    archive = live / "archive" / f"pivot_{k}"
    archived = (archive / ".samples.json").read_bytes()
    assert b"[]\n" in versions, "the new phase's empty .samples.json was never seen"
    assert archived == versions[versions.index(b"[]\n") - 1]
    assert [a["step"] for a in json.loads(archived)] == list(range(25, k + 1, 25))
    old_state = json.loads((archive / ".state.json").read_text())
    assert old_state["step"] == k and old_state["phase"] == 0 and old_state["policy"] == "ucb1"
    assert old_state["last_checkpoint"].endswith(f"step_{k:06d}.bin")

    # kill the proxy's process group some steps into the new phase, relaunch the same command
    target = min(k + kill_after, MAX_STEPS - 5)
    gate.hold_after(target + KILL_SLACK)
    wait_for(lambda: max_logged_step(live) >= target, 240, f"step {target}", proxy, poll=0.005)
    killed = proxy.running()
    proxy.kill_group()
    proxy.proc.wait(30)
    gate.open()
    proxy = Proxy(args, data_cache).start()
    assert proxy.wait() == 0, proxy.output()
    assert "determinism" not in proxy.stderr() and "Traceback" not in proxy.stderr()

    raw = (live / ".loss.json").read_bytes()
    assert raw.startswith(before), ".loss.json bytes before the pivot changed"
    steps = last_steps(live)
    assert sorted(steps) == list(range(1, MAX_STEPS + 1))
    assert all(steps[s]["phase"] == 0 for s in range(1, k + 1))
    check_new_phase_steps(steps, k, MAX_STEPS, rows)
    st = state(live)
    assert st["status"] == "finished" and st["phase"] == 1 and st["policy"] == "exp3"
    assert st["engine"]["ranks"] == ranks
    assert st["replay_mismatch_count"] == 0, st["replay_mismatches"]
    if killed:
        assert max(e["segment"] for e in read_entries(live)) >= 3
    assert (live / "checkpoints" / f"step_{k:06d}.bin").exists(), "retention deleted the pivot checkpoint"
    status = run_cmd(["status", "--run-dir", str(live), "--json"], data_cache)
    report = json.loads(status.stdout)
    assert report["phase"] == 1 and report["phase_start_step"] == k and report["policy"] == "exp3"
    text = run_cmd(["status", "--run-dir", str(live)], data_cache).stdout
    assert f"phase:       1 (exp3, pivot at step {k})" in text, text

    # the reference, on 1 rank: reach step k, stop, pivot offline at k (--at), continue
    ref_exp = make_experiment(tmp_path / "ref", "PIVOT", **{**train, "ckpt_every": k, "keep_last": 1000})
    ref = tmp_path / "ref" / "run"
    ref_gate = ranked_gate(engine, tmp_path / "gate-ref", 1)
    ref_args = run_args(ref_exp, ref, engine=ref_gate.engine_flag)
    ref_gate.hold_after(k + 1)  # stopped past step k, nowhere near the end
    proxy = Proxy(ref_args, data_cache).start()
    wait_for(lambda: max_logged_step(ref) >= k + 1, 240, f"reference step {k + 1}", proxy, poll=0.005)
    stop = run_cmd(["stop", "--run-dir", str(ref)], data_cache)
    assert stop.returncode == 0, stop.stderr
    assert proxy.wait() == 0, proxy.output()
    stopped_at = max_logged_step(ref)
    assert stopped_at > k
    offline = run_cmd(["pivot", "--caps", str(caps), "--run-dir", str(ref), "--at", str(k)], data_cache)
    assert offline.returncode == 0, offline.stdout + offline.stderr
    assert f"pivoted {ref} at step {k}" in offline.stdout
    assert f"steps {k + 1}..{stopped_at} in .loss.json belong to phase 0" in offline.stdout
    assert not (ref / "checkpoints" / f"step_{stopped_at:06d}.bin").exists()  # set aside in the archive
    assert (ref / "archive" / f"pivot_{k}" / "checkpoints" / f"step_{stopped_at:06d}.bin").exists()
    ref_gate.open()
    proxy = Proxy(ref_args, data_cache).start()
    assert proxy.wait() == 0, proxy.output()

    ref_steps = last_steps(ref)
    assert sorted(ref_steps) == list(range(1, MAX_STEPS + 1))
    diffs = [(s, f) for s in steps for f in COMPARED if steps[s][f] != ref_steps[s][f]]
    assert not diffs, f"live and offline pivots differ: {diffs[:10]}"
    name = f"step_{MAX_STEPS:06d}.bin"
    assert_same_checkpoint(live / "checkpoints" / name, ref / "checkpoints" / name)
    assert state(ref)["replay_mismatch_count"] == 0


def test_offline_pivot_and_bad_caps_files(engine, gate, data_cache, tmp_path):
    exp = make_experiment(tmp_path, "OFFLINE", **{**TRAIN, "max_steps": 90})
    rows = rows_per_batch(exp)
    run_dir = tmp_path / "run"
    args = run_args(exp, run_dir, *gate.rank_flags, engine=gate.engine_flag)
    gate.hold_after(30)  # stopped near step 30, far from the end
    proxy = Proxy(args, data_cache).start()
    wait_for(lambda: max_logged_step(run_dir) >= 30, 240, "step 30", proxy, poll=0.005)
    assert run_cmd(["stop", "--run-dir", str(run_dir)], data_cache).returncode == 0
    assert proxy.wait() == 0, proxy.output()
    m = max_logged_step(run_dir)

    # a bad caps file changes nothing and says why, in one line
    before = tree_hashes(run_dir)
    bad = {
        "unknown arm": ({"caps": {"poetry": 0.5}}, "unknown arm 'poetry'"),
        "cap below floor": ({"caps": {"topics": 0.05}}, "topics: cap 0.05 is below floor 0.1"),
        "floors above 1": ({"floors": {"code": 0.6, "docstrings": 0.5}}, "floors sum to 1.2, above 1"),
        "not JSON": ('{"caps": {"code": 0.5}', "not JSON"),
        "bad policy": ({"policy": "greedy"}, "policy: expected one of 'ucb1', 'exp3'"),
        "out of range": ({"floors": {"code": 1.5}}, "outside [0, 1]"),
    }
    for i, (what, (content, reason)) in enumerate(bad.items()):
        path = write_caps(tmp_path, content, f"bad{i}.json")
        result = run_cmd(["pivot", "--caps", str(path), "--run-dir", str(run_dir)], data_cache)
        line = one_line_error(result, 2)
        assert reason in line and str(path) in line, (what, line)
    missing = run_cmd(["pivot", "--caps", str(tmp_path / "nope.json"), "--run-dir", str(run_dir)], data_cache)
    assert "no such file" in one_line_error(missing, 2)
    assert tree_hashes(run_dir) == before

    # the offline pivot lands on the stop checkpoint (the newest the log covers)
    samples_before = (run_dir / ".samples.json").read_bytes()
    state_before = (run_dir / ".state.json").read_bytes()
    loss_before = (run_dir / ".loss.json").read_bytes()
    result = run_cmd(["pivot", "--caps", str(write_caps(tmp_path)), "--run-dir", str(run_dir)], data_cache)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"; .samples.json and .state.json archived in archive/pivot_{m}" in result.stdout, result.stdout
    ph = phases(run_dir)
    assert len(ph) == 2 and ph[1]["start_step"] == m and ph[1]["checkpoint"] == f"checkpoints/step_{m:06d}.bin"
    assert (run_dir / "archive" / f"pivot_{m}" / ".samples.json").read_bytes() == samples_before
    assert (run_dir / "archive" / f"pivot_{m}" / ".state.json").read_bytes() == state_before
    assert json.loads((run_dir / ".samples.json").read_text()) == []
    assert (run_dir / ".loss.json").read_bytes() == loss_before
    report = json.loads(run_cmd(["status", "--run-dir", str(run_dir), "--json"], data_cache).stdout)
    assert report["phase"] == 1 and report["phase_start_step"] == m and report["policy"] == "exp3"
    assert report["alive"] is False

    gate.open()
    proxy = Proxy(args, data_cache).start()
    assert proxy.wait() == 0, proxy.output()
    assert (run_dir / ".loss.json").read_bytes().startswith(loss_before)
    steps = last_steps(run_dir)
    assert sorted(steps) == list(range(1, 91))
    assert all(steps[s]["phase"] == 0 for s in range(1, m + 1))
    check_new_phase_steps(steps, m, 90, rows)
    assert (run_dir / "checkpoints" / f"step_{m:06d}.bin").exists()
    st = state(run_dir)
    assert st["status"] == "finished" and st["replay_mismatch_count"] == 0

    # a finished run: nothing left to train under a new phase
    again = run_cmd(["pivot", "--caps", str(write_caps(tmp_path)), "--run-dir", str(run_dir)], data_cache)
    assert "finished at step 90" in one_line_error(again, 1)
    assert len(phases(run_dir)) == 2


def test_concurrent_pivots_and_restarts_are_refused(engine, gate, data_cache, tmp_path):
    exp = make_experiment(tmp_path, "BUSY", **{**TRAIN, "max_steps": 400})
    run_dir = tmp_path / "run"
    # held at step 10 until the first pivot's STOP passes the gate; the new phase's engine then waits
    # at its first step until the test lets it train the three steps it waits for
    gate.hold_after(10)
    proxy = Proxy(
        run_args(exp, run_dir, "--restart-backoff", "8", *gate.rank_flags, engine=gate.engine_flag), data_cache
    ).start()
    caps = write_caps(tmp_path)
    wait_for(lambda: max_logged_step(run_dir) >= 10, 240, "step 10", proxy, poll=0.005)

    # another `proxy pivot` holds the pivot lock: refused at once, nothing sent
    fd = os.open(run_dir / ".pivot.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.pwrite(fd, b"999999\n", 0)
    try:
        result = run_cmd(["pivot", "--caps", str(caps), "--run-dir", str(run_dir)], data_cache)
    finally:
        os.close(fd)
    assert "another pivot" in one_line_error(result, 1) and "in flight" in result.stderr
    assert len(phases(run_dir)) == 1 and not (run_dir / ".pivot_request.json").exists()

    # a request that reaches the proxy while it is applying a pivot: refused, never interleaved
    engine_pid = json.loads((run_dir / ".engine.json").read_text())["pid"]
    os.kill(engine_pid, signal.SIGSTOP)  # the first pivot's STOP waits on this engine
    first = Proxy(["pivot", "--caps", str(caps), "--run-dir", str(run_dir)], data_cache).start()
    try:
        wait_for(lambda: (run_dir / ".pivot_claimed.json").exists(), 60, "the proxy to claim the first pivot", first)
        other = {
            "id": "second",
            "caps": {"code": 1.0, "docstrings": 1.0, "topics": 1.0},
            "floors": {"code": 0.0, "docstrings": 0.0, "topics": 0.1},
            "policy": "ucb1",
        }
        (run_dir / ".pivot_request.json").write_text(json.dumps(other))
        os.kill(proxy.proc.pid, signal.SIGUSR2)

        def answer():
            try:
                obj = json.loads((run_dir / ".pivot_response.json").read_text())
            except (OSError, ValueError):
                return None
            return obj if obj.get("id") == "second" else None

        refused = wait_for(answer, 30, "the answer to the second request", proxy)
        assert refused["ok"] is False and "another pivot" in refused["message"], refused
        assert len(phases(run_dir)) == 1
    finally:
        os.kill(engine_pid, signal.SIGCONT)
    assert first.wait(120) == 0, first.output()
    ph = phases(run_dir)
    assert len(ph) == 2 and ph[1]["policy"] == "exp3"

    # a pivot while the proxy waits to restart a failed engine: refused
    gate.hold_after(ph[1]["start_step"] + 3)
    wait_for(lambda: max_logged_step(run_dir) >= ph[1]["start_step"] + 3, 120, "the new phase", proxy)
    os.kill(json.loads((run_dir / ".engine.json").read_text())["pid"], signal.SIGKILL)
    wait_for(lambda: "restarting from the newest valid checkpoint" in proxy.stderr(), 60, "the restart", proxy)
    result = run_cmd(["pivot", "--caps", str(caps), "--run-dir", str(run_dir)], data_cache)
    line = one_line_error(result, 1)
    assert "refused" in line and "restarting" in line, line
    assert len(phases(run_dir)) == 2
    assert run_cmd(["stop", "--run-dir", str(run_dir)], data_cache).returncode == 0
    assert proxy.wait() == 0, proxy.output()
    assert ARMS == list(last_steps(run_dir)[1]["mixture"])


def test_a_pivot_says_it_archived_only_what_existed(engine, gate, data_cache, tmp_path):
    """A run without sample audits has no .samples.json: the pivot archives .state.json alone and says so."""
    exp = make_experiment(tmp_path, "NOAUDIT", **{**TRAIN, "max_steps": 90, "sample_every": 0})
    run_dir = tmp_path / "run"
    gate.hold_after(20)
    proxy = Proxy(run_args(exp, run_dir, *gate.rank_flags, engine=gate.engine_flag), data_cache).start()
    wait_for(lambda: max_logged_step(run_dir) >= 20, 240, "step 20", proxy, poll=0.005)
    assert run_cmd(["stop", "--run-dir", str(run_dir)], data_cache).returncode == 0
    assert proxy.wait() == 0, proxy.output()
    assert not (run_dir / ".samples.json").exists()
    result = run_cmd(["pivot", "--caps", str(write_caps(tmp_path)), "--run-dir", str(run_dir)], data_cache)
    assert result.returncode == 0, result.stdout + result.stderr
    m = phases(run_dir)[1]["start_step"]
    assert f"; .state.json archived in archive/pivot_{m}" in result.stdout, result.stdout
    assert ".samples.json" not in result.stdout
    assert sorted(p.name for p in (run_dir / "archive" / f"pivot_{m}").iterdir()) == [".state.json", "phase.json"]

"""`proxy fork`: both branches run, their histories share the prefix, the original is untouched. The original
trains on 1 rank; the branches run forward on the rank count under test (MICROGPT_TEST_RANKS) and, whatever it
is, once more on 2 ranks, so the plain branch's steps and final checkpoint on 2 ranks are compared bit for bit
with the 1-rank original's."""

from __future__ import annotations

import json

import pytest

from harness.ranks import rank_flags, require_ranks, with_two_ranks
from proxy.formats.checkpoint import checkpoint_step, list_checkpoints

from .conftest import (
    COMPARED,
    Proxy,
    assert_same_checkpoint,
    check_new_phase_steps,
    last_steps,
    make_experiment,
    one_line_error,
    phases,
    read_entries,
    rows_per_batch,
    run_args,
    run_cmd,
    state,
    tree_hashes,
    write_caps,
)

MAX_STEPS = 120
TRAIN = dict(max_steps=MAX_STEPS, ckpt_every=20, eval_every=40, sample_every=20, keep_last=1000, milestone_every=0)


@pytest.mark.parametrize("ranks", with_two_ranks())
def test_fork_branches_share_the_prefix_and_leave_the_original_alone(engine, data_cache, tmp_path, ranks):
    require_ranks(ranks, engine.kind)
    # one micro-batch per rank of the branches (1 rank trains the same experiment to the same bits)
    exp = make_experiment(tmp_path, "FORKED", **TRAIN, grad_accum=ranks)
    rows = rows_per_batch(exp)
    src = tmp_path / "src"
    proxy = Proxy(run_args(exp, src), data_cache).start()
    assert proxy.wait() == 0, proxy.output()
    original = tree_hashes(src)
    src_steps = last_steps(src)

    # --at 70 has no checkpoint: the nearest older valid one (60) is used, and said so
    same, other = tmp_path / "same", tmp_path / "other"
    result = run_cmd(["fork", "--run-dir", str(src), "--at", "70", "--to", str(same)], data_cache)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no valid checkpoint at step 70: forking at step 60" in result.stdout
    assert f"forked {src} at step 60 into {same}: 60 steps and 1 evals inherited" in result.stdout
    other.mkdir()  # an empty directory is a fine target
    result = run_cmd(
        ["fork", "--run-dir", str(src), "--at", "60", "--to", str(other), "--caps", str(write_caps(tmp_path))],
        data_cache,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "new phase 1 (exp3)" in result.stdout

    # refusals: a non-empty target, no checkpoint early enough, a bad caps file
    assert "not empty" in one_line_error(
        run_cmd(["fork", "--run-dir", str(src), "--at", "60", "--to", str(same)], data_cache), 2
    )
    line = one_line_error(
        run_cmd(["fork", "--run-dir", str(src), "--at", "10", "--to", str(tmp_path / "x" / "z")], data_cache), 1
    )
    assert "no valid checkpoint at or before step 10" in line
    bad = write_caps(tmp_path, {"caps": {"nope": 0.5}}, "bad.json")
    line = one_line_error(
        run_cmd(
            ["fork", "--run-dir", str(src), "--at", "60", "--to", str(tmp_path / "y"), "--caps", str(bad)], data_cache
        ),
        2,
    )
    assert "unknown arm 'nope'" in line
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()  # a refused fork makes no parent
    assert not [p for p in tmp_path.iterdir() if ".fork-" in p.name]
    # a target whose parents are missing: they are made, as for export --out
    nested = tmp_path / "branches" / "b1"
    result = run_cmd(["fork", "--run-dir", str(src), "--at", "60", "--to", str(nested)], data_cache)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (nested / "checkpoints" / "step_000060.bin").read_bytes() == (
        same / "checkpoints" / "step_000060.bin"
    ).read_bytes()

    # what a fork holds
    for fork_dir in (same, other):
        entries = read_entries(fork_dir)
        assert [e["step"] for e in entries if e["type"] == "step"] == list(range(1, 61))
        assert [e["step"] for e in entries if e["type"] == "eval"] == [40]
        assert all(e["inherited"] is True for e in entries)
        for e in entries:
            if e["type"] == "step":
                assert {k: v for k, v in e.items() if k != "inherited"} == src_steps[e["step"]]
        assert (fork_dir / "experiment.json").read_bytes() == (src / "experiment.json").read_bytes()
        assert [checkpoint_step(p) for p in list_checkpoints(fork_dir / "checkpoints")] == [60]
        assert (fork_dir / "checkpoints" / "step_000060.bin").read_bytes() == (
            src / "checkpoints" / "step_000060.bin"
        ).read_bytes()
    assert [a["step"] for a in json.loads((same / ".samples.json").read_text())] == [20, 40, 60]
    assert len(phases(same)) == 1 and phases(same)[0] == phases(src)[0]
    ph = phases(other)
    assert len(ph) == 2 and ph[1]["start_step"] == 60 and ph[1]["policy"] == "exp3"
    assert ph[1]["checkpoint"] == "checkpoints/step_000060.bin"
    assert json.loads((other / ".samples.json").read_text()) == []
    assert [a["step"] for a in json.loads((other / "archive" / "pivot_60" / ".samples.json").read_text())] == [
        20,
        40,
        60,
    ]
    status = json.loads(run_cmd(["status", "--run-dir", str(other), "--json"], data_cache).stdout)
    assert status["step"] == 60 and status["phase"] == 1 and status["alive"] is False

    # both branches run forward (`proxy run --run-dir DIR`: the experiment frozen there), on `ranks` ranks
    for fork_dir in (same, other):
        p = Proxy(run_args(None, fork_dir, *rank_flags(ranks)), data_cache).start()
        assert p.wait() == 0, p.output()
        assert "Traceback" not in p.stderr()
        steps = last_steps(fork_dir)
        assert sorted(steps) == list(range(1, MAX_STEPS + 1))
        assert all(steps[s].get("inherited") is True for s in range(1, 61))
        assert not any(steps[s].get("inherited") for s in range(61, MAX_STEPS + 1))
        assert min(steps[s]["segment"] for s in range(61, MAX_STEPS + 1)) > max(
            e["segment"] for e in src_steps.values()
        )
        st = state(fork_dir)
        assert st["status"] == "finished" and st["replay_mismatch_count"] == 0
        assert st["engine"]["ranks"] == ranks

    # the plain fork continues exactly as the original did; the pivoted one under its caps
    same_steps, other_steps = last_steps(same), last_steps(other)
    diffs = [(s, f) for s in range(61, MAX_STEPS + 1) for f in COMPARED if same_steps[s][f] != src_steps[s][f]]
    assert not diffs, diffs[:10]
    name = f"step_{MAX_STEPS:06d}.bin"
    assert_same_checkpoint(src / "checkpoints" / name, same / "checkpoints" / name)
    check_new_phase_steps(other_steps, 60, MAX_STEPS, rows)
    assert any(other_steps[s]["mixture"] != src_steps[s]["mixture"] for s in range(61, MAX_STEPS + 1))
    for s in range(1, 61):
        assert {k: v for k, v in other_steps[s].items() if k != "inherited"} == src_steps[s]

    # the original was never modified, not by a fork and not by a refused one
    assert tree_hashes(src) == original

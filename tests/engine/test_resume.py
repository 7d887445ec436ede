"""Bit-exact resume (ARCHITECTURE.md, "Determinism of the whole run"): an interrupted run, resumed from
its checkpoint, produces bitwise the same later losses and the same final
checkpoint bytes as the run that was never interrupted; and results do not
depend on --threads.

Losses (and gradient norms) are compared as the floats parsed from events:
the engine prints 9 significant digits, so a float32 round-trips exactly
(FORMATS.md).
"""

from __future__ import annotations

import math
import signal

import pytest

from harness.data import make_shard, train_frames
from harness.engine import event_path, parse_events, run_once
from harness.shape import Shape, proxy_args, standalone_args
from proxy.formats import frames
from proxy.formats.checkpoint import list_checkpoints, read_checkpoint, verify_checkpoint

from .conftest import THREADS, TINY, cpu_only, lr_at

# 64 steps of a few ms each: a signal sent after step 3 lands long before the end, even on a busy box.
MID = Shape(vocab=256, ctx=64, dim=64, layers=2, heads=4, batch=4, steps=64, warmup=8, lr=1e-3, min_lr=1e-4)
EVERY = 16


def outcome(events) -> dict[int, tuple[float, float]]:
    """step -> (loss, grad_norm) from step events."""
    return {e["step"]: (e["loss"], e["grad_norm"]) for e in events if e.kind == "step"}


@pytest.fixture(scope="module")
def straight(engine_bin, tmp_path_factory):
    """The uninterrupted standalone MID run: (shard, losses by step, final checkpoint bytes, events)."""
    d = tmp_path_factory.mktemp("straight")
    shard = make_shard(d / "data.tok", MID.vocab, n_tokens=50_000)
    res = run_once(engine_bin, standalone_args(MID, shard, d / "ck", EVERY, "--threads", 2), cwd=d)
    assert res.returncode == 0, res.stderr.decode()
    events = parse_events(res.stdout)
    losses = outcome(events)
    assert sorted(losses) == list(range(1, MID.steps + 1)), f"standalone run should train steps 1..{MID.steps}"
    assert all(math.isfinite(x) for pair in losses.values() for x in pair)
    exits = [e for e in events if e.kind == "exit"]
    assert [e["reason"] for e in exits] == ["done"] and exits[0]["step"] == MID.steps
    ckpts = [(e["step"], e["reason"]) for e in events if e.kind == "ckpt"]
    assert [s for s, _ in ckpts] == list(range(EVERY, MID.steps + 1, EVERY)), (
        f"--ckpt-every {EVERY} over {MID.steps} steps: one checkpoint per multiple, the last one once; got {ckpts}"
    )
    final = d / "ck" / f"step_{MID.steps:06d}.bin"
    assert verify_checkpoint(final) is None
    return shard, losses, final.read_bytes(), events


def resume_and_compare(engine_bin, shard, ckpt_dir, cwd, straight_losses, straight_final, *extra):
    """Relaunch with --resume latest; every later loss and the final file must equal the straight run's."""
    res = run_once(engine_bin, standalone_args(MID, shard, ckpt_dir, EVERY, "--resume", "latest", *extra), cwd=cwd)
    assert res.returncode == 0, res.stderr.decode()
    events = parse_events(res.stdout)
    ready = next(e for e in events if e.kind == "ready")
    k = ready["step"]
    assert ready["resumed_from"] is not None and ready["resumed_from"].endswith(f"step_{k:06d}.bin"), ready.fields
    got = outcome(events)
    assert sorted(got) == list(range(k + 1, MID.steps + 1)), f"resumed at {k}, trained {sorted(got)}"
    diff = {s: (got[s], straight_losses[s]) for s in got if got[s] != straight_losses[s]}
    assert not diff, f"resumed from step {k}: losses differ from the straight run (resumed, straight): {diff}"
    final = (ckpt_dir / f"step_{MID.steps:06d}.bin").read_bytes()
    assert final == straight_final, "final checkpoint bytes differ from the uninterrupted run"
    return k


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_standalone_signal_then_resume_is_bit_exact(engine_bin, run_engine, tmp_path, straight, sig):
    shard, losses, final, _ = straight
    ck = tmp_path / "ck"
    eng = run_engine(standalone_args(MID, shard, ck, EVERY, "--threads", 2))
    eng.wait_for("step", step=3)
    eng.send_signal(sig)
    assert eng.finish() == 0, eng.stderr
    steps = [e["step"] for e in eng.of("step")]
    ckpts = eng.of("ckpt")
    assert ckpts and ckpts[-1]["reason"] == "signal", [c.fields for c in ckpts]
    k = ckpts[-1]["step"]
    assert k == steps[-1], f"checkpointed step {k} but the last step trained was {steps[-1]}"
    assert eng.events[-1].kind == "exit" and eng.events[-1]["reason"] == "signal", eng.events[-1]
    assert k < MID.steps, "the run ended before the signal arrived; the test proves nothing (engine too fast?)"
    assert verify_checkpoint(event_path(ckpts[-1], eng)) is None
    # losses before the interruption already equal the straight run's
    assert outcome(eng.events) == {s: losses[s] for s in steps}
    assert resume_and_compare(engine_bin, shard, ck, tmp_path, losses, final, "--threads", 2) == k


def test_standalone_sigkill_after_checkpoint_then_resume_is_bit_exact(engine_bin, run_engine, tmp_path, straight):
    shard, losses, final, _ = straight
    ck = tmp_path / "ck"
    eng = run_engine(standalone_args(MID, shard, ck, EVERY, "--threads", 2))
    eng.wait_for("ckpt", step=EVERY)
    eng.send_signal(signal.SIGKILL)
    eng.proc.wait(timeout=30)
    for p in list_checkpoints(ck):
        assert verify_checkpoint(p) is None, verify_checkpoint(p)
    k = resume_and_compare(engine_bin, shard, ck, tmp_path, losses, final, "--threads", 2)
    assert k >= EVERY


@cpu_only(THREADS)
def test_threads_do_not_change_results(engine_bin, tmp_path, straight):
    """--threads 1 and 3 give bitwise the losses and final file of the --threads 2 run."""
    shard, losses, final, events = straight
    ready = next(e for e in events if e.kind == "ready")
    assert ready["threads"] == 2
    for threads in (1, 3):
        d = tmp_path / f"t{threads}"
        d.mkdir()
        res = run_once(engine_bin, standalone_args(MID, shard, d / "ck", EVERY, "--threads", threads), cwd=d)
        assert res.returncode == 0, res.stderr.decode()
        ev = parse_events(res.stdout)
        assert next(e for e in ev if e.kind == "ready")["threads"] == threads
        got = outcome(ev)
        diff = {s: (got.get(s), losses[s]) for s in losses if got.get(s) != losses[s]}
        assert not diff, f"--threads {threads} vs --threads 2 losses differ: {diff}"
        assert (d / "ck" / f"step_{MID.steps:06d}.bin").read_bytes() == final, (
            f"--threads {threads}: final checkpoint bytes differ from --threads 2"
        )


def test_proxy_sigkill_after_ckpt_then_resume_is_bit_exact(run_engine, tmp_path):
    cfg, n = TINY, 5
    data = train_frames(cfg, 1, 2 * n, seed=4)

    a = tmp_path / "a"
    eng = run_engine(proxy_args(cfg, a))
    eng.wait_for("ready")
    for s, tok, grp in data:
        eng.train(s, tok, grp)
    eng.send(frames.stop_frame())
    assert eng.finish() == 0, eng.stderr
    straight = outcome(eng.events)
    assert sorted(straight) == list(range(1, 2 * n + 1))

    b = tmp_path / "b"
    eng = run_engine(proxy_args(cfg, b))
    eng.wait_for("ready")
    for s, tok, grp in data[:n]:
        eng.train(s, tok, grp)
    eng.send(frames.checkpoint_frame())
    ck = eng.wait_for("ckpt")
    assert ck["step"] == n and ck["reason"] == "frame", ck.fields
    eng.send_signal(signal.SIGKILL)
    eng.proc.wait(timeout=30)
    first = outcome(eng.events)

    eng = run_engine(proxy_args(cfg, b, "--resume", "latest"))
    ready = eng.wait_for("ready")
    assert ready["step"] == n and ready["resumed_from"].endswith(f"step_{n:06d}.bin"), ready.fields
    for s, tok, grp in data[n:]:
        eng.train(s, tok, grp)
    eng.send(frames.stop_frame())
    assert eng.finish() == 0, eng.stderr
    got = {**first, **outcome(eng.events)}
    diff = {s: (got.get(s), straight[s]) for s in straight if got.get(s) != straight[s]}
    assert not diff, f"losses (resumed, straight) differ: {diff}"
    name = f"step_{2 * n:06d}.bin"
    assert (b / name).read_bytes() == (a / name).read_bytes(), "final checkpoint bytes differ after resume"
    assert read_checkpoint(b / name).trailer.tokens_seen == 2 * n * cfg.rows * cfg.ctx


def test_resume_takes_unset_optimizer_flags_from_checkpoint(run_engine, tmp_path):
    """Flags not given explicitly take the checkpoint's values: the schedule continues unchanged."""
    cfg = TINY.but(lr=2e-3, min_lr=1e-4, warmup=2, steps=8, weight_decay=0.05, grad_clip=0.5, beta2=0.99)
    ck = tmp_path / "ck"
    data = train_frames(cfg, 1, 4, seed=6)
    eng = run_engine(proxy_args(cfg, ck))
    eng.wait_for("ready")
    for s, tok, grp in data[:2]:
        eng.train(s, tok, grp)
    eng.send(frames.stop_frame())
    assert eng.finish() == 0, eng.stderr

    shape_only = [
        "--vocab",
        cfg.vocab,
        "--ctx",
        cfg.ctx,
        "--dim",
        cfg.dim,
        "--layers",
        cfg.layers,
        "--heads",
        cfg.heads,
        "--batch",
        cfg.batch,
    ]
    eng = run_engine(["--data", "-", "--ckpt-dir", ck, "--ckpt-every", 0, "--resume", "latest", *shape_only])
    ready = eng.wait_for("ready", step=2)
    conf = ready["config"]
    for key, want in [
        ("lr", cfg.lr),
        ("min_lr", cfg.min_lr),
        ("warmup", cfg.warmup),
        ("steps", cfg.steps),
        ("weight_decay", cfg.weight_decay),
        ("grad_clip", cfg.grad_clip),
        ("beta2", cfg.beta2),
    ]:
        got = conf.get(key, conf.get(key.replace("_", "-")))
        assert got is not None and math.isclose(got, want, rel_tol=1e-6), (
            f"config {key}: {got!r}, checkpoint has {want!r}"
        )
    for s, tok, grp in data[2:]:
        eng.train(s, tok, grp)
        ev = eng.wait_for("step", step=s)
        assert math.isclose(ev["lr"], lr_at(cfg, s), rel_tol=1e-6), (s, ev["lr"], lr_at(cfg, s))
    eng.close_stdin()
    assert eng.finish() == 0, eng.stderr


def test_resume_with_changed_lr_needs_allow_flag(engine_bin, run_engine, tmp_path):
    cfg = TINY
    ck = tmp_path / "ck"
    eng = run_engine(proxy_args(cfg, ck))
    eng.wait_for("ready")
    eng.send(frames.checkpoint_frame())
    eng.wait_for("ckpt")
    eng.send(frames.stop_frame())
    assert eng.finish() == 0
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in ck.iterdir()}

    changed = cfg.but(lr=cfg.lr * 2)
    res = run_once(engine_bin, proxy_args(changed, ck, "--resume", "latest"), cwd=tmp_path)
    lines = res.stderr.decode().splitlines()
    assert res.returncode == 3, (res.returncode, lines)
    assert len(lines) == 1 and lines[0].startswith("microgpt") and "lr" in lines[0], lines
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in ck.iterdir()} == before

    eng = run_engine(proxy_args(changed, ck, "--resume", "latest", "--allow-hparam-change"))
    eng.wait_for("ready", step=0)
    ((s, tok, grp),) = train_frames(cfg, 1, 1)
    eng.train(1, tok, grp)
    ev = eng.wait_for("step", step=1)
    assert math.isclose(ev["lr"], lr_at(changed, 1), rel_tol=1e-6), (ev["lr"], lr_at(changed, 1))
    eng.close_stdin()
    assert eng.finish() == 0, eng.stderr


def test_resume_latest_in_empty_dir_starts_fresh(run_engine, tmp_path):
    eng = run_engine(proxy_args(TINY, tmp_path / "new", "--resume", "latest"))
    ready = eng.wait_for("ready")
    assert ready["step"] == 0 and ready["resumed_from"] is None, ready.fields
    eng.close_stdin()
    assert eng.finish() == 0, eng.stderr


def test_keep_last_keeps_newest(engine_bin, tmp_path):
    cfg = TINY.but(steps=8)
    shard = make_shard(tmp_path / "d.tok", cfg.vocab)
    ck = tmp_path / "ck"
    res = run_once(
        engine_bin, ["--data", shard, "--ckpt-dir", ck, "--ckpt-every", 2, "--keep-last", 2, *cfg.flags()], cwd=tmp_path
    )
    assert res.returncode == 0, res.stderr.decode()
    assert sorted(p.name for p in ck.iterdir()) == ["step_000006.bin", "step_000008.bin"]
    for p in ck.iterdir():
        assert verify_checkpoint(p) is None

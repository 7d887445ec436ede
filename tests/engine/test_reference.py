"""The engine against a PyTorch reference (tests/engine/torch_reference.py).

Every test starts from the engine's own initial weights (step_000000.bin,
written on a CHECKPOINT frame), so the init scheme is the engine's to choose;
what is checked is the math: loss, every gradient, AdamW with the schedule,
clipping and decoupled decay, grad accumulation, per-group losses, EVAL and
greedy SAMPLE.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from harness.data import random_rows, train_frames
from harness.engine import event_path, initial_checkpoint
from harness.shape import Shape, proxy_args
from proxy.formats import frames
from proxy.formats.checkpoint import list_checkpoints, read_checkpoint
from proxy.formats.engine_cli import engine_args
from proxy.formats.parameters import ModelShape
from proxy.formats.shard import write_shard

from .conftest import TINY, TORCH, cpu_only, lr_at
from .torch_reference import Reference, Trainer, decays, param_slices

LOSS_TOL = 1e-5  # loss from --dump-grads vs float64 torch
GRAD_TOL = 1e-4  # every gradient element
TRAIN_LOSS_TOL = 1e-4  # losses over 10 AdamW steps
# Measured against the engine at the time of writing: loss 3e-7, grads 6e-8, 10-step losses 3e-7,
# weights 6e-6 (Adam amplifies rounding where gradients are tiny), m and v 3e-6 / 7e-6 relative.
W_TOL = 5e-5  # weights after 10 steps; decay on a LayerNorm weight would move it by ~2e-3
MOMENT_RTOL = 1e-4  # Adam m, v: relative to the largest element of each


def shape_of(cfg: Shape) -> ModelShape:
    return ModelShape(cfg.vocab, cfg.ctx, cfg.dim, cfg.layers, cfg.heads)


def trainer_for(cfg: Shape, weights: np.ndarray) -> Trainer:
    model = Reference(shape_of(cfg), weights)
    return Trainer(
        model, cfg.lr, cfg.min_lr, cfg.warmup, cfg.steps, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay, cfg.grad_clip
    )


def worst(a: np.ndarray, b: np.ndarray, cfg: Shape) -> str:
    """Name the parameter tensor and index of the largest |a - b|, for failure messages."""
    d = np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))
    i = int(d.argmax())
    for name, sl, _ in param_slices(shape_of(cfg)):
        if sl.start <= i < sl.stop:
            return f"max |diff| {d[i]:.3g} at {name}[{i - sl.start}] (engine {a[i]!r}, torch {b[i]!r})"
    return f"max |diff| {d[i]:.3g} at flat index {i}"


def per_tensor_report(a: np.ndarray, b: np.ndarray, cfg: Shape, tol: float) -> list[str]:
    bad = []
    for name, sl, _ in param_slices(shape_of(cfg)):
        d = float(np.abs(a[sl].astype(np.float64) - b[sl]).max())
        if d > tol:
            bad.append(f"{name}: max |diff| {d:.3g}")
    return bad


# ---------------------------------------------------------------------------


@cpu_only(TORCH)
@pytest.mark.parametrize("grad_accum", [1, 2])
def test_loss_and_grads_match_torch(engine_bin, run_engine, tmp_path, grad_accum):
    cfg = TINY.but(batch=4 // grad_accum, grad_accum=grad_accum)
    ckpt_dir = tmp_path / "ck"
    init = initial_checkpoint(engine_bin, cfg, ckpt_dir)
    weights = read_checkpoint(init).weights
    ((s, rows, groups),) = train_frames(cfg, 1, 1, seed=3)

    grads_path = tmp_path / "grads.f32"
    eng = run_engine(proxy_args(cfg, ckpt_dir, "--resume", init, "--dump-grads", grads_path))
    eng.wait_for("ready", step=0)
    eng.train(1, rows, groups)
    ev = eng.wait_for("grads")
    assert eng.finish() == 0, eng.stderr
    assert [e["reason"] for e in eng.of("exit")] == ["grads"], eng.events
    assert not eng.of("ckpt") and list_checkpoints(ckpt_dir) == [init], "--dump-grads must not checkpoint"
    assert event_path(ev, eng).resolve() == grads_path.resolve()

    grads = np.fromfile(grads_path, dtype="<f4")
    assert grads.shape == (cfg.n_params,), f"grads file holds {grads.size} floats, n_params is {cfg.n_params}"
    ref_loss, ref_grads = Reference(shape_of(cfg), weights).loss_and_grad(rows)

    assert abs(ev["loss"] - ref_loss) <= LOSS_TOL, f"loss: engine {ev['loss']!r}, torch {ref_loss!r}"
    bad = per_tensor_report(grads, ref_grads, cfg, GRAD_TOL)
    assert not bad, "gradients differ from torch:\n" + "\n".join(bad) + "\n" + worst(grads, ref_grads, cfg)
    # and the gradients are not trivially small (a test that would pass on zeros is no test)
    assert np.abs(ref_grads).max() > 100 * GRAD_TOL


def test_dump_grads_step_n_is_that_steps_gradients(run_engine, tmp_path):
    """--dump-grads-step 3 trains steps 1 and 2, then writes step 3's gradients: bit for bit those of
    step 1 of a run resumed from the step-2 checkpoint (the qualification compares step 3's)."""
    cfg = TINY.but(batch=2)
    frames3 = train_frames(cfg, 1, 3, seed=5)
    full = run_engine(
        proxy_args(
            cfg, tmp_path / "full", "--ckpt-every", "2", "--dump-grads", tmp_path / "g3.f32", "--dump-grads-step", "3"
        )
    )
    for s, rows, groups in frames3:
        full.train(s, rows, groups)
    ev = full.wait_for("grads")
    assert full.finish() == 0, full.stderr
    assert ev["step"] == 3 and [e["step"] for e in full.of("step")] == [1, 2]
    again = run_engine(
        proxy_args(
            cfg,
            tmp_path / "again",
            "--resume",
            tmp_path / "full" / "step_000002.bin",
            "--dump-grads",
            tmp_path / "g1.f32",
        )
    )
    s, rows, groups = frames3[2]
    again.train(s, rows, groups)
    ev1 = again.wait_for("grads")
    assert again.finish() == 0, again.stderr
    assert ev1["step"] == 3 and ev1["loss"] == ev["loss"]
    assert (tmp_path / "g1.f32").read_bytes() == (tmp_path / "g3.f32").read_bytes()


@cpu_only(TORCH)
def test_dump_grads_standalone_single_window(engine_bin, run_engine, tmp_path):
    """Standalone mode on a shard of exactly T+1 tokens: every row is that one window."""
    cfg = TINY
    shard = tmp_path / "one.tok"
    tokens = np.random.default_rng(5).integers(0, cfg.vocab, size=cfg.ctx + 1, dtype=np.uint16)
    write_shard(shard, tokens, cfg.vocab)
    ckpt_dir = tmp_path / "ck"
    init = initial_checkpoint(engine_bin, cfg, ckpt_dir)
    grads_path = tmp_path / "g.f32"
    eng = run_engine(
        engine_args(ckpt_dir, data=shard, resume=init, settings=cfg.flags(), extra=["--dump-grads", grads_path])
    )
    ev = eng.wait_for("grads")
    assert eng.finish() == 0, eng.stderr
    rows = np.tile(tokens, (cfg.batch, 1))
    ref_loss, ref_grads = Reference(shape_of(cfg), read_checkpoint(init).weights).loss_and_grad(rows)
    assert abs(ev["loss"] - ref_loss) <= LOSS_TOL, f"loss: engine {ev['loss']!r}, torch {ref_loss!r}"
    grads = np.fromfile(grads_path, dtype="<f4")
    assert grads.shape == (cfg.n_params,)
    bad = per_tensor_report(grads, ref_grads, cfg, GRAD_TOL)
    assert not bad, "\n".join(bad)


@cpu_only(TORCH)
@pytest.mark.parametrize(
    "grad_accum,grad_clip", [(1, 0.05), (2, 0.05), (1, 0.0)], ids=["accum1-clipped", "accum2-clipped", "accum1-noclip"]
)
def test_adamw_steps_match_torch(engine_bin, run_engine, tmp_path, grad_accum, grad_clip):
    # warmup 3 of a 10-step horizon: warmup, cosine and its end are all exercised.
    # clip 0.05 is far below this model's gradient norm, so every step is clipped.
    cfg = TINY.but(batch=4 // grad_accum, grad_accum=grad_accum, grad_clip=grad_clip)
    ckpt_dir = tmp_path / "ck"
    init = initial_checkpoint(engine_bin, cfg, ckpt_dir)
    start = read_checkpoint(init)
    assert start.step == 0 and not start.m.any() and not start.v.any(), "fresh Adam moments must be zero"
    ref = trainer_for(cfg, start.weights)
    data = train_frames(cfg, 1, 10, seed=11)

    eng = run_engine(proxy_args(cfg, ckpt_dir, "--resume", init))
    eng.wait_for("ready", step=0)
    problems = []
    for s, rows, groups in data:
        eng.train(s, rows, groups)
        ev = eng.wait_for("step", step=s)
        want = ref.step(rows, groups)
        if abs(ev["loss"] - want["loss"]) > TRAIN_LOSS_TOL:
            problems.append(f"step {s}: loss engine {ev['loss']!r} torch {want['loss']!r}")
        if not math.isclose(ev["lr"], want["lr"], rel_tol=1e-6, abs_tol=1e-12):
            problems.append(f"step {s}: lr engine {ev['lr']!r} schedule {want['lr']!r}")
        if not math.isclose(ev["grad_norm"], want["grad_norm"], rel_tol=1e-4):
            problems.append(f"step {s}: grad_norm engine {ev['grad_norm']!r} torch {want['grad_norm']!r}")
        if ev["tokens"] != cfg.rows * cfg.ctx:
            problems.append(f"step {s}: tokens {ev['tokens']!r}, expected {cfg.rows * cfg.ctx}")
        gl = ev["group_loss"]
        if set(gl) != set(want["group_loss"]):
            problems.append(f"step {s}: group_loss keys {sorted(gl)} expected {sorted(want['group_loss'])}")
        else:
            for g, v in want["group_loss"].items():
                if abs(gl[g] - v) > TRAIN_LOSS_TOL:
                    problems.append(f"step {s}: group {g} loss engine {gl[g]!r} torch {v!r}")
    assert not problems, "engine diverges from torch.optim.AdamW:\n" + "\n".join(problems)
    if grad_clip:
        assert min(e["grad_norm"] for e in eng.of("step")) > grad_clip  # clipping really happened

    eng.send(frames.stop_frame())
    assert eng.finish() == 0, eng.stderr
    final = read_checkpoint(ckpt_dir / "step_000010.bin")
    assert final.step == 10
    w = ref.model.flat()
    m, v = ref.moments()
    bad = per_tensor_report(final.weights, w, cfg, W_TOL)
    assert not bad, (
        "weights after 10 steps differ from torch (decay only on 2-D tensors?):\n"
        + "\n".join(bad)
        + "\n"
        + worst(final.weights, w, cfg)
    )
    bad = per_tensor_report(final.m, m, cfg, MOMENT_RTOL * np.abs(m).max())
    assert not bad, "Adam m differs from torch exp_avg:\n" + "\n".join(bad) + "\n" + worst(final.m, m, cfg)
    bad = per_tensor_report(final.v, v, cfg, MOMENT_RTOL * np.abs(v).max())
    assert not bad, "Adam v differs from torch exp_avg_sq:\n" + "\n".join(bad) + "\n" + worst(final.v, v, cfg)


@cpu_only(TORCH)
def test_weight_decay_only_on_matrices(engine_bin, run_engine, tmp_path):
    """One step with a large decay (lr*wd = 5e-3, 100x the weight tolerance): 2-D tensors decay,
    LayerNorm weights and biases do not; a wrong choice shows up per tensor."""
    cfg = TINY.but(weight_decay=0.5, lr=1e-2, warmup=1, steps=10, grad_clip=0.0)
    ckpt_dir = tmp_path / "ck"
    init = initial_checkpoint(engine_bin, cfg, ckpt_dir)
    start = read_checkpoint(init)
    ref = trainer_for(cfg, start.weights)
    ((s, rows, groups),) = train_frames(cfg, 1, 1, seed=2)
    eng = run_engine(proxy_args(cfg, ckpt_dir, "--resume", init))
    eng.wait_for("ready")
    eng.train(1, rows, groups)
    eng.wait_for("step", step=1)
    eng.send(frames.stop_frame())
    assert eng.finish() == 0, eng.stderr
    ref.step(rows, groups)
    got = read_checkpoint(ckpt_dir / "step_000001.bin").weights
    want = ref.model.flat()
    bad = per_tensor_report(got, want, cfg, W_TOL)
    hint = {n: ("decayed" if decays(n) else "not decayed") for n, _, _ in param_slices(shape_of(cfg))}
    assert not bad, "after one step:\n" + "\n".join(f"{b} (should be {hint[b.split(':')[0]]})" for b in bad)


def test_lr_floor_after_horizon(run_engine, tmp_path):
    """Past --steps the learning rate stays at --min-lr (proxy mode may train past the horizon)."""
    cfg = TINY.but(warmup=2, steps=4)
    ckpt_dir = tmp_path / "ck"
    eng = run_engine(proxy_args(cfg, ckpt_dir))
    eng.wait_for("ready")
    for s, rows, groups in train_frames(cfg, 1, 6):
        eng.train(s, rows, groups)
        ev = eng.wait_for("step", step=s)
        assert math.isclose(ev["lr"], lr_at(cfg, s), rel_tol=1e-6), (s, ev["lr"], lr_at(cfg, s))
    eng.close_stdin()
    assert eng.finish() == 0, eng.stderr


def model_and_engine(engine_bin, run_engine, cfg, ckpt_dir):
    """A fresh model's checkpoint, its torch reference, and an engine in proxy mode that loaded it and is ready
    at step 0."""
    init = initial_checkpoint(engine_bin, cfg, ckpt_dir)
    model = Reference(shape_of(cfg), read_checkpoint(init).weights)
    eng = run_engine(proxy_args(cfg, ckpt_dir, "--resume", init))
    eng.wait_for("ready", step=0)
    return init, model, eng


@cpu_only(TORCH)
def test_eval_and_greedy_sample_match_torch(engine_bin, run_engine, tmp_path):
    cfg = TINY
    init, model, eng = model_and_engine(engine_bin, run_engine, cfg, tmp_path / "ck")
    rows, groups = random_rows(cfg, 3, seed=21), np.array([4, 9, 4], np.uint16)  # any rows >= 1
    eng.send(frames.eval_frame(77, rows, groups))
    ev = eng.wait_for("eval", id=77)
    assert ev["step"] == 0
    want = model.loss(rows).item()
    assert abs(ev["loss"] - want) <= LOSS_TOL, (ev["loss"], want)
    want_groups = model.group_losses(rows, groups)
    assert set(ev["group_loss"]) == set(want_groups) == {"4", "9"}
    for g, v in want_groups.items():
        assert abs(ev["group_loss"][g] - v) <= LOSS_TOL, (g, ev["group_loss"][g], v)
    assert ev["group_tokens"] == {"4": 2 * cfg.ctx, "9": cfg.ctx}

    prompt = [1, 2, 3, 4]
    eng.send(frames.sample_frame(5, prompt, count=2, max_new=cfg.ctx - len(prompt), temperature=0.0, seed=9))
    ev = eng.wait_for("sample", id=5)
    greedy = model.greedy(prompt, cfg.ctx - len(prompt))
    assert ev["tokens"] == [greedy, greedy], f"greedy sample: engine {ev['tokens']}, torch {greedy}"

    # top_k=1 is greedy whatever the temperature
    eng.send(frames.sample_frame(6, prompt, count=1, max_new=8, temperature=1.0, top_k=1, seed=4))
    assert eng.wait_for("sample", id=6)["tokens"] == [greedy[:8]]

    # EVAL and SAMPLE do not touch the model: the first TRAIN step is still torch's step 1
    ref = trainer_for(cfg, read_checkpoint(init).weights)
    ((s, rows, groups),) = train_frames(cfg, 1, 1, seed=8)
    eng.train(1, rows, groups)
    ev = eng.wait_for("step", step=1)
    want = ref.step(rows, groups)["loss"]
    assert abs(ev["loss"] - want) <= TRAIN_LOSS_TOL, (ev["loss"], want)
    eng.close_stdin()
    assert eng.finish() == 0, eng.stderr


def test_sampling_is_deterministic_per_seed(run_engine, tmp_path):
    cfg = TINY
    eng = run_engine(proxy_args(cfg, tmp_path / "ck"))
    eng.wait_for("ready")
    out = []
    for rid, seed in [(1, 123), (2, 123), (3, 124)]:
        eng.send(frames.sample_frame(rid, [7, 8], count=3, max_new=10, temperature=1.0, top_k=0, seed=seed))
        out.append(eng.wait_for("sample", id=rid)["tokens"])
    eng.close_stdin()
    assert eng.finish() == 0, eng.stderr
    for toks in out:
        assert len(toks) == 3 and all(len(t) == 10 for t in toks), toks
        assert all(0 <= x < cfg.vocab for t in toks for x in t), toks
    assert out[0] == out[1], "same seed, different samples"
    assert out[0] != out[2], "different seeds gave identical samples (3 x 10 tokens at T=1 over 64 tokens)"
    assert len({tuple(t) for t in out[0]}) > 1, "the `count` samples of one request are all identical"


@cpu_only(TORCH)
def test_greedy_sample_longer_than_context(engine_bin, run_engine, tmp_path):
    """max_new past the context: generation goes on over the last T tokens (a sliding window)."""
    cfg = TINY
    _init, model, eng = model_and_engine(engine_bin, run_engine, cfg, tmp_path / "ck")
    prompt = list(range(10))
    eng.send(frames.sample_frame(1, prompt, count=1, max_new=2 * cfg.ctx, temperature=0.0))
    ev = eng.wait_for("sample", id=1)
    eng.close_stdin()
    eng.finish()
    assert ev["tokens"] == [model.greedy(prompt, 2 * cfg.ctx)]

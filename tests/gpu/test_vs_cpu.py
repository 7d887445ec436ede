"""fp32 CUDA against the CPU reference engine, from the same checkpoint:
first loss within 1e-5, every gradient tensor within 1e-4 relative, and ten
training steps whose losses agree within 1e-4."""

from __future__ import annotations

import numpy as np
import pytest

from harness.data import markov_frames, markov_rows
from harness.engine import Engine, initial_checkpoint
from harness.shape import Shape, proxy_args
from proxy.formats import frames

from .conftest import BASE, dump_grads, train

SHAPES = {
    # head dim 32, everything a multiple of 8
    "hd32": BASE,
    # head dim 64, an odd vocabulary (bf16 rows not 16-byte aligned), 3 layers
    "hd64-odd-vocab": BASE.but(vocab=301, ctx=64, dim=192, layers=3, heads=3, batch=3),
    # head dim 8 (the engine suite's tiny shape) with gradient accumulation
    "hd8-accum": BASE.but(vocab=64, ctx=16, dim=32, layers=2, heads=4, batch=4, grad_accum=2),
}


def compare_grads(shape: Shape, g_gpu: np.ndarray, g_cpu: np.ndarray, rtol: float = 1e-4) -> list[str]:
    """Per tensor: the error norm within rtol of the reference norm, and every
    element within rtol of the tensor's largest reference magnitude."""
    bad = []
    assert np.isfinite(g_gpu).all(), "non-finite CUDA gradients"
    for name, b, e in shape.tensors():
        ref, got = g_cpu[b:e].astype(np.float64), g_gpu[b:e].astype(np.float64)
        scale = np.abs(ref).max()
        if scale == 0:
            if np.abs(got).max() > 1e-12:
                bad.append(f"{name}: reference is zero, CUDA max {np.abs(got).max():.3g}")
            continue
        norm_err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
        max_err = np.abs(got - ref).max() / scale
        if norm_err > rtol or max_err > rtol:
            bad.append(f"{name}: norm rel err {norm_err:.3g}, max err {max_err:.3g} of max |g| {scale:.3g}")
    return bad


@pytest.mark.parametrize("name", list(SHAPES))
def test_first_step_loss_and_gradients_match_cpu(name, cpu_bin, cuda_bin, tmp_path):
    shape = SHAPES[name]
    init = initial_checkpoint(cpu_bin, shape, tmp_path / "init")
    frame = markov_frames(shape, 1, 1)[1]
    loss_cpu, g_cpu = dump_grads(cpu_bin, shape, tmp_path / "cpu", init, frame)
    loss_gpu, g_gpu = dump_grads(cuda_bin, shape, tmp_path / "gpu", init, frame, "--precision", "fp32")
    assert abs(loss_gpu - loss_cpu) <= 1e-5, (loss_gpu, loss_cpu)
    bad = compare_grads(shape, g_gpu, g_cpu)
    assert not bad, "gradients differ from the CPU engine:\n" + "\n".join(bad)


@pytest.mark.parametrize("name", ["hd32", "hd64-odd-vocab"])
def test_ten_steps_match_cpu(name, cpu_bin, cuda_bin, tmp_path):
    shape = SHAPES[name]
    init = initial_checkpoint(cpu_bin, shape, tmp_path / "init")
    steps = markov_frames(shape, 1, 10)
    cpu = train(cpu_bin, shape, tmp_path / "cpu", tmp_path / "cpu" / "ckpt", steps, "--resume", str(init))
    gpu = train(
        cuda_bin,
        shape,
        tmp_path / "gpu",
        tmp_path / "gpu" / "ckpt",
        steps,
        "--resume",
        str(init),
        "--precision",
        "fp32",
    )
    lc, lg = cpu.losses(), gpu.losses()
    assert sorted(lc) == sorted(lg) == list(range(1, 11))
    diffs = {s: abs(lg[s] - lc[s]) for s in lc}
    assert max(diffs.values()) <= 1e-4, diffs
    # The grad norms (before clipping) agree too.
    nc = {e["step"]: e["grad_norm"] for e in cpu.of("step")}
    ng = {e["step"]: e["grad_norm"] for e in gpu.of("step")}
    assert all(abs(ng[s] - nc[s]) <= 1e-3 * nc[s] for s in nc), (nc, ng)


def test_eval_and_greedy_sample_match_cpu(cpu_bin, cuda_bin, tmp_path):
    """EVAL losses (fewer rows than a batch: padding) and a greedy SAMPLE."""
    shape = SHAPES["hd32"]
    init = initial_checkpoint(cpu_bin, shape, tmp_path / "init")
    rows = markov_rows(shape, shape.batch + 1, seed=99)  # one full batch plus one padded row
    groups = np.array([0, 1, 0, 2, 1], dtype=np.uint16)[: len(rows)]
    prompt = [1, 2, 3]
    results = {}
    for binary, extra in ((cpu_bin, []), (cuda_bin, ["--precision", "fp32"])):
        eng = Engine(
            binary, proxy_args(shape, tmp_path / binary.name, "--resume", str(init), *extra), tmp_path / binary.name
        )
        eng.send(frames.eval_frame(1, rows, groups))
        ev = eng.wait_for("eval", id=1)
        eng.send(frames.sample_frame(2, prompt, count=2, max_new=shape.ctx, temperature=0.0))
        sample = eng.wait_for("sample", id=2)
        eng.close_stdin()
        assert eng.finish() == 0
        results[binary.name] = (ev, sample)
    (ev_c, s_c), (ev_g, s_g) = results[cpu_bin.name], results[cuda_bin.name]
    assert abs(ev_c["loss"] - ev_g["loss"]) <= 1e-5
    for g, loss in ev_c["group_loss"].items():
        assert abs(ev_g["group_loss"][g] - loss) <= 1e-5
    # Greedy decoding from near-identical logits: the same tokens unless two
    # logits tie within fp32 noise, which a fresh model makes unlikely.
    assert s_g["tokens"] == s_c["tokens"]

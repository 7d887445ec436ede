"""The CUDA engine's fast paths on a GPU: cuDNN attention, the fused step kernels, the step as one
CUDA graph, sampling with the KV cache, the asynchronous checkpoint snapshot, and the qualification
that decides which of them a run uses (proxy/qualification.py). Each fast path against the verified
path (naive attention, verified kernels, no graph) within the suite's bf16 tolerances; the graph
against the same kernels without it, bit for bit; determinism and bit-exact resume with everything
on; the KV cache's tokens and logits against the recompute path's, bit for bit.

Run first in a GPU session (scripts/gpu_session.sh): the rest of tests/gpu covers the verified path."""

from __future__ import annotations

import numpy as np
import pytest

from harness.data import markov_frames
from harness.engine import Engine, initial_checkpoint
from harness.shape import Shape, proxy_args
from proxy import qualification as qual
from proxy.formats import frames
from proxy.formats.checkpoint import read_checkpoint
from proxy.qualification import COSINE_MIN, LOSS_TOLERANCE

from .conftest import BASE, dump_grads_run, train

ALL_FAST = ["--attention", "cudnn", "--fused", "on", "--cuda-graph", "on"]


def cosines(shape: Shape, got: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    model = {"vocab": shape.vocab, "ctx": shape.ctx, "dim": shape.dim, "layers": shape.layers}
    return dict(qual.tensor_cosines(model, got, ref))


def assert_within_tolerance(shape: Shape, run, ref, what: str) -> None:
    assert np.isfinite(run.grads).all(), f"{what}: non-finite gradients"
    assert abs(run.loss - ref.loss) <= LOSS_TOLERANCE, f"{what}: loss {run.loss} vs {ref.loss}"
    bad = {n: c for n, c in cosines(shape, run.grads, ref.grads).items() if not c > COSINE_MIN}
    assert not bad, f"{what}: gradient cosines below {COSINE_MIN}: {bad}"


CUDNN_CASES = {f"hd{hd}-T{T}": (hd, T) for hd in (64, 128) for T in (64, 100, 1024)}


@pytest.mark.parametrize("case", list(CUDNN_CASES))
def test_cudnn_attention_matches_naive(case, cpu_bin, cuda_bin, tmp_path):
    hd, T = CUDNN_CASES[case]
    shape = BASE.but(vocab=512, ctx=T, dim=256, heads=256 // hd, layers=2, batch=2 if T >= 1024 else 4)
    init = initial_checkpoint(cpu_bin, shape, tmp_path / "init")
    frame = markov_frames(shape, 1, 1)[1]
    naive = dump_grads_run(cuda_bin, shape, tmp_path / "naive", init, frame, "--attention", "naive")
    cudnn = dump_grads_run(cuda_bin, shape, tmp_path / "cudnn", init, frame, "--attention", "cudnn")
    assert cudnn.device.endswith("attention cudnn"), (cudnn.device, cudnn.engine.stderr)
    assert_within_tolerance(shape, cudnn, naive, "cudnn against naive")


SHAPE = BASE.but(vocab=512, ctx=128, dim=128, heads=2, layers=2, batch=4, steps=20)


def test_fused_kernels_match_the_verified_step(cpu_bin, cuda_bin, tmp_path):
    init = initial_checkpoint(cpu_bin, SHAPE, tmp_path / "init")
    frame = markov_frames(SHAPE, 1, 1)[1]
    verified = dump_grads_run(cuda_bin, SHAPE, tmp_path / "verified", init, frame)
    fused = dump_grads_run(cuda_bin, SHAPE, tmp_path / "fused", init, frame, "--fused", "on")
    assert fused.engine.of("ready")[0]["paths"]["fused"] is True
    assert_within_tolerance(SHAPE, fused, verified, "fused against verified")


def test_the_graph_replays_the_fused_step_bit_for_bit(cuda_bin, tmp_path):
    steps = markov_frames(SHAPE, 1, 10)
    runs = {}
    for name, flags in (("fused", ["--fused", "on"]), ("graph", ["--cuda-graph", "on"])):
        runs[name] = train(cuda_bin, SHAPE, tmp_path / name, tmp_path / name / "ckpt", steps, *flags)
    assert runs["graph"].of("ready")[0]["paths"]["cuda_graph"] is True
    assert runs["graph"].losses() == runs["fused"].losses()
    assert (tmp_path / "graph" / "ckpt" / "step_000010.bin").read_bytes() == (
        tmp_path / "fused" / "ckpt" / "step_000010.bin"
    ).read_bytes()


def test_all_fast_paths_are_deterministic_and_resume_bit_exact(cuda_bin, tmp_path):
    steps = markov_frames(SHAPE, 1, 20)
    full = Engine(cuda_bin, proxy_args(SHAPE, tmp_path / "full", "--ckpt-every", "5", *ALL_FAST), tmp_path)
    for s in range(1, 21):
        full.send(steps[s])
    full.close_stdin()
    assert full.finish() == 0, full.stderr
    twice = train(cuda_bin, SHAPE, tmp_path / "twice", tmp_path / "twice" / "ckpt", steps, *ALL_FAST)
    assert twice.losses() == full.losses()
    again = train(
        cuda_bin,
        SHAPE,
        tmp_path / "again",
        tmp_path / "again" / "ckpt",
        {s: steps[s] for s in range(11, 21)},
        "--resume",
        str(tmp_path / "full" / "step_000010.bin"),
        *ALL_FAST,
    )
    assert again.losses() == {s: full.losses()[s] for s in range(11, 21)}
    assert (tmp_path / "again" / "ckpt" / "step_000020.bin").read_bytes() == (
        tmp_path / "full" / "step_000020.bin"
    ).read_bytes()


def test_asynchronous_snapshots_hold_the_state_of_their_step(cuda_bin, tmp_path):
    """Checkpoints taken while training goes on (every 2 steps) hold exactly the state a run stopped at
    that step writes."""
    steps = markov_frames(SHAPE, 1, 6)
    busy = train(cuda_bin, SHAPE, tmp_path / "busy", tmp_path / "busy" / "ckpt", steps, "--ckpt-every", "2", *ALL_FAST)
    assert len(busy.of("ckpt")) >= 3
    train(
        cuda_bin, SHAPE, tmp_path / "quiet", tmp_path / "quiet" / "ckpt", {s: steps[s] for s in (1, 2, 3, 4)}, *ALL_FAST
    )
    a = read_checkpoint(tmp_path / "busy" / "ckpt" / "step_000004.bin")
    b = read_checkpoint(tmp_path / "quiet" / "ckpt" / "step_000004.bin")
    for field in ("weights", "m", "v"):
        assert np.array_equal(getattr(a, field).view(np.uint32), getattr(b, field).view(np.uint32)), field


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_kv_cache_sampling_matches_recompute(precision, cpu_bin, cuda_bin, tmp_path):
    """The same SAMPLE frame through the KV cache and through --sample-recompute: the same tokens and
    the same logits, bit for bit (greedy and sampled, prompts of different lengths)."""
    shape = BASE.but(vocab=512, ctx=64, dim=128, heads=2, layers=2, batch=4)
    init = initial_checkpoint(cpu_bin, shape, tmp_path / "init")
    prompts = [
        frames.SamplePrompt([1, 2, 3], 2, 11),
        frames.SamplePrompt([7] * 9, 1, 12),
        frames.SamplePrompt([5], 2, 13),
    ]
    out = {}
    for mode, extra in (("kv", []), ("recompute", ["--sample-recompute"])):
        logits = tmp_path / f"{mode}.logits"
        eng = Engine(
            cuda_bin,
            proxy_args(
                shape,
                tmp_path / mode,
                "--resume",
                str(init),
                "--precision",
                precision,
                "--dump-logits",
                str(logits),
                *extra,
            ),
            tmp_path / mode,
        )
        eng.send(frames.sample_batch_frame(1, prompts, 40, 0.0, 0))
        greedy = eng.wait_for("sample", id=1)
        eng.send(frames.sample_batch_frame(2, prompts, 40, 0.9, 40))
        sampled = eng.wait_for("sample", id=2)
        eng.close_stdin()
        assert eng.finish() == 0, eng.stderr
        out[mode] = (greedy["tokens"], sampled["tokens"], logits.read_bytes())
    assert out["kv"][0] == out["recompute"][0]
    assert out["kv"][1] == out["recompute"][1]
    assert out["kv"][2] == out["recompute"][2]


def test_qualification_passes_on_this_gpu(cuda_bin, tmp_path):
    """Every fast path in this build passes its check here (none fails or crashes)."""
    model = {"vocab": 512, "ctx": 256, "dim": 256, "layers": 2, "heads": 4, "batch": 4, "grad_accum": 2}
    settings = BASE.but(vocab=512, ctx=256, dim=256, heads=4, layers=2, batch=4, grad_accum=2).flags()
    lines: list[str] = []
    q = qual.qualify(cuda_bin, settings, model, tmp_path / "cache", lines.append)
    print("\n".join(lines))
    assert q is not None, "\n".join(lines)  # the verified run ran, on the GPU NVML names
    bad = {p.value: c for p, c in q.paths.items() if c.verdict.value in ("failed", "crashed")}
    assert not bad, "\n".join(f"{p}: {c.verdict.value}: {c.detail}" for p, c in bad.items())
    flags = q.engine_flags()
    assert flags[flags.index("--cuda-graph") + 1] == "on", flags
    assert "--sample-recompute" not in flags and "--sync-snapshot" not in flags, flags

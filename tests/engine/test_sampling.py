"""Sampling (FORMATS.md "Engine frames", SAMPLE; ENGINE.md "Sampling"): the KV-cache path gives
the tokens of the recompute path (`--sample-recompute`, what engines without a KV cache do),
bit for bit, across temperatures, top-k, counts, prompt lengths (within, at and beyond the
context), batch chunking and thread counts; and one frame with several prompts gives exactly
what one frame per prompt gives."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from harness.data import train_frames
from harness.shape import Shape, proxy_args
from proxy.formats import frames
from proxy.formats.frames import SamplePrompt

from .conftest import THREADS, TINY, cpu_only

# (name, shape): odd widths too (dim 36: rows of 144 bytes, not a multiple of a 32-byte vector)
SHAPES = {
    "tiny": TINY.but(batch=3),
    "odd-width": Shape(vocab=97, ctx=12, dim=36, layers=2, heads=4, batch=2, steps=10, warmup=2),
    "long-ctx": Shape(vocab=50, ctx=40, dim=24, layers=1, heads=3, batch=4, steps=10, warmup=2),
}
SETTINGS = [(0.0, 0), (0.7, 0), (1.0, 5), (1.3, 1)]  # (temperature, top_k)


def prompt_lengths(cfg: Shape) -> list[int]:
    """Short, just under, at and beyond the context."""
    return [1, 3, cfg.ctx - 1, cfg.ctx, cfg.ctx + 5]


def prompts_for(cfg: Shape, seed: int) -> list[SamplePrompt]:
    rng = np.random.default_rng(seed)
    return [
        SamplePrompt(rng.integers(0, cfg.vocab, size=n).tolist(), count=1 + i % 3, seed=seed * 10 + i)
        for i, n in enumerate(prompt_lengths(cfg))
    ]


def trained_engine(run_engine, tmp_path, cfg: Shape, name: str, *extra):
    """An engine in proxy mode after 3 training steps (so the logits are not those of the initialisation)."""
    eng = run_engine([*proxy_args(cfg, tmp_path / f"ck-{name}"), *map(str, extra)])
    eng.wait_for("ready")
    for s, tok, grp in train_frames(cfg, 1, 3, seed=11):
        eng.train(s, tok, grp)
    eng.wait_for("step", step=3)
    return eng


def sample_all(eng, frames_by_id: dict[int, bytes]) -> dict[int, list]:
    for _rid, frame in frames_by_id.items():
        eng.send(frame)
    return {rid: eng.wait_for("sample", id=rid)["tokens"] for rid in frames_by_id}


def batched_frames(cfg: Shape, max_new: int) -> dict[int, bytes]:
    """One frame per (temperature, top_k): every prompt length, counts 1-3 (more rows than --batch)."""
    return {
        rid: frames.sample_batch_frame(rid, prompts_for(cfg, rid), max_new, temperature, top_k)
        for rid, (temperature, top_k) in enumerate(SETTINGS, start=1)
    }


@pytest.mark.parametrize("shape", list(SHAPES))
def test_kv_cache_tokens_equal_recompute(run_engine, tmp_path, shape):
    cfg = SHAPES[shape]
    max_new = cfg.ctx + 3  # every completion runs past the context: the KV path hands over to the window
    out = {}
    for name, extra in (("kv", ()), ("recompute", ("--sample-recompute",))):
        eng = trained_engine(run_engine, tmp_path, cfg, name, *extra)
        out[name] = sample_all(eng, batched_frames(cfg, max_new))
        eng.close_stdin()
        assert eng.finish() == 0, eng.stderr
    for rid, (temperature, top_k) in enumerate(SETTINGS, start=1):
        kv, ref = out["kv"][rid], out["recompute"][rid]
        n = sum(p.count for p in prompts_for(cfg, rid))
        assert len(kv) == n and all(len(t) == max_new for t in kv), (len(kv), n)
        assert all(0 <= x < cfg.vocab for t in kv for x in t)
        assert kv == ref, f"{shape}, temperature {temperature}, top_k {top_k}: KV cache {kv} != recompute {ref}"
    # the completions are not all alike (else the comparison proves little)
    assert len({tuple(t) for t in out["kv"][2]}) > 1


@cpu_only(THREADS)
@pytest.mark.parametrize("threads", [1, 3])
def test_kv_cache_tokens_do_not_depend_on_threads(run_engine, tmp_path, threads):
    cfg = SHAPES["odd-width"]
    got = {}
    for t in (2, threads):
        eng = trained_engine(run_engine, tmp_path, cfg, f"t{t}-{threads}", "--threads", t)
        got[t] = sample_all(eng, batched_frames(cfg, cfg.ctx + 3))
        eng.close_stdin()
        assert eng.finish() == 0, eng.stderr
    assert got[threads] == got[2], f"--threads {threads} samples differ from --threads 2"


@pytest.mark.parametrize("path", ["kv", "recompute"])
def test_one_frame_of_prompts_equals_one_frame_per_prompt(run_engine, tmp_path, path):
    """The proxy's audit is one frame; each completion must be what its own frame would give."""
    cfg = SHAPES["tiny"]
    prompts = prompts_for(cfg, 5)
    max_new, temperature, top_k = 9, 0.9, 7
    extra = ("--sample-recompute",) if path == "recompute" else ()
    eng = trained_engine(run_engine, tmp_path, cfg, path, *extra)
    together = sample_all(eng, {1: frames.sample_batch_frame(1, prompts, max_new, temperature, top_k)})[1]
    apart = sample_all(
        eng,
        {
            10 + i: frames.sample_frame(10 + i, p.tokens, p.count, max_new, temperature, top_k, p.seed)
            for i, p in enumerate(prompts)
        },
    )
    eng.close_stdin()
    assert eng.finish() == 0, eng.stderr
    assert together == list(itertools.chain.from_iterable(apart[10 + i] for i in range(len(prompts))))


def test_sample_event_keeps_the_frame_order_and_counts(run_engine, tmp_path):
    cfg = SHAPES["tiny"]
    eng = trained_engine(run_engine, tmp_path, cfg, "order")
    prompts = [
        SamplePrompt([1, 2], count=2, seed=1),
        SamplePrompt([3], count=1, seed=1),
        SamplePrompt([1, 2], count=2, seed=1),
    ]
    ev = sample_all(eng, {4: frames.sample_batch_frame(4, prompts, 6, 1.0, 0)})[4]
    eng.close_stdin()
    assert eng.finish() == 0, eng.stderr
    assert len(ev) == 5 and all(len(t) == 6 for t in ev)
    # the same prompt and seed give the same completions wherever they stand in the frame
    assert ev[0:2] == ev[3:5]

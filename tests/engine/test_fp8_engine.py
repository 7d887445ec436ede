"""--precision fp8 on the CPU engine (docs/ENGINE.md, "FP8"): the linear layers' GEMM operands rounded
through E4M3 and E5M2. Results do not depend on --threads, a resume within fp8 is bit-exact, and an fp8
checkpoint (the same fp32 ANDREA file) resumes under fp32 and back, the ready event stating the precision."""

from __future__ import annotations

import math
import shutil

import pytest

from harness.data import make_shard
from harness.engine import parse_events, run_once
from harness.shape import Shape, standalone_args
from proxy.formats.checkpoint import verify_checkpoint

from .conftest import THREADS, cpu_only

pytestmark = cpu_only("--precision fp8, which only the CPU engine runs")

SHAPE = Shape(vocab=256, ctx=64, dim=64, layers=2, heads=4, batch=4, steps=32, warmup=8, lr=1e-3, min_lr=1e-4)
EVERY = 16


def train(engine_bin, shard, ckpt_dir, cwd, *extra):
    res = run_once(engine_bin, standalone_args(SHAPE, shard, ckpt_dir, EVERY, *extra), cwd=cwd)
    assert res.returncode == 0, res.stderr.decode()
    events = parse_events(res.stdout)
    ready = next(e for e in events if e.kind == "ready")
    losses = {e["step"]: (e["loss"], e["grad_norm"]) for e in events if e.kind == "step"}
    assert all(math.isfinite(x) for pair in losses.values() for x in pair)
    return ready, losses


@pytest.fixture(scope="module")
def runs(engine_bin, tmp_path_factory):
    """fp32 and fp8 runs of SHAPE at --threads 2: (shard, {precision: (losses, final bytes, ckpt dir)})."""
    d = tmp_path_factory.mktemp("fp8")
    shard = make_shard(d / "data.tok", SHAPE.vocab, n_tokens=50_000)
    out = {}
    for precision in ("fp32", "fp8"):
        ck = d / precision
        ready, losses = train(engine_bin, shard, ck, d, "--threads", 2, "--precision", precision)
        assert ready["precision"] == precision
        final = ck / f"step_{SHAPE.steps:06d}.bin"
        assert verify_checkpoint(final) is None
        out[precision] = (losses, final.read_bytes(), ck)
    return shard, out


def test_fp8_rounds_the_gemms_and_stays_close_to_fp32(runs):
    _, out = runs
    fp32, fp8 = out["fp32"][0], out["fp8"][0]
    assert fp32[1] != fp8[1], "step 1's loss is the same in fp8 and fp32: the forward was not rounded"
    assert out["fp32"][1] != out["fp8"][1]
    last = SHAPE.steps
    assert abs(fp8[last][0] - fp32[last][0]) <= 0.02 * fp32[last][0], (fp8[last], fp32[last])


@cpu_only(THREADS)
def test_fp8_threads_do_not_change_results(engine_bin, tmp_path, runs):
    shard, out = runs
    losses, final, _ = out["fp8"]
    for threads in (1, 3):
        ck = tmp_path / f"t{threads}"
        _, got = train(engine_bin, shard, ck, tmp_path, "--threads", threads, "--precision", "fp8")
        assert got == losses, f"--threads {threads} vs 2: fp8 losses differ"
        assert (ck / f"step_{SHAPE.steps:06d}.bin").read_bytes() == final


def test_fp8_resume_is_bit_exact(engine_bin, tmp_path, runs):
    shard, out = runs
    losses, final, ck_straight = out["fp8"]
    ck = tmp_path / "ck"
    ck.mkdir()
    shutil.copy(ck_straight / f"step_{EVERY:06d}.bin", ck)
    res = run_once(
        engine_bin,
        standalone_args(SHAPE, shard, ck, EVERY, "--resume", "latest", "--precision", "fp8", "--threads", 1),
        cwd=tmp_path,
    )
    assert res.returncode == 0 and not res.stderr, res.stderr.decode()  # the same precision: nothing to say
    events = parse_events(res.stdout)
    ready = next(e for e in events if e.kind == "ready")
    got = {e["step"]: (e["loss"], e["grad_norm"]) for e in events if e.kind == "step"}
    assert ready["step"] == EVERY and ready["precision"] == "fp8"
    assert got == {s: losses[s] for s in range(EVERY + 1, SHAPE.steps + 1)}
    assert (ck / f"step_{SHAPE.steps:06d}.bin").read_bytes() == final


@pytest.mark.parametrize(("saved", "resumed"), [("fp8", "fp32"), ("fp32", "fp8")])
def test_checkpoint_resumes_across_precisions(engine_bin, tmp_path, runs, saved, resumed):
    """The file is the same fp32 layout in both: it loads, and the continuation is the other precision's
    arithmetic (not the saving run's), stated in the ready event."""
    shard, out = runs
    ck = tmp_path / "ck"
    ck.mkdir()
    shutil.copy(out[saved][2] / f"step_{EVERY:06d}.bin", ck)
    res = run_once(
        engine_bin, standalone_args(SHAPE, shard, ck, EVERY, "--resume", "latest", "--precision", resumed), cwd=tmp_path
    )
    assert res.returncode == 0, res.stderr.decode()
    path = ck / f"step_{EVERY:06d}.bin"
    assert (
        res.stderr.decode().strip()
        == f"microgpt: warning: {path} was trained in {saved}; this run computes in {resumed}"
    )
    events = parse_events(res.stdout)
    ready = next(e for e in events if e.kind == "ready")
    got = {e["step"]: (e["loss"], e["grad_norm"]) for e in events if e.kind == "step"}
    assert ready["step"] == EVERY and ready["precision"] == resumed
    assert sorted(got) == list(range(EVERY + 1, SHAPE.steps + 1))
    assert got != {s: out[saved][0][s] for s in got}, "the resumed run computed as the saving run's precision"
    assert verify_checkpoint(ck / f"step_{SHAPE.steps:06d}.bin") is None


@pytest.mark.parametrize(
    ("value", "message"),
    [("fp16", "--precision: 'fp16' is not fp32, bf16 or fp8"), ("bf16", "--precision bf16 is for the CUDA engine")],
)
def test_bad_precision_is_one_line_and_exit_2(engine_bin, tmp_path, value, message):
    shard = make_shard(tmp_path / "data.tok", SHAPE.vocab, n_tokens=5_000)
    res = run_once(
        engine_bin, standalone_args(SHAPE, shard, tmp_path / "ck", EVERY, "--precision", value), cwd=tmp_path
    )
    assert res.returncode == 2
    err = res.stderr.decode().strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert not (tmp_path / "ck").exists() or not list((tmp_path / "ck").iterdir())

"""--attention flash in the engine: the tensor-core kernels against the naive
bf16 kernels and the CPU engine (head dims 32, 64, 128 at T = 64, 1024 and
100, which is not a multiple of the 64-row tile), bit-exact resume, EVAL and
SAMPLE through it, and the fallbacks (fp32, other head dims) that must run
the naive kernels with one warning instead of failing.

Tolerances are the suite's bf16 ones (test_bf16.py): loss within 2e-2 of the
reference, gradient cosine above 0.99, here for every parameter tensor. The
kernels alone are held much tighter by test_flash_kernels.py; determinism
and the 200-step learning curve of flash are in test_bf16.py."""

from __future__ import annotations

import numpy as np
import pytest

from harness.data import markov_frames, markov_rows
from harness.engine import Engine, initial_checkpoint
from harness.shape import Shape, proxy_args
from proxy.formats import frames
from proxy.qualification import COSINE_MIN  # the qualification's tolerances
from proxy.qualification import LOSS_TOLERANCE as LOSS_TOL

from .conftest import BASE, GradDump, dump_grads_run, train


def flash_shape(hd: int, T: int) -> Shape:
    """Width 256 at every head dim (8, 4 or 2 heads); fewer rows at T = 1024."""
    return BASE.but(vocab=512, ctx=T, dim=256, heads=256 // hd, layers=2, batch=2 if T >= 1024 else 4)


CASES = {f"hd{hd}-T{T}": (hd, T) for hd in (32, 64, 128) for T in (64, 100, 1024)}


def tensor_cosines(shape: Shape, got: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    out = {}
    for name, b, e in shape.tensors():
        x, y = got[b:e].astype(np.float64), ref[b:e].astype(np.float64)
        denom = np.linalg.norm(x) * np.linalg.norm(y)
        out[name] = float(np.dot(x, y) / denom) if denom > 0 else float(np.array_equal(x, y))
    return out


def assert_close(shape: Shape, run: GradDump, ref: GradDump, what: str, naive: GradDump | None = None) -> None:
    assert np.isfinite(run.grads).all(), f"non-finite flash gradients ({what})"
    assert abs(run.loss - ref.loss) <= LOSS_TOL, f"loss {run.loss} vs {what} {ref.loss}"
    cos = tensor_cosines(shape, run.grads, ref.grads)
    control = tensor_cosines(shape, naive.grads, ref.grads) if naive else {}
    bad = [
        f"{n}: cosine {c:.5f}" + (f" (naive bf16: {control[n]:.5f})" if control else "")
        for n, c in cos.items()
        if not c > COSINE_MIN
    ]
    assert not bad, f"flash gradients against {what}:\n" + "\n".join(bad)


@pytest.mark.parametrize("case", list(CASES))
def test_flash_gradients_match_naive_and_cpu(case, cpu_bin, cuda_bin, tmp_path):
    hd, T = CASES[case]
    shape = flash_shape(hd, T)
    init = initial_checkpoint(cpu_bin, shape, tmp_path / "init")
    frame = markov_frames(shape, 1, 1)[1]
    cpu = dump_grads_run(cpu_bin, shape, tmp_path / "cpu", init, frame)
    naive = dump_grads_run(
        cuda_bin, shape, tmp_path / "naive", init, frame, "--precision", "bf16", "--attention", "naive"
    )
    flash = dump_grads_run(
        cuda_bin, shape, tmp_path / "flash", init, frame, "--precision", "bf16", "--attention", "flash"
    )
    assert naive.device.endswith("attention naive"), naive.device
    assert flash.device.endswith("attention flash"), flash.device
    assert "--attention flash" not in flash.engine.stderr, flash.engine.stderr  # no fallback warning
    assert_close(shape, flash, cpu, "the CPU engine (fp32)", naive)
    assert_close(shape, flash, naive, "naive bf16")


RESUME_SHAPE = BASE.but(ctx=100, dim=128, heads=2, batch=4, steps=20)  # head dim 64, a partial last tile


def test_flash_resume_is_bit_exact(cuda_bin, tmp_path):
    steps = markov_frames(RESUME_SHAPE, 1, 20)
    full = Engine(
        cuda_bin, proxy_args(RESUME_SHAPE, tmp_path / "full", "--ckpt-every", "5", "--attention", "flash"), tmp_path
    )
    for s in range(1, 21):
        full.send(steps[s])
    full.close_stdin()
    assert full.finish() == 0, full.stderr
    assert full.of("ready")[0]["device"].endswith("attention flash")
    losses = full.losses()
    assert sorted(losses) == list(range(1, 21))
    again = train(
        cuda_bin,
        RESUME_SHAPE,
        tmp_path / "again",
        tmp_path / "again" / "ckpt",
        {s: steps[s] for s in range(11, 21)},
        "--resume",
        str(tmp_path / "full" / "step_000010.bin"),
        "--attention",
        "flash",
    )
    assert again.losses() == {s: losses[s] for s in range(11, 21)}
    # The checkpoint at the end of both runs: byte for byte the same file.
    assert (tmp_path / "again" / "ckpt" / "step_000020.bin").read_bytes() == (
        tmp_path / "full" / "step_000020.bin"
    ).read_bytes()


def test_flash_eval_and_sample(cpu_bin, cuda_bin, tmp_path):
    """EVAL with a padded chunk and a SAMPLE run the forward alone through flash."""
    shape = flash_shape(64, 100)
    init = initial_checkpoint(cpu_bin, shape, tmp_path / "init")
    rows = markov_rows(shape, shape.batch + 1, seed=99)  # one full batch plus one padded row
    groups = np.array([0, 1, 0, 2, 1], dtype=np.uint16)[: len(rows)]
    results = {}
    for attention in ("naive", "flash"):
        eng = Engine(
            cuda_bin,
            proxy_args(
                shape, tmp_path / attention, "--resume", str(init), "--precision", "bf16", "--attention", attention
            ),
            tmp_path / attention,
        )
        eng.send(frames.eval_frame(1, rows, groups))
        ev = eng.wait_for("eval", id=1)
        eng.send(frames.sample_frame(2, [1, 2, 3], count=2, max_new=20, temperature=0.0))
        sample = eng.wait_for("sample", id=2)
        eng.close_stdin()
        assert eng.finish() == 0
        results[attention] = (ev, sample)
    (ev_n, s_n), (ev_f, s_f) = results["naive"], results["flash"]
    assert abs(ev_f["loss"] - ev_n["loss"]) <= LOSS_TOL, (ev_f["loss"], ev_n["loss"])
    for g, loss in ev_n["group_loss"].items():
        assert abs(ev_f["group_loss"][g] - loss) <= LOSS_TOL
    assert len(s_f["tokens"]) == len(s_n["tokens"]) and all(len(t) == 20 for t in s_f["tokens"]), s_f["tokens"]


# Where flash does not apply, the run goes on with the naive kernels: one
# warning on stderr, the ready event's device says so, and the numbers are
# bit for bit those of --attention naive.
FALLBACKS = {
    "fp32": (BASE.but(steps=20), ["--precision", "fp32"], "needs --precision bf16"),
    "head-dim-16": (BASE.but(dim=64, heads=4, steps=20), ["--precision", "bf16"], "head dims 32, 64 and 128"),
}


@pytest.mark.parametrize("case", list(FALLBACKS))
def test_flash_falls_back_to_naive(case, cuda_bin, tmp_path):
    shape, extra, says = FALLBACKS[case]
    steps = markov_frames(shape, 1, 3)
    runs = {}
    for attention in ("naive", "flash"):
        runs[attention] = train(
            cuda_bin,
            shape,
            tmp_path / attention,
            tmp_path / attention / "ckpt",
            steps,
            *extra,
            "--attention",
            attention,
        )
    asked = runs["flash"]
    assert asked.of("ready")[0]["device"].endswith("attention naive"), asked.of("ready")[0]["device"]
    warnings = [line for line in asked.stderr.splitlines() if "--attention flash" in line]
    assert len(warnings) == 1 and says in warnings[0], asked.stderr
    assert asked.losses() == runs["naive"].losses()

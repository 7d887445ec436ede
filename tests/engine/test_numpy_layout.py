"""The checkpoint's first five regions are the published ANDREA layout: numpy alone reads them.

This file deliberately uses no project code to read the file (only to write
the engine's input), so it checks the engine against the published layout,
not against our own reader; then it checks our reader agrees.
"""

from __future__ import annotations

import json
import struct
import zlib

import numpy as np

from harness.data import train_frames
from harness.shape import proxy_args
from proxy.formats import frames
from proxy.formats.checkpoint import read_checkpoint

from .conftest import ENGINE, TINY


def test_numpy_reads_published_layout(run_engine, tmp_path):
    cfg = TINY.but(grad_accum=2, batch=2)
    ck = tmp_path / "ck"
    meta = {"run": "layout-test", "n": [1, 2]}
    eng = run_engine(proxy_args(cfg, ck, "--meta", json.dumps(meta)))
    ready = eng.wait_for("ready")
    assert ready["n_params"] == cfg.n_params
    assert cfg.n_params == (
        cfg.vocab * cfg.dim + cfg.ctx * cfg.dim + cfg.layers * (12 * cfg.dim**2 + 13 * cfg.dim) + 2 * cfg.dim
    )
    assert ready["engine"] == ENGINE.build and ready["resumed_from"] is None and ready["step"] == 0
    for s, tok, grp in train_frames(cfg, 1, 3):
        eng.train(s, tok, grp)
    eng.close_stdin()
    assert eng.finish() == 0, eng.stderr
    path = ck / "step_000003.bin"
    assert path.is_file(), sorted(p.name for p in ck.iterdir())

    # --- numpy alone, exactly as docs/FORMATS.md shows
    raw = np.fromfile(path, dtype=np.uint8)
    step, n = raw[:8].view(np.int32)
    assert (step, n) == (3, cfg.n_params)
    f = raw[8 : 8 + 12 * n].view(np.float32)
    weights, m, v = f[:n], f[n : 2 * n], f[2 * n :]
    assert np.isfinite(f).all()
    assert weights.std() > 0 and np.abs(m).max() > 0 and v.min() >= 0 and v.max() > 0

    # --- the trailer, by struct and zlib, from the file's tail
    data = path.read_bytes()
    trailer_bytes, crc, reserved, end = struct.unpack("<QII8s", data[-24:])
    assert end == b"MGPTEND1" and reserved == 0
    assert len(data) == 8 + 12 * n + trailer_bytes
    assert zlib.crc32(data[:-16]) == crc
    t = 8 + 12 * n
    magic, version, meta_bytes = struct.unpack_from("<8sII", data, t)
    assert (magic, version) == (b"MGPTTRLR", 2)
    assert trailer_bytes == 128 + meta_bytes + 24
    ints = struct.unpack_from("<9i", data, t + 16)
    assert ints == (
        cfg.vocab,
        cfg.ctx,
        cfg.dim,
        cfg.layers,
        cfg.heads,
        cfg.batch,
        cfg.grad_accum,
        cfg.warmup,
        cfg.steps,
    )
    floats = struct.unpack_from("<7f", data, t + 52)
    want = np.array([cfg.lr, cfg.min_lr, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay, cfg.grad_clip], np.float32)
    assert np.array_equal(np.array(floats, np.float32), want), floats
    seed, tokens_seen = struct.unpack_from("<QQ", data, t + 80)
    assert seed == cfg.seed and tokens_seen == 3 * cfg.rows * cfg.ctx
    schedule, decay_fraction = struct.unpack_from("<if", data, t + 96)
    assert schedule == ("cosine", "wsd", "constant", "linear").index(cfg.lr_schedule)
    assert decay_fraction == np.float32(cfg.decay_fraction)
    assert data[t + 104 : t + 128] == b"\0" * 24
    meta_json = json.loads(data[t + 128 : t + 128 + meta_bytes].decode("utf-8"))
    assert meta_json == {"engine": ENGINE.build, "precision": ready["precision"], "meta": meta}
    assert ready["precision"] in ("fp32", "bf16")  # the engine's default: this run gives no --precision

    # --- the project's reader agrees with numpy
    c = read_checkpoint(path)
    assert (c.step, c.n_params) == (3, n)
    assert np.array_equal(c.weights, weights) and np.array_equal(c.m, m) and np.array_equal(c.v, v)
    assert c.trailer is not None and c.trailer.tokens_seen == tokens_seen and c.warnings == []


def test_checkpoint_names_are_zero_padded_steps(run_engine, tmp_path):
    cfg = TINY
    ck = tmp_path / "ck"
    eng = run_engine(proxy_args(cfg, ck))
    eng.wait_for("ready")
    for s, tok, grp in train_frames(cfg, 1, 12):
        eng.train(s, tok, grp)
        if s in (7, 12):
            eng.send(frames.checkpoint_frame())
    eng.close_stdin()
    assert eng.finish() == 0, eng.stderr
    assert sorted(p.name for p in ck.iterdir()) == ["step_000007.bin", "step_000012.bin"]
    for p in ck.iterdir():
        assert np.fromfile(p, dtype=np.int32, count=1)[0] == int(p.name[5:11])

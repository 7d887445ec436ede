"""The learning-rate schedules (--lr-schedule, --decay-fraction; docs/ENGINE.md): the rate every step
event reports against the schedule's textbook formula and against the proxy's mirror
(proxy/formats/lr_schedule.py) bit for bit; a resume adopting the checkpoint's schedule; a checkpoint
written before schedules existed (trailer version 1) resuming as the cosine it trained under.
"""

from __future__ import annotations

import math
import struct
import zlib

import numpy as np
import pytest

from harness.data import make_shard
from harness.engine import parse_events, run_once
from harness.shape import standalone_args
from proxy.formats.checkpoint import body_bytes, read_checkpoint
from proxy.formats.engine_cli import engine_args
from proxy.formats.lr_schedule import lr_at

from .conftest import TINY

CFG = TINY.but(steps=20, warmup=3, decay_fraction=0.25)  # wsd: 5 decaying steps, 16..20


def textbook(schedule: str, s: int) -> float:
    """Each schedule as written down, in double precision."""
    lr, low, w, n = CFG.lr, CFG.min_lr, CFG.warmup, CFG.steps
    if s <= w:
        return lr * s / w
    if schedule == "cosine":
        return low + (lr - low) * 0.5 * (1 + math.cos(math.pi * (s - w) / (n - w)))
    if schedule == "linear":
        return lr + (low - lr) * (s - w) / (n - w)
    if schedule == "constant":
        return lr
    start = n - round(CFG.decay_fraction * n)  # wsd
    return lr if s <= start else lr + (low - lr) * (s - start) / (n - start)


def step_rates(events) -> dict[int, float]:
    return {e["step"]: e["lr"] for e in events if e.kind == "step"}


def train(engine_bin, cwd, cfg, ckpt_every=0, *extra, settings=None):
    shard = make_shard(cwd / "data.tok", cfg.vocab, n_tokens=5000)
    args = (
        standalone_args(cfg, shard, cwd / "ck", ckpt_every, *extra)
        if settings is None
        else engine_args(cwd / "ck", data=shard, ckpt_every=ckpt_every, settings=settings, extra=extra)
    )
    res = run_once(engine_bin, args, cwd=cwd)
    assert res.returncode == 0, res.stderr.decode()
    return parse_events(res.stdout)


@pytest.mark.parametrize("schedule", ["cosine", "wsd", "constant", "linear"])
def test_every_step_runs_at_its_schedules_rate(engine_bin, tmp_path, schedule):
    cfg = CFG.but(lr_schedule=schedule)
    events = train(engine_bin, tmp_path, cfg)
    ready = next(e for e in events if e.kind == "ready")
    assert ready["config"]["lr_schedule"] == schedule
    assert np.float32(ready["config"]["decay_fraction"]) == np.float32(cfg.decay_fraction)
    rates = step_rates(events)
    assert sorted(rates) == list(range(1, cfg.steps + 1))
    for s, got in rates.items():
        assert math.isclose(got, textbook(schedule, s), rel_tol=1e-6), (schedule, s, got, textbook(schedule, s))
        mirror = lr_at(
            s,
            lr=cfg.lr,
            min_lr=cfg.min_lr,
            warmup=cfg.warmup,
            steps=cfg.steps,
            schedule=schedule,
            decay_fraction=cfg.decay_fraction,
        )
        assert np.float32(got) == np.float32(mirror), (schedule, s, got, mirror)
    if schedule != "constant":
        assert np.float32(rates[cfg.steps]) == np.float32(cfg.min_lr), "a decaying schedule ends at min_lr"
    if schedule == "wsd":
        assert all(np.float32(rates[s]) == np.float32(cfg.lr) for s in range(cfg.warmup, 16)), rates


SHAPE_ONLY = ("vocab", "ctx", "dim", "layers", "heads", "batch")


def shape_flags(cfg) -> list[str]:
    pairs = cfg.flags()
    return [x for k, v in zip(pairs[::2], pairs[1::2], strict=False) if k[2:] in SHAPE_ONLY for x in (k, v)]


def test_resume_adopts_the_checkpoints_schedule(engine_bin, tmp_path):
    """Schedule flags not given on resume come from the trailer: a wsd run goes on as wsd."""
    cfg = CFG.but(lr_schedule="wsd")
    straight = step_rates(train(engine_bin, tmp_path, cfg, 8))
    for late in ("step_000016.bin", "step_000020.bin"):
        (tmp_path / "ck" / late).unlink()
    assert read_checkpoint(tmp_path / "ck" / "step_000008.bin").trailer.lr_schedule == "wsd"
    events = train(engine_bin, tmp_path, cfg, 0, "--resume", "latest", settings=shape_flags(cfg))
    ready = next(e for e in events if e.kind == "ready")
    assert ready["step"] == 8 and ready["config"]["lr_schedule"] == "wsd"
    resumed = step_rates(events)
    assert resumed == {s: straight[s] for s in range(9, cfg.steps + 1)}


def as_version_1(path):
    """Rewrite a checkpoint as one written before schedules: trailer version 1, its last 32 fixed bytes
    zero, the CRC made again."""
    raw = bytearray(path.read_bytes())
    n = struct.unpack_from("<i", raw, 4)[0]
    t = body_bytes(n)
    struct.pack_into("<I", raw, t + 8, 1)
    raw[t + 96 : t + 128] = b"\0" * 32
    struct.pack_into("<I", raw, len(raw) - 16, zlib.crc32(bytes(raw[:-16])))
    path.write_bytes(bytes(raw))


def test_a_version_1_checkpoint_resumes_as_cosine(engine_bin, tmp_path):
    straight = step_rates(train(engine_bin, tmp_path, CFG, 8))
    ck = tmp_path / "ck"
    for late in ("step_000016.bin", "step_000020.bin"):
        (ck / late).unlink()
    as_version_1(ck / "step_000008.bin")
    trailer = read_checkpoint(ck / "step_000008.bin").trailer
    assert (trailer.lr_schedule, trailer.decay_fraction) == ("cosine", 0.2)

    refused = run_once(
        engine_bin,
        engine_args(ck, data=tmp_path / "data.tok", resume="latest", settings=CFG.but(lr_schedule="wsd").flags()),
        cwd=tmp_path,
    )
    lines = refused.stderr.decode().splitlines()
    assert refused.returncode == 3 and len(lines) == 1 and "--lr-schedule wsd differs from cosine" in lines[0], lines

    events = train(engine_bin, tmp_path, CFG, 0, "--resume", "latest", settings=shape_flags(CFG))
    ready = next(e for e in events if e.kind == "ready")
    assert ready["step"] == 8 and ready["config"]["lr_schedule"] == "cosine"
    assert step_rates(events) == {s: straight[s] for s in range(9, CFG.steps + 1)}

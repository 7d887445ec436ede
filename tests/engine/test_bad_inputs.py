"""Every bad input: exactly one clear line on stderr starting with "microgpt", no
traceback or usage dump, the documented exit code (FORMATS.md "Engine exit
codes"), and a valid checkpoint already in the ckpt dir left untouched (bytes
and mtime). Plus the positive twins: --help, a bare ANDREA file, and
`--resume latest` skipping a corrupt newest file.
"""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest

from harness.data import make_shard, random_groups, random_rows, train_frames
from harness.engine import parse_events, run_once
from harness.shape import Shape, proxy_args
from proxy.formats import frames
from proxy.formats.checkpoint import read_checkpoint
from proxy.formats.shard import HEADER as SHARD_HEADER
from proxy.formats.shard import SHARD_MAGIC

from .conftest import TINY, dir_snapshot

CFG = TINY
VALID_STEP = 2
VALID_NAME = f"step_{VALID_STEP:06d}.bin"


@pytest.fixture(scope="module")
def valid_ckpt(engine_bin, tmp_path_factory) -> bytes:
    """A real checkpoint after 2 steps of CFG (proxy mode, STOP)."""
    d = tmp_path_factory.mktemp("valid")
    stdin = b"".join(frames.train_frame(s, t, g) for s, t, g in train_frames(CFG, 1, VALID_STEP)) + frames.stop_frame()
    res = run_once(engine_bin, proxy_args(CFG, d / "ck"), cwd=d, stdin=stdin)
    assert res.returncode == 0, res.stderr.decode()
    path = d / "ck" / VALID_NAME
    assert read_checkpoint(path).step == VALID_STEP
    return path.read_bytes()


@pytest.fixture
def ck(tmp_path, valid_ckpt, engine_bin):
    """A ckpt dir holding the valid checkpoint (mtime set in the past so a rewrite would show)."""
    d = tmp_path / "ck"
    d.mkdir()
    p = d / VALID_NAME
    p.write_bytes(valid_ckpt)
    os.utime(p, ns=(1_600_000_000_000_000_000, 1_600_000_000_000_000_000))
    return d


def flags(cfg: Shape = CFG, drop=(), **override) -> list[str]:
    """cfg.flags() with some flags replaced (override, '_' -> '-') or removed (drop); never duplicated."""
    pairs = cfg.flags()
    d = dict(zip(pairs[::2], pairs[1::2], strict=False))
    for k, v in override.items():
        d["--" + k.replace("_", "-")] = str(v)
    for k in drop:
        d.pop(k, None)
    return [x for kv in d.items() for x in kv]


def assert_one_line_failure(res, code: int, *, contains: str | tuple = ()):
    err = res.stderr.decode(errors="replace")
    lines = err.splitlines()
    assert res.returncode == code, f"exit {res.returncode}, expected {code}; stderr: {err!r}"
    assert len(lines) == 1, f"expected exactly one stderr line, got {len(lines)}: {err!r}"
    line = lines[0]
    assert line.startswith("microgpt"), f"stderr line should start with 'microgpt': {line!r}"
    assert "Traceback" not in line and "usage" not in line.lower(), line
    assert len(line) < 400, f"not one clear line: {line!r}"
    for word in (contains,) if isinstance(contains, str) else contains:
        assert word.lower() in line.lower(), f"stderr should mention {word!r}: {line!r}"
    return line


# ---------------------------------------------------------------------------
# usage: exit 2

USAGE_CASES = {
    "unknown-flag": (flags(), ["--bogus-flag", "1"]),
    "positional-arg": (flags(), ["stray"]),
    "dim-abc": (flags(dim="abc"), []),
    "dim-zero": (flags(dim=0), []),
    "heads-not-dividing-dim": (flags(heads=5), []),
    "ctx-trailing-garbage": (flags(ctx="16x"), []),
    "batch-negative": (flags(batch=-1), []),
    "lr-abc": (flags(lr="abc"), []),
    "lr-zero": (flags(lr=0), []),
    "lr-negative": (flags(lr=-1e-3), []),
    "ckpt-every-seconds-negative": (flags(), ["--ckpt-every-seconds", "-1"]),
    "ckpt-every-seconds-nan": (flags(), ["--ckpt-every-seconds", "nan"]),
    "min-lr-negative": (flags(min_lr=-1e-5), []),
    "lr-schedule-unknown": (flags(lr_schedule="step"), []),
    "decay-fraction-zero": (flags(decay_fraction=0.0), []),
    "decay-fraction-above-one": (flags(decay_fraction=1.5), []),
    "vocab-over-uint16": (flags(vocab=70000), []),
    "precision-unknown": (flags(), ["--precision", "fp16"]),
    "attention-unknown": (flags(), ["--attention", "fast"]),
    "fused-unknown": (flags(), ["--fused", "yes"]),
    "cuda-graph-unknown": (flags(), ["--cuda-graph", "1"]),
    "dump-grads-step-zero": (flags(), ["--dump-grads", "g.bin", "--dump-grads-step", "0"]),
    "meta-not-json": (flags(), ["--meta", "{not json"]),
    "missing-value": (flags(), ["--dim"]),
}


@pytest.mark.parametrize("case", list(USAGE_CASES))
def test_usage_errors_exit_2(engine_bin, tmp_path, ck, case):
    base, extra = USAGE_CASES[case]
    shard = make_shard(tmp_path / "d.tok", CFG.vocab, n_tokens=1000)
    before = dir_snapshot(ck)
    res = run_once(engine_bin, ["--data", shard, "--ckpt-dir", ck, *base, *extra], cwd=tmp_path)
    assert_one_line_failure(res, 2)
    assert dir_snapshot(ck) == before


def test_missing_data_exits_2(engine_bin, tmp_path, ck):
    before = dir_snapshot(ck)
    res = run_once(engine_bin, ["--ckpt-dir", ck, *flags()], cwd=tmp_path)
    assert_one_line_failure(res, 2, contains="--data")
    assert dir_snapshot(ck) == before


def test_help_lists_every_flag(engine_bin, tmp_path):
    res = run_once(engine_bin, ["--help"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    out = res.stdout.decode() + res.stderr.decode()
    missing = [
        f
        for f in (
            "--data",
            "--ckpt-dir",
            "--resume",
            "--ckpt-every",
            "--keep-last",
            "--vocab",
            "--ctx",
            "--dim",
            "--layers",
            "--heads",
            "--batch",
            "--grad-accum",
            "--steps",
            "--lr",
            "--min-lr",
            "--lr-schedule",
            "--decay-fraction",
            "--warmup",
            "--beta1",
            "--beta2",
            "--eps",
            "--weight-decay",
            "--grad-clip",
            "--seed",
            "--threads",
            "--precision",
            "--attention",
            "--fused",
            "--cuda-graph",
            "--meta",
            "--dump-grads",
            "--dump-grads-step",
            "--allow-hparam-change",
            "--sample-recompute",
            "--sync-snapshot",
            "--help",
        )
        if f not in out
    ]
    assert not missing, f"--help does not list {missing}"


# ---------------------------------------------------------------------------
# checkpoint: exit 3


def corrupt(valid: bytes, region: str) -> bytes:
    n = CFG.n_params
    b = bytearray(valid)
    at = {
        "weights": 8 + 4 * (n // 2),
        "m": 8 + 4 * n + 4 * (n // 3),
        "v": 8 + 8 * n + 4 * (n // 5),
        "trailer": 8 + 12 * n + 20,
        "meta": 8 + 12 * n + 128 + 2,
        "crc": len(b) - 16,
        "end-magic": len(b) - 3,
        "n_params": 4,
    }[region]
    b[at] ^= 0x5A
    return bytes(b)


BAD_FILES = {
    **{
        f"flip-{r}": (lambda v, r=r: corrupt(v, r))
        for r in ("weights", "m", "v", "trailer", "meta", "crc", "end-magic", "n_params")
    },
    "truncated-in-weights": lambda v: v[: 8 + 4 * (CFG.n_params // 2)],
    "truncated-in-trailer": lambda v: v[: 8 + 12 * CFG.n_params + 60],
    "trailer-cut-by-one": lambda v: v[:-1],
    "bare-plus-garbage-byte": lambda v: v[: 8 + 12 * CFG.n_params] + b"\0",
    "empty": lambda v: b"",
    "foreign-random": lambda v: np.random.default_rng(3).integers(0, 256, 4096, dtype=np.uint8).tobytes(),
    "foreign-text": lambda v: b"this is not a checkpoint\n" * 100,
    "bare-wrong-n": lambda v: struct.pack("<ii", 2, CFG.n_params - 1) + v[8 : 8 + 12 * (CFG.n_params - 1)],
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_rejected_checkpoint_exits_3(engine_bin, tmp_path, ck, valid_ckpt, case):
    bad = ck / "step_000009.bin"
    bad.write_bytes(BAD_FILES[case](valid_ckpt))
    before = dir_snapshot(ck)
    res = run_once(engine_bin, proxy_args(CFG, ck, "--resume", bad), cwd=tmp_path, stdin=frames.stop_frame())
    assert_one_line_failure(res, 3)
    assert not [e for e in parse_events(res.stdout) if e.kind in ("ready", "ckpt")]
    assert dir_snapshot(ck) == before, "a rejected file (or the valid one) was modified, or a file was written"


@pytest.mark.parametrize(
    "override",
    [{"dim": 64}, {"vocab": 100}, {"layers": 3}, {"heads": 8}, {"ctx": 32}],
    ids=lambda o: "-".join(f"{k}{v}" for k, v in o.items()),
)
def test_shape_mismatch_exits_3(engine_bin, tmp_path, ck, override):
    before = dir_snapshot(ck)
    ((key, value),) = override.items()
    args = ["--data", "-", "--ckpt-dir", ck, "--ckpt-every", 0, "--resume", ck / VALID_NAME, *flags(**override)]
    res = run_once(engine_bin, args, cwd=tmp_path, stdin=frames.stop_frame())
    line = assert_one_line_failure(res, 3, contains="shape")
    assert key in line, line
    assert dir_snapshot(ck) == before


def test_resume_missing_file_exits_3(engine_bin, tmp_path, ck):
    before = dir_snapshot(ck)
    res = run_once(
        engine_bin, proxy_args(CFG, ck, "--resume", ck / "step_000777.bin"), cwd=tmp_path, stdin=frames.stop_frame()
    )
    assert_one_line_failure(res, 3)
    assert dir_snapshot(ck) == before


def test_resume_latest_skips_corrupt_newest(run_engine, ck, valid_ckpt):
    bad = ck / "step_000009.bin"
    bad.write_bytes(corrupt(valid_ckpt, "weights"))
    before = dir_snapshot(ck)
    eng = run_engine(proxy_args(CFG, ck, "--resume", "latest"))
    ready = eng.wait_for("ready")
    assert ready["step"] == VALID_STEP and ready["resumed_from"].endswith(VALID_NAME), ready.fields
    eng.kill()
    assert "step_000009.bin" in eng.stderr, f"the skipped file should be named on stderr: {eng.stderr!r}"
    assert dir_snapshot(ck) == before


# ---------------------------------------------------------------------------
# protocol: exit 4 (proxy mode, resumed from the valid step-2 checkpoint)

T1 = CFG.ctx + 1
FIRST = VALID_STEP + 1  # the good frame every case starts with
NEXT = VALID_STEP + 2  # the id the engine expects after it


def good(step=NEXT, seed=0):
    return frames.train_frame(step, random_rows(CFG, CFG.rows, seed), random_groups(CFG.rows, seed))


def raw_frame(
    kind=frames.TRAIN, fid=NEXT, rows=CFG.rows, row_len=T1, payload=None, magic=frames.FRAME_MAGIC, payload_bytes=None
):
    if payload is None:
        payload = random_rows(CFG, rows, 1)[:, :row_len].astype("<u2").tobytes() + b"\0\0" * rows
    n = len(payload) if payload_bytes is None else payload_bytes
    return frames.HEADER.pack(magic, kind, 0, fid, rows, row_len, n, 0) + payload


def oob_tokens():
    t = random_rows(CFG, CFG.rows, 2)
    t[1, 5] = CFG.vocab
    return frames.train_frame(NEXT, t, np.zeros(CFG.rows, np.uint16))


def sample_payload(*prompts: tuple[list[int], int], n_prompts=None, max_new=2, temperature=1.0) -> bytes:
    """A SAMPLE payload of (tokens, count) prompts, its fields free to disagree."""
    head = frames.SAMPLE_PARAMS.pack(len(prompts) if n_prompts is None else n_prompts, max_new, 0, temperature)
    heads = b"".join(frames.SAMPLE_PROMPT.pack(len(t), c, 7) for t, c in prompts)
    return head + heads + b"".join(np.asarray(t, "<u2").tobytes() for t, _ in prompts)


def sample_frame_raw(payload: bytes, rows=0, payload_bytes=None) -> bytes:
    return raw_frame(kind=frames.SAMPLE, fid=1, rows=rows, row_len=0, payload=payload, payload_bytes=payload_bytes)


PROTOCOL_CASES = {
    "bad-magic": raw_frame(magic=b"XGF1"),
    "unknown-type": raw_frame(kind=9, fid=0, rows=0, row_len=0, payload=b""),
    "wrong-row-len": raw_frame(row_len=CFG.ctx),
    "wrong-rows": raw_frame(rows=CFG.rows - 1),
    "payload-bytes-disagree": raw_frame(payload=random_rows(CFG, CFG.rows, 1).astype("<u2").tobytes()),
    "truncated-payload": raw_frame()[:-7],
    "truncated-header": raw_frame()[:13],
    "token-out-of-range": oob_tokens(),
    "train-id-skips-ahead": good(step=NEXT + 1),
    "train-id-repeated": good(step=FIRST),
    "train-id-replays-older-step": good(step=VALID_STEP),
    "train-id-zero": good(step=0),
    "eval-zero-rows": raw_frame(kind=frames.EVAL, fid=1, rows=0, payload=b""),
    "sample-empty-prompt": frames.sample_frame(1, [], count=1, max_new=2),
    "sample-prompt-out-of-range": frames.sample_frame(1, [1, CFG.vocab], count=1, max_new=2),
    "sample-no-prompts": frames.sample_batch_frame(1, [], max_new=2),
    "sample-second-prompt-empty": sample_frame_raw(sample_payload(([1, 2], 1), ([], 1))),
    "sample-second-prompt-zero-count": sample_frame_raw(sample_payload(([1, 2], 1), ([3], 0))),
    "sample-second-prompt-out-of-range": sample_frame_raw(sample_payload(([1, 2], 1), ([3, CFG.vocab], 1))),
    "sample-too-many-completions": sample_frame_raw(sample_payload(([1], 4000), ([2], 97))),
    "sample-temperature-nan": sample_frame_raw(sample_payload(([1], 1), temperature=float("nan"))),
    "sample-temperature-negative": sample_frame_raw(sample_payload(([1], 1), temperature=-0.5)),
    "sample-max-new-too-large": sample_frame_raw(sample_payload(([1], 1), max_new=(1 << 20) + 1)),
    "sample-more-prompt-headers-than-payload": sample_frame_raw(sample_payload(([1], 1), n_prompts=3)),
    "sample-payload-shorter-than-params": sample_frame_raw(sample_payload(([1], 1))[:8]),
    "sample-payload-bytes-disagree": sample_frame_raw(sample_payload(([1, 2], 1)) + b"\0\0"),
    "sample-payload-bytes-too-few": sample_frame_raw(
        sample_payload(([1, 2], 1)), payload_bytes=len(sample_payload(([1, 2], 1))) - 2
    ),
    "sample-truncated": frames.sample_batch_frame(1, [frames.SamplePrompt([1, 2, 3])], max_new=2)[:-3],
    "sample-rows-nonzero": sample_frame_raw(sample_payload(([1], 1)), rows=1),
    "checkpoint-with-payload": raw_frame(kind=frames.CHECKPOINT, fid=0, rows=0, row_len=0, payload=b"\0" * 8),
}


@pytest.mark.parametrize("case", list(PROTOCOL_CASES))
def test_protocol_errors_exit_4(engine_bin, tmp_path, ck, case):
    before = dir_snapshot(ck)
    # a good frame first, so an engine that errs must also not checkpoint what it trained
    stdin = good(step=FIRST) + PROTOCOL_CASES[case]
    res = run_once(engine_bin, proxy_args(CFG, ck, "--resume", "latest"), cwd=tmp_path, stdin=stdin)
    assert_one_line_failure(res, 4)
    events = parse_events(res.stdout)
    errors = [e for e in events if e.kind == "error"]
    assert len(errors) == 1 and errors[0]["code"] == 4 and errors[0]["message"], [e.fields for e in events]
    assert [e["step"] for e in events if e.kind == "step"] == [FIRST]
    assert not [e for e in events if e.kind == "ckpt"], "nothing is written on a protocol error"
    assert dir_snapshot(ck) == before


# ---------------------------------------------------------------------------
# bad shard: exit 4


def shard_bytes(tokens, vocab=CFG.vocab, magic=SHARD_MAGIC, version=1, n=None):
    tokens = np.asarray(tokens, "<u2")
    return SHARD_HEADER.pack(magic, version, vocab, len(tokens) if n is None else n, b"\0" * 8) + tokens.tobytes()


GOOD_TOKENS = np.random.default_rng(0).integers(0, CFG.vocab, 1000)
BAD_SHARDS = {
    "bad-magic": shard_bytes(GOOD_TOKENS, magic=b"NOTTOKS!"),
    "bad-version": shard_bytes(GOOD_TOKENS, version=2),
    "size-mismatch": shard_bytes(GOOD_TOKENS)[:-2],
    "count-says-more": shard_bytes(GOOD_TOKENS, n=2000),
    "token-out-of-range": shard_bytes(np.r_[GOOD_TOKENS, CFG.vocab]),
    "shorter-than-a-row": shard_bytes(GOOD_TOKENS[: CFG.ctx]),
    "empty": shard_bytes([]),
    "not-a-file-at-all": b"\x89PNG\r\n",
}


@pytest.mark.parametrize("case", list(BAD_SHARDS) + ["missing"])
def test_bad_shard_exits_4(engine_bin, tmp_path, ck, case):
    shard = tmp_path / "bad.tok"
    if case != "missing":
        shard.write_bytes(BAD_SHARDS[case])
    before = dir_snapshot(ck)
    res = run_once(engine_bin, ["--data", shard, "--ckpt-dir", ck, "--ckpt-every", 1, *flags()], cwd=tmp_path)
    assert_one_line_failure(res, 4)
    assert dir_snapshot(ck) == before


# ---------------------------------------------------------------------------
# a bare ANDREA file (8 + 12n bytes) loads with a warning and trains identically


def test_bare_andrea_file_loads_with_warning(run_engine, tmp_path, valid_ckpt):
    n = CFG.n_params
    full_dir, bare_dir = tmp_path / "full", tmp_path / "bare"
    full_dir.mkdir()
    bare_dir.mkdir()
    full, bare = full_dir / VALID_NAME, bare_dir / VALID_NAME
    full.write_bytes(valid_ckpt)
    bare.write_bytes(valid_ckpt[: 8 + 12 * n])
    data = train_frames(CFG, FIRST, 3, seed=5)

    results = {}
    for name, src in (("full", full), ("bare", bare)):
        out = tmp_path / f"out-{name}"
        eng = run_engine(proxy_args(CFG, out, "--resume", src))
        ready = eng.wait_for("ready")
        assert ready["step"] == VALID_STEP, ready.fields
        for s, tok, grp in data:
            eng.train(s, tok, grp)
        eng.send(frames.stop_frame())
        assert eng.finish() == 0, eng.stderr
        results[name] = (eng.losses(), read_checkpoint(out / f"step_{FIRST + 2:06d}.bin"), eng.stderr)

    (lf, cf, ef), (lb, cb, eb) = results["full"], results["bare"]
    assert "no trailer" in eb and eb.startswith("microgpt"), f"bare file: expected a 'no trailer' warning, got {eb!r}"
    assert len(eb.splitlines()) == 1, eb
    assert "no trailer" not in ef, ef
    assert lb == lf, f"losses from the bare file {lb} differ from the full file's {lf}"
    assert np.array_equal(cb.weights, cf.weights) and np.array_equal(cb.m, cf.m) and np.array_equal(cb.v, cf.v)
    assert (bare_dir / VALID_NAME).read_bytes() == valid_ckpt[: 8 + 12 * n], "the bare file was modified"


def test_non_finite_loss_exits_6_nothing_written(engine_bin, tmp_path, ck):
    """lr 1e38 blows the weights up after one update: step 2's loss is not finite."""
    before = dir_snapshot(ck)
    stdin = b"".join(frames.train_frame(s, t, g) for s, t, g in train_frames(CFG, 1, 3)) + frames.stop_frame()
    res = run_once(
        engine_bin, ["--data", "-", "--ckpt-dir", ck, "--ckpt-every", 1, *flags(lr=1e38)], cwd=tmp_path, stdin=stdin
    )
    assert_one_line_failure(res, 6)
    events = parse_events(res.stdout)
    errors = [e for e in events if e.kind == "error"]
    assert len(errors) == 1 and errors[0]["code"] == 6, [e.fields for e in events]
    assert not [e for e in events if e.kind == "ckpt" and e["step"] >= 2], "a non-finite state was checkpointed"
    assert all(p.name == VALID_NAME or p.name == "step_000001.bin" for p in ck.iterdir())
    assert ck.joinpath(VALID_NAME).read_bytes() == before[VALID_NAME][0]
    assert ck.joinpath(VALID_NAME).stat().st_mtime_ns == before[VALID_NAME][1]

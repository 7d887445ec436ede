"""`--dump-logits FILE`: every SAMPLE frame appends the logits its tokens were picked from (FORMATS.md)."""

from __future__ import annotations

import numpy as np
import torch

from harness.engine import initial_checkpoint, run_once
from harness.shape import proxy_args
from proxy.formats import frames
from proxy.formats.checkpoint import read_checkpoint

from .conftest import TINY, TORCH, cpu_only
from .test_reference import shape_of
from .torch_reference import Reference

LOGIT_TOL = 1e-4


def test_help_lists_dump_logits(engine_bin, tmp_path):
    res = run_once(engine_bin, ["--help"], cwd=tmp_path)
    assert res.returncode == 0 and b"--dump-logits" in res.stdout


@cpu_only(TORCH)
def test_dumped_logits_are_the_models_and_frames_append(engine_bin, run_engine, tmp_path):
    cfg = TINY
    init = initial_checkpoint(engine_bin, cfg, tmp_path / "ck")
    model = Reference(shape_of(cfg), read_checkpoint(init).weights)
    dump = tmp_path / "logits.f32"
    dump.write_bytes(b"stale bytes from an earlier run")  # the engine starts it empty
    eng = run_engine(proxy_args(cfg, tmp_path / "ck", "--resume", init, "--dump-logits", dump))
    eng.wait_for("ready")
    # greedy, then 5 sampled completions (more than --batch 4: two chunks) running past the context
    requests = [([3, 1, 4, 1, 5], 1, 6, 0.0), ([2, 7], 5, cfg.ctx + 3, 1.0)]
    events = []
    for rid, (prompt, count, max_new, temperature) in enumerate(requests, 1):
        eng.send(frames.sample_frame(rid, prompt, count, max_new, temperature, 0, seed=11))
        events.append(eng.wait_for("sample", id=rid))
    eng.close_stdin()
    assert eng.finish() == 0, eng.stderr

    raw = np.fromfile(dump, dtype="<f4")
    assert raw.size == sum(count * max_new for _p, count, max_new, _t in requests) * cfg.vocab
    offset = 0
    for (prompt, count, max_new, temperature), event in zip(requests, events, strict=False):
        block = raw[offset : offset + count * max_new * cfg.vocab].reshape(count, max_new, cfg.vocab)
        offset += block.size
        for k, new in enumerate(event["tokens"]):
            sequence = prompt + new
            for j in range(max_new):
                window = sequence[: len(prompt) + j][-cfg.ctx :]
                with torch.no_grad():
                    want = model.logits(torch.tensor([window]))[0, -1].numpy()
                assert np.abs(block[k, j] - want).max() < LOGIT_TOL, (k, j)
            if temperature == 0.0:
                assert new == [int(i) for i in block[k].argmax(axis=-1)]


def test_a_dump_file_that_cannot_be_created_is_one_line_and_exit_5(engine_bin, tmp_path):
    res = run_once(
        engine_bin,
        proxy_args(TINY, tmp_path / "ck", "--dump-logits", tmp_path / "no" / "such.f32"),
        cwd=tmp_path,
        stdin=frames.stop_frame(),
    )
    assert res.returncode == 5, res.stderr
    lines = res.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "cannot create" in lines[0] and "such.f32" in lines[0], lines
    assert not (tmp_path / "ck").exists() or not any((tmp_path / "ck").iterdir())

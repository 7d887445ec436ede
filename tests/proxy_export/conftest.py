"""Shared helpers for export, sample, eval and verify: one trained TINY run, the real CPU engine.

The run (tests/proxy_e2e's TINY derivative: 60 steps, a checkpoint and an
eval every 20, every checkpoint kept) is trained once per module by a real
`proxy run`; tests only read it, or damage a copy.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from proxy_e2e.conftest import (  # noqa: F401
    REPO,
    Proxy,
    _reap_proxies,
    assert_same_checkpoint,
    data_cache,
    engine,
    gate,
    last_steps,
    make_experiment,
    max_logged_step,
    proxy_env,
    run_args,
    run_cmd,
    wait_for,
)
from proxy_pivot.conftest import one_line_error, tree_hashes  # noqa: F401

MAX_STEPS = 60
TRAIN = dict(max_steps=MAX_STEPS, ckpt_every=20, eval_every=20, sample_every=0, keep_last=0, milestone_every=0)
EVAL_STEPS = (20, 40, 60)


@pytest.fixture(scope="module")
def trained_run(engine, data_cache, tmp_path_factory) -> Path:
    """A finished 60-step run with checkpoints and evals at steps 20, 40, 60 (and best.bin)."""
    root = tmp_path_factory.mktemp("trained")
    exp = make_experiment(root, "EXPORTED", **TRAIN)
    run = root / "run"
    proxy = Proxy(
        ["run", str(exp), "--run-dir", str(run), "--no-dashboard", "--engine", engine.flag], data_cache
    ).start()
    assert proxy.wait() == 0, proxy.output()
    return run


@pytest.fixture
def run_copy(trained_run, tmp_path) -> Path:
    """A copy of the trained run that a test may damage."""
    copy = tmp_path / "run"
    shutil.copytree(trained_run, copy)
    return copy

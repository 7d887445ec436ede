"""Learning-rate schedules through the proxy (docs/EXPERIMENTS.md, train.lr_schedule): a wsd run,
stopped in its stable phase and extended (max_steps raised), goes on at the rate it had and changes
no step already trained; extending a cosine run says, before asking for --allow-experiment-change,
how the next step's rate jumps."""

from __future__ import annotations

import json

import numpy as np

from proxy.formats.lr_schedule import lr_at

from .conftest import (
    TINY,
    Proxy,
    last_steps,
    make_experiment,
    max_logged_step,
    one_line_error,
    run_args,
    run_cmd,
    state,
    wait_for,
)

TRAIN = dict(warmup=5, ckpt_every=10, eval_every=20, sample_every=20, keep_last=3, milestone_every=0)
LR, MIN_LR = (json.loads(TINY.read_text())["train"][k] for k in ("lr", "min_lr"))


def rate(step: int, max_steps: int, schedule: str) -> float:
    return lr_at(step, lr=LR, min_lr=MIN_LR, warmup=TRAIN["warmup"], steps=max_steps, schedule=schedule)


def test_a_wsd_run_extended_in_its_stable_phase_keeps_its_rate(gate, data_cache, tmp_path):
    exp = make_experiment(tmp_path, "WSD", max_steps=40, lr_schedule="wsd", **TRAIN)  # decays over steps 33..40
    run_dir = tmp_path / "run"
    gate.hold_after(20)
    proxy = Proxy(run_args(exp, run_dir, engine=gate.engine_flag), data_cache).start()
    wait_for(lambda: max_logged_step(run_dir) >= 20, 240, "step 20", proxy)
    assert run_cmd(["stop", "--run-dir", str(run_dir)], data_cache).returncode == 0
    assert proxy.wait(60) == 0, proxy.output()
    stopped = state(run_dir)["step"]
    before = last_steps(run_dir)
    assert sorted(before) == list(range(1, stopped + 1)) and stopped < 32
    assert all(np.float32(e["lr"]) == np.float32(LR) for s, e in before.items() if s >= TRAIN["warmup"])

    extend = run_args(exp, run_dir, "--set", "train.max_steps=80", engine=gate.engine_flag)
    line = one_line_error(run_cmd(extend, data_cache), 2)
    assert f"the learning rate at step {stopped + 1} stays {LR:.6g} (train.max_steps 40 -> 80)" in line, line
    assert "--allow-experiment-change" in line

    gate.open()
    extended = run_cmd([*extend, "--allow-experiment-change"], data_cache)
    assert extended.returncode == 0, extended.stderr
    assert f"the learning rate at step {stopped + 1} stays {LR:.6g}" in extended.stderr
    after = last_steps(run_dir)
    assert sorted(after) == list(range(1, 81))
    assert {s: after[s] for s in before} == before, "a step trained before the extension changed"
    for s in range(stopped + 1, 81):
        assert np.float32(after[s]["lr"]) == np.float32(rate(s, 80, "wsd")), (s, after[s]["lr"])
    assert all(np.float32(after[s]["lr"]) == np.float32(LR) for s in range(stopped + 1, 65))
    assert np.float32(after[80]["lr"]) == np.float32(MIN_LR)
    assert state(run_dir)["replay_mismatch_count"] == 0


def test_extending_a_cosine_run_says_how_its_rate_jumps(data_cache, tmp_path):
    run_dir = tmp_path / "run"
    exp = make_experiment(tmp_path, "COSINE", max_steps=20, **TRAIN)
    first = run_cmd(run_args(exp, run_dir), data_cache)
    assert first.returncode == 0, first.stderr
    assert np.float32(last_steps(run_dir)[20]["lr"]) == np.float32(MIN_LR)

    line = one_line_error(run_cmd(run_args(exp, run_dir, "--set", "train.max_steps=40"), data_cache), 2)
    jump = f"{rate(21, 20, 'cosine'):.6g} to {rate(21, 40, 'cosine'):.6g}"
    assert f"the learning rate at step 21 goes from {jump} (train.max_steps 20 -> 40)" in line, line
    assert rate(21, 40, "cosine") > 4 * MIN_LR  # the jump the message warns of is real
    assert line.index("learning rate") < line.index("--allow-experiment-change")

    extended = run_cmd(run_args(exp, run_dir, "--set", "train.max_steps=40", "--allow-experiment-change"), data_cache)
    assert extended.returncode == 0, extended.stderr
    assert f"the learning rate at step 21 goes from {jump}" in extended.stderr
    assert np.float32(last_steps(run_dir)[21]["lr"]) == np.float32(rate(21, 40, "cosine"))

"""TINY-TRAIN end to end: it trains, the loss falls, every sidecar is valid, a relaunch says done."""

from __future__ import annotations

import json
import math
import subprocess

import numpy as np
import pytest

from proxy.config.experiment import load_experiment
from proxy.data.batches import BatchSampler
from proxy.formats import frames
from proxy.formats.checkpoint import (
    checkpoint_path,
    checkpoint_step,
    list_checkpoints,
    read_checkpoint,
    verify_checkpoint,
)
from proxy.formats.engine_cli import engine_args
from proxy.formats.shard import read_shard
from proxy.formats.state import AUDIT_KINDS

from .conftest import ENGINE, TINY, Proxy, make_experiment, read_entries, run_args, run_cmd

STATE_FIELDS = {
    "step",
    "phase",
    "policy",
    "status",
    "arms",
    "tokens",
    "tokens_per_s",
    "eta_s",
    "last_checkpoint",
    "engine",
    "updated",
}
ENGINE_FIELDS = {"kind", "device", "pid", "alive", "rss_bytes", "cpu_percent", "mem_bytes"}
ARM_FIELDS = {"pulls", "ema", "reward", "weight", "cap", "floor"}


def check_sidecars(run_dir, exp: dict) -> None:
    """Every file of a finished run directory against docs/FORMATS.md."""
    train = exp["train"]
    arms = [a["name"] for a in exp["arms"]]
    max_steps = train["max_steps"]

    # .loss.json: every line a complete object, each step once, cumulative tokens
    raw = (run_dir / ".loss.json").read_bytes()
    assert raw.endswith(b"\n")
    lines = [json.loads(line) for line in raw.split(b"\n") if line]
    steps = [e for e in lines if e["type"] == "step"]
    evals = [e for e in lines if e["type"] == "eval"]
    assert len(steps) + len(evals) == len(lines)
    assert [e["step"] for e in steps] == list(range(1, max_steps + 1))
    rows = train["batch"] * train.get("grad_accum", 1)
    for i, e in enumerate(steps):
        assert set(e) >= {
            "step",
            "loss",
            "lr",
            "grad_norm",
            "tokens",
            "time",
            "ms",
            "arms",
            "mixture",
            "phase",
            "segment",
        }
        assert e["tokens"] == (i + 1) * rows * exp["model"]["ctx"]
        assert math.isfinite(e["loss"]) and e["lr"] > 0 and e["grad_norm"] > 0
        assert set(e["arms"]) <= set(arms) and e["arms"]
        assert list(e["mixture"]) == arms and abs(sum(e["mixture"].values()) - 1) < 1e-9
        assert e["phase"] == 0 and e["segment"] == 1
    eval_steps = sorted({*range(train["eval_every"], max_steps + 1, train["eval_every"]), max_steps})
    assert [e["step"] for e in evals] == eval_steps
    for e in evals:
        assert set(e["arms"]) == set(arms) and math.isfinite(e["loss"])

    # .state.json
    state = json.loads((run_dir / ".state.json").read_text())
    assert STATE_FIELDS <= set(state)
    assert ENGINE_FIELDS <= set(state["engine"])
    assert state["status"] == "finished" and state["step"] == max_steps
    assert state["engine"]["alive"] is False and state["engine"]["kind"] == ENGINE.kind
    assert list(state["arms"]) == arms
    for arm in state["arms"].values():
        assert ARM_FIELDS <= set(arm)
    assert state["tokens"] == steps[-1]["tokens"]
    assert state["replay_mismatch_count"] == 0
    check_goodput(state, exp, steps)

    # .samples.json: one audit per sample_every steps, every prompt decoded
    samples = json.loads((run_dir / ".samples.json").read_text())
    sample_steps = sorted({*range(train["sample_every"], max_steps + 1, train["sample_every"]), max_steps})
    assert [a["step"] for a in samples] == sample_steps
    for audit in samples:
        prompts = [s["prompt"] for s in audit["samples"]]
        assert prompts == [p for p in exp["samples"]["prompts"] for _ in range(exp["samples"]["count"])]
        for s in audit["samples"]:
            assert len(s["tokens"]) == exp["samples"]["max_new"]
            assert isinstance(s["completion"], str)

    # phases.json
    phases = json.loads((run_dir / "phases.json").read_text())
    assert len(phases) == 1 and phases[0]["phase"] == 0 and phases[0]["start_step"] == 0
    assert phases[0]["policy"] == exp["bandit"]["policy"] and set(phases[0]["caps"]) == set(arms)

    # frozen experiment, checkpoints, retention, best.bin
    assert json.loads((run_dir / "experiment.json").read_text()) == exp
    ckpts = list_checkpoints(run_dir / "checkpoints")
    assert ckpts and checkpoint_step(ckpts[0]) == max_steps
    for path in ckpts:
        assert verify_checkpoint(path) is None
    assert len(ckpts) <= max(train["keep_last"], 1) + (
        max_steps // train["milestone_every"] if train.get("milestone_every") else 0
    )
    best_step = min(evals, key=lambda e: e["loss"])["step"]
    best = read_checkpoint(run_dir / "checkpoints" / "best.bin")
    assert best.step == best_step
    assert state["best"]["step"] == best_step
    assert (run_dir / "engine.log").exists()
    assert not list((run_dir / "checkpoints").glob(".*tmp"))


def check_goodput(state: dict, exp: dict, steps: list[dict]) -> None:
    """.state.json's goodput account: the steps' compute and the audits, each counted once, within the
    wall time; the wall-clock rate below the engine's."""
    train, max_steps = exp["train"], exp["train"]["max_steps"]
    g = state["goodput"]
    assert g["steps"] == max_steps and g["tokens"] == steps[-1]["tokens"]
    assert g["step_s"] == pytest.approx(sum(e["ms"] for e in steps) / 1000.0)
    assert set(g["audits"]) == set(AUDIT_KINDS)
    assert g["audits"]["eval"]["count"] == max_steps // train["eval_every"]
    assert g["audits"]["sample"]["count"] == max_steps // train["sample_every"]
    assert g["audits"]["checkpoint"]["count"] == max_steps // train["ckpt_every"]
    assert all(a["s"] > 0 for a in g["audits"].values())
    audits_s = sum(a["s"] for a in g["audits"].values())
    assert g["wall_s"] > g["step_s"] + audits_s and g["other_s"] == pytest.approx(g["wall_s"] - g["step_s"] - audits_s)
    assert g["overhead"] == pytest.approx(1 - g["step_s"] / g["wall_s"])
    assert g["tokens_per_s"] == pytest.approx(g["tokens"] / g["wall_s"])
    assert 0 < state["tokens_per_s"] < state["engine_tokens_per_s"]


def check_evals_against_per_arm_frames(run_dir, path, data_cache, tmp_path) -> None:
    """An evaluation is one EVAL frame holding every arm's rows; each logged eval must equal, bit for
    bit, what one EVAL frame per arm (the proxy's frames before) gives on the same checkpoint, and its
    loss their token-weighted mean."""
    experiment = load_experiment(path)
    val = {arm: read_shard(run_dir / "data" / f"{arm}.val.tok")[0] for arm in experiment.arm_names}  # as frozen
    sampler = BatchSampler(
        {arm: [t] for arm, t in val.items()},
        val,
        experiment.arm_names,
        int(experiment.train.seed),
        int(experiment.model.ctx) + 1,
    )
    evals = {e["step"]: e for e in read_entries(run_dir) if e["type"] == "eval"}
    compared = 0
    for step, logged in sorted(evals.items()):
        ckpt = checkpoint_path(run_dir / "checkpoints", step)
        if not ckpt.exists():
            continue
        arms = experiment.arm_names
        feed = b"".join(
            frames.eval_frame(arm + 1, *sampler.eval_batch(arm, int(experiment.train.eval_rows)))
            for arm in range(len(arms))
        )
        argv = [
            str(ENGINE.path),
            *engine_args(tmp_path / f"scratch-{step}", resume=ckpt, ckpt_every=0, settings=experiment.engine_flags()),
        ]
        out = subprocess.run(argv, input=feed, capture_output=True, timeout=120, check=True).stdout
        events = {e["id"]: e for e in map(json.loads, out.splitlines()) if e["event"] == "eval"}
        parts = [(events[a + 1]["group_loss"][str(a)], events[a + 1]["group_tokens"][str(a)]) for a in range(len(arms))]
        assert logged["arms"] == {name: loss for name, (loss, _t) in zip(arms, parts, strict=False)}, step
        assert logged["loss"] == sum(loss * t for loss, t in parts) / sum(t for _loss, t in parts), step
        compared += 1
    assert compared >= 2, f"only {compared} evals had a checkpoint to compare on"


def test_tiny_trains_end_to_end(engine, data_cache, tmp_path):
    # TINY-TRAIN as shipped, but on one engine thread: results do not depend on the thread count,
    # and OpenMP threads fighting over a small shared box make the run many times slower
    path = make_experiment(tmp_path, "TINY-TRAIN")
    exp = json.loads(path.read_text())
    shipped = json.loads(TINY.read_text())["train"]
    assert {k: v for k, v in exp["train"].items() if k != "threads"} == {
        k: v for k, v in shipped.items() if k != "threads"
    }
    run_dir = tmp_path / "run"
    proxy = Proxy(run_args(path, run_dir), data_cache).start()
    assert proxy.wait() == 0, proxy.output()
    assert "finished" in proxy.stdout()
    out = proxy.stdout().splitlines()
    progress = [ln for ln in out if ln.startswith("step ") and " tok/s (engine " in ln and "| mixture " in ln]
    assert [ln.split("/")[0] for ln in progress] == ["step 1", "step 100", "step 200", "step 300"], out
    checkpoints = [ln for ln in out if ln.startswith("checkpoint step_")]
    assert len(checkpoints) == 3 and all("| overhead " in ln for ln in checkpoints), checkpoints
    assert "Traceback" not in proxy.stderr()

    check_sidecars(run_dir, exp)
    check_evals_against_per_arm_frames(run_dir, path, data_cache, tmp_path)
    steps = [e for e in read_entries(run_dir) if e["type"] == "step"]
    first = np.mean([e["loss"] for e in steps[:10]])
    last = np.mean([e["loss"] for e in steps[-10:]])
    assert last < first - 1.0, (first, last)
    assert first > math.log(exp["model"]["vocab"]) - 0.5  # it started from chance

    # relaunching a finished run says so and exits 0, changing nothing
    before = (run_dir / ".loss.json").read_bytes()
    again = run_cmd(run_args(path, run_dir), data_cache)
    assert again.returncode == 0, again.stderr
    assert "already finished" in again.stdout
    assert (run_dir / ".loss.json").read_bytes() == before

    status = run_cmd(["status", "--run-dir", str(run_dir)], data_cache)
    assert status.returncode == 0, status.stderr
    assert f"{exp['train']['max_steps']} / {exp['train']['max_steps']}" in status.stdout
    assert "finished" in status.stdout and "mixture:" in status.stdout
    assert "tok/s (engine " in status.stdout and "goodput:     overhead " in status.stdout
    report = json.loads(run_cmd(["status", "--run-dir", str(run_dir), "--json"], data_cache).stdout)
    assert report["alive"] is False and report["step"] == exp["train"]["max_steps"]
    assert report["last_checkpoint"].endswith(f"step_{exp['train']['max_steps']:06d}.bin")

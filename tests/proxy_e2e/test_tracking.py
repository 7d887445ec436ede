"""Tracking and overrides end to end, with the real CPU engine.

TINY with `--set train.max_steps=120 --set train.lr=0.002 --set log.tensorboard=true`: the frozen
(effective) experiment holds both values and `proxy status` shows the overrides; TensorBoard's own
reader finds one training-loss point per step and the validation points, also after the proxy and
the tracker were killed with SIGKILL mid-run and the command relaunched. W&B in offline mode: a run
whose `.wandb` records W&B's own protobuf classes read, and the same run id after a resume.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from harness.tracking_readers import tensorboard_scalars, tensorboard_texts, wandb_history_steps, wandb_records

from .conftest import TINY, Proxy, last_steps, max_logged_step, read_entries, run_args, run_cmd, wait_for

OVERRIDES = ["--set", "train.max_steps=120", "--set", "train.lr=0.002", "--set", "log.tensorboard=true"]


def tracker_pid(proxy: Proxy) -> int | None:
    """The proxy's child running `proxy.tracking` (read from /proc: it is the proxy's own child)."""
    pid = proxy.proc.pid
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            try:
                cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            except OSError:
                continue
            if b"proxy.tracking" in cmdline:
                return int(child)
    return None


def marks(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def logged_evals(run_dir: Path) -> list[int]:
    return sorted({e["step"] for e in read_entries(run_dir) if e.get("type") == "eval"})


def test_overrides_and_tensorboard_after_kill(gate, data_cache, tmp_path):
    run_dir = tmp_path / "run"
    args = run_args(TINY, run_dir, *OVERRIDES, engine=gate.engine_flag)
    gate.hold_after(60)
    proxy = Proxy(args, data_cache).start()
    wait_for(lambda: max_logged_step(run_dir) >= 60, 240, "step 60", proxy)
    wait_for(
        lambda: marks(run_dir / "tensorboard" / ".marks.json").get("step", -1) >= 30,
        120,
        "the tracker's first writes",
        proxy,
    )
    tracker = tracker_pid(proxy)
    assert tracker is not None, proxy.output()
    os.kill(tracker, signal.SIGKILL)  # both at once, neither gets to finish anything
    proxy.kill_group()
    proxy.proc.wait(30)
    gate.open()
    proxy = Proxy(args, data_cache).start()  # the same command: the same effective experiment
    assert proxy.wait() == 0, proxy.output()
    assert "tracking: TensorBoard" in proxy.stdout()

    frozen = json.loads((run_dir / "experiment.json").read_text())
    assert frozen["train"]["max_steps"] == 120 and frozen["train"]["lr"] == 0.002
    assert frozen["log"]["tensorboard"] is True
    status = run_cmd(["status", "--run-dir", str(run_dir), "--json"], data_cache)
    assert json.loads(status.stdout)["overrides"] == ["train.max_steps=120", "train.lr=0.002", "log.tensorboard=true"]
    assert (
        "overrides:   train.max_steps=120, train.lr=0.002"
        in run_cmd(["status", "--run-dir", str(run_dir)], data_cache).stdout
    )

    scalars = tensorboard_scalars(run_dir / "tensorboard")
    steps = last_steps(run_dir)
    assert [s for s, _ in scalars["train/loss"]] == list(range(1, 121))  # one point per step, none twice
    assert all(v == pytest.approx(steps[s]["loss"], rel=1e-6) for s, v in scalars["train/loss"])
    assert [s for s, _ in scalars["train/lr"]] == list(range(1, 121))
    assert max(v for _, v in scalars["train/lr"]) == pytest.approx(0.002, rel=1e-6)
    assert [s for s, _ in scalars["val/loss"]] == logged_evals(run_dir) == [100, 120]
    for tag in ("train/loss_smoothed", "train/grad_norm", "train/tokens_per_s", "val/code", "mixture/topics"):
        assert scalars[tag], tag
    assert [s for s, _ in tensorboard_texts(run_dir / "tensorboard", "samples")] == [100, 120]
    assert not (run_dir / "tracker.log").read_text().strip(), "the tracker reported a failure"


def test_an_unknown_key_or_a_bad_value_is_one_line(data_cache, tmp_path):
    for setting, words in (
        ("train.lrate=0.1", "unknown key 'lrate'"),
        ("train.lr=fast", "train.lr: expected a number"),
        ("log.wandb.mode=sometimes", "log.wandb"),
        ("train.max_steps", "expected KEY=VALUE"),
    ):
        result = run_cmd(run_args(TINY, tmp_path / "run", "--set", setting), data_cache)
        lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
        assert result.returncode == 2 and len(lines) == 1 and words in lines[0], (setting, result.stderr)
    assert not (tmp_path / "run" / "experiment.json").exists()


def test_a_started_run_takes_a_changed_override_only_with_the_flag(data_cache, tmp_path):
    run_dir = tmp_path / "run"
    first = run_cmd(run_args(TINY, run_dir, "--set", "train.max_steps=20"), data_cache)
    assert first.returncode == 0, first.stderr
    refused = run_cmd(run_args(TINY, run_dir, "--set", "train.max_steps=30"), data_cache)
    assert (
        refused.returncode == 2
        and "train.max_steps" in refused.stderr
        and "--allow-experiment-change" in refused.stderr
    )
    extended = run_cmd(run_args(TINY, run_dir, "--set", "train.max_steps=30", "--allow-experiment-change"), data_cache)
    assert extended.returncode == 0, extended.stderr
    assert max_logged_step(run_dir) == 30
    assert json.loads((run_dir / "experiment.json").read_text())["train"]["max_steps"] == 30


def test_wandb_offline_run_resumes_the_same_run(data_cache, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    monkeypatch.setenv("WANDB_MODE", "offline")  # nothing may reach the network, whatever the experiment says
    run_dir = tmp_path / "run"
    wandb = ["--set", 'log.wandb={"project": "microgpt-tests", "mode": "offline"}']
    first = run_cmd(run_args(TINY, run_dir, "--set", "train.max_steps=40", *wandb), data_cache)
    assert first.returncode == 0, first.stderr
    run_id = json.loads((run_dir / "wandb" / ".run_id.json").read_text())["id"]
    resumed = run_cmd(
        run_args(TINY, run_dir, "--set", "train.max_steps=70", *wandb, "--allow-experiment-change"), data_cache
    )
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((run_dir / "wandb" / ".run_id.json").read_text())["id"] == run_id

    files = sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert [f.name for f in files] == [f"run-{run_id}.wandb"] * 2  # one per launch, both of the same W&B run
    steps = []
    for _i, f in enumerate(files):
        records = wandb_records(f)
        runs = [r.run for r in records if r.WhichOneof("record_type") == "run"]
        assert [r.run_id for r in runs] == [run_id] and runs[0].project == "microgpt-tests"
        steps += wandb_history_steps(records)
    assert steps == list(range(1, 71))  # the resumed launch went on from step 41, nothing twice
    assert not (run_dir / "tracker.log").read_text().strip()


def test_a_failing_sink_is_one_line_and_training_goes_on(data_cache, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "tensorboard").write_text("a file where the tracker wants its directory")
    result = run_cmd(
        run_args(TINY, run_dir, "--set", "train.max_steps=30", "--set", "log.tensorboard=true"), data_cache
    )
    assert result.returncode == 0, result.stderr
    assert max_logged_step(run_dir) == 30
    lines = (run_dir / "tracker.log").read_text().splitlines()
    assert (
        len(lines) == 1 and lines[0].startswith("tracker: tensorboard: ") and "not logging to TensorBoard" in lines[0]
    )
    assert (run_dir / "tensorboard").read_text().startswith("a file")

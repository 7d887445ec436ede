"""A minimal experiment (a name, the model, one dataset written as `data`, max_steps) trains end to end
with the real engine on the documented defaults, and its progress lines name no mixture."""

from __future__ import annotations

import json
import re

import numpy as np

from proxy.formats.lr_schedule import lr_at

from .conftest import TINY, last_steps, read_entries, run_args, run_cmd, state


def test_a_minimal_experiment_trains(engine, data_cache, tmp_path):
    model = json.loads(TINY.read_text())["model"]
    data = {"builtin": "stdlib_code", "modules": ["json", "textwrap"]}
    exp = tmp_path / "MINIMAL.json"
    exp.write_text(json.dumps({"name": "MINIMAL", "model": model, "data": data, "train": {"max_steps": 20}}))
    run_dir = tmp_path / "run"
    result = run_cmd(run_args(exp, run_dir), data_cache)
    assert result.returncode == 0, result.stderr
    progress = [line for line in result.stdout.splitlines() if line.startswith("step ")]
    assert progress and not any("mixture" in line for line in progress), progress
    eval_lines = [line for line in result.stdout.splitlines() if line.startswith("eval step")]
    assert len(eval_lines) == 1 and re.fullmatch(r"eval step 20: val loss \d+\.\d{4}", eval_lines[0]), eval_lines

    steps = last_steps(run_dir)
    assert sorted(steps) == list(range(1, 21)) and all(list(e["arms"]) == ["main"] for e in steps.values())
    for s, e in steps.items():  # lr 6e-4, min_lr lr / 10, warmup 5% of max_steps: 1
        assert np.float32(e["lr"]) == np.float32(lr_at(s, lr=6e-4, min_lr=6e-5, warmup=1, steps=20)), (s, e["lr"])
    evals = [e for e in read_entries(run_dir) if e.get("type") == "eval"]
    assert [e["step"] for e in evals] == [20] and list(evals[0]["arms"]) == ["main"]
    assert state(run_dir)["status"] == "finished"
    # `proxy eval` takes the same eval_tokens rows (capped by the validation tokens) and so gives the same loss
    result = run_cmd(["eval", "--run-dir", str(run_dir), "--step", "20", "--engine", engine.flag, "--json"], data_cache)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["arms"] == evals[0]["arms"]

"""A minimal experiment: the model, one dataset written as `data`, max_steps; every other train key
defaults to what docs/EXPERIMENTS.md states."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proxy.config.config_file import ExperimentError
from proxy.config.experiment import DATA_ARM, load_experiment

MODEL = {"vocab": 512, "ctx": 64, "dim": 64, "layers": 2, "heads": 4}
MINIMAL = {"name": "m", "model": MODEL, "train": {"max_steps": 300}, "data": {"builtin": "stdlib_code"}}


def load(tmp_path: Path, data) -> object:
    path = tmp_path / "e.json"
    path.write_text(json.dumps(data))
    return load_experiment(path)


def error(tmp_path: Path, data) -> str:
    with pytest.raises(ExperimentError) as caught:
        load(tmp_path, data)
    assert "\n" not in str(caught.value)
    return str(caught.value)


def test_the_train_defaults_are_the_documented_ones(tmp_path):
    t = load(tmp_path, MINIMAL).train
    assert (t.batch, t.grad_accum, t.lr, t.min_lr, t.warmup, t.seed) == (8, 1, 6e-4, 6e-5, 15, 1337)
    assert (t.lr_schedule, t.decay_fraction, t.eval_every, t.eval_tokens, t.eval_rows) == (
        "cosine",
        0.2,
        100,
        65536,
        None,
    )
    assert t.eval_row_count(64) == 1024 and t.eval_row_count(1000) == 66  # whole rows holding eval_tokens
    assert t.eval_row_count(64, longest_val=5000) == 76  # no more rows than 5000 tokens hold side by side
    assert t.eval_row_count(64, longest_val=10) == 1


def test_min_lr_and_warmup_follow_lr_and_max_steps_unless_given(tmp_path):
    t = load(tmp_path, {**MINIMAL, "train": {"max_steps": 100_000, "lr": 0.003}}).train
    assert (t.min_lr, t.warmup) == (0.0003, 1000)  # lr / 10; 5% of max_steps, at most 1000
    t = load(tmp_path, {**MINIMAL, "train": {"max_steps": 10, "lr": 0.003, "min_lr": 0, "warmup": 2}}).train
    assert (t.min_lr, t.warmup) == (0.0, 2)
    assert load(tmp_path, {**MINIMAL, "train": {"max_steps": 19}}).train.warmup == 0
    given = {"max_steps": 10, "eval_rows": 4, "eval_tokens": 10}
    assert load(tmp_path, {**MINIMAL, "train": given}).train.eval_row_count(64, longest_val=100) == 4  # it wins


def test_a_bad_lr_is_the_one_error_not_a_min_lr_missing(tmp_path):
    msg = error(tmp_path, {**MINIMAL, "train": {"max_steps": 10, "lr": "fast"}})
    assert "train.lr: expected a number" in msg and "min_lr" not in msg, msg
    msg = error(tmp_path, {**MINIMAL, "train": {}})
    assert "train.max_steps: missing" in msg and "warmup" not in msg, msg


@pytest.mark.parametrize(
    "data", [{"builtin": "stdlib_code"}, [{"builtin": "stdlib_code"}, {"builtin": "pydoc_topics"}]]
)
def test_data_is_one_arm(tmp_path, data):
    exp = load(tmp_path, {**MINIMAL, "data": data})
    assert exp.arm_names == [DATA_ARM] and exp.target_arms == [DATA_ARM]
    assert [s.kind for s in exp.arms[0].sources] == ["builtin"] * (len(data) if isinstance(data, list) else 1)
    dumped = exp.model_dump(mode="json")
    assert dumped["data"] is None and dumped["arms"][0]["name"] == DATA_ARM
    assert type(exp).model_validate(dumped).arm_names == [DATA_ARM]  # the dump reads back the same


def test_data_and_arms_are_one_or_the_other(tmp_path):
    arms = [{"name": "a", "sources": [{"builtin": "stdlib_code"}]}]
    assert "give either data (one dataset) or arms (a mixture), not both" in error(tmp_path, {**MINIMAL, "arms": arms})
    neither = {k: v for k, v in MINIMAL.items() if k != "data"}
    assert "no data: give data (one dataset) or arms (a mixture)" in error(tmp_path, neither)


def test_a_data_problem_is_named_by_where_it_is_written(tmp_path):
    assert "data[0]: unknown key 'filex'" in error(tmp_path, {**MINIMAL, "data": {"filex": "a.txt"}})
    assert "data[0].file: no such file 'a.txt'" in error(tmp_path, {**MINIMAL, "data": {"file": "a.txt"}})

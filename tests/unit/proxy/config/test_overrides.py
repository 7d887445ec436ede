"""proxy/config/overrides.py: `--set KEY=VALUE` parsed, applied and checked by the experiment's schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proxy.config.config_file import ExperimentError
from proxy.config.overrides import MAX_OVERRIDES, apply_overrides, load_effective, parse_override

TINY = Path(__file__).resolve().parents[4] / "experiments" / "TINY-TRAIN.json"


def test_values_are_json_where_they_parse_else_text():
    assert parse_override("train.lr=0.001").value == 0.001
    assert parse_override("log.tensorboard=true").value is True
    assert parse_override('log.wandb={"project": "p"}').value == {"project": "p"}
    assert parse_override("name=my-run").value == "my-run"
    assert parse_override("name=").value == ""
    assert parse_override("a.b=x=y").path == ("a", "b") and parse_override("a.b=x=y").value == "x=y"


@pytest.mark.parametrize("text", ["train.lr", "=1", "train..lr=1", ".lr=1", "a.b.c.d.e.f.g.h.i=1"])
def test_a_malformed_override_is_refused(text):
    with pytest.raises(ExperimentError):
        parse_override(text)


def test_apply_sets_nested_keys_and_list_items_without_touching_the_input():
    data = {"train": {"lr": 1}, "arms": [{"cap": 1}, {"cap": 1}]}
    out = apply_overrides(
        data,
        [
            parse_override("train.lr=2"),
            parse_override("arms.1.cap=0.5"),
            parse_override("log.tensorboard=true"),
            parse_override("train.lr=3"),
        ],
    )
    assert out == {"train": {"lr": 3}, "arms": [{"cap": 1}, {"cap": 0.5}], "log": {"tensorboard": True}}
    assert data == {"train": {"lr": 1}, "arms": [{"cap": 1}, {"cap": 1}]}


@pytest.mark.parametrize(
    "text, words", [("arms.9.cap=1", "is no index"), ("arms.x.cap=1", "is no index"), ("train.lr.x=1", "not an object")]
)
def test_a_path_through_nothing_is_one_line(text, words):
    with pytest.raises(ExperimentError, match=words):
        apply_overrides({"train": {"lr": 1}, "arms": [{}]}, [parse_override(text)])


def test_the_effective_experiment_is_validated_and_frozen_as_json():
    experiment, raw = load_effective(TINY, ["train.max_steps=120", "train.lr=0.002", "log.tensorboard=true"])
    assert experiment.train.max_steps == 120 and experiment.train.lr == 0.002 and experiment.log.tensorboard
    frozen = json.loads(raw)
    assert frozen["train"]["max_steps"] == 120 and frozen["train"]["warmup"] == 20  # the rest as the file has it


def test_without_overrides_the_file_is_frozen_as_it_is():
    experiment, raw = load_effective(TINY, [])
    assert raw is None and experiment.name == "TINY-TRAIN"


@pytest.mark.parametrize(
    "text, words",
    [
        ("train.lrx=1", "train: unknown key 'lrx'"),
        ("train.lr=fast", "train.lr: expected a number"),
        ("train.max_steps=0", "train.max_steps"),
        ("log.wandb.mode=sometimes", "log.wandb"),
    ],
)
def test_the_schema_names_an_unknown_key_or_a_bad_value(text, words):
    with pytest.raises(ExperimentError) as err:
        load_effective(TINY, [text])
    message = str(err.value)
    assert words in message and "--set" in message and "\n" not in message


def test_too_many_overrides():
    with pytest.raises(ExperimentError, match="at most"):
        load_effective(TINY, ["train.lr=0.1"] * (MAX_OVERRIDES + 1))

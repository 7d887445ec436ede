"""Experiment schema: the shipped experiments load, and every kind of mistake is one clear line."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from proxy.config.caps import CapsFile, load_caps
from proxy.config.config_file import ExperimentError
from proxy.config.experiment import MAX_PROMPTS, MAX_SAMPLE_COUNT, Experiment, load_experiment, parse_experiment
from proxy.formats.engine_cli import engine_args
from proxy.formats.frames import SAMPLE_MAX_COMPLETIONS

ROOT = Path(__file__).resolve().parents[4]
EXPERIMENTS = ROOT / "experiments"

BASE = {
    "name": "t",
    "model": {"vocab": 512, "ctx": 64, "dim": 64, "layers": 2, "heads": 4},
    "train": {"batch": 8, "max_steps": 300, "lr": 0.003, "min_lr": 0.0003, "warmup": 20, "seed": 1, "eval_rows": 8},
    "arms": [
        {"name": "a", "sources": [{"builtin": "pydoc_topics"}], "cap": 0.8, "floor": 0.1},
        {"name": "b", "sources": [{"builtin": "stdlib_code", "modules": ["json"]}]},
    ],
}


def write(tmp_path: Path, data, name="e.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return p


def error_of(tmp_path: Path, data) -> str:
    p = write(tmp_path, data)
    with pytest.raises(ExperimentError) as ei:
        load_experiment(p)
    msg = str(ei.value)
    assert "\n" not in msg, msg
    assert str(p) in msg
    assert "http" not in msg and "pydantic" not in msg.lower(), msg
    return msg


@pytest.mark.parametrize("name", ["ANDREA-12M-TRAIN", "ANDREA-120M-TRAIN", "TINY-TRAIN"])
def test_shipped_experiments_load(name):
    exp = load_experiment(EXPERIMENTS / f"{name}.json")
    assert exp.name == name
    assert len(exp.arms) >= 2
    assert all(src.kind == "builtin" for arm in exp.arms for src in arm.sources)  # no download


def test_shipped_shapes():
    e12 = load_experiment(EXPERIMENTS / "ANDREA-12M-TRAIN.json")
    m = e12.model
    assert (m.vocab, m.ctx, m.dim, m.layers, m.heads) == (4608, 1024, 384, 6, 12)
    assert abs(m.n_params - 12.8e6) < 0.1e6
    e120 = load_experiment(EXPERIMENTS / "ANDREA-120M-TRAIN.json")
    m = e120.model
    assert (m.ctx, m.dim, m.layers, m.heads) == (1024, 768, 12, 12)
    assert abs(m.n_params - 120e6) < 2e6
    tiny = load_experiment(EXPERIMENTS / "TINY-TRAIN.json")
    assert tiny.train.ckpt_every == 100 and tiny.train.max_steps >= 200
    assert tiny.model.vocab <= 1024 and tiny.model.ctx <= 128 and tiny.model.dim <= 128


def test_defaults(tmp_path):
    exp = load_experiment(write(tmp_path, BASE))
    t = exp.train
    assert (t.grad_accum, t.beta1, t.beta2, t.eps, t.weight_decay, t.grad_clip) == (1, 0.9, 0.95, 1e-8, 0.1, 1.0)
    assert (t.ckpt_every, t.eval_every, t.sample_every, t.lag, t.keep_last, t.milestone_every, t.threads) == (
        100,
        100,
        100,
        2,
        3,
        1000,
        None,
    )
    assert exp.bandit.policy == "target"
    assert exp.arms[1].cap == 1.0 and exp.arms[1].floor == 0.0
    assert exp.samples.prompts


def test_engine_flags(tmp_path):
    exp = load_experiment(write(tmp_path, BASE))
    flags = exp.engine_flags()
    pairs = dict(zip(flags[::2], flags[1::2], strict=False))
    assert pairs == {
        "--vocab": "512",
        "--ctx": "64",
        "--dim": "64",
        "--layers": "2",
        "--heads": "4",
        "--batch": "8",
        "--grad-accum": "1",
        "--steps": "300",
        "--lr": "0.003",
        "--min-lr": "0.0003",
        "--lr-schedule": "cosine",
        "--decay-fraction": "0.2",
        "--warmup": "20",
        "--beta1": "0.9",
        "--beta2": "0.95",
        "--eps": "1e-08",
        "--weight-decay": "0.1",
        "--grad-clip": "1.0",
        "--seed": "1",
    }
    data = copy.deepcopy(BASE)
    data["train"]["threads"] = 2
    assert load_experiment(write(tmp_path, data)).engine_flags()[-2:] == ["--threads", "2"]


def test_ckpt_every_seconds_reaches_the_engine_argv(tmp_path):
    """train.ckpt_every_seconds (default 0: off) becomes the engine's --ckpt-every-seconds."""
    assert load_experiment(write(tmp_path, BASE)).train.ckpt_every_seconds == 0
    data = copy.deepcopy(BASE)
    data["train"]["ckpt_every_seconds"] = 90
    train = load_experiment(write(tmp_path, data)).train
    args = engine_args(tmp_path / "ck", ckpt_every=int(train.ckpt_every), ckpt_every_seconds=train.ckpt_every_seconds)
    assert args[args.index("--ckpt-every-seconds") + 1] == "90.0"
    for bad, why in ((-1, "greater than or equal to 0"), (float("inf"), "finite")):
        data["train"]["ckpt_every_seconds"] = bad
        assert why in error_of(tmp_path, data)


def test_the_largest_audit_fits_one_sample_frame(tmp_path):
    data = copy.deepcopy(BASE)
    data["samples"] = {"prompts": [f"p{i}" for i in range(MAX_PROMPTS)], "count": MAX_SAMPLE_COUNT}
    samples = load_experiment(write(tmp_path, data)).samples
    assert len(samples.prompts) * samples.count <= SAMPLE_MAX_COMPLETIONS
    data["samples"]["count"] = MAX_SAMPLE_COUNT + 1
    assert "samples.count" in error_of(tmp_path, data)
    data["samples"] = {"prompts": [f"p{i}" for i in range(MAX_PROMPTS + 1)]}
    assert "samples.prompts" in error_of(tmp_path, data)


def test_unknown_key(tmp_path):
    data = copy.deepcopy(BASE)
    data["train"]["learning_rate"] = 1
    data["arms"][0]["sources"][0]["fiel"] = "x"
    msg = error_of(tmp_path, data)
    assert "train: unknown key 'learning_rate'" in msg
    assert "arms[0].sources[0]: unknown key 'fiel'" in msg


def test_wrong_type(tmp_path):
    data = copy.deepcopy(BASE)
    data["train"]["lr"] = "fast"
    data["model"]["layers"] = 2.5
    data["train"]["batch"] = True
    msg = error_of(tmp_path, data)
    assert 'train.lr: expected a number, got "fast"' in msg
    assert "model.layers: expected an integer, got 2.5" in msg
    assert "train.batch: expected an integer, got true" in msg


def test_missing_field(tmp_path):
    data = copy.deepcopy(BASE)
    del data["train"]["max_steps"]  # the one train key without a default
    assert "train.max_steps: missing" in error_of(tmp_path, data)


def test_cap_below_floor(tmp_path):
    data = copy.deepcopy(BASE)
    data["arms"][0]["cap"] = 0.05
    assert "arms[0]: cap 0.05 is below floor 0.1" in error_of(tmp_path, data)


def test_floors_above_one(tmp_path):
    data = copy.deepcopy(BASE)
    data["arms"][0]["floor"] = 0.7
    data["arms"][1]["floor"] = 0.6
    assert "floors sum to 1.3, above 1" in error_of(tmp_path, data)


def test_caps_below_one(tmp_path):
    data = copy.deepcopy(BASE)
    data["arms"][0]["cap"] = 0.3
    data["arms"][1]["cap"] = 0.3
    assert "caps sum to 0.6, below 1" in error_of(tmp_path, data)


def test_missing_data_source(tmp_path):
    data = copy.deepcopy(BASE)
    data["arms"][0]["sources"] = [{"file": "nothere.txt"}]
    data["arms"][1]["sources"] = [{"glob": "data/*.md"}]
    msg = error_of(tmp_path, data)
    assert "arms[0].sources[0].file: no such file 'nothere.txt'" in msg
    assert "arms[1].sources[0].glob: pattern 'data/*.md' matches no file" in msg
    data["arms"][0]["sources"] = []
    assert "arms[0].sources: at least one source is required" in error_of(tmp_path, data)


def test_source_needs_one_kind(tmp_path):
    data = copy.deepcopy(BASE)
    data["arms"][0]["sources"] = [{"file": "a", "dir": "b"}, {"suffix": ".py"}, {"builtin": "nope"}]
    msg = error_of(tmp_path, data)
    kinds = "file, glob, dir, jsonl, parquet, hf_dataset, tokens, builtin"
    assert f"arms[0].sources[0]: a source needs exactly one of {kinds} (got file, dir)" in msg
    assert "arms[0].sources[1]: a source needs exactly one" in msg
    assert "arms[0].sources[2].builtin:" in msg and '"nope"' in msg
    # an unknown kind lists the kinds that exist; an option of another kind names the kind's own
    data["arms"][0]["sources"] = [{"parquett": "a.parquet"}, {"file": "a.txt", "suffix": ".py"}]
    msg = error_of(tmp_path, data)
    assert f"arms[0].sources[0]: unknown key 'parquett'; a source is one of {kinds}" in msg
    assert "arms[0].sources[1]: unknown key 'suffix' (a file source takes file, max_chars, val)" in msg


def test_relative_sources_resolve_against_experiment_dir(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.txt").write_text("hello")
    data = copy.deepcopy(BASE)
    data["arms"][0]["sources"] = [{"file": "data/x.txt"}, {"dir": "data", "suffix": ".txt"}, {"glob": "data/*.txt"}]
    load_experiment(write(tmp_path, data))


def test_bandit_params_checked(tmp_path):
    data = copy.deepcopy(BASE)
    data["bandit"] = {"policy": "exp3", "temperature": 2.0}
    assert "bandit: temperature does not apply to policy 'exp3'" in error_of(tmp_path, data)
    data["bandit"] = {"policy": "thompson"}
    assert (
        "bandit: unknown policy 'thompson' (the policies: 'ucb1', 'exp3', 'uniform', 'progress', 'target')"
        in error_of(tmp_path, data)
    )
    data["bandit"] = {"policy": "exp3", "c": 1.0, "window": 100, "stall": 0.25}  # others' defaults: a frozen copy
    assert load_experiment(write(tmp_path, data)).bandit.params() == {"ema_alpha": 0.1, "smoothing": 0.9}
    data["bandit"] = {"c": 2.0}  # no policy: the default's
    assert "bandit: c does not apply to policy 'target'" in error_of(tmp_path, data)
    data["bandit"] = {"policy": "ucb1", "nonsense": 1}
    assert "bandit: unknown key 'nonsense'" in error_of(tmp_path, data)
    data["bandit"] = {"policy": "exp3", "smoothing": 0.5}
    assert load_experiment(write(tmp_path, data)).bandit.smoothing == 0.5


def test_many_problems_one_line(tmp_path):
    data = copy.deepcopy(BASE)
    data["model"]["heads"] = 5
    data["train"]["min_lr"] = 1.0
    data["arms"].append(copy.deepcopy(data["arms"][0]))
    msg = error_of(tmp_path, data)
    assert "dim 64 is not divisible by heads 5" in msg
    assert "min_lr 1 is above lr 0.003" in msg
    assert "duplicate arm name 'a'" in msg


def test_not_json(tmp_path):
    msg = error_of(tmp_path, "{nope")
    assert "not JSON" in msg
    with pytest.raises(ExperimentError, match="no such file"):
        load_experiment(tmp_path / "absent.json")
    assert "top level" in error_of(tmp_path, [1, 2])


def test_round_trip(tmp_path):
    exp = load_experiment(write(tmp_path, BASE))
    again = Experiment.model_validate(json.loads(exp.model_dump_json()))
    assert again == exp
    assert parse_experiment(json.loads(exp.model_dump_json(exclude_defaults=True))) == exp


# --- caps files -------------------------------------------------------------


def test_caps_partial(tmp_path):
    exp = load_experiment(write(tmp_path, BASE))
    caps, floors = load_caps(write(tmp_path, {"caps": {"b": 0.5}}, "c.json"), exp)
    assert caps == {"a": 0.8, "b": 0.5} and floors == {"a": 0.1, "b": 0.0}
    caps, floors = load_caps(write(tmp_path, {"floors": {"b": 0.2}}, "c.json"), exp)
    assert caps == {"a": 0.8, "b": 1.0} and floors == {"a": 0.1, "b": 0.2}
    caps, floors = load_caps(write(tmp_path, {}, "c.json"), exp, base=({"a": 0.6, "b": 0.6}, {"a": 0.0, "b": 0.0}))
    assert caps == {"a": 0.6, "b": 0.6}


@pytest.mark.parametrize(
    "data, expect",
    [
        ({"caps": {"zz": 0.5}}, "caps: unknown arm 'zz'"),
        ({"caps": {"a": 0.05}}, "a: cap 0.05 is below floor 0.1"),
        ({"floors": {"a": 0.6, "b": 0.6}}, "floors sum to 1.2, above 1"),
        ({"caps": {"a": 0.2, "b": 0.2}}, "caps sum to 0.4, below 1"),
        ({"caps": {"a": 1.5}}, "outside [0, 1]"),
        ({"caps": {"a": "high"}}, "caps.a: expected a number"),
        ({"cap": {"a": 0.5}}, "unknown key 'cap'"),
        ("not json", "not JSON"),
    ],
)
def test_caps_errors(tmp_path, data, expect):
    exp = load_experiment(write(tmp_path, BASE))
    p = write(tmp_path, data, "caps.json")
    with pytest.raises(ExperimentError) as ei:
        load_caps(p, exp)
    msg = str(ei.value)
    assert expect in msg and str(p) in msg and "\n" not in msg


def test_caps_model():
    assert CapsFile.model_validate({"caps": {"a": 0.5}}).floors == {}

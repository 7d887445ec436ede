"""Curation test data and the schema around it: target arms, random_tokens, repeated_names, the policies, the
suite's mixes (their low-quality corpora are the suite's own files: tests/unit/scripts/mixing/)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

from proxy.config.config_file import ExperimentError
from proxy.config.experiment import load_experiment
from proxy.config.sources import parse_source
from proxy.data import prepare_data
from proxy.data.builtin_sources import RANDOM_DOC_TOKENS, RANDOM_DOCS, REPEATS, random_token_documents
from proxy.data.source_files import SourceError
from proxy.data.source_readers import load_documents
from proxy.formats.shard import read_shard

ROOT = Path(__file__).resolve().parents[2]
BASE = {
    "name": "t",
    "model": {"vocab": 512, "ctx": 32, "dim": 16, "layers": 1, "heads": 2},
    "train": {"batch": 4, "max_steps": 10, "lr": 1e-3, "min_lr": 1e-4, "warmup": 1, "seed": 1, "eval_rows": 2},
    "arms": [
        {"name": "real", "sources": [{"builtin": "stdlib_docstrings", "modules": ["json", "textwrap"]}]},
        {"name": "junk", "sources": [{"builtin": "random_tokens"}], "target": False},
        {"name": "dup", "sources": [{"builtin": "repeated_names"}], "target": False},
    ],
}


def write(tmp_path: Path, data, name="e.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(data))
    return p


def error_of(tmp_path: Path, data) -> str:
    with pytest.raises(ExperimentError) as ei:
        load_experiment(write(tmp_path, data))
    msg = str(ei.value)
    assert "\n" not in msg and "pydantic" not in msg.lower(), msg
    return msg


# --- schema -------------------------------------------------------------------


def test_target_flag(tmp_path):
    exp = load_experiment(write(tmp_path, BASE))
    assert [a.target for a in exp.arms] == [True, False, False] and exp.target_arms == ["real"]
    data = copy.deepcopy(BASE)
    del data["arms"][1]["target"]
    assert load_experiment(write(tmp_path, data)).arms[1].target is True  # default
    data["arms"][0]["target"] = False
    data["arms"][1]["target"] = False
    assert "arms: at least one arm must be a target" in error_of(tmp_path, data)
    data["arms"][0]["target"] = "yes"
    assert 'arms[0].target: expected true or false, got "yes"' in error_of(tmp_path, data)


def test_token_source_rules(tmp_path):
    data = copy.deepcopy(BASE)
    data["arms"][1]["sources"].append({"builtin": "pydoc_topics"})
    assert "arms[1].sources: a builtin random_tokens source must be its arm's only source" in error_of(tmp_path, data)
    data = copy.deepcopy(BASE)
    data["arms"][1]["sources"] = [{"builtin": "random_tokens", "max_chars": 100}]
    assert "max_chars does not apply to builtin random_tokens" in error_of(tmp_path, data)
    data["arms"][1]["sources"] = [{"builtin": "repeated_names", "modules": ["math"]}]
    assert "modules applies only to builtin stdlib_code and stdlib_docstrings" in error_of(tmp_path, data)


@pytest.mark.parametrize("policy", ["uniform", "progress", "target"])
def test_new_policies_in_the_schema(tmp_path, policy):
    data = copy.deepcopy(BASE)
    data["bandit"] = {"policy": policy}
    assert load_experiment(write(tmp_path, data)).bandit.policy == policy
    data["bandit"] = {"policy": policy, "temperature": 2.0}
    assert f"bandit: temperature does not apply to policy '{policy}'" in error_of(tmp_path, data)
    data["bandit"] = {"policy": "uniform", "window": 50}
    assert "bandit: window does not apply to policy 'uniform'" in error_of(tmp_path, data)
    data["bandit"] = {"policy": "progress", "window": 2, "explore": 1.5}
    msg = error_of(tmp_path, data)
    assert "bandit.window: input should be greater than or equal to 3" in msg and "bandit.explore" in msg
    data["bandit"] = {"policy": "progress", "stall": 0.5}
    assert "bandit: stall does not apply to policy 'progress'" in error_of(tmp_path, data)
    data["bandit"] = {"policy": "target", "eval_window": 2, "max_move": 0}
    msg = error_of(tmp_path, data)
    assert "bandit.eval_window: input should be greater than or equal to 3" in msg and "bandit.max_move" in msg


def test_mixing_suite_experiments():
    """The suite's mixes differ only in their arms (same model, training and cadence), run on one engine
    thread each (two runs at once on a 2-core machine), and default to the target policy."""
    import sys  # noqa: PLC0415

    sys.path.insert(0, str(ROOT / "scripts"))
    from mixing.suite import SUITE  # noqa: PLC0415

    exps = {m.name: load_experiment(m.experiment, check_sources=False) for m in SUITE}  # corpora may be unbuilt
    assert list(exps) == ["good", "sizes", "shuffled", "lowquality", "worthless"]
    first = exps["good"]
    for exp in exps.values():
        assert exp.model == first.model and exp.train.model_copy(update={"seed": 1}) == first.train
        assert exp.train.threads == 1 and exp.bandit.policy == "target"
    kinds = {name: {a.name: (a.sources[0].describe(), a.target) for a in exp.arms} for name, exp in exps.items()}
    assert all(t for _kind, t in kinds["good"].values()) and all(t for _kind, t in kinds["sizes"].values())
    assert kinds["shuffled"]["shuffled_words"] == ("jsonl 'mixing-corpora/shuffled_words.jsonl'", False)
    assert {k: kind for k, (kind, t) in kinds["lowquality"].items() if not t} == {
        "boilerplate": "jsonl 'mixing-corpora/boilerplate.jsonl'",
        "near_duplicates": "jsonl 'mixing-corpora/near_duplicates.jsonl'",
        "german": "parquet 'mixing-corpora/man_pages_de.parquet'",
    }
    assert kinds["worthless"]["junk"] == ("builtin 'random_tokens'", False)
    assert kinds["worthless"]["duplicates"] == ("builtin 'repeated_names'", False)


@pytest.mark.parametrize("gone", ["shuffled_words", "boilerplate", "near_duplicates", "man_pages_de"])
def test_the_mixing_suite_s_corpora_are_no_builtin(tmp_path, gone):
    """They are the suite's evaluation data (scripts/mixing/corpora.py), not the product's: an experiment
    naming one as a builtin is one line that names it and the builtins there are."""
    data = copy.deepcopy(BASE)
    data["arms"][0]["sources"] = [{"builtin": gone}]
    msg = error_of(tmp_path, data)
    assert "arms[0].sources[0].builtin: input should be 'stdlib_code'" in msg and f'got "{gone}"' in msg


# --- sources ------------------------------------------------------------------


def test_random_tokens_are_uniform_and_fixed():
    a = random_token_documents("train", 512, 0)
    assert len(a) == RANDOM_DOCS["train"] and all(d.size == RANDOM_DOC_TOKENS for d in a)
    ids = np.concatenate(a)
    assert ids.min() == 1 and ids.max() == 511  # never the separator
    counts = np.bincount(ids, minlength=512)[1:]
    assert abs(counts.mean() - ids.size / 511) < 1e-9 and counts.std() < 4 * np.sqrt(counts.mean())
    again = np.concatenate(random_token_documents("train", 512, 0))
    assert np.array_equal(ids, again)
    val = np.concatenate(random_token_documents("val", 512, 0))
    assert not np.array_equal(val, ids[: val.size])  # its own stream
    skip = np.concatenate(random_token_documents("val", 512, 7))
    assert 7 not in skip and skip.max() == 511 and 0 in skip
    with pytest.raises(SourceError, match="token ids"):
        load_documents(parse_source({"builtin": "random_tokens"}), ".")


def test_repeated_names():
    docs = load_documents(parse_source({"builtin": "repeated_names"}), ".")
    unique = sorted(set(docs))
    assert 200 <= len(unique) <= 600 and len(docs) == REPEATS * len(unique)
    assert "math.isclose" in unique and "builtins.len" in unique
    assert max(map(len, unique)) < 40
    first_pass, second_pass = docs[: len(unique)], docs[len(unique) : 2 * len(unique)]
    assert sorted(first_pass) == unique and first_pass != second_pass  # each pass in its own order
    assert load_documents(parse_source({"builtin": "repeated_names"}), ".") == docs


def test_prepare_with_curation_arms(tmp_path):
    """The junk arm's shards are random ids with EOT between documents; it trains no part of the
    tokenizer (the same as without it); the duplicates are text like any arm."""
    exp = load_experiment(write(tmp_path, BASE))
    data = prepare_data(exp, tmp_path, tmp_path / "cache", progress=False)
    train, vocab = read_shard(data.train["junk"][0].path)
    assert vocab == 512 and train.size == RANDOM_DOCS["train"] * (RANDOM_DOC_TOKENS + 1)
    docs = train.reshape(RANDOM_DOCS["train"], RANDOM_DOC_TOKENS + 1)
    assert np.all(docs[:, -1] == data.tokenizer.eot_id) and np.all(docs[:, :-1] != data.tokenizer.eot_id)
    assert data.stats["junk"]["val_tokens"] == RANDOM_DOCS["val"] * (RANDOM_DOC_TOKENS + 1)
    assert data.stats["dup"]["train_tokens"] > 0
    without_junk = copy.deepcopy(BASE)
    del without_junk["arms"][1]
    other = prepare_data(
        load_experiment(write(tmp_path, without_junk, "b.json")), tmp_path, tmp_path / "cache", progress=False
    )
    assert other.key != data.key
    assert other.tokenizer_json == data.tokenizer_json

"""Shared helpers for the pivot and fork suite: real proxies, the engine under test, the frame gate
(tests/proxy_e2e's), on the rank count under test (MICROGPT_TEST_RANKS, harness/ranks.py: the runs a test
checks train on that many ranks, the references they are compared with on 1)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from harness.engines import EngineUnderTest
from harness.gate import Gate
from harness.ranks import ranks_under_test, require_ranks
from proxy_e2e.conftest import (  # noqa: F401
    TINY,
    Proxy,
    _reap_proxies,
    assert_same_checkpoint,
    data_cache,
    engine,
    last_steps,
    make_experiment,
    max_logged_step,
    one_line_error,
    read_entries,
    run_args,
    run_cmd,
    state,
    wait_for,
)

RANKS = ranks_under_test()


def ranked_gate(engine: EngineUnderTest, directory: Path, ranks: int) -> Gate:
    """A frame gate in front of the engine under test on `ranks` ranks (in front of mpirun for more than 1)."""
    require_ranks(ranks, engine.kind)
    return Gate(directory, engine.path, ranks)


@pytest.fixture
def gate(engine, tmp_path) -> Gate:
    """The suite's gate: on the rank count under test (tests/proxy_e2e's is on 1)."""
    return ranked_gate(engine, tmp_path / "gate", RANKS)


ARMS = ["code", "docstrings", "topics"]
# the pivot's caps file: another policy, a cap that binds, a floor that binds (topics keeps its 0.1)
NEW_CAPS = {"policy": "exp3", "caps": {"code": 0.25}, "floors": {"docstrings": 0.45}}
BOUNDS = {"code": (0.0, 0.25), "docstrings": (0.45, 1.0), "topics": (0.1, 1.0)}
COMPARED = ("loss", "grad_norm", "lr", "tokens", "arms", "mixture", "phase")


def write_caps(directory: Path, obj=NEW_CAPS, name: str = "caps.json") -> Path:
    path = directory / name
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return path


def tree_hashes(root: Path) -> dict[str, str]:
    """sha256 of every file under `root` (hidden ones included), by relative path."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def phases(run_dir: Path) -> list[dict]:
    return json.loads((run_dir / "phases.json").read_text())


def rows_per_batch(exp_path: Path) -> int:
    train = json.loads(exp_path.read_text())["train"]
    return train["batch"] * train.get("grad_accum", 1)


def check_new_phase_steps(steps: dict[int, dict], start: int, last: int, rows: int) -> None:
    """Every step after the pivot: the new phase, a mixture within the new caps and floors from the
    first batch on, per-arm losses only for arms that had rows, and the floor arm always present."""
    for s in range(start + 1, last + 1):
        e = steps[s]
        assert e["phase"] == 1, (s, e["phase"])
        mix = e["mixture"]
        assert list(mix) == ARMS and abs(sum(mix.values()) - 1) < 1e-9, (s, mix)
        for arm, (lo, hi) in BOUNDS.items():
            assert lo - 1e-9 <= mix[arm] <= hi + 1e-9, (s, arm, mix[arm], lo, hi)
        assert e["arms"] and set(e["arms"]) <= {a for a in ARMS if mix[a] > 0}, (s, e["arms"], mix)
        # systematic sampling gives every arm floor(w * rows) rows at least
        for arm in ARMS:
            if int(mix[arm] * rows + 1e-9) >= 1:
                assert arm in e["arms"], (s, arm, mix, e["arms"])

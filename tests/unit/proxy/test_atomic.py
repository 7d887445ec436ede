"""Durable writes (proxy/atomic.py)."""

from __future__ import annotations

import json

import pytest

from proxy.atomic import atomic_copy, atomic_write_json


def test_atomic_writes_leave_no_temp_files(tmp_path):
    target = tmp_path / "x.json"
    atomic_write_json(target, {"a": 1})
    atomic_write_json(target, {"a": 2})
    assert json.loads(target.read_text()) == {"a": 2}
    atomic_copy(target, tmp_path / "y.json")
    assert (tmp_path / "y.json").read_bytes() == target.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json", "y.json"]
    with pytest.raises(ValueError):
        atomic_write_json(target, {"a": float("nan")})
    assert json.loads(target.read_text()) == {"a": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json", "y.json"]

"""phases.json (rundir/phases.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from proxy.rundir.layout import RunDir, RunDirError
from proxy.rundir.phases import append_phase, ensure_phases, read_phases


def test_phases_are_appended(tmp_path):
    run = RunDir(tmp_path / "run")
    run.create()
    experiment = SimpleNamespace(
        bandit=SimpleNamespace(policy="ucb1"),
        arms=[SimpleNamespace(name="a", cap=1.0, floor=0.0), SimpleNamespace(name="b", cap=0.5, floor=0.1)],
    )
    phases = ensure_phases(run, experiment)
    assert phases[0] == read_phases(run)[0] and phases[0].caps == {"a": 1.0, "b": 0.5}
    assert ensure_phases(run, experiment) == phases  # written once
    new = append_phase(run, 200, "exp3", {"a": 0.6, "b": 0.5}, {"a": 0.0, "b": 0.1}, "step_000200.bin")
    assert [p.phase for p in read_phases(run)] == [0, 1] and new.contains(201) and not new.contains(200)
    run.phases.write_text('[{"phase": 3}]')
    with pytest.raises(RunDirError):
        read_phases(run)

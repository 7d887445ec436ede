"""`.state.json` and `.samples.json` (formats/state.py, formats/samples.py)."""

from __future__ import annotations

import json

from proxy.formats.samples import Sample, SampleAudit, SamplesFile
from proxy.formats.state import RunState, read_state, write_state


def test_state_and_samples_files(tmp_path):
    st = RunState(step=5, tokens_per_s=float("nan"))
    write_state(tmp_path / ".state.json", st)
    back = read_state(tmp_path / ".state.json")
    assert back["step"] == 5 and back["tokens_per_s"] is None and back["engine"]["alive"] is False
    samples = SamplesFile(tmp_path / ".samples.json", keep=2)
    for s in (100, 200, 200, 300):
        samples.add(SampleAudit(step=s, time=float(s), samples=[Sample("def ", f"x{s}", [1, 2])]))
    on_disk = json.loads((tmp_path / ".samples.json").read_text())
    assert [a["step"] for a in on_disk] == [200, 300]
    assert [a.step for a in SamplesFile(tmp_path / ".samples.json").audits] == [200, 300]

"""RunReport.record_step (proxy/supervision/report.py): a step's bookkeeping in one call."""

from __future__ import annotations

from proxy.formats.state import EngineStatus
from proxy.supervision.report import RunReport


def test_a_step_counts_its_tokens_its_compute_and_its_progress():
    report = RunReport(engine=EngineStatus())
    report.resumed(0, None, 1000, None)
    assert report.record_step(1, 64, 12.5, 4.25, {"a": 0.75, "b": 0.25}, now=100.0) == 1064
    assert report.record_step(2, 64, 11.5, 4.0, {"a": 0.5, "b": 0.5}, now=100.5) == 1128
    assert report.tokens == 1128
    assert (report.goodput.steps, report.goodput.tokens, report.goodput.step_ms) == (2, 128, 24.0)
    assert report.progress.last_loss == 4.0 and report.progress.mixture == {"a": 0.5, "b": 0.5}

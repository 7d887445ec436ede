"""best.bin while running (supervision/best_copier.py, supervision/checkpoints.py)."""

from __future__ import annotations

from types import SimpleNamespace

from proxy.formats.state import EngineStatus
from proxy.rundir.layout import RunDir
from proxy.supervision.best_copier import BestCopier
from proxy.supervision.checkpoints import maybe_best
from proxy.supervision.report import RunReport


def test_best_bin_only_from_announced_checkpoints_copied_in_the_background(tmp_path):
    ck = tmp_path / "checkpoints"
    ck.mkdir()
    for s in (100, 200):
        (ck / f"step_{s:06d}.bin").write_bytes(bytes([s % 251]) * 4096)
    report, warnings = RunReport(engine=EngineStatus()), []
    ctx = SimpleNamespace(
        report=report,
        best_copier=BestCopier(),
        eval_loss={100: 3.0, 200: 2.5, 300: 1.0},
        run=RunDir(tmp_path),
        lock=SimpleNamespace(check=lambda: None),
        warn=warnings.append,
    )
    report.checkpointed(100, str(ck / "step_000100.bin"))
    maybe_best(ctx, 200)  # on disk, but its ckpt event has not come: it may still be being written
    assert ctx.best_copier.job is None and not ctx.run.best.exists()
    maybe_best(ctx, 100)
    assert ctx.best_copier.busy_step == 100 and report.best_step is None  # recorded once the copy is durable
    ctx.best_copier.wait(report, warnings.append)
    assert (report.best_step, report.best_loss) == (100, 3.0)
    assert ctx.run.best.read_bytes() == (ck / "step_000100.bin").read_bytes()
    report.checkpointed(200, str(ck / "step_000200.bin"))
    maybe_best(ctx, 200)
    maybe_best(ctx, 100)  # not better than the copy in flight: nothing
    assert ctx.best_copier.busy_step == 200
    ctx.best_copier.wait(report, warnings.append)
    assert report.best_step == 200 and ctx.run.best.read_bytes() == (ck / "step_000200.bin").read_bytes()
    (ck / "step_000300.bin").mkdir()  # a copy that fails: one warning, best.bin and the report unchanged
    report.checkpointed(300, str(ck / "step_000300.bin"))
    maybe_best(ctx, 300)
    ctx.best_copier.wait(report, warnings.append)
    assert report.best_step == 200 and len(warnings) == 1 and "best.bin" in warnings[0]
    assert ctx.run.best.read_bytes() == (ck / "step_000200.bin").read_bytes()

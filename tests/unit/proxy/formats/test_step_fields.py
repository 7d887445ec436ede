"""The step-field table (proxy/formats/step_fields.py) and the `.loss.json` step line it drives.

The fixture was written by the loss log code before the table existed (`StepEntry.to_dict` and the two
readers, strict and lenient, written out field by field): lines written now must be byte-identical, and old
lines must read back the same through both readers."""

from __future__ import annotations

import json
import math
from pathlib import Path

from proxy.formats.loss_log import LossLogWriter, encode_line, iter_lines, parse_line
from proxy.formats.step_fields import (
    COMPARED_FIELDS,
    ENGINE_KEYS,
    PLOTTED,
    STEP_FIELDS,
    StepEntry,
    StepValueKind,
    StepValueSource,
    engine_metrics,
    markdown_table,
    step_fields,
)

FIXTURES = Path(__file__).parent / "fixtures"
ROOT = Path(__file__).resolve().parents[4]


def _nan_as_text(v):
    return "NaN" if isinstance(v, float) and math.isnan(v) else v


def test_old_lines_read_and_write_the_same():
    lines = (FIXTURES / "loss_log_v1.jsonl").read_bytes().splitlines(keepends=True)
    expected = json.loads((FIXTURES / "loss_log_v1.expected.json").read_text())
    assert len(lines) == len(expected)
    for line, want in zip(lines, expected, strict=False):
        entry = parse_line(line)
        got = None if entry is None else [type(entry).__name__, entry.to_dict()]
        assert got == want["strict"], line
        try:
            obj = json.loads(line)
        except ValueError:
            obj = None
        f = step_fields(obj) if isinstance(obj, dict) else None
        shown = (
            None
            if f is None
            else {
                "step": f.step,
                "tokens": _nan_as_text(f.tokens),
                "time": _nan_as_text(f.time),
                **{k: _nan_as_text(v) for k, v in f.values.items()},
                "mixture": f.mixture,
            }
        )
        assert shown == want["display"], line


def test_written_lines_are_byte_identical(tmp_path):
    lines = (FIXTURES / "loss_log_v1.jsonl").read_bytes().splitlines(keepends=True)
    canonical = lines[:3]  # written by the old writer; the rest are old or foreign lines
    for line in canonical:
        assert encode_line(parse_line(line).to_dict()) == line
    log = tmp_path / ".loss.json"
    writer = LossLogWriter(log)
    for line in canonical:
        writer.append(parse_line(line))
    writer.close()
    assert log.read_bytes() == b"".join(canonical)
    assert [ln for _o, ln in iter_lines(log)] == canonical


def test_table_is_the_entry():
    assert [f.name for f in STEP_FIELDS] == list(StepEntry.__dataclass_fields__)
    assert list(
        StepEntry(
            step=1, loss=2.0, lr=0.0, grad_norm=0.0, tokens=0, time=0.0, ms=0.0, arms={}, mixture={}, phase=0, segment=0
        ).to_dict()
    ) == ["type"] + [f.name for f in STEP_FIELDS if f.kind is not StepValueKind.FLAG]
    assert ENGINE_KEYS == {"step", "loss", "group_loss", "lr", "grad_norm", "ms", "tokens"}
    assert COMPARED_FIELDS == ("loss", "lr", "grad_norm", "tokens", "arms", "mixture")
    assert [f.name for f in PLOTTED] == ["loss", "lr", "grad_norm", "ms"]


def test_engine_metrics_copies_the_copied_fields():
    ev = {
        "event": "step",
        "step": 3,
        "loss": 4,
        "lr": 0.5,
        "grad_norm": 1.25,
        "ms": 2.0,
        "tokens": 64,
        "group_loss": {"0": 4.0},
    }
    assert engine_metrics(ev) == {"loss": 4.0, "lr": 0.5, "grad_norm": 1.25, "ms": 2.0}
    assert all(type(v) is float for v in engine_metrics(ev).values())
    assert engine_metrics({"loss": 1.0}) == {"loss": 1.0, "lr": 0.0, "grad_norm": 0.0, "ms": 0.0}
    assert {f.name for f in STEP_FIELDS if f.source is StepValueSource.COPIED} == set(engine_metrics(ev))


def test_a_missing_required_field_refuses_the_line():
    assert parse_line(b'{"type": "step", "step": 1}\n') is None
    assert parse_line(b'{"type": "step", "loss": 1.0}\n') is None


def test_formats_doc_holds_the_table():
    doc = (ROOT / "docs" / "FORMATS.md").read_text(encoding="utf-8")
    assert markdown_table() in doc, "docs/FORMATS.md: paste proxy.formats.step_fields.markdown_table()'s text"

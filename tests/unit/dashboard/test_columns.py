"""The dashboard's value columns come from the step-field table (proxy/formats/step_fields.py), and the page
(app.js, index.html) names none of them but the two it draws specially: the loss (raw and smoothed) and the
engine's tokens/s (beside the wall clock's)."""

from __future__ import annotations

import math
import re
from pathlib import Path

from dashboard.columns import BASE_COLS, ENVELOPE_COLS, MEAN_COLS, TOK_S, columns_payload, row_values
from dashboard.payload import rows_payload
from proxy.formats.step_fields import PLOTTED, step_fields

STATIC = Path(__file__).resolve().parents[3] / "dashboard" / "static"
DRAWN_BY_NAME = {"loss", TOK_S}


def test_columns_are_the_tables_plotted_fields():
    assert BASE_COLS == tuple(f.name for f in PLOTTED) + (TOK_S,)
    assert set(ENVELOPE_COLS) | set(MEAN_COLS) == set(BASE_COLS) and not set(ENVELOPE_COLS) & set(MEAN_COLS)
    assert ENVELOPE_COLS == tuple(f.name for f in PLOTTED if f.plot.envelope)
    sent = columns_payload()
    assert [c["name"] for c in sent] == list(BASE_COLS)
    for c, f in zip(sent, PLOTTED, strict=False):
        assert (c["label"], c["envelope"], c["chart"]) == (f.plot.label, f.plot.envelope, f.plot.chart)
    # the charts the page has had: the learning rate's and the gradient norm's, now from the table
    assert [c["chart"] for c in sent if c["chart"]] == ["chart-lr", "chart-gn"]


def test_the_page_names_no_column_of_the_table():
    for name in ("app.js", "index.html"):
        text = (STATIC / name).read_text(encoding="utf-8")
        for c in columns_payload():
            if c["name"] not in DRAWN_BY_NAME:
                assert not re.search(r"\b{}\b".format(re.escape(c["name"])), text), (name, c["name"])
            if c["chart"]:
                assert c["chart"] not in text, (name, c["chart"])


def test_a_row_carries_every_column():
    f = step_fields(
        {
            "type": "step",
            "step": 2,
            "loss": 4.0,
            "lr": 0.5,
            "grad_norm": 1.5,
            "ms": 10.0,
            "tokens": 200,
            "time": 1.0,
            "mixture": {"a": 1.0},
        }
    )
    assert row_values(f, 1, 100.0) == [4.0, 0.5, 1.5, 10.0, 100 / 0.010]
    out, _prev = rows_payload([f], None)
    for c in BASE_COLS:
        col = out[c]["mean"] if c in ENVELOPE_COLS else out[c]
        assert len(col) == 1 and col[0] is not None and math.isfinite(col[0]), c

"""The value columns the dashboard plots per step, and a step's throughput.

The columns are the step-field table's plotted fields (proxy/formats/step_fields.py, `PLOTTED`, read from
`.loss.json` by its lenient reader `step_fields`) plus the one the dashboard computes, `tok_s`. The page
gets this list from /api/columns (`columns_payload`) and draws from it: a field added to the table with a
`StepPlot` is stored, downsampled, sent and charted without an edit here, in payload.py or in app.js.
"""

from __future__ import annotations

from proxy.formats.step_fields import NAN, PLOTTED, StepFields, StepPlot

TOK_S = "tok_s"  # the engine's throughput of one step (tokens_per_s); app.js draws it beside the wall clock's
COLUMN_PLOTS: dict[str, StepPlot] = {
    **{f.name: f.plot for f in PLOTTED if f.plot is not None},
    TOK_S: StepPlot("tokens / s"),
}
# value columns every run has, in store order; the mixture weights follow as "mix:<arm>"
BASE_COLS: tuple[str, ...] = tuple(COLUMN_PLOTS)
ENVELOPE_COLS: tuple[str, ...] = tuple(c for c, p in COLUMN_PLOTS.items() if p.envelope)  # sent as min/max/mean
MEAN_COLS: tuple[str, ...] = tuple(c for c, p in COLUMN_PLOTS.items() if not p.envelope)


def columns_payload() -> list[dict[str, object]]:
    """The columns as the page reads them: name, label, envelope, chart (its own chart's element id, or null)."""
    return [{"name": c, "label": p.label, "envelope": p.envelope, "chart": p.chart} for c, p in COLUMN_PLOTS.items()]


def row_values(f: StepFields, prev_step: int | None, prev_tokens: float | None) -> list[float]:
    """One step's values in BASE_COLS order."""
    return [f.values[p.name] for p in PLOTTED] + [tokens_per_s(f, prev_step, prev_tokens)]


def tokens_per_s(f: StepFields, prev_step: int | None, prev_tokens: float | None) -> float:
    """Training throughput of one step: its tokens over its engine time.

    `tokens` is cumulative; the step's own tokens are the difference from the
    previous step when that is known, else the run's mean tokens per step.
    """
    ms = f.values["ms"]
    if not (ms > 0) or not (f.tokens == f.tokens):
        return NAN
    if prev_step is not None and prev_step == f.step - 1 and prev_tokens is not None and f.tokens > prev_tokens:
        d = f.tokens - prev_tokens
    elif f.step > 0:
        d = f.tokens / f.step
    else:
        return NAN
    return d / (ms / 1000.0)

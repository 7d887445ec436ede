"""The step entry of `.loss.json` and its one field table.

`StepEntry`'s field declarations are the table: each field's metadata says its
kind, its unit, which key of the engine's `step` event it comes from (and how),
and whether and how the dashboard plots it. Everything else is derived from it:
the strict reader (`StepEntry.from_dict`) and the writer (`to_dict`, the line's
key order is the declaration order), the proxy's copy of the engine's metrics
(`engine_metrics`), the lenient reader for display (`step_fields`), the
dashboard's value columns, the engine's event-key check (tests/engine) and the
field table of docs/FORMATS.md (`markdown_table`, checked by a test).

Adding a metric the engine computes: one field in the engine's step `printf`
(microgpt/train.h) and one field here, declared with `source=COPIED`, a
`missing` value for older lines and a `default` (so code that builds entries
by keyword keeps working), placed after `segment` (a new key goes last on a
line); a `StepPlot` charts it. The entry, both readers, the replay comparison, the
dashboard's columns and its page follow from this table; the tests that pin
today's table (tests/unit/proxy/formats/test_step_fields.py,
tests/unit/dashboard/test_columns.py) and the copy in docs/FORMATS.md say what
changed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any

from ..run_names import MAX_ARMS, MAX_NAME


class StepValueKind(Enum):
    """How a value is written and read back."""

    INT = "integer"
    FLOAT = "number"
    ARM_MAP = "object: arm name -> number"
    FLAG = "true, or absent"  # written only when true


class StepValueSource(Enum):
    """Where the proxy gets a field's value from."""

    COPIED = "the engine's step event, copied"
    ENGINE = "the engine's step event, converted"  # named and handled in supervision/events.py
    PROXY = "the proxy"


@dataclass(frozen=True)
class StepPlot:
    """How the dashboard plots a field: `label` names it on the page; `envelope`: sent as min/max/mean per
    bucket (spikes survive downsampling), else the mean; `chart`: the id of a line chart of its own on the
    page, or None (plotted by a chart of several fields, or only sent)."""

    label: str
    envelope: bool = False
    chart: str | None = None


@dataclass(frozen=True)
class StepField:
    """One row of the table (`name` is the key in `.loss.json`)."""

    name: str
    kind: StepValueKind
    unit: str
    doc: str
    source: StepValueSource
    engine_key: str | None  # its key in the engine's step event, if it comes from there
    missing: Any  # what the strict reader takes when an old line lacks it; None: the field is required
    plot: StepPlot | None
    compared: bool  # a step re-trained after a restart must repeat it bit for bit (compare_replayed)


_META = "step_field"


def _field(
    kind: StepValueKind,
    unit: str,
    doc: str,
    source: StepValueSource,
    engine_key: str | None = None,
    missing: Any = None,
    plot: StepPlot | None = None,
    compared: bool = False,
    default: Any = None,
) -> Any:
    """A dataclass field of StepEntry carrying its table row (the name is filled in from the attribute)."""
    row = StepField("", kind, unit, doc, source, engine_key, missing, plot, compared)
    if default is None:
        return field(metadata={_META: row})
    return field(default=default, metadata={_META: row})


# the table's words, short
INT, FLOAT, ARM_MAP, FLAG = StepValueKind.INT, StepValueKind.FLOAT, StepValueKind.ARM_MAP, StepValueKind.FLAG
COPIED, ENGINE, PROXY = StepValueSource.COPIED, StepValueSource.ENGINE, StepValueSource.PROXY


@dataclass
class StepEntry:
    """One training step as `.loss.json` stores it; the declaration order is the key order of a line."""

    step: int = _field(INT, "", "the step trained (the first is 1)", ENGINE, "step")
    loss: float = _field(
        FLOAT,
        "nats/token",
        "mean training loss of the step's tokens",
        COPIED,
        "loss",
        plot=StepPlot("loss", envelope=True),
        compared=True,
    )
    lr: float = _field(
        FLOAT,
        "",
        "learning rate of the update",
        COPIED,
        "lr",
        0.0,
        StepPlot("learning rate", chart="chart-lr"),
        compared=True,
    )
    grad_norm: float = _field(
        FLOAT,
        "",
        "gradient norm before clipping",
        COPIED,
        "grad_norm",
        0.0,
        StepPlot("gradient norm", envelope=True, chart="chart-gn"),
        compared=True,
    )
    tokens: int = _field(
        INT,
        "tokens",
        "tokens trained so far, this step's included (the engine reports the step's own)",
        ENGINE,
        "tokens",
        0,
        compared=True,
    )
    time: float = _field(FLOAT, "s", "wall clock (Unix time) when the proxy read the step's event", PROXY, None, 0.0)
    ms: float = _field(FLOAT, "ms", "the engine's time for the step", COPIED, "ms", 0.0, StepPlot("step time (ms)"))
    arms: dict[str, float] = _field(
        ARM_MAP,
        "nats/token",
        "mean loss of each arm's tokens in the step (the engine's group_loss, by arm name)",
        ENGINE,
        "group_loss",
        {},
        compared=True,
    )
    mixture: dict[str, float] = _field(
        ARM_MAP, "", "the mixture weights the step's batch was drawn with", PROXY, None, {}, compared=True
    )
    phase: int = _field(INT, "", "the experiment phase (phases.json)", PROXY, None, 0)
    segment: int = _field(INT, "", "the engine launch that trained it", PROXY, None, 0)
    inherited: bool = _field(FLAG, "", "copied from the parent run by a fork", PROXY, None, False, default=False)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "step"}
        for f in STEP_FIELDS:
            value = getattr(self, f.name)
            if f.kind is not FLAG or value:
                out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any]) -> StepEntry:
        """Strict: a value of the wrong type raises (ValueError, TypeError, KeyError, AttributeError)."""
        return cls(
            **{
                f.name: _STRICT[f.kind](obj[f.name] if f.missing is None else obj.get(f.name, f.missing))
                for f in STEP_FIELDS
            }
        )


def _arm_floats(v: Any) -> dict[str, float]:
    return {str(k): float(x) for k, x in dict(v or {}).items()}


_STRICT: dict[StepValueKind, Callable[[Any], Any]] = {INT: int, FLOAT: float, ARM_MAP: _arm_floats, FLAG: bool}


def _rows() -> tuple[StepField, ...]:
    out = []
    for f in fields(StepEntry):
        row: StepField = f.metadata[_META]
        out.append(dataclasses.replace(row, name=f.name))
    return tuple(out)


STEP_FIELDS: tuple[StepField, ...] = _rows()
COMPARED_FIELDS: tuple[str, ...] = tuple(f.name for f in STEP_FIELDS if f.compared)
PLOTTED: tuple[StepField, ...] = tuple(f for f in STEP_FIELDS if f.plot is not None)
ENGINE_KEYS: frozenset[str] = frozenset(f.engine_key for f in STEP_FIELDS if f.engine_key)  # "event" aside


def engine_metrics(event: Mapping[str, Any]) -> dict[str, Any]:
    """The COPIED fields of an engine step event (floats), as StepEntry keyword arguments."""
    return {
        f.name: float(event[f.engine_key] if f.missing is None else event.get(f.engine_key, f.missing))
        for f in STEP_FIELDS
        if f.source is StepValueSource.COPIED and f.engine_key
    }


# ---------------------------------------------------------------- reading for display

NAN = float("nan")


def num(v: Any) -> float:
    """A finite float, or NaN for anything else (None, strings, bools, inf)."""
    t = type(v)
    if t is float:
        return v if v - v == 0.0 else NAN
    if t is int and -(1 << 1000) < v < (1 << 1000):
        return float(v)
    return NAN


def step_of(v: Any) -> int | None:
    t = type(v)
    if t is int:
        return v if 0 <= v < 1 << 53 else None
    if t is float and v.is_integer() and 0 <= v < 2**53:
        return int(v)
    return None


def arm_map(v: Any) -> dict[str, float]:
    """{arm: finite float} from an entry's "arms"/"mixture" object (bad values dropped)."""
    if type(v) is not dict:
        return {}
    out = {}
    for k, x in v.items():
        if type(x) is float and x - x == 0.0 or type(x) is int and -(1 << 1000) < x < (1 << 1000):
            if type(k) is str and 0 < len(k) <= MAX_NAME:
                out[k] = float(x)
                if len(out) >= MAX_ARMS:
                    break
    return out


@dataclass(frozen=True)
class StepFields:
    """A step entry's fields as the dashboard plots them: the x axes (step, tokens, time), the mixture and
    every PLOTTED field by name (`values`); a malformed number is NaN."""

    step: int
    tokens: float
    time: float
    mixture: dict[str, float]
    values: dict[str, float]

    def __getattr__(self, name: str) -> float:
        """A plotted field by name (`f.loss`, `f.ms`), as the fixed fields are read."""
        try:
            return self.__dict__["values"][name]
        except KeyError:
            raise AttributeError(name) from None


def step_fields(obj: Mapping[str, Any]) -> StepFields | None:
    """Lenient: a step entry's plotted fields (None: not a step entry, or no usable step)."""
    if obj.get("type") != "step":
        return None
    step = step_of(obj.get("step"))
    if step is None:
        return None
    g = obj.get
    return StepFields(
        step, num(g("tokens")), num(g("time")), arm_map(g("mixture")), {f.name: num(g(f.name)) for f in PLOTTED}
    )


# ---------------------------------------------------------------- documentation


def markdown_table() -> str:
    """The fields of a step line as docs/FORMATS.md shows them (a test checks the doc holds this text)."""
    lines = ["| key | value | unit | from | meaning |", "|---|---|---|---|---|"]
    for f in STEP_FIELDS:
        origin = f"engine `{f.engine_key}`" if f.engine_key else "proxy"
        lines.append(f"| `{f.name}` | {f.kind.value} | {f.unit or '-'} | {origin} | {f.doc} |")
    return "\n".join(lines) + "\n"

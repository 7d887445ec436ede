"""Turn series data into compact, JSON-safe columns for the page.

Floats are rounded to 6 significant digits (short JSON), non-finite values
become null, and the shape is the same for a zoomed read, an overview and a
live push, so the page has one code path.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

from proxy.formats.loss_log import EvalFields, StepFields

from .columns import BASE_COLS, ENVELOPE_COLS, MEAN_COLS, row_values
from .downsample import Agg

WALL_COL = "wall_tok_s"  # from the x fields (tokens and time), not a column of the store
WALL_WINDOW_S = 10.0  # a wall-clock rate spans at least this much wall time (docs/DASHBOARD.md)


def round_sig(a: npt.ArrayLike, digits: int = 6) -> list:
    """List of floats rounded to `digits` significant digits; NaN/inf -> None."""
    a = np.asarray(a, dtype=np.float64)
    out = np.full(a.shape, np.nan)
    ok = np.isfinite(a)
    nz = ok & (a != 0)
    if nz.any():
        v = a[nz]
        dec = digits - 1 - np.floor(np.log10(np.abs(v))).astype(np.int64)
        pos = dec >= 0
        r = np.empty_like(v)
        scale = 10.0 ** np.where(pos, dec, 0)
        r[pos] = np.round(v[pos] * scale[pos]) / scale[pos]
        inv = 10.0 ** np.where(pos, 0, -dec)
        r[~pos] = np.round(v[~pos] / inv[~pos]) * inv[~pos]
        out[nz] = r
    out[ok & (a == 0)] = 0.0
    return [None if x != x else x for x in out.tolist()]


def round_dec(a: npt.ArrayLike, decimals: int) -> list:
    a = np.round(np.asarray(a, dtype=np.float64), decimals)
    return [None if not math.isfinite(x) else x for x in a.tolist()]


def ints(a: npt.ArrayLike) -> list:
    return np.asarray(a, dtype=np.int64).tolist()


def wall_tokens_per_s(
    tok_end: npt.ArrayLike,
    time_end: npt.ArrayLike,
    anchor_tok: npt.ArrayLike = (),
    anchor_time: npt.ArrayLike = (),
    window_s: float = WALL_WINDOW_S,
) -> np.ndarray:
    """Wall-clock tokens/s at each point (a bucket's last step, points in step order): the tokens added since
    the latest earlier point at least `window_s` seconds before it, over the wall time between them.

    The earlier points are the anchors (points before the first: block ends, a stream's recent steps, oldest
    first) and the points before it. Everything between steps counts (evals, samples, checkpoint stalls,
    restarts), which the engine's tok_s leaves out. A window of seconds, never a pair of log lines: steps
    logged in a burst must not read as impossibly fast. NaN where no point lies that far back (the start of
    a run, or of what is known)."""
    tok_end = np.asarray(tok_end, dtype=np.float64)
    time_end = np.asarray(time_end, dtype=np.float64)
    n = tok_end.size
    out = np.full(n, np.nan)
    if not n:
        return out
    tok = np.concatenate([np.asarray(anchor_tok, dtype=np.float64), tok_end])
    tim = np.concatenate([np.asarray(anchor_time, dtype=np.float64), time_end])
    first = tok.size - n  # index of point 0 among all
    usable = np.flatnonzero(np.isfinite(tok) & np.isfinite(tim))
    if not usable.size:
        return out
    # searched over the running maximum of the times: a clock stepping back never picks a later point
    latest = np.maximum.accumulate(tim[usable])
    target = time_end - window_s
    pos = np.searchsorted(latest, np.where(np.isfinite(target), target, -np.inf), side="right") - 1
    j = usable[np.maximum(pos, 0)]
    dk, dt = tok_end - tok[j], time_end - tim[j]
    ok = (pos >= 0) & np.isfinite(target) & (j < first + np.arange(n)) & (dt >= window_s) & (dk >= 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        out[ok] = dk[ok] / dt[ok]
    return out


class WallWindow:
    """A live stream's recent (tokens, time) points: enough history to rate each new step over
    WALL_WINDOW_S, the newest point at least that old and everything after it."""

    MAX_POINTS = 100_000  # bounds the memory of a stream of very fast steps

    def __init__(self, tokens: Iterable[float] = (), times: Iterable[float] = ()) -> None:
        self.tokens = [float(x) for x in tokens]
        self.times = [float(x) for x in times]

    def rates(self, tokens: list[float], times: list[float]) -> np.ndarray:
        out = wall_tokens_per_s(tokens, times, self.tokens, self.times)
        self.tokens.extend(float(x) for x in tokens)
        self.times.extend(float(x) for x in times)
        finite = [t for t in self.times if t == t]
        if finite:
            newest = max(finite)
            # later points (no older than this one) find their anchor at or after the newest old-enough point
            keep = max((i for i, t in enumerate(self.times) if t <= newest - WALL_WINDOW_S), default=0)
            keep = max(keep, len(self.times) - self.MAX_POINTS)
            del self.tokens[:keep], self.times[:keep]
        return out


def agg_payload(agg: Agg, cols: list[str], raw: bool, before: tuple[np.ndarray, np.ndarray] | None = None) -> dict:
    """Columns of `agg` as {"step": [...], "loss": {"min","max","mean"}, "lr": [...], "mix": {...}}.

    A raw payload (each bucket one row) leaves out the *_end fields and the
    min/max of envelope columns: they equal the start and the mean. `before`
    is the (tokens, time) of points before the first bucket, where the
    wall-clock rates of the first buckets may start.
    """
    n = len(agg)
    ncol = agg.vmin.shape[1] if agg.vmin.ndim == 2 else 0
    mean = agg.mean if n else np.zeros((0, ncol))
    out: dict = {
        "n": n,
        "raw": raw,
        "step": ints(agg.step0),
        "tokens": round_sig(agg.tok0, 12),
        "time": round_dec(agg.time0, 3),
    }
    if not raw:
        out.update(
            step_end=ints(agg.step1),
            tokens_end=round_sig(agg.tok1, 12),
            time_end=round_dec(agg.time1, 3),
            rows=ints(agg.rows),
        )
    mix = {}
    for j, c in enumerate(cols[:ncol]):
        col_mean = round_sig(mean[:, j])
        if c in ENVELOPE_COLS:
            out[c] = (
                {"mean": col_mean}
                if raw
                else {"min": round_sig(agg.vmin[:, j]), "max": round_sig(agg.vmax[:, j]), "mean": col_mean}
            )
        elif c.startswith("mix:"):
            mix[c[4:]] = col_mean
        else:
            out[c] = col_mean
    for c in ENVELOPE_COLS + MEAN_COLS:  # always present, even before the first entry
        out.setdefault(c, {"mean": []} if c in ENVELOPE_COLS else [])
    anchor_tok, anchor_time = before if before is not None else (np.zeros(0), np.zeros(0))
    if n:  # the first bucket's own first step too
        anchor_tok, anchor_time = np.append(anchor_tok, agg.tok0[0]), np.append(anchor_time, agg.time0[0])
    out[WALL_COL] = round_sig(wall_tokens_per_s(agg.tok1, agg.time1, anchor_tok, anchor_time))
    out["mix"] = mix
    return out


def rows_payload(
    rows: list[StepFields], prev: tuple[int, float, float] | None, window: WallWindow | None = None
) -> tuple[dict, tuple[int, float, float] | None]:
    """Raw payload of freshly read step entries (a live push). `prev` is the (step, tokens, time) of the
    entry before them, for tok_s; returns the new one. `window` holds the stream's recent steps for
    wall_tok_s and takes these rows in (without one, the rates start from these rows alone)."""
    steps, tokens, times = [], [], []
    values: list[list[float]] = []
    mix: dict[str, list] = {}
    for k, f in enumerate(rows):
        steps.append(f.step)
        tokens.append(f.tokens)
        times.append(f.time)
        values.append(row_values(f, prev[0] if prev else None, prev[1] if prev else None))
        for arm, w in f.mixture.items():
            mix.setdefault(arm, [float("nan")] * k).append(w)
        for col in mix.values():
            if len(col) < k + 1:
                col.append(float("nan"))
        prev = (f.step, f.tokens, f.time)
    out: dict = {
        "n": len(steps),
        "raw": True,
        "step": steps,
        "tokens": round_sig(tokens, 12),
        "time": round_dec(times, 3),
    }
    for j, c in enumerate(BASE_COLS):
        col = round_sig([v[j] for v in values])
        out[c] = {"mean": col} if c in ENVELOPE_COLS else col
    out[WALL_COL] = round_sig((window or WallWindow()).rates(tokens, times))
    out["mix"] = {arm: round_sig(col) for arm, col in mix.items()}
    return out, prev


def evals_payload(evals: list[EvalFields]) -> dict:
    """Eval entries in step order as columns: step, loss, time, arms {name: [...]}."""
    arms: dict[str, list] = {}
    for k, e in enumerate(evals):
        for a, v in e.arms.items():
            arms.setdefault(a, [float("nan")] * k).append(v)
        for col in arms.values():
            if len(col) < k + 1:
                col.append(float("nan"))
    return {
        "n": len(evals),
        "step": [e.step for e in evals],
        "loss": round_sig([e.loss for e in evals]),
        "time": round_dec([e.time for e in evals], 3),
        "arms": {a: round_sig(col) for a, col in arms.items()},
    }


def dumps(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False, ensure_ascii=False).encode("utf-8")


def sanitize(obj: object, depth: int = 0) -> object:
    """A JSON-safe copy of parsed sidecar content (non-finite floats -> None)."""
    if depth > 40:
        return None
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): sanitize(v, depth + 1) for k, v in obj.items()}
    if isinstance(obj, list):
        return [sanitize(v, depth + 1) for v in obj]
    return obj

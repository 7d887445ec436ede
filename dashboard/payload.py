"""Turn series data into compact, JSON-safe columns for the page.

Floats are rounded to 6 significant digits (short JSON), non-finite values
become null, and the shape is the same for a zoomed read, an overview and a
live push, so the page has one code path.
"""
from __future__ import annotations

import json
import math

import numpy as np

from .downsample import Agg
from .entries import EvalFields, StepFields, tokens_per_s

ENVELOPE_COLS = ("loss", "grad_norm")  # sent as min/max/mean so spikes survive
MEAN_COLS = ("lr", "ms", "tok_s")
WALL_COL = "wall_tok_s"  # from the x fields (tokens and time), not a column of the store


def round_sig(a, digits: int = 6) -> list:
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


def round_dec(a, decimals: int) -> list:
    a = np.round(np.asarray(a, dtype=np.float64), decimals)
    return [None if not math.isfinite(x) else x for x in a.tolist()]


def ints(a) -> list:
    return np.asarray(a, dtype=np.int64).tolist()


def wall_tokens_per_s(tok0, tok1, time0, time1, before: tuple[float, float] | None = None) -> np.ndarray:
    """Wall-clock tokens/s of each bucket: the tokens its steps added over the wall time since the
    previous bucket's last step (the first bucket: since `before`, the (tokens, time) of the step
    before it, else since its own first step). Everything between steps counts (evals, samples,
    checkpoint stalls, restarts), which the engine's tok_s leaves out; NaN where no time passed."""
    tok1 = np.asarray(tok1, dtype=np.float64)
    time1 = np.asarray(time1, dtype=np.float64)
    if not tok1.size:
        return np.zeros(0)
    start_tok = np.concatenate(([before[0] if before else tok0[0]], tok1[:-1]))
    start_time = np.concatenate(([before[1] if before else time0[0]], time1[:-1]))
    dt = time1 - start_time
    dk = tok1 - start_tok
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where((dt > 0) & (dk >= 0), dk / dt, np.nan)


def agg_payload(agg: Agg, cols: list[str], raw: bool) -> dict:
    """Columns of `agg` as {"step": [...], "loss": {"min","max","mean"}, "lr": [...], "mix": {...}}.

    A raw payload (each bucket one row) leaves out the *_end fields and the
    min/max of envelope columns: they equal the start and the mean.
    """
    n = len(agg)
    ncol = agg.vmin.shape[1] if agg.vmin.ndim == 2 else 0
    mean = agg.mean if n else np.zeros((0, ncol))
    out: dict = {"n": n, "raw": raw, "step": ints(agg.step0), "tokens": round_sig(agg.tok0, 12),
                 "time": round_dec(agg.time0, 3)}
    if not raw:
        out.update(step_end=ints(agg.step1), tokens_end=round_sig(agg.tok1, 12),
                   time_end=round_dec(agg.time1, 3), rows=ints(agg.rows))
    mix = {}
    for j, c in enumerate(cols[:ncol]):
        col_mean = round_sig(mean[:, j])
        if c in ENVELOPE_COLS:
            out[c] = {"mean": col_mean} if raw else {
                "min": round_sig(agg.vmin[:, j]), "max": round_sig(agg.vmax[:, j]), "mean": col_mean}
        elif c.startswith("mix:"):
            mix[c[4:]] = col_mean
        else:
            out[c] = col_mean
    for c in ENVELOPE_COLS + MEAN_COLS:  # always present, even before the first entry
        out.setdefault(c, {"mean": []} if c in ENVELOPE_COLS else [])
    out[WALL_COL] = round_sig(wall_tokens_per_s(agg.tok0, agg.tok1, agg.time0, agg.time1))
    out["mix"] = mix
    return out


def rows_payload(rows: list[StepFields], prev: tuple[int, float, float] | None
                 ) -> tuple[dict, tuple[int, float, float] | None]:
    """Raw payload of freshly read step entries (a live push). `prev` is the (step, tokens, time) of the
    entry before them, for tok_s and wall_tok_s; returns the new one."""
    before = (prev[1], prev[2]) if prev else None
    steps, tokens, times = [], [], []
    loss, gn, lr, ms, tps = [], [], [], [], []
    mix: dict[str, list] = {}
    for k, f in enumerate(rows):
        steps.append(f.step)
        tokens.append(f.tokens)
        times.append(f.time)
        loss.append(f.loss)
        gn.append(f.grad_norm)
        lr.append(f.lr)
        ms.append(f.ms)
        tps.append(tokens_per_s(f, prev[0] if prev else None, prev[1] if prev else None))
        for arm, w in f.mixture.items():
            mix.setdefault(arm, [float("nan")] * k).append(w)
        for arm, col in mix.items():
            if len(col) < k + 1:
                col.append(float("nan"))
        prev = (f.step, f.tokens, f.time)
    out = {"n": len(steps), "raw": True, "step": steps, "tokens": round_sig(tokens, 12),
           "time": round_dec(times, 3), "loss": {"mean": round_sig(loss)}, "grad_norm": {"mean": round_sig(gn)},
           "lr": round_sig(lr), "ms": round_sig(ms), "tok_s": round_sig(tps),
           WALL_COL: round_sig(wall_tokens_per_s(tokens, tokens, times, times, before)),
           "mix": {arm: round_sig(col) for arm, col in mix.items()}}
    return out, prev


def evals_payload(evals: list[EvalFields]) -> dict:
    """Eval entries in step order as columns: step, loss, time, arms {name: [...]}."""
    arms: dict[str, list] = {}
    for k, e in enumerate(evals):
        for a, v in e.arms.items():
            arms.setdefault(a, [float("nan")] * k).append(v)
        for a, col in arms.items():
            if len(col) < k + 1:
                col.append(float("nan"))
    return {"n": len(evals), "step": [e.step for e in evals], "loss": round_sig([e.loss for e in evals]),
            "time": round_dec([e.time for e in evals], 3),
            "arms": {a: round_sig(col) for a, col in arms.items()}}


def dumps(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False, ensure_ascii=False).encode("utf-8")


def sanitize(obj, depth: int = 0):
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

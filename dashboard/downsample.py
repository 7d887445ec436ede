"""Min/max bucket downsampling: many rows or blocks into at most `width` buckets.

An `Agg` is a run of buckets. Each bucket knows its first and last step,
tokens and wall time, how many rows it holds, and per value column its min,
max, sum and count of present (non-NaN) values. Single rows are buckets of
one; merging buckets keeps the extremes, so a one-step loss spike survives any
zoom level. Means come from sum/count, so smoothing stays honest too.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
from numpy.typing import ArrayLike

X_FIELDS = ("step0", "step1", "tok0", "tok1", "time0", "time1")


@dataclass
class Agg:
    step0: np.ndarray  # int64 first step
    step1: np.ndarray  # int64 last step
    tok0: np.ndarray  # float64 cumulative tokens at the first/last step
    tok1: np.ndarray
    time0: np.ndarray  # float64 wall time at the first/last step
    time1: np.ndarray
    rows: np.ndarray  # int64 rows in the bucket
    vmin: np.ndarray  # float (n, cols); NaN where no value
    vmax: np.ndarray
    vsum: np.ndarray  # float64 (n, cols); 0 where no value
    vcnt: np.ndarray  # int64 (n, cols)

    def __len__(self) -> int:
        return len(self.step0)

    @property
    def mean(self) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.vcnt > 0, self.vsum / np.maximum(self.vcnt, 1), np.nan)


def empty(cols: int) -> Agg:
    z = np.zeros(0)
    zi = np.zeros(0, dtype=np.int64)
    m = np.zeros((0, cols))
    return Agg(zi, zi, z, z, z, z, zi, m, m, m, np.zeros((0, cols), dtype=np.int64))


def from_rows(step: ArrayLike, tokens: ArrayLike, time: ArrayLike, values: ArrayLike) -> Agg:
    """Buckets of one row each; `values` is (n, cols) with NaN for a missing value."""
    values = np.asarray(values, dtype=np.float64)
    present = ~np.isnan(values)
    step = np.asarray(step, dtype=np.int64)
    return Agg(
        step,
        step,
        np.asarray(tokens, np.float64),
        np.asarray(tokens, np.float64),
        np.asarray(time, np.float64),
        np.asarray(time, np.float64),
        np.ones(len(step), dtype=np.int64),
        values,
        values,
        np.where(present, values, 0.0),
        present.astype(np.int64),
    )


def concat(parts: list[Agg], cols: int) -> Agg:
    parts = [p for p in parts if len(p)]
    if not parts:
        return empty(cols)
    if len(parts) == 1:
        return parts[0]

    def pad(a: np.ndarray, fill: float) -> np.ndarray:
        if a.shape[1] == cols:
            return a
        out = np.full((a.shape[0], cols), fill, dtype=a.dtype)
        out[:, : a.shape[1]] = a
        return out

    return Agg(
        **{f: np.concatenate([getattr(p, f) for p in parts]) for f in X_FIELDS},
        rows=np.concatenate([p.rows for p in parts]),
        vmin=np.concatenate([pad(p.vmin, np.nan) for p in parts]),
        vmax=np.concatenate([pad(p.vmax, np.nan) for p in parts]),
        vsum=np.concatenate([pad(p.vsum, 0.0) for p in parts]),
        vcnt=np.concatenate([pad(p.vcnt, 0) for p in parts]),
    )


def bucket_starts(n: int, width: int) -> np.ndarray:
    """Start indices of at most `width` buckets of nearly equal size over n items."""
    if n <= 0:
        return np.zeros(0, dtype=np.int64)
    width = max(1, min(width, n))
    return np.unique(np.linspace(0, n, width + 1)[:-1].astype(np.int64))


def merge(agg: Agg, width: int) -> Agg:
    """At most `width` buckets, each merging consecutive buckets of `agg`."""
    n = len(agg)
    if n <= width:
        return agg
    starts = bucket_starts(n, width)
    ends = np.append(starts[1:], n) - 1
    with np.errstate(invalid="ignore"):
        vmin = np.fmin.reduceat(agg.vmin, starts, axis=0)
        vmax = np.fmax.reduceat(agg.vmax, starts, axis=0)
    return Agg(
        agg.step0[starts],
        agg.step1[ends],
        agg.tok0[starts],
        agg.tok1[ends],
        agg.time0[starts],
        agg.time1[ends],
        np.add.reduceat(agg.rows, starts),
        vmin,
        vmax,
        np.add.reduceat(agg.vsum, starts, axis=0),
        np.add.reduceat(agg.vcnt, starts, axis=0),
    )


def clip_rows(agg: Agg, first: int, last: int) -> Agg:
    """Only the buckets that overlap steps [first, last]."""
    keep = (agg.step1 >= first) & (agg.step0 <= last)
    if keep.all():
        return agg
    return Agg(**{f.name: getattr(agg, f.name)[keep] for f in fields(Agg)})

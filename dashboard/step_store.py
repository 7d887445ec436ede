"""The training-step series of one run, in memory that stays small as the log grows.

Steps are grouped into blocks of K consecutive steps. For a closed block only
its summary is kept (first/last step, tokens and time; per column min, max,
sum and count) plus the byte span of its lines in `.loss.json`: about 16 bytes
per column per K steps. Full resolution is read back from the log on demand
(a zoomed view), so a million-step run costs a few MiB, not hundreds.

For a step seen twice (a replay after a crash) the last entry wins: the block
that holds it is marked dirty and its summary is recomputed from its byte
spans, read back in file order, the next time it is queried.

Not thread-safe: the owner (RunIndex) serializes access.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from proxy.formats.loss_log import StepFields, step_fields

from . import downsample
from .columns import BASE_COLS, row_values
from .downsample import Agg
from .log_follower import parse_lines

K = 32  # steps per block
SPAN_GAP = 64 << 10  # lines of one block closer than this share one byte span


class StepStore:
    def __init__(self, reader: Callable[[int, int], bytes]):
        self.reader = reader  # (start, end) -> bytes of the log
        self.cols: list[str] = list(BASE_COLS)
        self.colidx = {c: i for i, c in enumerate(self.cols)}
        self._mixcol: dict[str, int] = {}
        self.nb = 0
        self._alloc(256, len(self.cols) + 8)
        self.extra_spans: dict[int, list[list[int]]] = {}
        self.dirty: set[int] = set()
        self.open: dict[int, tuple] = {}  # step -> (tokens, time, values list)
        self.open_start = 0
        self.open_spans: list[list[int]] = []
        self.max_step = -1
        self.prev: tuple[int, float] | None = None
        self.n_steps = 0  # distinct steps seen
        self.first_time: float | None = None

    # ---------------------------------------------------------------- storage

    def _alloc(self, cap: int, ccap: int) -> None:
        self.b_start = np.zeros(cap, dtype=np.int64)
        self.b_x = np.zeros((cap, 6))  # step0, step1, tok0, tok1, time0, time1
        self.b_rows = np.zeros(cap, dtype=np.int64)
        self.b_span = np.zeros((cap, 2), dtype=np.int64)
        self.b_min = np.full((cap, ccap), np.nan, dtype=np.float32)
        self.b_max = np.full((cap, ccap), np.nan, dtype=np.float32)
        self.b_sum = np.zeros((cap, ccap), dtype=np.float32)
        self.b_cnt = np.zeros((cap, ccap), dtype=np.int32)

    def _grow(self, cap: int, ccap: int) -> None:
        old = (self.b_start, self.b_x, self.b_rows, self.b_span, self.b_min, self.b_max, self.b_sum, self.b_cnt)
        self._alloc(cap, ccap)
        n, c = self.nb, old[4].shape[1]
        self.b_start[:n] = old[0][:n]
        self.b_x[:n] = old[1][:n]
        self.b_rows[:n] = old[2][:n]
        self.b_span[:n] = old[3][:n]
        for new, o in zip((self.b_min, self.b_max, self.b_sum, self.b_cnt), old[4:], strict=False):
            new[:n, :c] = o[:n, :c]

    def _col(self, name: str) -> int:
        i = self.colidx.get(name)
        if i is None:
            i = len(self.cols)
            self.cols.append(name)
            self.colidx[name] = i
            if i >= self.b_min.shape[1]:
                self._grow(self.b_min.shape[0], i + 8)
        return i

    def nbytes(self) -> int:
        arrays = (self.b_start, self.b_x, self.b_rows, self.b_span, self.b_min, self.b_max, self.b_sum, self.b_cnt)
        return sum(a.nbytes for a in arrays)

    # ---------------------------------------------------------------- ingest

    def _values(self, f: StepFields, prev: tuple[int, float] | None) -> list[float]:
        vals = row_values(f, prev[0] if prev else None, prev[1] if prev else None)
        if f.mixture:
            mixcol = self._mixcol
            vals.extend([np.nan] * (len(self.cols) - len(vals)))
            for arm, w in f.mixture.items():
                i = mixcol.get(arm)
                if i is None:
                    i = mixcol[arm] = self._col("mix:" + arm)
                    vals.extend([np.nan] * (len(self.cols) - len(vals)))
                vals[i] = w
        return vals

    def add(self, start: int, end: int, obj: dict) -> bool:
        """Take one log line's object; True if it was a usable step entry."""
        f = step_fields(obj)
        if f is None:
            return False
        if self.first_time is None and f.time == f.time:
            self.first_time = f.time
        s = f.step
        if s > self.max_step:
            if len(self.open) >= K:
                self._close_open()
            if not self.open:
                self.open_start = s
            _add_span(self.open_spans, start, end)
            self.open[s] = (f.tokens, f.time, self._values(f, self.prev))
            self.max_step = s
            self.prev = (s, f.tokens)
            self.n_steps += 1
            return True
        # a step seen before (or older than the newest): last entry wins
        if self.nb == 0 or s >= self.open_start:
            if s not in self.open:
                self.n_steps += 1
            before = self.open.get(s - 1)
            self.open[s] = (f.tokens, f.time, self._values(f, (s - 1, before[0]) if before else None))
            self.open_start = min(self.open_start, s) if self.open else s
            _add_span(self.open_spans, start, end)
            return True
        i = max(0, int(np.searchsorted(self.b_start[: self.nb], s, "right")) - 1)
        if s < self.b_start[i]:
            self.b_start[i] = s
        spans = self.extra_spans.setdefault(i, [])
        _add_span(spans, start, end)
        self.dirty.add(i)
        return True

    def _close_open(self) -> None:
        if self.nb >= len(self.b_start):
            self._grow(2 * len(self.b_start), self.b_min.shape[1])
        i = self.nb
        self.b_start[i] = self.open_start
        self._set_block(i, self.open)
        spans = self.open_spans
        self.b_span[i] = spans[0]
        if len(spans) > 1:
            self.extra_spans[i] = spans[1:]
        self.nb += 1
        self.open = {}
        self.open_spans = []

    def _set_block(self, i: int, rows: dict[int, tuple]) -> None:
        agg = self._rows_agg(rows)
        ncol = agg.vmin.shape[1]
        self.b_x[i] = (agg.step0[0], agg.step1[-1], agg.tok0[0], agg.tok1[-1], agg.time0[0], agg.time1[-1])
        self.b_rows[i] = len(agg)
        self.b_min[i] = np.nan
        self.b_max[i] = np.nan
        self.b_sum[i] = 0
        self.b_cnt[i] = 0
        with np.errstate(invalid="ignore"):
            self.b_min[i, :ncol] = np.fmin.reduce(agg.vmin, axis=0)
            self.b_max[i, :ncol] = np.fmax.reduce(agg.vmax, axis=0)
        self.b_sum[i, :ncol] = agg.vsum.sum(axis=0)
        self.b_cnt[i, :ncol] = agg.vcnt.sum(axis=0)

    def _rows_agg(self, rows: dict[int, tuple]) -> Agg:
        steps = sorted(rows)
        ncol = len(self.cols)
        vals = np.full((len(steps), ncol), np.nan)
        for j, s in enumerate(steps):
            v = rows[s][2]
            vals[j, : len(v)] = v
        return downsample.from_rows(
            np.array(steps, dtype=np.int64), [rows[s][0] for s in steps], [rows[s][1] for s in steps], vals
        )

    # ---------------------------------------------------------------- read back

    def _read_rows(self, spans: list[list[int]], lo: int, hi: int) -> dict[int, tuple]:
        """Steps in [lo, hi) from the given byte spans of the log, last entry winning."""
        found: dict[int, StepFields] = {}
        for start, end in _coalesce(spans):
            entries, _ = parse_lines(self.reader(start, end), start)
            for _s, _e, obj in entries:
                f = step_fields(obj)
                if f is not None and lo <= f.step < hi:
                    found[f.step] = f
        rows: dict[int, tuple] = {}
        prev = None
        for s in sorted(found):
            f = found[s]
            rows[s] = (f.tokens, f.time, self._values(f, prev))
            prev = (s, f.tokens)
        return rows

    def _block_spans(self, i: int) -> list[list[int]]:
        return [list(self.b_span[i])] + self.extra_spans.get(i, [])

    def _block_hi(self, i: int) -> int:
        if i + 1 < self.nb:
            return int(self.b_start[i + 1])
        return self.open_start if self.open else 1 << 62

    def _clean(self, i0: int, i1: int) -> None:
        for i in sorted(d for d in self.dirty if i0 <= d <= i1):
            rows = self._read_rows(self._block_spans(i), int(self.b_start[i]), self._block_hi(i))
            if rows:
                self._set_block(i, rows)
            self.dirty.discard(i)

    def _blocks_agg(self, i0: int, i1: int) -> Agg:
        n = self.nb
        if i1 < i0 or n == 0:
            return downsample.empty(len(self.cols))
        c = len(self.cols)
        x = self.b_x[i0 : i1 + 1]
        return Agg(
            x[:, 0].astype(np.int64),
            x[:, 1].astype(np.int64),
            x[:, 2].copy(),
            x[:, 3].copy(),
            x[:, 4].copy(),
            x[:, 5].copy(),
            self.b_rows[i0 : i1 + 1].copy(),
            self.b_min[i0 : i1 + 1, :c].astype(np.float64),
            self.b_max[i0 : i1 + 1, :c].astype(np.float64),
            self.b_sum[i0 : i1 + 1, :c].astype(np.float64),
            self.b_cnt[i0 : i1 + 1, :c].astype(np.int64),
        )

    def query(self, first: int, last: int, width: int, raw_limit: int) -> tuple[Agg, bool]:
        """Steps [first, last] in at most `width` buckets; (agg, True) when every row is its own bucket.

        Up to `raw_limit` rows are read back from the log at full resolution;
        more are summarized from the block summaries.
        """
        ncol = len(self.cols)
        if last < first or (self.nb == 0 and not self.open):
            return downsample.empty(ncol), True
        starts = self.b_start[: self.nb]
        if self.nb and first < self.open_start:
            i0 = max(0, int(np.searchsorted(starts, first, "right")) - 1)
            i1 = int(np.searchsorted(starts, last, "right")) - 1
        else:
            i0, i1 = 0, -1
        use_open = bool(self.open) and last >= self.open_start
        self._clean(i0, i1)
        est = int(self.b_rows[i0 : i1 + 1].sum()) + (len(self.open) if use_open else 0)
        if est <= raw_limit:
            rows: dict[int, tuple] = {}
            if i1 >= i0:
                spans = [sp for i in range(i0, i1 + 1) for sp in self._block_spans(i)]
                rows = self._read_rows(spans, max(first, int(self.b_start[i0])), min(last + 1, self._block_hi(i1)))
            if use_open:
                rows.update({s: r for s, r in self.open.items() if first <= s <= last})
            agg = self._rows_agg(rows) if rows else downsample.empty(ncol)
            return downsample.merge(agg, width), len(agg) <= width
        parts = [self._blocks_agg(i0, i1)]
        if use_open:
            parts.append(self._rows_agg(self.open))
        agg = downsample.concat(parts, ncol)
        agg = downsample.clip_rows(agg, first, last)
        return downsample.merge(agg, width), False

    def rows_agg(self, rows: dict[int, tuple]) -> Agg:
        return self._rows_agg(rows)

    def points_before(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, time) of the last step of each closed block and of each open step before `step`, in step
        order: where the wall-clock rate of a view or a push starting at `step` may start (payload.py)."""
        ends = self.b_x[: self.nb]
        closed = ends[ends[:, 1] < step]
        opened = sorted(s for s in self.open if s < step)
        tokens = np.concatenate([closed[:, 3], np.array([self.open[s][0] for s in opened], dtype=np.float64)])
        times = np.concatenate([closed[:, 5], np.array([self.open[s][1] for s in opened], dtype=np.float64)])
        return tokens, times

    def first_step(self) -> int | None:
        if self.nb:
            return int(min(self.b_start[0], self.b_x[0, 0]))
        return min(self.open) if self.open else None


def _add_span(spans: list[list[int]], start: int, end: int) -> None:
    if spans and 0 <= start - spans[-1][1] <= SPAN_GAP:
        spans[-1][1] = end
    else:
        spans.append([start, end])


def _coalesce(spans: list[list[int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for s, e in sorted((int(a), int(b)) for a, b in spans):
        if out and s <= out[-1][1] + SPAN_GAP:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]

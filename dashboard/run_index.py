"""Everything the dashboard knows about one run directory, kept current by refresh().

refresh() is called from the watcher thread (dashboard.watch); queries come
from request threads. One lock serializes them; the log is ingested a chunk
at a time, and between chunks the refresher steps aside for every query
already waiting (a lock alone is not fair: the refresher would take it back at
once), so a query waits at most one chunk while a long history is indexed,
and answers with what is indexed so far (`indexed` false until caught up).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from proxy.formats.loss_log import EvalFields, eval_fields
from proxy.rundir.layout import EXPERIMENT, LOSS_LOG, OVERRIDES, PHASES, SAMPLES, STATE

from . import payload, sidecars
from .log_follower import LogFollower, read_range
from .run_files import stat_sig
from .step_store import StepStore

MAX_EVALS_SENT = 20000
# A view of at most max(RAW_PER_BUCKET * width, RAW_MIN) rows (and never more than
# RAW_MAX) is read back from the log at full resolution; a wider one is summarized
# from the block summaries (K steps each).
RAW_PER_BUCKET = 3
RAW_MIN = 6000
RAW_MAX = 12000

SIDECAR_KINDS = ("state", "phases", "samples", "experiment", "overrides", "checkpoints")
_FILES = {"state": STATE, "phases": PHASES, "samples": SAMPLES, "experiment": EXPERIMENT, "overrides": OVERRIDES}
_READERS = {
    "state": sidecars.read_state,
    "phases": sidecars.read_phases,
    "samples": sidecars.read_samples,
    "experiment": sidecars.read_experiment,
    "overrides": sidecars.read_overrides,
}


class RunIndex:
    def __init__(self, index: int, name: str, root: Path):
        self.index = index
        self.name = name
        self.root = Path(root)
        self.lock = threading.Lock()
        self._waiting = 0  # queries waiting for the lock; the refresher lets them go first
        self._waiting_lock = threading.Lock()
        self.follower = LogFollower(self.root, LOSS_LOG)
        self.store = StepStore(self.read_log)
        self.evals: dict[int, EvalFields] = {}
        self.generation = 1
        self.lines = 0  # usable entries ingested
        self.indexed = False  # caught up with the log at least once
        self.index_seconds: float | None = None
        self._index_started = time.monotonic()
        self.side: dict = {k: None for k in SIDECAR_KINDS}
        self.side["checkpoints"] = []
        self.sigs: dict = {}
        self.versions = {k: 0 for k in SIDECAR_KINDS}
        # what position() and sidecar() return: replaced whole (one assignment) under the lock, read without it
        self._position = (self.generation, 0)
        self._published = {k: (self.side[k], 0) for k in SIDECAR_KINDS}

    @contextmanager
    def _query(self) -> Iterator[None]:
        """The lock, for a query: counted as waiting, so that refresh_log lets it in after the chunk in hand."""
        with self._waiting_lock:
            self._waiting += 1
        try:
            self.lock.acquire()
        finally:
            with self._waiting_lock:
                self._waiting -= 1
        try:
            yield
        finally:
            self.lock.release()

    def _let_queries_in(self) -> None:
        """Between two chunks: wait until every query that waits for the lock has taken it."""
        while self._waiting:
            time.sleep(0.0005)

    def read_log(self, start: int, end: int) -> bytes:
        """Bytes [start, end) of the run's log."""
        return read_range(self.root, LOSS_LOG, start, end)

    # ---------------------------------------------------------------- refresh

    def _reset(self) -> None:
        self.store = StepStore(self.read_log)
        self.evals = {}
        self.lines = 0
        self.generation += 1

    def refresh_log(self) -> bool:
        """Ingest every complete new line; True if anything changed."""
        changed = False
        while True:
            with self.lock:
                chunk = self.follower.poll()
                if chunk.reset:
                    self._reset()
                    changed = True
                store = self.store
                for start, end, obj in chunk.entries:
                    if store.add(start, end, obj):
                        self.lines += 1
                    else:
                        e = eval_fields(obj)
                        if e is not None:
                            self.evals[e.step] = e
                            self.lines += 1
                if chunk.end != chunk.start:
                    changed = True
                self._position = (self.generation, self.follower.offset)
                done = (chunk.end == chunk.start and not chunk.scanned) or self.follower.caught_up()
                if done and not self.indexed:
                    self.indexed = True
                    self.index_seconds = time.monotonic() - self._index_started
            if done:
                return changed
            self._let_queries_in()

    def refresh_sidecars(self) -> set[str]:
        """Re-read the small files whose inode, size or mtime changed; the kinds that changed."""
        changed = set()
        for kind, name in _FILES.items():
            sig = stat_sig(self.root, name)
            if sig == self.sigs.get(kind, ()):
                continue
            value = _READERS[kind](self.root) if sig is not None else None
            if value is None and sig is not None and self.side[kind] is not None:
                continue  # unreadable right now (mid-write by a non-atomic writer): keep the last good copy
            with self.lock:
                self.sigs[kind] = sig
                self.side[kind] = payload.sanitize(value)
                self.versions[kind] += 1
                self._published[kind] = (self.side[kind], self.versions[kind])
            changed.add(kind)
        ck = sidecars.list_checkpoints(self.root)
        sig = tuple((c["name"], c["bytes"], c["mtime"]) for c in ck)
        if sig != self.sigs.get("checkpoints"):
            with self.lock:
                self.sigs["checkpoints"] = sig
                self.side["checkpoints"] = ck
                self.versions["checkpoints"] += 1
                self._published["checkpoints"] = (ck, self.versions["checkpoints"])
            changed.add("checkpoints")
        return changed

    # ---------------------------------------------------------------- queries

    def position(self) -> tuple[int, int]:
        """(generation, committed offset), without waiting for the lock: the event loop asks for it."""
        return self._position

    def info(self) -> dict:
        with self._query():
            st = self.store
            exp = self.side["experiment"] or {}
            arms = [c[4:] for c in st.cols if c.startswith("mix:")]
            for p in self.side["phases"] or []:
                for a in list(p.get("caps") or {}) if isinstance(p.get("caps"), dict) else []:
                    if a not in arms:
                        arms.append(a)
            return {
                "index": self.index,
                "name": self.name,
                "experiment": exp.get("name") if isinstance(exp.get("name"), str) else None,
                "max_steps": _max_steps(exp),
                "generation": self.generation,
                "offset": self.follower.offset,
                "size": self.follower.size,
                "indexed": self.indexed,
                "index_seconds": self.index_seconds,
                "steps": st.n_steps,
                "first_step": st.first_step(),
                "last_step": st.max_step if st.max_step >= 0 else None,
                "t0": st.first_time,
                "evals": len(self.evals),
                "arms": arms,
                "memory_bytes": st.nbytes(),
            }

    def series(self, first: int | None, last: int | None, width: int) -> dict:
        with self._query():
            st = self.store
            lo = st.first_step()
            hi = st.max_step
            if lo is None:  # nothing stored yet
                first = last = 0
            else:
                first = lo if first is None else first
                last = hi if last is None else last
            raw_limit = min(RAW_MAX, max(RAW_PER_BUCKET * width, RAW_MIN))
            agg, raw = st.query(int(first), int(last), width, raw_limit)
            before = st.points_before(int(agg.step0[0])) if len(agg) else None
            out = payload.agg_payload(agg, st.cols, raw, before)
            out.update(
                run=self.index,
                generation=self.generation,
                offset=self.follower.offset,
                first=first,
                last=last,
                width=width,
                total_steps=st.n_steps,
                t0=st.first_time,
                last_step=hi if hi >= 0 else None,
            )
            return out

    def wall_window(self, step: int) -> payload.WallWindow:
        """The history a live stream rates the wall clock of steps from `step` on with."""
        with self._query():
            return payload.WallWindow(*self.store.points_before(step))

    def evals_payload(self) -> dict:
        with self._query():
            evals = [self.evals[s] for s in sorted(self.evals)]
            gen, off = self.generation, self.follower.offset
        if len(evals) > MAX_EVALS_SENT:
            stride = -(-len(evals) // MAX_EVALS_SENT)
            evals = evals[::-1][::stride][::-1]
        out = payload.evals_payload(evals)
        out.update(run=self.index, generation=gen, offset=off)
        return out

    def sidecar(self, kind: str) -> tuple[Any, int]:
        """(value, version) of a sidecar, without waiting for the lock: the event loop asks for it."""
        return self._published[kind]


def _max_steps(exp: dict) -> int | None:
    for key in ("max_steps", "steps"):
        v = exp.get(key)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    for sub in ("train", "training", "schedule", "engine"):
        d = exp.get(sub)
        if isinstance(d, dict):
            for key in ("max_steps", "steps"):
                v = d.get(key)
                if isinstance(v, int) and not isinstance(v, bool):
                    return v
    return None

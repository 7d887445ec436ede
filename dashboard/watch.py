"""Watchdog glue: wake the refresher when a run directory changes.

One background thread owns every refresh (log ingest, sidecar re-reads). A
watchdog observer on each run directory wakes it at once when `.loss.json`
grows, `.state.json` / `phases.json` / `.samples.json` are replaced (the
writers rename a temp file over them, so the event that matters is a move
whose destination is the sidecar), or a checkpoint appears. A slow poll (every
`poll_s`) backs the events up, so a missed event (inotify limits, network file
systems, a directory that did not exist yet) costs at most that long.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver

from proxy.rundir.layout import CHECKPOINTS, EXPERIMENT, LOSS_LOG, OVERRIDES, PHASES, SAMPLES, STATE

from .run_index import RunIndex

log = logging.getLogger("dashboard")

SIDE_NAMES = {STATE, PHASES, SAMPLES, EXPERIMENT, OVERRIDES}


def classify(root: str, path: str) -> str | None:
    """ "log", "side" or None (ignored: temp files, engine.log, ...) for a changed path."""
    if not path:
        return None
    rel = os.path.relpath(path, root)
    if rel == LOSS_LOG:
        return "log"
    if rel in SIDE_NAMES or rel == CHECKPOINTS:
        return "side"
    parts = rel.split(os.sep)
    if len(parts) == 2 and parts[0] == CHECKPOINTS and not parts[1].endswith(".tmp"):
        return "side"
    return None


class _Handler(FileSystemEventHandler):
    def __init__(self, watcher: Watcher, idx: int, root: str):
        self.watcher, self.idx, self.root = watcher, idx, root

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.event_type in ("opened", "closed_no_write"):
            return
        found = (
            classify(self.root, os.fsdecode(event.src_path)),
            classify(self.root, os.fsdecode(getattr(event, "dest_path", "") or "")),
        )
        kinds = {kind for kind in found if kind is not None}
        if kinds:
            self.watcher.wake(self.idx, kinds)


class Watcher:
    """Refreshes `runs` on change events and every `poll_s`; calls on_change(idx, kinds) after."""

    def __init__(self, runs: list[RunIndex], on_change: Callable[[int, set[str]], None], poll_s: float = 1.0):
        self.runs = runs
        self.on_change = on_change
        self.poll_s = poll_s
        self._cv = threading.Condition()
        self._pending: dict[int, set[str]] = {}
        self._stop = False
        self._observer: BaseObserver | None = None
        self._scheduled: set[int] = set()
        self._thread = threading.Thread(target=self._loop, name="dashboard-watch", daemon=True)

    def wake(self, idx: int, kinds: set[str]) -> None:
        with self._cv:
            self._pending.setdefault(idx, set()).update(kinds)
            self._cv.notify()

    def start(self) -> None:
        try:
            observer = Observer()
            observer.daemon = True
            observer.start()
            self._observer = observer
        except Exception as exc:  # noqa: BLE001 - no inotify (limits, a file system without it): poll, say why
            log.warning("dashboard: file events unavailable (%s); polling every %.1fs", exc, self.poll_s)
            self._observer = None
        self._schedule_missing()
        self._thread.start()

    def stop(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=2)
        self._thread.join(timeout=5)

    def _schedule_missing(self) -> None:
        if self._observer is None:
            return
        for run in self.runs:
            if run.index in self._scheduled or not Path(run.root).is_dir():
                continue
            try:
                self._observer.schedule(_Handler(self, run.index, str(run.root)), str(run.root), recursive=True)
                self._scheduled.add(run.index)
            except Exception as exc:  # noqa: BLE001
                log.warning("dashboard: cannot watch %s (%s); polling", run.root, exc)
                self._scheduled.add(run.index)  # do not retry every poll

    def _refresh(self, run: RunIndex, kinds: set[str]) -> None:
        changed: set[str] = set()
        try:
            if "log" in kinds and run.refresh_log():
                changed.add("log")
            if "side" in kinds:
                changed |= run.refresh_sidecars()
        except Exception:  # noqa: BLE001 - one bad read must not stop the dashboard
            log.exception("dashboard: refreshing run %s failed", run.name)
        if changed:
            self.on_change(run.index, changed)

    def _loop(self) -> None:
        everything = {"log", "side"}
        for run in self.runs:  # sidecars first: they are small, the page can show status at once
            self._refresh(run, {"side"})
        for run in self.runs:
            self._refresh(run, {"log"})
        last_poll = time.monotonic()
        while True:
            with self._cv:
                wait = last_poll + self.poll_s - time.monotonic()
                if not self._pending and not self._stop and wait > 0:
                    self._cv.wait(wait)
                if self._stop:
                    return
                pending, self._pending = self._pending, {}
            for idx, kinds in pending.items():
                self._refresh(self.runs[idx], kinds)
            if time.monotonic() - last_poll >= self.poll_s:  # backstop for missed events
                last_poll = time.monotonic()
                self._schedule_missing()
                for run in self.runs:
                    self._refresh(run, everything)

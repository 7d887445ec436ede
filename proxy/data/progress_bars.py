"""Progress of data preparation on stderr, drawn by tqdm.

On a terminal each task is a tqdm bar. Anywhere else (a log file, a pipe) a
task prints tqdm's line, in plain ASCII, every 2 seconds while it runs and
once when it ends, so logs stay short and readable.
"""

from __future__ import annotations

import io
import sys
import time
from types import TracebackType
from typing import Any, TextIO

from tqdm import tqdm

from ..stop_signals import held

LOG_EVERY_S = 2.0  # not a terminal: at most one line per task this often while it runs
# tqdm's monitor thread (it redraws bars that stall) is not needed here, and starting it catches any
# exception, a stop signal's included (supervision/signals.py)
tqdm.monitor_interval = 0
# tqdm's own work runs with the stop signals held (a bar made half when a stop signal's handler raises prints
# a traceback when it is collected); they come right after.


class ProgressBar:
    """One step of the preparation: `advance(n)` as work is done, `done(note)` at the end."""

    def __init__(self, progress: ProgressBars, label: str, total: float | None, unit: str):
        self.p = progress
        self.live = progress.enabled and progress.tty
        options: dict[str, Any] = dict(
            total=total,
            desc=label,
            unit=unit or "it",
            unit_scale=bool(unit),
            unit_divisor=1024 if unit == "B" else 1000,
            leave=True,
        )
        if total is None:  # no amount to show: the label, the time taken and the note
            options["bar_format"] = "{desc}  {elapsed}{postfix}"
        # off a terminal tqdm draws into nothing; the lines are printed here
        with held():
            self.bar = tqdm(
                file=progress.stream if self.live else io.StringIO(),
                ascii=not self.live,
                disable=not progress.enabled,
                **options,
            )
        self.last_line = time.monotonic()
        self.closed = False

    def _line(self) -> None:
        self.last_line = time.monotonic()
        with held():
            line = str(self.bar)
        self.p.write(line + "\n")

    def advance(self, n: float = 1) -> None:
        with held():
            self.bar.update(n)
        if self.p.enabled and not self.live and time.monotonic() - self.last_line >= LOG_EVERY_S:
            self._line()

    def done(self, note: str = "") -> None:
        if self.closed:
            return
        self.closed = True
        with held():
            if self.bar.total:
                self.bar.update(max(0, self.bar.total - self.bar.n))
            if note:
                self.bar.set_postfix_str(note, refresh=False)
        if self.p.enabled and not self.live:
            self._line()
        with held():
            self.bar.close()

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.done()
        elif not self.closed:
            self.closed = True
            with held():
                self.bar.close()
            if self.p.enabled:
                self.p.write(f"{self.bar.desc}: failed\n")


class ProgressBars:
    """`ProgressBars(enabled)`; `with progress.task("encoding x", total=n, unit="B") as t: t.advance(k)`."""

    def __init__(self, enabled: bool = True, stream: TextIO | None = None):
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        try:
            self.tty = bool(self.stream.isatty())
        except (AttributeError, ValueError):
            self.tty = False

    def write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):
            pass

    def task(self, label: str, total: float | None = None, unit: str = "") -> ProgressBar:
        return ProgressBar(self, label, total, unit)

    def note(self, text: str) -> None:
        if self.enabled:
            self.write(text + "\n")

"""A plain-text progress bar on stderr (no ANSI codes, no dependencies).

On a terminal one line is redrawn with a carriage return; anywhere else (a
log file, a pipe) a task prints its bar every 2 seconds while it runs and once
when it ends, so logs stay short and readable.
"""
from __future__ import annotations

import sys
import time
from typing import Optional, TextIO

WIDTH = 24


def _human(n: float, unit: str) -> str:
    if unit == "B":
        for scale, suffix in ((1 << 30, "GB"), (1 << 20, "MB"), (1 << 10, "KB")):
            if n >= scale:
                return f"{n / scale:.1f} {suffix}"
        return f"{int(n)} B"
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.2f}{suffix}{(' ' + unit) if unit else ''}"
    return f"{int(n)}{(' ' + unit) if unit else ''}"


class Task:
    def __init__(self, progress: "Progress", label: str, total: Optional[float], unit: str):
        self.p, self.label, self.total, self.unit = progress, label, total, unit
        self.done_n = 0.0
        self.t0 = time.monotonic()
        self._last_draw = self.t0 if not progress.tty else 0.0
        self._closed = False
        self._draw(force=True)

    def advance(self, n: float = 1) -> None:
        self.done_n += n
        self._draw()

    def _line(self, final: bool = False, note: str = "") -> str:
        elapsed = time.monotonic() - self.t0
        if self.total:
            frac = min(1.0, self.done_n / self.total) if self.total else 1.0
            fill = int(round(frac * WIDTH))
            bar = "[" + "#" * fill + "." * (WIDTH - fill) + "]"
            amount = f"{_human(self.done_n, self.unit)}/{_human(self.total, self.unit)}"
            text = f"{self.label:<34} {bar} {frac * 100:3.0f}%  {amount}  {elapsed:.1f}s"
        else:
            text = f"{self.label:<34} {'[' + ('#' * WIDTH if final else '.' * WIDTH) + ']'}  {elapsed:.1f}s"
        if note:
            text += f"  {note}"
        return text

    def _draw(self, force: bool = False) -> None:
        if not self.p.enabled or self._closed:
            return
        now = time.monotonic()
        if self.p.tty:
            if force or now - self._last_draw >= 0.1:
                self._last_draw = now
                self.p.write("\r" + self._line())
        elif not force and now - self._last_draw >= 2.0:  # a log: a line every 2 s at most, none at start
            self._last_draw = now
            self.p.write(self._line() + "\n")

    def done(self, note: str = "") -> None:
        if self._closed:
            return
        if self.total:
            self.done_n = max(self.done_n, self.total)
        if self.p.enabled:
            line = self._line(final=True, note=note)
            self.p.write(("\r" + line + "\n") if self.p.tty else line + "\n")
        self._closed = True

    def __enter__(self) -> "Task":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.done()
        elif self.p.enabled and not self._closed:
            self._closed = True
            self.p.write(("\n" if self.p.tty else "") + f"{self.label}: failed\n")


class Progress:
    """`Progress(enabled)`; `with progress.task("encoding x", total=n, unit="B") as t: t.advance(k)`."""

    def __init__(self, enabled: bool = True, stream: Optional[TextIO] = None):
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

    def task(self, label: str, total: Optional[float] = None, unit: str = "") -> Task:
        return Task(self, label, total, unit)

    def note(self, text: str) -> None:
        if self.enabled:
            self.write(text + "\n")

"""best.bin, copied off the event loop.

Copying a 150 MB checkpoint takes about a second. The event loop must keep
feeding TRAIN frames meanwhile: at most `lag` are in flight, so a fast engine
would wait for its next frame for as long as the copy lasts. So one copy at a
time runs in a worker thread; the event loop records the new best once the
copy is durable (`collect`, `wait`), and retention leaves the checkpoint being
copied alone (`busy_step`).

A copy that fails for lack of space or an I/O error (StorageError) stops the
run as any failed write of the proxy does (exit 5), raised again on the event
loop; any other failure (an unreadable or unsafe source) leaves best.bin as it
was, with one warning.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from ..errors import StorageError
from ..rundir.retention import copy_best
from ..safe_fs import UnsafeFileError
from .report import RunReport


class BestCopier:
    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self.job: tuple[int, float] | None = None  # (step, loss) being copied
        self._best: Path | None = None
        self._error: OSError | UnsafeFileError | StorageError | None = None

    @property
    def busy_step(self) -> int | None:
        return self.job[0] if self.job is not None else None

    def start(self, step: int, loss: float, source: Path, best: Path) -> None:
        """Copy `source` (the checkpoint of `step`, validation loss `loss`) over `best` in the background.
        The caller waits for any copy in flight first."""

        def copy() -> None:
            try:
                copy_best(source, best)
            except (OSError, UnsafeFileError, StorageError) as exc:
                self._error = exc

        self.job, self._best, self._error = (step, loss), best, None
        self._thread = threading.Thread(target=copy, name="best.bin copy", daemon=True)
        self._thread.start()

    def collect(self, report: RunReport, warn: Callable[[str], None]) -> None:
        """A finished copy: record the new best in the report, or say why best.bin is unchanged."""
        if self._thread is None or self._thread.is_alive() or self.job is None:
            return
        self._thread.join()
        (step, loss), error, best = self.job, self._error, self._best
        self._thread, self.job, self._error = None, None, None
        if isinstance(error, StorageError):
            raise error
        if error is not None:
            warn(f"cannot update {best}: {error}")
        else:
            report.new_best(step, loss)

    def wait(self, report: RunReport, warn: Callable[[str], None]) -> None:
        """Wait for the copy in flight, if any, and collect it."""
        if self._thread is not None:
            self._thread.join()
        self.collect(report, warn)

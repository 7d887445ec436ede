"""safe_fs.open_fd under stop signals whose handler raises wherever it lands (supervision/signals.py)."""

from __future__ import annotations

import gc
import os
import signal
import threading
import time

from proxy import safe_fs


class Landed(Exception):
    """What the test's handler raises where a signal lands."""


def test_a_stop_signal_landing_in_open_fd_never_closes_another_files_descriptor(tmp_path):
    """SIGHUP sent to the main thread every few microseconds while it opens files: each open either returns
    a file or raises the handler's exception; never EBADF (a descriptor closed twice, the second time under
    a file that reused the number), and no descriptor is left open."""
    path = tmp_path / "text.txt"
    path.write_bytes(b"some text")
    armed = [False]

    def handler(_signum, _frame):
        if armed[0]:
            armed[0] = False
            raise Landed()

    old = signal.signal(signal.SIGHUP, handler)
    main, stop = threading.main_thread().ident, threading.Event()

    def storm() -> None:
        while not stop.is_set():
            signal.pthread_kill(main, signal.SIGHUP)
            time.sleep(20e-6)

    before = len(os.listdir("/proc/self/fd"))
    sender = threading.Thread(target=storm)
    outcomes = {"opened": 0, "interrupted": 0}
    errors: list[str] = []
    sender.start()
    try:
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            try:
                armed[0] = True
                f = safe_fs.open_fd(path, safe_fs.READ_FLAGS, None)
                armed[0] = False
                with f:
                    if f.read() != b"some text":
                        errors.append("read other bytes")
                outcomes["opened"] += 1
            except Landed:
                outcomes["interrupted"] += 1
            except OSError as exc:
                errors.append(exc.strerror or str(exc))
    finally:
        armed[0] = False
        stop.set()
        sender.join()
        signal.signal(signal.SIGHUP, old)
    gc.collect()
    assert outcomes["opened"] > 0 and outcomes["interrupted"] > 0, outcomes
    assert errors == [], f"{len(errors)} errors, first {errors[0]!r} ({outcomes})"
    assert len(os.listdir("/proc/self/fd")) == before, "descriptors left open"

"""The signals that ask `proxy run` to stop, and a block of code they wait for.

Until training starts their handler raises wherever it lands (supervision/signals.py). A few steps
must not be cut in two by that: a descriptor between open(2) and the file object that owns it, a
tqdm bar half made. Those run `with held():`; a signal that comes meanwhile is delivered right after.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@contextmanager
def held() -> Iterator[None]:
    """The stop signals wait (in this thread, the one Python runs handlers in) until the block ends."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)

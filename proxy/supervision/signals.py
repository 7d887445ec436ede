"""Signals to `proxy run`, counted: the handlers only count, the loop acts (docs/CLI.md, "Signals").

SIGTERM/SIGINT/SIGHUP ask the run to stop (a second sends SIGTERM to the
engine, a third kills it), SIGUSR1 asks for a checkpoint, SIGUSR2 says `proxy
pivot` left a request. SIGUSR1 and SIGUSR2 are counted from the moment the
process holds the run's lock (their default action would end it); the stop
signals once the supervisor runs. Before that (loading, preparing data) a stop
signal interrupts the setup: `interrupt` raises a ProxyError where the signal
lands, so every `finally` on the way out runs (the data cache's temp
directory is removed) and the command ends with one line and exit 130. A
library may catch any exception where it lands (tqdm does while it starts a
thread), so the signal is also remembered, and `check_interrupted` raises
it again before training starts.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable
from dataclasses import dataclass
from types import FrameType

from ..errors import EXIT_INTERRUPTED, ProxyError
from ..stop_signals import STOP_SIGNALS

STOPS = STOP_SIGNALS
EARLY = (signal.SIGUSR1, signal.SIGUSR2)
ALL = STOPS + EARLY


_interrupted: list[int] = []  # the stop signals `interrupt` took (the first one names the interruption)


def _interruption(signum: int) -> ProxyError:
    return ProxyError(
        f"interrupted by {signal.Signals(signum).name} before training started; nothing was "
        "trained in this launch (relaunch the same command to start again)",
        EXIT_INTERRUPTED,
    )


def interrupt(signum: int, _frame: FrameType | None) -> None:
    """The stop signals' handler until training starts: end the setup where it is, with one line."""
    _interrupted.append(signum)
    raise _interruption(signum)


def check_interrupted() -> None:
    """The interruption again, if a stop signal came during the setup and its ProxyError was swallowed."""
    if _interrupted:
        raise _interruption(_interrupted[0])


def install_interrupt() -> dict:
    """Stop signals interrupt the setup from now on; returns the handlers they replace (for restore)."""
    return {sig: signal.signal(sig, interrupt) for sig in STOPS}


def default_stops() -> None:
    """Stop signals act as by default again (the run is over; nothing is left to interrupt cleanly)."""
    for sig in STOPS:
        signal.signal(sig, signal.SIG_DFL)


@dataclass
class SignalCounts:
    stop: int = 0  # SIGTERM, SIGINT
    checkpoint: int = 0  # SIGUSR1
    pivot: int = 0  # SIGUSR2

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if signum == signal.SIGUSR1:
            self.checkpoint += 1
        elif signum == signal.SIGUSR2:
            self.pivot += 1
        else:
            self.stop += 1

    def take_checkpoint(self) -> bool:
        """One SIGUSR1 not yet acted on, now taken by the loop (False: none left)."""
        if not self.checkpoint:
            return False
        self.checkpoint -= 1
        return True

    def take_pivot(self) -> bool:
        """One SIGUSR2 not yet acted on, now taken by the pivot desk (False: none left)."""
        if not self.pivot:
            return False
        self.pivot -= 1
        return True

    def install(self, signals: Iterable[int] = ALL) -> dict:
        """Count `signals` from now on; returns the handlers they replace (for restore)."""
        return {sig: signal.signal(sig, self._on_signal) for sig in signals}

    @staticmethod
    def restore(old: dict) -> None:
        for sig, handler in old.items():
            signal.signal(sig, handler)

"""Signals to `proxy run`, counted: the handlers only count, the loop acts (docs/CLI.md, "Signals").

SIGTERM/SIGINT ask the run to stop (a second sends SIGTERM to the engine,
a third kills it), SIGUSR1 asks for a checkpoint, SIGUSR2 says `proxy pivot`
left a request. SIGUSR1 and SIGUSR2 are counted from the moment the process
holds the run's lock (their default action would end it); the rest once
the supervisor runs.
"""
from __future__ import annotations

import signal
from dataclasses import dataclass

EARLY = (signal.SIGUSR1, signal.SIGUSR2)
ALL = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)


@dataclass
class SignalCounts:
    stop: int = 0  # SIGTERM, SIGINT
    checkpoint: int = 0  # SIGUSR1
    pivot: int = 0  # SIGUSR2

    def _on_signal(self, signum, _frame) -> None:
        if signum == signal.SIGUSR1:
            self.checkpoint += 1
        elif signum == signal.SIGUSR2:
            self.pivot += 1
        else:
            self.stop += 1

    def install(self, signals=ALL) -> dict:
        """Count `signals` from now on; returns the handlers they replace (for restore)."""
        return {sig: signal.signal(sig, self._on_signal) for sig in signals}

    @staticmethod
    def restore(old: dict) -> None:
        for sig, handler in old.items():
            signal.signal(sig, handler)

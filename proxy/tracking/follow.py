"""The tracker's loop: poll the run's records, hand what is new to each sink, make it durable, repeat.

A sink that fails (to open, to write) is reported in one line and dropped;
the others go on, and training never notices: the tracker is a process of its
own (launch.py). The end of its stdin (the proxy is done, or died) or SIGTERM
ends the loop after one last poll, so the sinks hold every step the run logged.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..config.experiment import Experiment
from ..errors import one_line
from ..rundir.layout import RunDir
from .records import RunRecords

if TYPE_CHECKING:  # each sink's module is imported only when the experiment asks for it (open_sinks)
    from .tensorboard_sink import TensorBoardSink
    from .wandb_sink import WandbSink

    Sink = TensorBoardSink | WandbSink

POLL_S = 2.0


def open_sinks(run: RunDir, experiment: Experiment, warn: Callable[[str], object]) -> list[Sink]:
    sinks: list[Sink] = []  # a TensorBoardSink, a WandbSink, each imported only when the experiment asks for it
    if experiment.log.tensorboard:
        try:
            from .tensorboard_sink import TensorBoardSink

            sinks.append(TensorBoardSink(run.tensorboard))
        except Exception as exc:  # the tensorboard package missing, a bad directory: one line, no tracking there
            warn(f"tensorboard: {one_line(exc)}; not logging to TensorBoard")
    if experiment.log.wandb is not None:
        try:
            from .wandb_sink import WandbSink

            sinks.append(WandbSink(run, experiment.log.wandb, experiment.model_dump(mode="json")))
        except Exception as exc:
            warn(f"wandb: {one_line(exc)}; not logging to W&B")
    return sinks


class Tracker:
    def __init__(self, run: RunDir, sinks: list[Sink], warn: Callable[[str], object]) -> None:
        self.records = RunRecords(run)
        self.sinks = sinks
        self.warn = warn
        self.stopping = False

    def sweep(self) -> None:
        points = self.records.poll()
        for sink in list(self.sinks):
            try:
                if points:
                    sink.write(points)
                    sink.commit()
            except Exception as exc:
                self.warn(f"{sink.name}: {one_line(exc)}; no more logging there")
                self.sinks.remove(sink)

    def run_forever(self, poll_s: float = POLL_S) -> None:
        while self.sinks:
            self.sweep()
            if self.stopping:
                break
            deadline = time.monotonic() + poll_s
            while not self.stopping and time.monotonic() < deadline:
                time.sleep(0.1)
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as exc:
                self.warn(f"{sink.name}: {one_line(exc)} while closing")

    def use(self, sinks: list[Sink]) -> None:
        self.sinks = sinks

    def stop(self, *_args: object) -> None:
        self.stopping = True


def warn(message: str) -> None:
    print(f"tracker: {message}", file=sys.stderr, flush=True)


def _stop_at_end_of_input(tracker: Tracker) -> None:
    """The proxy holds the other end of stdin: its end (a close, or the proxy's death) stops the tracker."""

    def wait() -> None:
        try:
            while sys.stdin.buffer.read(4096):
                pass
        except (OSError, ValueError):
            pass
        tracker.stop()

    threading.Thread(target=wait, name="stdin", daemon=True).start()


def follow(run: RunDir, experiment: Experiment) -> int:
    tracker = Tracker(run, [], warn)
    # before the sinks open (wandb takes seconds): a run that ends meanwhile still gets its last sweep
    _stop_at_end_of_input(tracker)
    signal.signal(signal.SIGTERM, tracker.stop)
    signal.signal(signal.SIGINT, tracker.stop)
    tracker.use(open_sinks(run, experiment, warn))
    signal.signal(signal.SIGTERM, tracker.stop)  # again: a library may have put in a handler of its own
    tracker.run_forever()
    return 0

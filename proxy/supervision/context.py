"""What one `proxy run` shares between its parts: the run's fixed inputs and its state across engine launches.

The loop (loop.py), a launch (launcher.py), the event handlers (events.py),
the pivot desk (pivot_desk.py) and the live status (live_status.py) all take this one
object, so every piece of state has one owner and is visible in one place.
The fields that change while the run goes on (the bandit, caps and floors, the
phases, `.samples.json`, the launch number, refused checkpoints, evaluation
losses) change only through RunContext's own methods.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from ..bandit import Bandit, bandit_for_phase
from ..config.experiment import Experiment, TrainConfig
from ..data.batches import BatchSampler
from ..formats.loss_log import LossLogWriter
from ..formats.samples import SamplesFile
from ..rundir.identity import RunIdentity
from ..rundir.layout import RunDir
from ..rundir.lock import RunLock
from ..rundir.phases import Phase, read_phases
from ..rundir.retention import RetentionPolicy
from .best_copier import BestCopier
from .engine_process import EngineChoice
from .report import RunReport
from .run_data import RunData  # noqa: F401 - the type of RunContext.data
from .signals import SignalCounts


@dataclass
class SupervisorOptions:
    hang_timeout: float | None = None  # seconds without an event before the engine counts as hung
    max_failures: int = 5  # consecutive engine failures without progress before giving up
    backoff_s: float = 1.0  # first restart delay; doubles per failure
    backoff_max_s: float = 60.0
    orphan_grace_s: float = 60.0  # how long an engine left by a killed proxy may take to exit
    state_every_s: float = 2.0
    fsync_every_s: float = 5.0
    samples_kept: int = 50


class Console:
    """Progress on stdout; warnings on stderr, each line starting `proxy: `."""

    def __init__(self, out: TextIO | None = None, err: TextIO | None = None) -> None:
        self.out = out or sys.stdout
        self.err = err or sys.stderr

    def say(self, line: str) -> None:
        print(line, file=self.out, flush=True)

    def warn(self, line: str) -> None:
        print(f"proxy: {line}", file=self.err, flush=True)


@dataclass
class RunContext:
    experiment: Experiment
    run: RunDir
    data: RunData  # the tokenizer, the training and validation tokens (run_data.py)
    engine_choice: EngineChoice
    opts: SupervisorOptions
    console: Console
    signals: SignalCounts
    sampler: BatchSampler
    prompts: list[tuple[str, list[int]]]  # (text, token ids) of each sample prompt
    phases: list[Phase]  # phases.json; the last is the current phase
    writer: LossLogWriter
    samples: SamplesFile
    report: RunReport
    retention: RetentionPolicy
    lock: RunLock  # held for the whole run; `lock.check()` stops it if the directory is replaced
    identity: RunIdentity  # the run id every engine record of this run carries
    row_spread: dict[str, float] = field(default_factory=dict)  # each target arm's (data/row_spread.py)
    unigram_gap: dict[str, float] = field(default_factory=dict)  # each other arm's (data/row_spread.py)
    bandit: Bandit | None = None  # the current phase's, rebuilt at every launch
    caps: dict[str, float] = field(default_factory=dict)  # in force for the bandit
    floors: dict[str, float] = field(default_factory=dict)
    launch_number: int = 0  # engine launches of the run so far (`segment` in .loss.json)
    rejected: set[str] = field(default_factory=set)  # checkpoints the engine refused (exit 3)
    eval_loss: dict[int, float] = field(default_factory=dict)  # step -> validation loss
    best_copier: BestCopier = field(default_factory=BestCopier)  # best.bin, written off the event loop
    engine_paths: list[str] = field(default_factory=list)  # path (qualification.py), precision flags

    @property
    def phase(self) -> Phase:
        return self.phases[-1]

    @property
    def train(self) -> TrainConfig:
        return self.experiment.train

    @property
    def arm_names(self) -> list[str]:
        return self.experiment.arm_names

    @property
    def max_steps(self) -> int:
        return int(self.train.max_steps)

    @property
    def lag(self) -> int:
        """At most `lag` TRAIN frames are in flight: the mixture for step s uses the losses up to s - lag."""
        return int(self.train.lag)

    def reload_phases(self) -> Phase:
        """Re-read phases.json and make its last phase current (after a pivot)."""
        self.phases = read_phases(self.run)
        return self.phase

    # The run's live state changes only through these methods: the setup, the launch (launcher.py) and the
    # pivot desk call them, and nothing else assigns a field of this object (tests/repository checks it).

    def new_bandit(self) -> Bandit:
        """A fresh bandit for the current phase, and the caps and floors in force for it: at every launch
        (then fed the phase's log) and when a pivot starts a new phase."""
        self.bandit, self.caps, self.floors = bandit_for_phase(
            self.experiment, self.phase, self.row_spread, self.unigram_gap
        )
        return self.bandit

    def start_phase(self) -> Phase:
        """After a pivot is applied: phases.json re-read, `.samples.json` started empty, the new phase's
        bandit."""
        self.reload_phases()
        self.samples = SamplesFile(self.run.samples, self.opts.samples_kept)
        self.new_bandit()
        return self.phase

    def use_engine_paths(self, flags: list[str]) -> None:
        """The CUDA engine's path flags, set once before the supervisor starts: they are chosen after the
        run's identity is saved, so that a bad batch (build_context) is refused before any qualification
        runs."""
        self.engine_paths = list(flags)

    def reject_checkpoint(self, path: Path) -> None:
        """A checkpoint the engine refused (exit 3): the next launch resumes from an older one."""
        self.rejected.add(str(path))

    def record_eval(self, step: int, loss: float) -> None:
        """An evaluation's validation loss (best.bin follows the lowest)."""
        self.eval_loss[step] = loss

    def next_launch(self, logged: int) -> int:
        """The number of the engine launch about to start: one past the last (at the run's first launch,
        one past the highest `segment` the log holds, `logged`)."""
        if self.launch_number == 0:
            self.launch_number = logged
        self.launch_number += 1
        return self.launch_number

    def say(self, line: str) -> None:
        self.console.say(line)

    def warn(self, line: str) -> None:
        self.console.warn(line)

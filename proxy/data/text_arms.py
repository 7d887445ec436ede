"""Arms of text: their sources planned into work units, read by the workers, tokenized and written as shards
(ArmWriter, TextArms), and the tokenizer trained on a sample of them (prepare.py drives them)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..config.experiment import ArmConfig, Experiment
from ..config.sources import BuiltinSource, Source
from ..formats.shard import ShardWriter
from . import source_readers
from .builtin_sources import repeated_names
from .data_error import DataError, unreadable
from .progress_bars import ProgressBars
from .source_files import SourceError, hash_file, source_bytes
from .source_readers import limited_units
from .split import SAMPLE_CAP, TRAIN, VAL, by_hash, sample_rate, tail_tokens, val_doc_max
from .tokenizer import Tokenizer, train_tokenizer
from .workers import UnitResult, UnitTask, Workers


class Hashes(dict):
    """path -> hex SHA-256 of its bytes. Kept only for the files larger than a work unit (their train/val
    decision is made from it, after the key, in the main process), so that it stays small however many
    files a corpus has."""

    def __call__(self, p: Path) -> str:
        if p in self:
            return self[p]
        digest = hash_file(p)
        if p.stat().st_size > source_readers.UNIT_BYTES:
            self[p] = digest
        return digest


def named_val(arm: ArmConfig) -> bool:
    """Whether the arm's validation documents are the ones its sources name (`val`, `val_split`)."""
    return any(src.val_part() is not None for src in arm.sources)


def _always(split: str) -> Callable[[Path, int], str]:
    """The train/val decision of a source part whose documents all go one way."""
    return lambda _path, _size: split


class ArmWriter:
    """One text arm's two shards, written as the units' results come in order. `named_val`: its validation
    documents are the ones its sources name, so no tail of the training stream moves over."""

    def __init__(self, name: str, tmp: Path, vocab: int, named_val: bool = False):
        self.name = name
        self.named_val = named_val
        self.train = ShardWriter(tmp / f"{name}.train.tok", vocab)
        self.val = ShardWriter(tmp / f"{name}.val.tok", vocab)
        self.stats: dict[str, Any] = {"kind": "text", "docs": 0, "val_docs": 0, "chars": 0}  # the arm's JSON record
        if named_val:
            self.stats["val_named"] = True

    def add(self, result: UnitResult) -> None:
        self.train.append(result.train)
        self.val.append(result.val)
        self.stats["docs"] += result.docs
        self.stats["val_docs"] += result.val_docs
        self.stats["chars"] += result.chars

    def finish(self) -> dict:
        """The validation split's tail (split.py rule 2) moved over; both shards closed; the arm's stats."""
        tail = 0 if self.named_val else tail_tokens(self.train.count, self.val.count)
        if tail:
            self.val.append(self.train.take_tail(tail))
        self.stats.update(train_tokens=self.train.finish(), val_tokens=self.val.finish(), val_tail_tokens=tail)
        return self.stats

    def close(self) -> None:
        self.train.close()
        self.val.close()


def source_size(src: Source, base: Path) -> int:
    """A text source's bytes, for the validation split's bound and the progress bar."""
    if isinstance(src, BuiltinSource) and src.builtin == "repeated_names":
        return sum(len(d) for d in repeated_names())
    return source_bytes(src, base)


class TextArms:
    """The text arms' work: their units in order, the bound on a validation document per arm."""

    def __init__(self, experiment: Experiment, base: Path, hashes: Hashes):
        self.arms = [a for a in experiment.arms if a.sources[0].is_text]
        self.base = base
        self.hashes = hashes
        try:
            self.bytes = {a.name: sum(source_size(s, base) for s in a.sources) for a in self.arms}
        except SourceError as exc:
            raise DataError(str(exc)) from None
        self.docs: dict[tuple[str, int], int] = {}

    def named_val(self, name: str) -> bool:
        return named_val(next(a for a in self.arms if a.name == name))

    @property
    def total(self) -> int:
        return sum(self.bytes.values())

    def tasks(self, rate: float = 0.0) -> Iterator[tuple[str, int, UnitTask]]:
        """(arm, source index, task) of every unit, in order."""
        for arm in self.arms:
            largest = val_doc_max(self.bytes[arm.name])

            def decide(path: Path, size: int, largest: int = largest) -> str:
                return by_hash(size, bytes.fromhex(self.hashes(path)), largest)

            named = named_val(arm)
            for i, src in enumerate(arm.sources):
                self.docs.setdefault((arm.name, i), 0)
                val = src.val_part()
                # an arm with named validation documents splits none off: its sources' documents all train
                parts = [(src, TRAIN if named else None)] + ([(val, VAL)] if val is not None else [])
                try:
                    for part, split in parts:
                        for unit in limited_units(part, self.base, decide if split is None else _always(split)):
                            yield arm.name, i, UnitTask(unit, largest, rate, split)
                except SourceError as exc:
                    raise DataError(f"arm {arm.name!r}: {exc}") from None

    def run(
        self, workers: Workers, rate: float = 0.0, stop: Callable[[], bool] = lambda: False
    ) -> Iterator[tuple[str, UnitTask, UnitResult]]:
        """(arm, task, result) of every unit, in order; a source's error is one line naming its arm."""
        order: deque[tuple[str, int, UnitTask]] = deque()  # handed out, no result yet (bounded by the workers' window)

        def tasks() -> Iterator[UnitTask]:
            for arm, i, task in self.tasks(rate):
                order.append((arm, i, task))
                yield task

        try:
            for result in workers.map(tasks(), stop):
                arm, i, task = order.popleft()
                self.docs[(arm, i)] += result.docs
                yield arm, task, result
        except (SourceError, OSError) as exc:  # the unit at the head of the order failed
            why = str(exc) if isinstance(exc, SourceError) else unreadable(exc)
            raise DataError(f"arm {order[0][0] if order else '?'!r}: {why}") from None

    def check_documents(self) -> None:
        for arm in self.arms:
            for i, src in enumerate(arm.sources):
                if self.docs.get((arm.name, i), 0) == 0:
                    raise DataError(f"arm {arm.name!r}: {src.describe()}: no text documents")


def skipped_note(progress: ProgressBars, skipped: int, first: str | None) -> None:
    if skipped:
        progress.note(f"skipped {skipped} file(s) that are not text (first: {first})")


def train_arms_tokenizer(arms: TextArms, vocab: int, n_workers: int, progress: ProgressBars) -> Tokenizer:
    rate = sample_rate(arms.total)
    sample: list[str] = []
    size = 0
    with (
        progress.task(
            f"sampling text for the tokenizer ({100 * rate:.3g}% of {arms.total / 1e6:.1f} MB)",
            total=arms.total,
            unit="B",
        ) as t,
        Workers(n_workers, None) as workers,
    ):
        for _arm, task, result in arms.run(workers, rate, stop=lambda: size >= SAMPLE_CAP):  # noqa: B023 (reads the live count on purpose)
            for piece in result.sample:
                if size < SAMPLE_CAP:
                    sample.append(piece)
                    size += len(piece)
            t.advance(task.unit.nbytes)
        t.done(f"{size / 1e6:.1f}M characters")
    with progress.task(f"training tokenizer (vocab {vocab})", total=None) as t:
        tok = train_tokenizer(sample, vocab)
        t.done(f"{tok.trained_size} tokens learned from {size / 1e6:.1f}M characters")
    return tok

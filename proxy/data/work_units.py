"""What the preparation's workers are handed and give back: a work unit of a source's documents, the parts
of files it reads, the documents it yields, and the one error a source that cannot be read raises
(source_readers.py plans and reads them; workers.py runs them).
"""

from __future__ import annotations

from dataclasses import dataclass, field


class SourceError(ValueError):
    """A source that cannot be read; the message is one line saying which and why."""


@dataclass(frozen=True)
class FilePart:
    """Bytes [start, stop) of a file, as nominal offsets: a part that does not start at 0 begins at the
    first safe place at or after `start` (text.safe_cut), and ends at the first one at or after `stop`, so
    consecutive parts tile the file. `split` is set for a document spread over several units (its
    train/val decision is made once, in the main process)."""

    path: str
    start: int
    stop: int
    size: int
    split: str | None = None
    module: str | None = None  # stdlib_docstrings: the module whose docstrings the file's document is


@dataclass(frozen=True)
class Unit:
    reader: str  # a key of READERS
    items: tuple  # what that reader reads: FileParts, (path, start, stop), (path, group), texts...
    nbytes: int  # how much of the source's bytes it stands for (progress)
    where: str  # the source, for messages
    strict: bool = False  # refuse (rather than skip) a file that is not text
    column: str = ""  # jsonl field, Parquet or Arrow column


@dataclass
class Doc:
    """A document, or a piece of one (`last`: the document ends here). `split` is decided already for a
    document spread over several units; else None (decided by its hash, prepare.py)."""

    text: str
    last: bool = True
    split: str | None = None
    raw: bytes | None = None  # the document's UTF-8 bytes when read whole from a file (its hash)


@dataclass
class UnitNotes:
    """What a unit's reading skipped, for the messages."""

    skipped: list[str] = field(default_factory=list)

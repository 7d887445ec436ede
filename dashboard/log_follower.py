"""Follow a JSON Lines log (`.loss.json`) by byte offset, torn-line safe.

Only complete lines (ending in "\\n") are consumed: a torn last line stays
unread until its newline arrives, and the offset only ever points just past a
newline. A line that is not a complete JSON object (garbage, a torn fragment
left by a crash, a bare number) is skipped, never glued onto its neighbour.
A line longer than MAX_LINE is skipped once its newline arrives; it is scanned
for that newline one chunk per poll, like any other bytes, so that a huge
region without a newline (a broken writer, a 1 GB line) never holds the
index's lock for longer than one chunk.

If the file is replaced (another inode) or shrinks below the offset, the
follower starts over from byte 0 and says so (`Chunk.reset`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, NoReturn

from proxy.formats import bounded_json
from proxy.rundir.layout import LOSS_LINE_LIMIT

from .run_files import open_in_root

MAX_LINE = LOSS_LINE_LIMIT  # 1 MiB, as the proxy reads: no real entry comes close
CHUNK = 4 << 20  # bytes read per poll

try:  # optional speed-up (6x on a 300-byte line); same accept/reject rules as below
    import orjson as _orjson

    def _loads(line: bytes) -> object:
        return _orjson.loads(line)
except ImportError:  # pragma: no cover - depends on the environment

    def _reject_constant(name: str) -> NoReturn:
        raise ValueError(f"non-finite constant {name}")

    def _finite_float(text: str) -> float:
        f = float(text)
        if f - f != 0.0:
            raise ValueError(f"number out of range: {text}")
        return f

    def _loads(line: bytes) -> object:
        return bounded_json.loads(line, parse_constant=_reject_constant, parse_float=_finite_float)


def loads_object(line: bytes) -> dict | None:
    """The JSON object on `line`, or None when the line is anything else.

    NaN/Infinity literals are not JSON and are rejected, as are numbers that
    overflow a double (the same rules with or without orjson).
    """
    try:
        obj = _loads(line)
    except (ValueError, TypeError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


def parse_lines(data: bytes, base: int = 0) -> tuple[list[tuple[int, int, dict]], int]:
    """Complete lines of `data` as [(start, end, object)], and bytes consumed.

    `base` is the file offset of data[0]; start/end are file offsets of the
    line (end just past its newline). Bytes after the last newline are not
    consumed.
    """
    out: list[tuple[int, int, dict]] = []
    last_nl = data.rfind(b"\n")
    if last_nl < 0:
        return out, 0
    pos = base
    append = out.append
    for line in data[: last_nl + 1].split(b"\n")[:-1]:
        n = len(line)
        if 0 < n <= MAX_LINE:
            try:
                obj = _loads(line)
            except (ValueError, TypeError, RecursionError):
                obj = None
            if type(obj) is dict:
                append((pos, pos + n + 1, obj))
        pos += n + 1
    return out, last_nl + 1


@dataclass
class Chunk:
    """What one poll found: entries in [start, end), and whether the file was replaced."""

    entries: list[tuple[int, int, dict]] = field(default_factory=list)
    start: int = 0
    end: int = 0
    reset: bool = False
    scanned: int = 0  # bytes of an overlong line scanned for its newline (the offset stays at its start)


class LogFollower:
    """Reads new complete lines of `root/name` from the last offset on each poll."""

    def __init__(self, root: Path, name: str = ".loss.json"):
        self.root = Path(root)
        self.name = name
        self.offset = 0
        self.ident: tuple[int, int] | None = None
        self.size = 0
        self.scan: int | None = None  # inside an overlong line: how far it was scanned for its newline

    def poll(self, max_bytes: int = CHUNK) -> Chunk:
        chunk = Chunk(start=self.offset, end=self.offset)
        f = open_in_root(self.root, self.name)
        if f is None:
            return chunk
        with f:
            st = os.fstat(f.fileno())
            ident = (st.st_dev, st.st_ino)
            self.size = st.st_size
            if self.ident is not None and (ident != self.ident or st.st_size < self.offset):
                self.offset = 0
                self.scan = None
                chunk.reset = True
                chunk.start = chunk.end = 0
            self.ident = ident
            if self.scan is not None:
                return self._scan_overlong(f, self.scan, st.st_size, max_bytes, chunk)
            if st.st_size <= self.offset:
                return chunk
            f.seek(self.offset)
            data = f.read(min(max_bytes, st.st_size - self.offset))
            entries, used = parse_lines(data, self.offset)
            if used == 0 and len(data) >= MAX_LINE:  # no newline in a whole chunk: an overlong line
                self.scan = self.offset + len(data)
                chunk.scanned = len(data)
            self.offset += used
            chunk.entries = entries
            chunk.end = self.offset
            return chunk

    def _scan_overlong(self, f: BinaryIO, scan: int, size: int, max_bytes: int, chunk: Chunk) -> Chunk:
        """One chunk more of the overlong line's scan, from `scan`; past its newline once found."""
        f.seek(scan)
        data = f.read(min(max_bytes, size - scan))
        i = data.find(b"\n")
        if i < 0:
            self.scan = scan + len(data)
            chunk.scanned = len(data)
        else:
            self.offset = scan + i + 1
            self.scan = None
            chunk.end = self.offset
        return chunk

    def position(self) -> int:
        """How far the log has been read: the offset, or inside an overlong line, how far it was scanned."""
        return self.scan if self.scan is not None else self.offset

    def caught_up(self) -> bool:
        return self.position() >= self.size


def read_range(root: Path, name: str, start: int, end: int) -> bytes:
    """Bytes [start, end) of root/name ("" if the file is gone)."""
    if end <= start:
        return b""
    f = open_in_root(root, name)
    if f is None:
        return b""
    with f:
        f.seek(start)
        return f.read(end - start)

"""The gate's side of a gated engine launch (see gate.py): exec the engine behind a relay.

This module runs in the wrapper script a `Gate` writes, once per engine launch, and imports the
standard library only, so a launch costs one bare Python start. The frame layout (the header's
struct format, the magic, the TRAIN and STOP kinds) is handed in by the wrapper, which has it from
proxy/formats/frames.py.

`exec_engine` forks the relay (as a grandchild: the engine never has a child of its own to reap),
puts the relay's pipe on fd 0 and execs the engine, which so keeps the wrapper's pid, its process
group and every signal sent to it. The relay passes the proxy's frames on in order:

- a TRAIN frame whose step is above the limit (the file `limit`: a step, or `open`) is held, with
  everything behind it, until the limit lets it through;
- a STOP frame passes with everything before it, and once the proxy's end of the pipe closes
  everything passes: a stopping proxy, or the EOF an orphaned engine checkpoints on, sees no gate;
- the launch's first TRAIN frame and every frame that is not a TRAIN frame are recorded as they
  arrive, one line each in `frames` (`<engine pid> <relay pid> <kind> <frame id>`), so a test knows
  where a relaunched engine resumes before it trains, and that a request reached the gate;
- when the engine's end closes (it exited or was killed) the relay exits too.
"""

from __future__ import annotations

import errno
import os
import select
import signal
import struct
import sys
from collections import deque
from pathlib import Path

HOLD_POLL_MS = 5  # how often a relay that holds a frame looks at the limit again
READ_BYTES = 1 << 20


def exec_engine(engine: str, directory: str, header: str, magic: bytes, train: int, stop: int) -> None:
    down_r, down_w = os.pipe()
    engine_pid = os.getpid()
    child = os.fork()
    if child == 0:
        if os.fork() == 0:
            os.close(down_r)
            _detach_stdout()  # the proxy sees the engine's stdout close when the engine ends, not the relay
            code = 0
            try:
                Relay(0, down_w, Path(directory), engine_pid, struct.Struct(header), magic, train, stop).run()
            except Exception as exc:  # noqa: BLE001 - the relay's last words go to engine.log
                print(f"frame gate: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
                code = 1
            os._exit(code)
        os._exit(0)
    os.waitpid(child, 0)
    os.close(down_w)
    os.dup2(down_r, 0)
    os.close(down_r)
    # Python ignores SIGPIPE and SIGXFSZ; an ignored signal stays ignored across exec, and the
    # engine must start with the dispositions it would have had without the gate.
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_DFL)
    os.execv(engine, [engine, *sys.argv[1:]])


def _detach_stdout() -> None:
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.close(null)


class Relay:
    def __init__(
        self,
        up: int,
        down: int,
        directory: Path,
        engine_pid: int,
        header: struct.Struct,
        magic: bytes,
        train: int,
        stop: int,
    ):
        self.up, self.down = up, down
        self.limit_path = directory / "limit"
        self.record_path = directory / "frames"
        self.engine_pid = engine_pid
        self.header, self.magic, self.train, self.stop = header, magic, train, stop
        self.incoming = bytearray()  # bytes of a frame not yet whole
        self.frames: deque[tuple[int, int, bytes]] = deque()  # whole frames not yet passed: (kind, id, bytes)
        self.raw = False  # the stream is not frames (a test feeding garbage): pass it through untouched
        self.first_train_seen = False

    def limit(self) -> int | None:
        """The highest step that may pass; None: everything passes."""
        try:
            text = self.limit_path.read_text().strip()
        except FileNotFoundError:
            return None
        return None if text == "open" else int(text)

    def receive(self, chunk: bytes) -> None:
        """Split what arrived into whole frames, recording the ones a test may wait for."""
        self.incoming += chunk
        size = self.header.size
        while not self.raw and len(self.incoming) >= size:
            magic, kind, _flags, frame_id, _rows, _row_len, payload, _reserved = self.header.unpack_from(self.incoming)
            if magic != self.magic:
                self.raw = True
                break
            if len(self.incoming) < size + payload:
                break
            self.frames.append((kind, frame_id, bytes(self.incoming[: size + payload])))
            del self.incoming[: size + payload]
            if kind == self.train:
                if self.first_train_seen:
                    continue
                self.first_train_seen = True
            self._record(kind, frame_id)

    def _record(self, kind: int, frame_id: int) -> None:
        fd = os.open(self.record_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{self.engine_pid} {os.getpid()} {kind} {frame_id}\n".encode())
        finally:
            os.close(fd)

    def passable(self, limit: int | None) -> int:
        """How many whole frames at the front may go to the engine now."""
        n, held = 0, False
        for i, (kind, frame_id, _data) in enumerate(self.frames):
            held = held or (kind == self.train and limit is not None and frame_id > limit)
            if kind == self.stop or not held:
                n = i + 1
        return n

    def run(self) -> None:
        eof = False
        poller = select.poll()
        poller.register(self.up, select.POLLIN)
        poller.register(self.down, 0)  # POLLERR: the engine's end of the pipe closed
        while True:
            n = len(self.frames) if eof or self.raw else self.passable(self.limit())
            out = b"".join(self.frames.popleft()[2] for _ in range(n))
            if (eof or self.raw) and self.incoming:
                out += bytes(self.incoming)
                self.incoming.clear()
            if out:
                if not self._send(out):
                    return
                continue
            if eof:
                return
            for fd, mask in poller.poll(HOLD_POLL_MS if self.frames else None):
                if fd == self.down and mask & (select.POLLERR | select.POLLHUP):
                    return
                if fd == self.up:
                    chunk = os.read(self.up, READ_BYTES)
                    if chunk:
                        self.receive(chunk)
                    else:
                        eof = True
                        poller.unregister(self.up)

    def _send(self, data: bytes) -> bool:
        """Write all of `data` to the engine; False once the engine is gone."""
        view = memoryview(data)
        while view:
            try:
                n = os.write(self.down, view)
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    return False
                raise
            view = view[n:]
        return True

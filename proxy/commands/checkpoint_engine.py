"""The engine on one checkpoint, for `proxy sample` and `proxy eval`: the audits' code path, read-only.

The engine runs in proxy mode (frames on stdin, events on stdout), resumed
from the checkpoint with the checkpoint's own shape. Its checkpoint directory
and its log are a temporary directory of their own, removed afterwards, and it
never trains, so nothing in the run is written: not a checkpoint (the
checkpoint it resumed from is already on disk, so STOP writes none), not
`engine.log`, not a temp file. Its command line comes from the one builder
(formats/engine_cli.py), its process from the one launcher
(supervision/engine_process.py).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from ..errors import EXIT_FAILURE, ProxyError
from ..formats import frames
from ..formats.engine_cli import engine_args, exit_description, setting_flags
from ..formats.frames import Event
from ..supervision.engine_process import EOF, EVENT, WRITE_FAILED, EngineChoice, EngineProcess
from .model_source import ModelSource

STOP_GRACE_S = 30.0  # how long the engine may take to exit after STOP before it is killed


class CheckpointEngine:
    """`with CheckpointEngine(choice, source) as engine: event = engine.ask(frame, "sample")`."""

    def __init__(self, choice: EngineChoice, source: ModelSource, extra: Sequence[str] = ()):
        self.choice = choice
        self.source = source
        self.extra = list(extra)
        self.tmp: Path | None = None
        self.process: EngineProcess | None = None
        self.ready: Event | None = None

    def __enter__(self) -> CheckpointEngine:
        self.tmp = Path(tempfile.mkdtemp(prefix="microgpt-engine-"))
        try:
            args = engine_args(
                self.tmp / "checkpoints",
                resume=self.source.path,
                ckpt_every=0,
                settings=setting_flags(**self.source.engine_settings()),
                extra=self.extra,
            )
            self.process = EngineProcess(
                [str(self.choice.path), *args], self.log, header=f"read-only on {self.source.path}"
            )
            self.ready = self._next("ready")
            if int(self.ready.get("step", -1)) != self.source.step:
                raise ProxyError(
                    f"the engine loaded step {self.ready.get('step')} from {self.source.path}, "
                    f"expected {self.source.step}",
                    EXIT_FAILURE,
                )
        except BaseException as exc:
            self.__exit__(type(exc), exc, exc.__traceback__)
            raise
        return self

    @property
    def log(self) -> Path:
        if self.tmp is None:
            raise RuntimeError("CheckpointEngine used outside its with block")
        return self.tmp / "engine.log"

    @property
    def engine(self) -> EngineProcess:
        if self.process is None:
            raise RuntimeError("CheckpointEngine used outside its with block")
        return self.process

    def ask(self, frame: bytes, kind: str) -> Event:
        """Send one EVAL or SAMPLE frame and return its event."""
        self.engine.send(frame)
        return self._next(kind)

    def _next(self, kind: str) -> Event:
        """The next event of `kind`; ProxyError with the engine's own reason if it fails or ends first."""
        while True:
            what, payload = self.engine.events.get()
            if what == EVENT and payload.kind == kind:
                return payload
            if what == EVENT and payload.kind == "error":
                raise ProxyError(f"engine error: {payload.get('message')}", EXIT_FAILURE)
            if what in (EOF, WRITE_FAILED):
                raise ProxyError(self._ended(), EXIT_FAILURE)

    def _ended(self) -> str:
        """Why the engine stopped answering: its exit and the last line it wrote on stderr."""
        code = self.engine.wait(STOP_GRACE_S)
        try:
            lines = [ln for ln in self.log.read_text(errors="replace").splitlines() if ln and not ln.startswith("===")]
        except OSError:
            lines = []
        why = f": {lines[-1]}" if lines else ""
        return f"the engine ({self.choice.path}) ended, {exit_description(code)}{why}"

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """STOP after a clean finish; after an error or Ctrl-C, kill at once (nothing it holds is worth
        waiting for)."""
        if self.process is not None:
            if self.process.alive() and exc_type is None:
                self.process.send(frames.stop_frame())
                self.process.close_input()
                self.process.wait(STOP_GRACE_S)
            if self.process.alive():
                self.process.kill_group()
                self.process.wait(STOP_GRACE_S)
            self.process.finish()
            self.process = None
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None

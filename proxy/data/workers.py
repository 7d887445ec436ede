"""The preparation's workers: a work unit in, its token ids (or its share of the tokenizer sample) out.

Encoding is the slow part of preparing text (a byte-level BPE encodes a few
MB/s per core), so it runs on every core: a pool of processes (spawned, each
with its own copy of the tokenizer: HF tokenizers does not scale across
threads of one process), each reading its units from the source files itself,
so only token ids travel back. The results are taken in unit order, at most
WINDOW_PER_WORKER per worker in flight: the main process holds a bounded
number of results whatever the corpus size, and the output is the same
bytes for any number of workers (one worker runs in the main process).

Workers ignore SIGINT and SIGHUP (a Ctrl-C or a closed terminal reaches the
whole process group; the main process decides) and die with the main
process (PR_SET_PDEATHSIG on Linux).
"""

from __future__ import annotations

import ctypes
import hashlib
import multiprocessing
import os
import signal
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field

import numpy as np

from .source_readers import read_unit
from .split import TRAIN, VAL, by_hash, in_sample
from .text import pieces
from .tokenizer import Tokenizer
from .work_units import Doc, Unit, UnitNotes

SMALL_BYTES = 8 << 20  # below this much text, one worker (the main process): a pool's start costs more
WINDOW_PER_WORKER = 3
ENV_WORKERS = "MICROGPT_DATA_WORKERS"  # overrides the number of workers (at least 1)

_tokenizer: Tokenizer | None = None  # a worker's own copy


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def default_workers(text_bytes: int) -> int:
    """$MICROGPT_DATA_WORKERS, else 1 for a small corpus, else every core."""
    env = os.environ.get(ENV_WORKERS, "").strip()
    if env.isdigit() and int(env) >= 1:
        return int(env)
    return 1 if text_bytes < SMALL_BYTES else cpu_count()


@dataclass
class UnitResult:
    train: np.ndarray  # uint16 ids, each document followed by the separator
    val: np.ndarray
    docs: int = 0  # documents that ended in this unit
    val_docs: int = 0
    chars: int = 0
    skipped: list[str] = field(default_factory=list)
    sample: list[str] = field(default_factory=list)  # sample mode: the training pieces drawn for the tokenizer


@dataclass(frozen=True)
class UnitTask:
    unit: Unit
    largest_val_doc: int  # split.val_doc_max of the unit's arm
    sample_rate: float = 0.0  # > 0: sample mode (no tokenizer yet): return the sample, not ids
    split: str | None = None  # TRAIN or VAL: every document of the unit goes there (named validation files)


def _pieces(task: UnitTask, notes: UnitNotes) -> Iterator[tuple[str, str, bool]]:
    """(split, piece, whether its document ends with it) for every non-empty document of the unit, in
    order."""
    for doc in read_unit(task.unit, notes):
        split = task.split or doc.split or _decide(doc, task.largest_val_doc)
        if doc.last and doc.split is None and not doc.text:
            continue  # an empty document is no document
        chunks = pieces(doc.text)
        for k, piece in enumerate(chunks):
            yield split, piece, doc.last and k == len(chunks) - 1


def _decide(doc: Doc, largest: int) -> str:
    raw = doc.raw if doc.raw is not None else doc.text.encode("utf-8", "surrogatepass")
    return by_hash(len(raw), hashlib.sha256(raw).digest(), largest)


def run_task(task: UnitTask) -> UnitResult:
    """One unit read and encoded (or sampled) with this process's tokenizer."""
    notes = UnitNotes()
    if task.sample_rate > 0:
        result = UnitResult(np.zeros(0, np.uint16), np.zeros(0, np.uint16))
        for split, piece, last in _pieces(task, notes):
            if split == TRAIN and in_sample(piece, task.sample_rate):
                result.sample.append(piece)
            result.docs += last
            result.chars += len(piece)
        result.skipped = notes.skipped
        return result
    tok = _tokenizer
    if tok is None:  # a sampling pass (sample_rate > 0) is the only one made before a tokenizer exists
        raise RuntimeError("an encoding task ran before the tokenizer was given to this process")
    items: list[tuple[str, int, bool]] = []  # (split, chars, last) of each piece, in the order encoded

    def texts() -> Iterator[str]:  # the pieces, read as the encoder asks for them (a batch at a time)
        for split, piece, last in _pieces(task, notes):
            items.append((split, len(piece), last))
            yield piece

    out: dict[str, list[np.ndarray]] = {TRAIN: [], VAL: []}
    docs = val_docs = chars = 0
    eot = np.array([tok.eot_id], dtype=np.uint16)
    for k, piece_ids in enumerate(tok.encode_pieces(texts())):
        split, length, last = items[k]
        out[split].append(piece_ids)
        chars += length
        if last:
            out[split].append(eot)
            docs += 1
            val_docs += split == VAL
    arrays = {s: np.concatenate(parts) if parts else np.zeros(0, np.uint16) for s, parts in out.items()}
    return UnitResult(arrays[TRAIN], arrays[VAL], docs, val_docs, chars, notes.skipped)


def _init_worker(tokenizer_json: str | None, vocab: int, eot: str | None = None) -> None:
    global _tokenizer
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    if tokenizer_json is not None:
        _tokenizer = Tokenizer.from_json(tokenizer_json.encode("utf-8"), vocab, "the run's tokenizer", eot)


class WorkerError(RuntimeError):
    """The worker processes could not run (one died or could not start); the message is one line."""


class Workers:
    """`with Workers(n, tokenizer) as w: for result in w.map(tasks): ...`: results in task order."""

    def __init__(self, n: int, tokenizer: Tokenizer | None):
        self.n = max(1, int(n))
        self.tokenizer = tokenizer
        self.pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> Workers:
        global _tokenizer
        if self.n == 1:
            _tokenizer = self.tokenizer
            return self
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the parent's own encodes stay serial
        tok = self.tokenizer
        self.pool = ProcessPoolExecutor(
            self.n,
            multiprocessing.get_context("spawn"),
            _init_worker,
            (tok.to_str(), tok.vocab_size, tok.eot) if tok is not None else (None, 0, None),
        )
        return self

    def map(self, tasks: Iterable[UnitTask], stop: Callable[[], bool] = lambda: False) -> Iterator[UnitResult]:
        """Each task's result in order; no new task is handed out once `stop()` is true."""
        if self.pool is None:
            for task in tasks:
                if stop():
                    return
                yield run_task(task)
            return
        pending: deque = deque()
        feed = iter(tasks)
        window = WINDOW_PER_WORKER * self.n
        exhausted = False
        while True:
            while not exhausted and len(pending) < window and not stop():
                given = next(feed, None)
                if given is None:
                    exhausted = True
                    break
                pending.append(self.pool.submit(run_task, given))
            if not pending:
                return
            try:
                result = pending.popleft().result()
            except BrokenProcessPool as exc:
                raise WorkerError(
                    f"a data preparation worker died ({exc}); run again with {ENV_WORKERS}=1 to prepare in this process"
                ) from None
            yield result

    def __exit__(self, *exc: object) -> None:
        global _tokenizer
        _tokenizer = None
        if self.pool is not None:
            processes = list((getattr(self.pool, "_processes", None) or {}).values())
            self.pool.shutdown(wait=False, cancel_futures=True)
            for proc in processes:  # a unit in progress is not waited for (an interrupted preparation)
                if proc.is_alive():
                    proc.terminate()
            for proc in processes:
                proc.join(10)
            self.pool = None

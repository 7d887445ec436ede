"""Data preparation: tokenizer and per-arm train/val token shards, cached by content hash.

`prepare_data(experiment, experiment_dir, cache_dir)`:

1. Fingerprints every source (a SHA-256 of its options and the bytes of each
   file it reads) and forms the cache key from those, the vocabulary size, the
   tokenizer settings, the split settings and FORMAT_VERSION.
2. If `cache_dir/data-<key>/manifest.json` exists, loads it: no other work.
3. Otherwise reads each arm's documents, splits them ~99/1 into train and val
   (whole documents chosen by content hash, so the split does not depend on
   order or on the tokenizer), trains a byte-level BPE on the train documents
   of all arms, encodes each split as `doc EOT doc EOT ...` (an arm of
   random_tokens gets its ids from `random_token_documents` instead: no text,
   no part in the tokenizer), writes the shards and the tokenizer into a
   temporary directory and renames it into place, so a crash or a concurrent
   preparation never leaves a half-written data set.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from ..atomic import fsync_dir, make_dirs, storage_guard, write_synced
from ..config.experiment import Experiment
from ..formats.shard import read_shard, write_shard
from .progress import Progress
from .sources import (SourceError, hash_file, is_token_source, load_documents, random_token_documents, source_bytes,
                      source_fingerprint)
from .tokenizer import TOKENIZER_SETTINGS, Tokenizer, train_tokenizer

FORMAT_VERSION = 1
VAL_FRACTION = 0.01        # of each arm's characters
VAL_MIN_CHARS = 64 * 1024  # ...but at least this much (about 16K tokens) where the arm has 10x that
VAL_MAX_FRACTION = 0.1
SPLIT_SETTINGS = {"fraction": VAL_FRACTION, "min_chars": VAL_MIN_CHARS, "max_fraction": VAL_MAX_FRACTION,
                  "method": "sha256-docs-v1"}
MANIFEST = "manifest.json"
TOKENIZER_FILE = "tokenizer.json"
TEMP_PREFIX = ".tmp-"  # cache_dir/.tmp-<key>-<pid>-<ns>: a preparation under way (renamed into place when whole)


class DataError(ValueError):
    """Data preparation failed; the message is one line saying which arm/source and why."""


@dataclass
class PreparedData:
    key: str                       # the content hash naming the cache entry
    path: Path                     # cache_dir/data-<key>
    tokenizer: Tokenizer
    tokenizer_path: Path
    train_shards: dict[str, Path]  # arm name -> token shard
    val_shards: dict[str, Path]
    stats: dict[str, dict] = field(default_factory=dict)  # arm -> docs, chars, train_tokens, val_tokens
    cached: bool = False           # True when nothing had to be built


def default_cache_dir() -> Path:
    """$MICROGPT_CACHE, else $XDG_CACHE_HOME/microgpt, else ~/.cache/microgpt."""
    env = os.environ.get("MICROGPT_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "microgpt"


def unreadable(exc: OSError) -> str:
    """A source read that failed (permission denied, a directory, a /proc file that refuses reads): the
    file and the reason, for a one-line DataError."""
    where = f" {exc.filename}" if exc.filename else ""
    return f"cannot read{where}: {exc.strerror or exc}"


def data_key(experiment: Experiment, experiment_dir: Path | str) -> str:
    """The cache key: a hash of everything the prepared data depends on."""
    hashes: dict[Path, str] = {}

    def memo_hash(p: Path) -> str:
        if p not in hashes:
            try:
                hashes[p] = hash_file(p)
            except OSError as e:  # a read that fails has no file name of its own: name it
                raise OSError(e.errno, e.strerror, str(p)) from None
        return hashes[p]

    arms = []
    for arm in experiment.arms:
        try:
            fps = [source_fingerprint(s, experiment_dir, memo_hash) for s in arm.sources]
        except SourceError as e:
            raise DataError(f"arm {arm.name!r}: {e}") from None
        except OSError as e:  # EACCES, EINVAL, EISDIR, ENOTDIR, EIO ... on a source file: one line
            raise DataError(f"arm {arm.name!r}: {unreadable(e)}") from None
        arms.append([arm.name, fps])
    obj = {"format": FORMAT_VERSION, "vocab": experiment.model.vocab, "tokenizer": TOKENIZER_SETTINGS,
           "split": SPLIT_SETTINGS, "arms": arms}
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def split_documents(docs: list[str]) -> tuple[list[str], list[str]]:
    """Deterministic ~99/1 train/val split of one arm's documents.

    Val takes whole documents in order of their SHA-256 until it holds
    max(1%, min(64 KiB, 10%)) of the characters (skipping documents that would
    take it past 1.5x). Where that cannot reach half the target (a few huge
    documents), the tail of the largest remaining document is cut off instead.
    Both lists keep the documents' original order."""
    n = sum(len(d) for d in docs)
    target = max(math.ceil(VAL_FRACTION * n), min(VAL_MIN_CHARS, int(n * VAL_MAX_FRACTION)))
    order = sorted(range(len(docs)), key=lambda i: (hashlib.sha256(docs[i].encode("utf-8", "surrogatepass")).digest(), i))
    val_idx: set[int] = set()
    got = 0
    for i in order:
        if got >= target:
            break
        if len(val_idx) + 1 >= len(docs):
            break  # keep at least one document for training
        if got + len(docs[i]) > target + target // 2:
            continue
        val_idx.add(i)
        got += len(docs[i])
    train = [d for i, d in enumerate(docs) if i not in val_idx]
    val = [d for i, d in enumerate(docs) if i in val_idx]
    if got < target // 2 and train:
        need = target - got
        j = max(range(len(train)), key=lambda k: (len(train[k]), -k))
        doc = train[j]
        if len(doc) > need:
            cut = len(doc) - need
            nl = doc.rfind("\n", 0, cut)  # start val on a line boundary where one is near
            if nl > 0 and cut - nl < need // 2:
                cut = nl + 1
            train[j], tail = doc[:cut], doc[cut:]
            val.append(tail)
    return train, val


def _encode(tok: Tokenizer, docs: list[str], task) -> np.ndarray:
    """doc EOT doc EOT ... as uint16, encoding in chunks of about 1 MB (progress per chunk)."""
    parts: list[np.ndarray] = []
    eot = np.array([tok.eot_id], dtype=np.uint16)
    chunk: list[str] = []
    size = 0

    def flush():
        nonlocal chunk, size
        for ids in tok.encode_batch(chunk):
            parts.append(np.asarray(ids, dtype=np.uint16))
            parts.append(eot)
        task.advance(size)
        chunk, size = [], 0

    for d in docs:
        chunk.append(d)
        size += len(d)
        if size >= 1 << 20:
            flush()
    if chunk:
        flush()
    return np.concatenate(parts) if parts else np.zeros(0, np.uint16)


def _join_ids(docs: list[np.ndarray], eot_id: int) -> np.ndarray:
    """doc EOT doc EOT ... for documents that are already token ids."""
    eot = np.array([eot_id], dtype=np.uint16)
    return np.concatenate([part for d in docs for part in (d.astype(np.uint16), eot)])


def _load(entry: Path, key: str, vocab: int) -> Optional[PreparedData]:
    """The cache entry at `entry`, or None when absent or incomplete."""
    try:
        manifest = json.loads((entry / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if manifest.get("key") != key or manifest.get("format") != FORMAT_VERSION:
        return None
    train, val = {}, {}
    try:
        for name, info in manifest["arms"].items():
            train[name] = entry / info["train"]
            val[name] = entry / info["val"]
            for p in (train[name], val[name]):
                read_shard(p)
        tok = Tokenizer.load(entry / TOKENIZER_FILE, vocab)
    except Exception:  # noqa: BLE001 - a damaged entry of any kind is rebuilt
        return None
    return PreparedData(key, entry, tok, entry / TOKENIZER_FILE, train, val, manifest["arms"], cached=True)


def _build(experiment: Experiment, experiment_dir: Path, key: str, tmp: Path, progress: Progress) -> None:
    vocab = experiment.model.vocab
    splits: dict[str, tuple[list[str], list[str]]] = {}
    docs_n: dict[str, int] = {}
    for arm in experiment.arms:
        if is_token_source(arm.sources[0]):  # ids made below, once the tokenizer's size is known
            continue
        docs: list[str] = []
        try:
            total = sum(source_bytes(s, experiment_dir) for s in arm.sources)
            with progress.task(f"reading {arm.name}", total=total, unit="B") as t:
                for s in arm.sources:
                    docs.extend(load_documents(s, experiment_dir, on_file=t.advance))
        except SourceError as e:
            raise DataError(f"arm {arm.name!r}: {e}") from None
        except OSError as e:
            raise DataError(f"arm {arm.name!r}: {unreadable(e)}") from None
        docs_n[arm.name] = len(docs)
        splits[arm.name] = split_documents(docs)

    train_docs = [d for tr, _ in splits.values() for d in tr]
    chars = sum(len(d) for d in train_docs)
    with progress.task(f"training tokenizer (vocab {vocab})", total=None) as t:
        tok = train_tokenizer(train_docs, vocab)
        t.done(f"{tok.trained_size} tokens learned from {chars / 1e6:.1f}M characters")
    del train_docs
    tok.save(tmp / TOKENIZER_FILE)

    arms_info = {}
    for arm in experiment.arms:
        if is_token_source(arm.sources[0]):
            tr, va = (random_token_documents(split, tok.trained_size, tok.eot_id) for split in ("train", "val"))
            train_tokens, val_tokens = _join_ids(tr, tok.eot_id), _join_ids(va, tok.eot_id)
            docs_n[arm.name], total = len(tr) + len(va), 0
        else:
            tr, va = splits[arm.name]
            total = sum(len(d) for d in tr) + sum(len(d) for d in va)
            with progress.task(f"encoding {arm.name}", total=total, unit="chars") as t:
                train_tokens = _encode(tok, tr, t)
                val_tokens = _encode(tok, va, t)
                t.done(f"{train_tokens.size:,} train + {val_tokens.size:,} val tokens")
        files = {"train": f"{arm.name}.train.tok", "val": f"{arm.name}.val.tok"}
        write_shard(tmp / files["train"], train_tokens, vocab)
        write_shard(tmp / files["val"], val_tokens, vocab)
        arms_info[arm.name] = {
            **files, "docs": docs_n[arm.name], "train_docs": len(tr), "val_docs": len(va),
            "chars": total, "train_tokens": int(train_tokens.size), "val_tokens": int(val_tokens.size),
        }
    manifest = {"format": FORMAT_VERSION, "key": key, "vocab": vocab, "tokenizer": TOKENIZER_FILE,
                "tokenizer_trained": tok.trained_size, "python": sys.version.split()[0],
                "created": time.time(), "arms": arms_info}
    write_synced(tmp / MANIFEST, json.dumps(manifest, indent=1).encode())
    fsync_dir(tmp)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def remove_stale_temps(cache_dir: Path) -> list[Path]:
    """Remove the temp directories of preparations whose process is gone (killed, or stopped by a signal
    in a version that did not clean up); a live one's (another proxy preparing now) is left alone."""
    removed = []
    for tmp in cache_dir.glob(TEMP_PREFIX + "*"):
        parts = tmp.name[len(TEMP_PREFIX):].split("-")
        pid = int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None
        if pid is None or pid == os.getpid() or _pid_alive(pid) or not tmp.is_dir() or tmp.is_symlink():
            continue
        shutil.rmtree(tmp, ignore_errors=True)
        removed.append(tmp)
    return removed


def check_lengths(data: PreparedData, experiment: Experiment) -> None:
    """Every arm must hold at least one training row (ctx + 1 tokens, plus one) and one val row."""
    row_len = experiment.model.ctx + 1
    problems = []
    for name in experiment.arm_names:
        n_train = data.stats[name]["train_tokens"]
        n_val = data.stats[name]["val_tokens"]
        if n_train < row_len + 1 or n_val < row_len:
            problems.append(f"arm {name!r} has {n_train} train and {n_val} val tokens; "
                            f"ctx {experiment.model.ctx} needs at least {row_len + 1} and {row_len}")
    if problems:
        raise DataError("; ".join(problems) + " (add data to the arm or lower model.ctx)")


def prepare_data(experiment: Experiment, experiment_dir: str | os.PathLike, cache_dir: str | os.PathLike,
                 progress: bool | Progress = True) -> PreparedData:
    """Tokenizer and per-arm train/val shards for `experiment`, built on first use and cached.

    `experiment_dir` is where relative source paths are resolved (the
    experiment file's directory). `progress`: True for a bar on stderr, False
    for silence, or a Progress. Raises DataError (one line) on a bad source or
    an arm too small for the context length."""
    prog = progress if isinstance(progress, Progress) else Progress(enabled=bool(progress))
    experiment_dir = Path(experiment_dir)
    cache_dir = Path(cache_dir)
    key = data_key(experiment, experiment_dir)
    entry = cache_dir / f"data-{key[:24]}"
    if cache_dir.is_dir():
        remove_stale_temps(cache_dir)
    data = _load(entry, key, experiment.model.vocab)
    if data is None:
        make_dirs(cache_dir)
        prog.note(f"preparing data for {experiment.name} (first use) into {entry}")
        t0 = time.monotonic()
        tmp = cache_dir / f"{TEMP_PREFIX}{key[:24]}-{os.getpid()}-{time.monotonic_ns()}"
        try:  # made inside the try: a stop signal landing just after mkdir still removes it
            with storage_guard(tmp, "create"):
                tmp.mkdir()
            _build(experiment, experiment_dir, key, tmp, prog)
            if entry.exists():  # damaged entry, or another process finished first
                if _load(entry, key, experiment.model.vocab) is None:
                    shutil.rmtree(entry)
            try:
                with storage_guard(entry, "rename into"):
                    os.rename(tmp, entry)
            except OSError:
                if _load(entry, key, experiment.model.vocab) is None:
                    raise
            fsync_dir(cache_dir)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        data = _load(entry, key, experiment.model.vocab)
        if data is None:
            raise DataError(f"data preparation wrote {entry} but it does not load")
        data.cached = False
        prog.note(f"data ready in {time.monotonic() - t0:.1f}s")
    check_lengths(data, experiment)
    return data

"""Data preparation: the tokenizer and each arm's training and validation tokens, cached by content hash.

`prepare_data(experiment, experiment_dir, cache_dir)`:

1. Fingerprints every source (a SHA-256 of its options and the bytes of each
   file it reads) and forms the cache key from those, the vocabulary size, the
   tokenizer (its settings when trained, the SHA-256 of its JSON when given),
   the split rule (split.py) and FORMAT_VERSION.
2. If `cache_dir/data-<key>/manifest.json` and everything it names load: no
   other work.
3. Otherwise, into a temporary directory renamed into place whole (a crash or
   a concurrent preparation never leaves a half-written entry):
   - the tokenizer: the given one byte for byte, or a byte-level BPE trained
     on a bounded sample of the training text (split.py);
   - each text arm streamed through the workers (workers.py: every core, a
     bounded number of results in memory) into `<arm>.train.tok` and
     `<arm>.val.tok`, documents split by split.py's rule;
   - each token-file arm checked (header, size, every id below the
     vocabulary) and read in place: only its validation tokens are copied,
     into `<arm>.val.tok`;
   - each random_tokens arm made from its SHAKE-256 stream.

Peak memory does not grow with the corpus: documents are read a work unit at
a time, the shards are written as the units come, and the tokenizer sample
is bounded. The same inputs give the same bytes whatever the number of
workers.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..atomic import fsync_dir, make_dirs, storage_guard, write_synced
from ..config.experiment import Experiment
from ..formats import bounded_json
from ..formats.shard import ShardWriter, shard_segment
from ..formats.token_files import TokenSegment, open_token_file
from ..safe_fs import UnsafeFileError, read_regular
from .builtin_sources import random_token_documents
from .data_error import DataError, unreadable
from .progress_bars import ProgressBars
from .source_files import SourceError, source_fingerprint
from .split import SPLIT_SETTINGS
from .text_arms import ArmWriter, Hashes, TextArms, skipped_note, train_arms_tokenizer
from .token_arms import build_token_arm, is_random_arm, is_token_file_arm, token_layout
from .tokenizer import GIVEN_LIMIT, TOKENIZER_SETTINGS, Tokenizer, TokenizerError
from .workers import Workers, default_workers

FORMAT_VERSION = 4  # 4: runs longer than text.WORD_CHARS are cut; 3: before a \r\n (text.safe_cut)
FORMATS_READ = (1, 2, 3, FORMAT_VERSION)  # 2 and 3 differ from 4 only in those cuts: they hold a run's tokens
# The cache entries of format 1 (before preparation streamed), read for runs trained on one: their key's
# parts, as that version wrote them (it trained the tokenizer on every training document, split by whole
# documents in the order of their hash).
V1 = {
    "format": 1,
    "tokenizer": {
        "kind": "byte_level_bpe",
        "special_tokens": ["<|endoftext|>"],
        "add_prefix_space": False,
        "use_regex": True,
        "min_frequency": 2,
        "version": 1,
    },
    "split": {"fraction": 0.01, "min_chars": 64 * 1024, "max_fraction": 0.1, "method": "sha256-docs-v1"},
}
MANIFEST = "manifest.json"
TOKENIZER_FILE = "tokenizer.json"
TEMP_PREFIX = ".tmp-"  # cache_dir/.tmp-<key>-<pid>-<ns>: a preparation under way (renamed into place when whole)
MANIFEST_LIMIT = 16 << 20


@dataclass
class PreparedData:
    key: str  # the content hash naming the cache entry
    path: Path  # cache_dir/data-<key>
    tokenizer: Tokenizer
    tokenizer_json: bytes  # the tokenizer file's bytes: what a run freezes and an export writes
    train: dict[str, list[TokenSegment]]  # arm name -> its training tokens (our shard, or token files in place)
    val_shards: dict[str, Path]  # arm name -> its validation shard
    stats: dict[str, dict] = field(default_factory=dict)  # arm -> docs, bytes, train_tokens, val_tokens
    cached: bool = False  # True when nothing had to be built
    fingerprints: dict[str, list[str]] = field(default_factory=dict)  # arm -> its sources' (when computed)

    @property
    def tokenizer_path(self) -> Path:
        return self.path / TOKENIZER_FILE


def default_cache_dir() -> Path:
    """$MICROGPT_CACHE, else $XDG_CACHE_HOME/microgpt, else ~/.cache/microgpt."""
    env = os.environ.get("MICROGPT_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "microgpt"


def read_given_tokenizer(experiment: Experiment, experiment_dir: Path | str) -> bytes | None:
    """The bytes of the tokenizer.json the experiment names (relative to its directory), or None."""
    if experiment.tokenizer is None:
        return None
    path = Path(experiment_dir) / experiment.tokenizer
    try:
        return read_regular(path, GIVEN_LIMIT)
    except FileNotFoundError:
        raise DataError(f"tokenizer: no such file {experiment.tokenizer!r} (looked at {path})") from None
    except UnsafeFileError as exc:
        raise DataError(f"tokenizer: {exc}") from None
    except OSError as exc:
        raise DataError(f"tokenizer: cannot read {path}: {exc.strerror}") from None


def fingerprints(
    experiment: Experiment, experiment_dir: Path | str, hashes: Hashes | None = None
) -> dict[str, list[str]]:
    """Each arm's sources' fingerprints (source_readers.source_fingerprint), in order; DataError naming the arm."""
    hashes = hashes if hashes is not None else Hashes()
    out = {}
    for arm in experiment.arms:
        try:
            out[arm.name] = [source_fingerprint(s, experiment_dir, hashes) for s in arm.sources]
        except SourceError as e:
            raise DataError(f"arm {arm.name!r}: {e}") from None
        except OSError as e:  # EACCES, EINVAL, EISDIR, ENOTDIR, EIO ... on a source file: one line
            raise DataError(f"arm {arm.name!r}: {unreadable(e)}") from None
    return out


def data_key(
    experiment: Experiment,
    experiment_dir: Path | str,
    tokenizer_json: bytes | None = None,
    hashes: Hashes | None = None,
    fps: dict[str, list[str]] | None = None,
) -> str:
    """The cache key: a hash of everything the prepared data depend on. `tokenizer_json`: a given
    tokenizer's bytes (default: the one the experiment names, if any); `fps`: the fingerprints, when
    computed already."""
    given = tokenizer_json if tokenizer_json is not None else read_given_tokenizer(experiment, experiment_dir)
    fps = fps if fps is not None else fingerprints(experiment, experiment_dir, hashes)
    arms = [[arm.name, fps[arm.name]] for arm in experiment.arms]
    tokenizer: Mapping[str, object] = (
        {"given": hashlib.sha256(given).hexdigest()} if given is not None else TOKENIZER_SETTINGS
    )
    if experiment.eot is not None:  # the separator written between documents (one found in the file: its bytes)
        tokenizer = {**tokenizer, "eot": experiment.eot}
    obj = {
        "format": FORMAT_VERSION,
        "vocab": experiment.model.vocab,
        "tokenizer": tokenizer,
        "split": SPLIT_SETTINGS,
        "arms": arms,
    }
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def v1_key(experiment: Experiment, experiment_dir: Path | str, fps: dict[str, list[str]] | None = None) -> str:
    """The key format 1 gave the same experiment and sources (its trained tokenizer, its split)."""
    fps = fps if fps is not None else fingerprints(experiment, experiment_dir)
    arms = [[arm.name, fps[arm.name]] for arm in experiment.arms]
    obj = {
        "format": V1["format"],
        "vocab": experiment.model.vocab,
        "tokenizer": V1["tokenizer"],
        "split": V1["split"],
        "arms": arms,
    }
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def _build(
    experiment: Experiment,
    base: Path,
    key: str,
    tmp: Path,
    progress: ProgressBars,
    given: bytes | None,
    hashes: Hashes,
    n_workers: int | None,
) -> None:
    vocab = experiment.model.vocab
    arms = TextArms(experiment, base, hashes)
    n = n_workers or default_workers(arms.total)
    if given is not None:
        try:
            tok = Tokenizer.from_json(given, vocab, experiment.tokenizer or "the run's tokenizer", experiment.eot)
        except TokenizerError as exc:
            raise DataError(str(exc)) from None
        tokenizer_json = given
    elif arms.arms:
        tok = train_arms_tokenizer(arms, vocab, n, progress)
        arms.docs.clear()
        tokenizer_json = tok.to_str().encode("utf-8")
    else:
        raise DataError('no arm holds text to train a tokenizer on: name one with "tokenizer"')
    write_synced(tmp / TOKENIZER_FILE, tokenizer_json)

    info: dict[str, dict] = {}
    if arms.arms:
        skipped, first_skipped = 0, None
        opened: list[ArmWriter] = []
        with (
            progress.task(
                f"encoding {len(arms.arms)} arm(s) ({n} worker{'s' if n > 1 else ''})", total=arms.total, unit="B"
            ) as t,
            Workers(n, tok) as workers,
        ):
            try:
                for arm_name, task, result in arms.run(workers):
                    if not opened or opened[-1].name != arm_name:
                        if opened:
                            info[opened[-1].name] = opened[-1].finish()
                        opened.append(ArmWriter(arm_name, tmp, vocab, arms.named_val(arm_name)))
                    opened[-1].add(result)
                    skipped += len(result.skipped)
                    first_skipped = first_skipped or (result.skipped[0] if result.skipped else None)
                    t.advance(task.unit.nbytes)
                if opened:
                    info[opened[-1].name] = opened[-1].finish()
            finally:
                for w in opened:
                    w.close()
            t.done(
                ", ".join(f"{name} {s['train_tokens']:,} + {s['val_tokens']:,}" for name, s in info.items())
                + " train + val tokens"
            )
        arms.check_documents()
        skipped_note(progress, skipped, first_skipped)

    train_segments: dict[str, list[dict]] = {}
    for arm in experiment.arms:
        if is_token_file_arm(arm):
            segments, info[arm.name] = build_token_arm(arm, base, vocab, tmp, progress)
            train_segments[arm.name] = [s.to_dict() for s in segments]
        elif is_random_arm(arm):
            tr, va = (random_token_documents(split, tok.trained_size, tok.eot_id) for split in ("train", "val"))
            for split, docs in (("train", tr), ("val", va)):
                writer = ShardWriter(tmp / f"{arm.name}.{split}.tok", vocab)
                try:
                    for d in docs:
                        writer.append(np.append(d, np.uint16(tok.eot_id)))
                    count = writer.finish()
                finally:
                    writer.close()
                info.setdefault(arm.name, {"kind": "random_tokens", "docs": len(tr) + len(va)})[f"{split}_tokens"] = (
                    count
                )
            train_segments[arm.name] = [{"file": f"{arm.name}.train.tok"}]
        else:
            train_segments[arm.name] = [{"file": f"{arm.name}.train.tok"}]
    arms_info = {
        arm.name: {"train": train_segments[arm.name], "val": f"{arm.name}.val.tok", **info[arm.name]}
        for arm in experiment.arms
    }
    manifest = {
        "format": FORMAT_VERSION,
        "key": key,
        "vocab": vocab,
        "tokenizer": TOKENIZER_FILE,
        "tokenizer_sha256": hashlib.sha256(tokenizer_json).hexdigest(),
        "tokenizer_given": given is not None,
        "tokenizer_trained": tok.trained_size,
        "python": sys.version.split()[0],
        "created": time.time(),
        "arms": arms_info,
    }
    write_synced(tmp / MANIFEST, json.dumps(manifest, indent=1).encode())
    fsync_dir(tmp)


# ---------------------------------------------------------------------------
# The cache entry.


def _load(entry: Path, key: str, vocab: int, external: dict[str, list[str]], eot: str | None) -> PreparedData | None:
    """The cache entry at `entry`, or None when absent, incomplete, or naming token files other than the
    experiment's (`external`: a token-file arm's files as they are now); `eot`: the experiment's."""
    try:
        manifest = bounded_json.loads(read_regular(entry / MANIFEST, MANIFEST_LIMIT))
    except (OSError, ValueError, UnsafeFileError, RecursionError):
        return None
    if not isinstance(manifest, dict) or manifest.get("key") != key or manifest.get("format") not in FORMATS_READ:
        return None
    train, val = {}, {}
    try:
        tokenizer_json = read_regular(entry / TOKENIZER_FILE, GIVEN_LIMIT)
        if manifest["format"] == V1["format"]:  # its arms name one train shard each, and no checksum
            manifest["arms"] = {
                name: {**info, "train": [{"file": info["train"]}]} for name, info in manifest["arms"].items()
            }
        elif hashlib.sha256(tokenizer_json).hexdigest() != manifest["tokenizer_sha256"]:
            return None
        tok = Tokenizer.from_json(tokenizer_json, vocab, str(entry / TOKENIZER_FILE), eot)
        for name, info in manifest["arms"].items():
            segments = []
            for s in info["train"]:
                if "file" in s:
                    segments.append(shard_segment(entry / Path(s["file"]).name)[0])
                    continue
                seg = TokenSegment.from_dict(s)
                if seg.path not in external.get(name, ()):
                    return None
                tf = open_token_file(seg.path, None)
                if (tf.dtype, tf.offset) != (seg.dtype, seg.offset) or seg.stop > tf.count:
                    return None
                segments.append(seg)
            train[name] = segments
            val[name] = entry / Path(info["val"]).name
            shard_segment(val[name])
    except Exception:  # noqa: BLE001 - a damaged entry of any kind is rebuilt
        return None
    stats = {
        name: {k: v for k, v in info.items() if k not in ("train", "val")} for name, info in manifest["arms"].items()
    }
    return PreparedData(key, entry, tok, tokenizer_json, train, val, stats, cached=True)


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
        parts = tmp.name[len(TEMP_PREFIX) :].split("-")
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
            problems.append(
                f"arm {name!r} has {n_train} train and {n_val} val tokens; "
                f"ctx {experiment.model.ctx} needs at least {row_len + 1} and {row_len}"
            )
    if problems:
        raise DataError("; ".join(problems) + " (add data to the arm or lower model.ctx)")


def load_cached(
    experiment: Experiment, experiment_dir: str | os.PathLike, cache_dir: str | os.PathLike, key: str
) -> PreparedData | None:
    """The cache entry of `key` if it is there whole (a run's recorded entry, or one of format 1), else
    None."""
    try:
        external = _external(experiment, Path(experiment_dir))
    except DataError:
        return None
    if Path(cache_dir).is_dir():
        remove_stale_temps(Path(cache_dir))
    data = _load(Path(cache_dir) / f"data-{key[:24]}", key, experiment.model.vocab, external, experiment.eot)
    if data is not None:
        check_lengths(data, experiment)
    return data


def _external(experiment: Experiment, base: Path) -> dict[str, list[str]]:
    """Each token-file arm's training files as they are now (a cache entry must name these)."""
    return {arm.name: [str(p) for p in token_layout(arm, base)[0]] for arm in experiment.arms if is_token_file_arm(arm)}


def prepare_data(
    experiment: Experiment,
    experiment_dir: str | os.PathLike,
    cache_dir: str | os.PathLike,
    progress: bool | ProgressBars = True,
    tokenizer_json: bytes | None = None,
    workers: int | None = None,
    fps: dict[str, list[str]] | None = None,
) -> PreparedData:
    """Tokenizer and per-arm train/val tokens for `experiment`, built on first use and cached.

    `experiment_dir` is where relative source paths are resolved (the experiment file's directory).
    `tokenizer_json`: a tokenizer's bytes to use instead of the experiment's own (a run's frozen one).
    `workers`: processes that encode (default: workers.default_workers); `fps`: the sources' fingerprints
    when computed already (a launch's comparison with its run's frozen sources: each file is read once).
    `progress`: True for a bar on
    stderr, False for silence, or a ProgressBars. Raises DataError (one line) on a bad source, a bad
    tokenizer, or an arm too small for the context length."""
    prog = progress if isinstance(progress, ProgressBars) else ProgressBars(enabled=bool(progress))
    experiment_dir = Path(experiment_dir)
    cache_dir = Path(cache_dir)
    given = tokenizer_json if tokenizer_json is not None else read_given_tokenizer(experiment, experiment_dir)
    hashes = Hashes()
    fps = fps if fps is not None else fingerprints(experiment, experiment_dir, hashes)
    key = data_key(experiment, experiment_dir, given, fps=fps)
    external = _external(experiment, experiment_dir)
    entry = cache_dir / f"data-{key[:24]}"
    if cache_dir.is_dir():
        remove_stale_temps(cache_dir)
    vocab = experiment.model.vocab
    data = _load(entry, key, vocab, external, experiment.eot)
    if data is None:
        make_dirs(cache_dir)
        prog.note(f"preparing data for {experiment.name} (first use) into {entry}")
        t0 = time.monotonic()
        tmp = cache_dir / f"{TEMP_PREFIX}{key[:24]}-{os.getpid()}-{time.monotonic_ns()}"
        try:  # made inside the try: a stop signal landing just after mkdir still removes it
            with storage_guard(tmp, "create"):
                tmp.mkdir()
            _build(experiment, experiment_dir, key, tmp, prog, given, hashes, workers)
            if entry.exists():  # damaged entry, or another process finished first
                if _load(entry, key, vocab, external, experiment.eot) is None:
                    shutil.rmtree(entry)
            try:
                with storage_guard(entry, "rename into"):
                    os.rename(tmp, entry)
            except OSError:
                if _load(entry, key, vocab, external, experiment.eot) is None:
                    raise
            fsync_dir(cache_dir)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        data = _load(entry, key, vocab, external, experiment.eot)
        if data is None:
            raise DataError(f"data preparation wrote {entry} but it does not load")
        data.cached = False
        prog.note(f"data ready in {time.monotonic() - t0:.1f}s")
    check_lengths(data, experiment)
    data.fingerprints = fps
    return data

"""The run's data definition: what it was trained on, frozen in RUN/data/ (docs/FORMATS.md, "The data definition").

    RUN/data/data.json          the definition: tokenizer, each arm's sources and validation shard
    RUN/data/tokenizer.json     the tokenizer, byte for byte (checksummed in data.json)
    RUN/data/<arm>.val.tok      the tokens each arm is evaluated on (a token shard, checksummed)

Written at the first launch that prepares the data, replaced freely until a
step is trained (a launch that fails before its first step freezes nothing),
and binding from the first trained step on: `sample`, `eval`, `export`,
`verify` and `fork` use only these files, never the sources; `proxy run`
compares each source's fingerprint with the one recorded here and refuses a
source that changed or vanished unless told to continue, which is recorded
in `changes` (the definition it replaced kept as archive/data_<time>.json).

Nothing here is trusted: data.json is read within its size cap and checked
against its schema, every file it names against its size and SHA-256.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import numpy as np
from pydantic import Field, ValidationError

from .. import temp_names
from ..atomic import (
    atomic_copy,
    atomic_write_bytes,
    copy_synced,
    fsync_dir,
    json_bytes,
    make_dirs,
    storage_guard,
    write_synced,
)
from ..config.strict import StrictModel
from ..data.tokenizer import GIVEN_LIMIT, Tokenizer, TokenizerError
from ..formats.shard import HEADER, ShardError, shard_segment
from ..formats.token_files import first_out_of_range
from ..safe_fs import UnsafeFileError, file_sha256, read_regular
from .layout import ARCHIVE, DATA, DATA_DEFINITION, READ_LIMITS, TOKENIZER, RunDir, RunDirError

DEFINITION_FORMAT = 1
SHA256 = r"^[0-9a-f]{64}$"
REPLACED_NAME = "data_{time:.0f}.json"  # in RUN/archive/: a definition a data change replaced


class FrozenFile(StrictModel):
    """A file of RUN/data/: its name there, size and SHA-256."""

    file: str = Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$", max_length=128)
    bytes: int = Field(ge=0)
    sha256: str = Field(pattern=SHA256)


class FrozenTokenizer(FrozenFile):
    given: str | None = None  # the experiment's tokenizer file (absolute) it was copied from; None: trained
    eot_id: int = Field(ge=0)
    tokens: int = Field(ge=1)  # its size (the model's vocabulary may be larger)


class FrozenShard(FrozenFile):
    tokens: int = Field(ge=0)


class FrozenSource(StrictModel):
    """One source as the run read it: its kind, its path fields made absolute, its fingerprint, and the number
    and total size of the files it read (to say what changed)."""

    kind: str
    paths: dict[str, str] = Field(default_factory=dict)
    fingerprint: str = Field(pattern=SHA256)
    files: int = Field(ge=0)
    bytes: int = Field(ge=0)


class FrozenArm(StrictModel):
    sources: list[FrozenSource]
    val: FrozenShard
    train_tokens: int = Field(ge=0)


class DataChange(StrictModel):
    """A launch that continued with sources other than the frozen ones (`--allow-data-change`)."""

    time: float
    step: int = Field(ge=0)  # the step training continued from
    changes: list[str]


class DataDefinition(StrictModel):
    format: int
    vocab: int = Field(ge=1)
    cache_key: str = Field(pattern=SHA256)  # the prepared-data cache entry it came from
    tokenizer: FrozenTokenizer
    arms: dict[str, FrozenArm]
    time: float
    changes: list[DataChange] = Field(default_factory=list)


def read_definition(run: RunDir) -> DataDefinition | None:
    """RUN/data/data.json, checked against its schema; None when there is none; RunDirError (one line) when
    it is unreadable or malformed."""
    path = run.data_definition
    try:
        raw = read_regular(path, READ_LIMITS[DATA_DEFINITION], within=run.root)
    except FileNotFoundError:
        return None
    except UnsafeFileError as exc:
        raise RunDirError(str(exc)) from None
    except OSError as exc:
        raise RunDirError(f"{path}: unreadable ({exc.strerror})") from None
    try:
        definition = DataDefinition.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise RunDirError(
            f"{path}: not a data definition ({where}: {first.get('msg')}); restore the run's data/ directory"
        ) from None
    if definition.format != DEFINITION_FORMAT:
        raise RunDirError(f"{path}: data definition format {definition.format}, this proxy reads {DEFINITION_FORMAT}")
    return definition


def _check_file(run: RunDir, frozen: FrozenFile) -> str | None:
    """Why one file of RUN/data/ is not the one data.json names, or None."""
    path = run.data_dir / frozen.file  # a plain name (the schema's pattern)
    try:
        size, digest = file_sha256(path, within=run.root)
    except FileNotFoundError:
        return f"{DATA}/{frozen.file} is missing"
    except UnsafeFileError as exc:
        return f"{DATA}/{frozen.file}: {exc.reason}"
    except OSError as exc:
        return f"{DATA}/{frozen.file}: unreadable ({exc.strerror})"
    if size != frozen.bytes:
        return f"{DATA}/{frozen.file} has {size} bytes, data.json says {frozen.bytes}"
    if digest != frozen.sha256:
        return f"{DATA}/{frozen.file} does not match its SHA-256 in data.json"
    return None


def problems(run: RunDir, definition: DataDefinition) -> list[str]:
    """Every file of the definition checked (size, SHA-256, a shard's header): what is wrong, one phrase each."""
    out = []
    for frozen in [definition.tokenizer] + [arm.val for arm in definition.arms.values()]:
        problem = _check_file(run, frozen)
        if problem is None and isinstance(frozen, FrozenShard):
            try:
                segment, _vocab = shard_segment(run.data_dir / frozen.file)
                bad = first_out_of_range(segment, definition.vocab)
                if segment.tokens != frozen.tokens:
                    problem = f"{DATA}/{frozen.file} holds {segment.tokens} tokens, data.json says {frozen.tokens}"
                elif bad is not None:  # the engine would refuse its eval frames, restart after restart
                    problem = (
                        f"{DATA}/{frozen.file} holds token id {bad[1]} at position {bad[0]}, at or above "
                        f"the vocabulary ({definition.vocab})"
                    )
            except (ShardError, OSError) as exc:
                problem = f"{DATA}/{frozen.file}: {exc}"
        if problem is not None:
            out.append(problem)
    return out


def checked_definition(run: RunDir) -> DataDefinition | None:
    """The definition with every file it names verified; None when the run has none; RunDirError naming what is
    wrong otherwise."""
    definition = read_definition(run)
    if definition is None:
        return None
    wrong = problems(run, definition)
    if wrong:
        raise RunDirError(
            f"the run's frozen data are damaged: {'; '.join(wrong[:3])}"
            + (f"; and {len(wrong) - 3} more" if len(wrong) > 3 else "")
            + f" (restore {run.data_dir} from a copy of the run)"
        )
    return definition


def run_tokenizer(run: RunDir, definition: DataDefinition) -> tuple[Tokenizer, bytes]:
    """The run's tokenizer and its bytes (the definition's files verified already)."""
    path = run.data_dir / definition.tokenizer.file
    try:
        raw = read_regular(path, GIVEN_LIMIT, within=run.root)
        return Tokenizer.from_json(raw, definition.vocab, str(path), eot_id=definition.tokenizer.eot_id), raw
    except (OSError, UnsafeFileError, TokenizerError) as exc:
        raise RunDirError(str(exc) if str(path) in str(exc) else f"{path}: {exc}") from None  # named once


def run_val_arrays(run: RunDir, definition: DataDefinition, arm_names: list[str]) -> dict[str, np.ndarray]:
    """Each arm's frozen validation tokens, memory-mapped; RunDirError for an arm the definition lacks."""
    missing = [name for name in arm_names if name not in definition.arms]
    if missing:
        raise RunDirError(f"{run.data_definition} has no validation tokens for arm(s) {', '.join(missing)}")
    return {name: shard_segment(run.data_dir / definition.arms[name].val.file)[0].array() for name in arm_names}


def val_file(arm: str) -> str:
    return f"{arm}.val.tok"


def freeze(
    run: RunDir,
    *,
    vocab: int,
    cache_key: str,
    tokenizer: Tokenizer,
    tokenizer_json: bytes,
    given: str | None,
    arms: dict[str, tuple[list[FrozenSource], Path, int]],
) -> DataDefinition:
    """Write RUN/data/ whole: the tokenizer's bytes, each arm's validation shard (copied from `arms`' paths)
    and data.json, built in a temp directory beside it and swapped in, so that data.json names only files
    that are there. `arms`: name -> (its sources, its validation shard, its training tokens). The temp
    directories are temp_names.py's: nothing planted under a temp name is written through."""
    run.check_paths()  # data/ a symlink or not a directory: one line, nothing written
    tmp = temp_names.make_dir(run.root, DATA, temp_names.DATA_TMP)
    old = None
    try:
        write_synced(tmp / TOKENIZER, tokenizer_json)
        frozen_arms = {}
        for name, (sources, val_path, train_tokens) in arms.items():
            target = tmp / val_file(name)
            copy_synced(val_path, target)
            size, digest = file_sha256(target)
            frozen_arms[name] = FrozenArm(
                sources=sources,
                train_tokens=train_tokens,
                val=FrozenShard(file=val_file(name), bytes=size, sha256=digest, tokens=(size - HEADER.size) // 2),
            )
        definition = DataDefinition(
            format=DEFINITION_FORMAT,
            vocab=vocab,
            cache_key=cache_key,
            time=time.time(),
            arms=frozen_arms,
            tokenizer=FrozenTokenizer(
                file=TOKENIZER,
                bytes=len(tokenizer_json),
                sha256=hashlib.sha256(tokenizer_json).hexdigest(),
                given=given,
                eot_id=tokenizer.eot_id,
                tokens=tokenizer.trained_size,
            ),
        )
        write_synced(tmp / DATA_DEFINITION, json_bytes(definition.model_dump(mode="json")))
        fsync_dir(tmp)
        with storage_guard(run.data_dir, "replace"):
            if os.path.lexists(run.data_dir):  # a real directory (check_paths): renamed over a new empty one
                old = temp_names.make_dir(run.root, DATA, temp_names.DATA_OLD)
                os.rename(run.data_dir, old)
            os.rename(tmp, run.data_dir)
        fsync_dir(run.root)
        return definition
    finally:
        temp_names.remove_entry(tmp)
        if old is not None:
            temp_names.remove_entry(old)


def record_change(
    run: RunDir,
    definition: DataDefinition,
    cache_key: str,
    arms: dict[str, tuple[list[FrozenSource], Path, int]],
    changes: list[str],
    step: int,
) -> DataDefinition:
    """A launch continuing with changed sources: the old data.json kept as archive/data_<time>.json; the new
    one records each arm's sources as they are now, with the change appended. The tokenizer and the
    validation shards stay the frozen ones; an arm the definition lacks (the experiment gained it) gets its
    validation shard copied from `arms`."""
    make_dirs(run.root / ARCHIVE)
    atomic_write_bytes(
        run.root / ARCHIVE / REPLACED_NAME.format(time=time.time()), json_bytes(definition.model_dump(mode="json"))
    )
    merged = definition.model_copy(deep=True)
    for name, (sources, val_path, train_tokens) in arms.items():
        if name in merged.arms:
            merged.arms[name] = merged.arms[name].model_copy(update={"sources": sources, "train_tokens": train_tokens})
            continue
        target = run.data_dir / val_file(name)
        atomic_copy(val_path, target)
        size, digest = file_sha256(target)
        merged.arms[name] = FrozenArm(
            sources=sources,
            train_tokens=train_tokens,
            val=FrozenShard(file=val_file(name), bytes=size, sha256=digest, tokens=(size - HEADER.size) // 2),
        )
    merged.cache_key = cache_key
    merged.changes.append(DataChange(time=time.time(), step=step, changes=changes))
    atomic_write_bytes(run.data_definition, json_bytes(merged.model_dump(mode="json")))
    return merged


def copy_definition(source: RunDir, target_dir: Path, arm_names: list[str]) -> None:
    """RUN/data/ copied into a new run being built in `target_dir` (a fork), after the checks that `run`,
    `eval` and `export` make of it (every file against data.json, the tokenizer loaded, a validation shard
    for each of `arm_names`, the experiment's arms), so that a fork holds only data they accept."""
    definition = checked_definition(source)
    if definition is None:
        return
    run_tokenizer(source, definition)
    run_val_arrays(source, definition, arm_names)
    make_dirs(target_dir / DATA)
    names = [definition.tokenizer.file] + [arm.val.file for arm in definition.arms.values()] + [DATA_DEFINITION]
    for name in names:
        copy_synced(source.data_dir / name, target_dir / DATA / name)
    fsync_dir(target_dir / DATA)

"""Arms of token files read in place, and the random_tokens arm: their training and validation tokens, no
tokenizer trained on them (prepare.py calls these once the tokenizer is known)."""

from __future__ import annotations

from pathlib import Path

from ..config.experiment import ArmConfig
from ..config.sources import BuiltinSource, TokensSource
from ..formats.shard import ShardWriter
from ..formats.token_files import TokenFileError, TokenSegment, copy_ids, first_out_of_range, open_token_file
from .data_error import DataError
from .progress_bars import ProgressBars
from .source_files import SourceError, _matches
from .split import tail_tokens


def _tokens_source(arm: ArmConfig) -> TokensSource:
    """The token-file source of a token-file arm (experiment.py: it is the arm's only source)."""
    src = arm.sources[0]
    if not isinstance(src, TokensSource):  # a caller's mistake: only is_token_file_arm's arms come here
        raise DataError(f"arm {arm.name!r}: not a token-file arm ({src.describe()})")
    return src


def token_layout(arm: ArmConfig, base: Path) -> tuple[list[Path], list[Path]]:
    """(the training files, the validation files) of a token-file arm, absolute, in order."""
    src = _tokens_source(arm)
    try:
        train = [p.resolve() for p in _matches("tokens", src.tokens, base)]
        val = [p.resolve() for p in _matches("tokens val", src.val, base)] if src.val else []
    except SourceError as exc:
        raise DataError(f"arm {arm.name!r}: {exc}") from None
    return train, val


def is_token_file_arm(arm: ArmConfig) -> bool:
    return isinstance(arm.sources[0], TokensSource)


def is_random_arm(arm: ArmConfig) -> bool:
    return isinstance(arm.sources[0], BuiltinSource) and not arm.sources[0].is_text


def build_token_arm(arm: ArmConfig, base: Path, vocab: int, tmp: Path, progress: ProgressBars) -> tuple[list, dict]:
    """Check a token-file arm's files (headers, sizes, every id < vocab); its validation tokens (the val
    files, or the training stream's tail by split.py's rule) copied into `<arm>.val.tok`."""
    src = _tokens_source(arm)
    train_files, val_files = token_layout(arm, base)
    try:
        train = [open_token_file(p, src.format) for p in train_files]
        val = [open_token_file(p, src.format) for p in val_files]
    except TokenFileError as exc:
        raise DataError(f"arm {arm.name!r}: {exc}") from None
    total = sum(p.stat().st_size for p in train_files + val_files)
    with progress.task(f"checking {arm.name} (token ids < {vocab})", total=total, unit="B") as t:
        for tf in train + val:
            bad = first_out_of_range(tf.segment(), vocab, t.advance)
            if bad is not None:
                raise DataError(
                    f"arm {arm.name!r}: {tf.path}: token id {bad[1]} at position {bad[0]} is at or "
                    f"above model.vocab {vocab} (the file was made with another tokenizer, or is not "
                    f"{tf.format} token ids)"
                )
    segments = [tf.segment() for tf in train if tf.count]
    if val:
        val_segments = [tf.segment() for tf in val if tf.count]
    else:
        need = tail_tokens(sum(s.tokens for s in segments), 0)
        val_segments = []
        while need > 0 and segments:  # the tail of the stream, across files if one is short
            last = segments.pop()
            take = min(need, last.tokens)
            val_segments.insert(0, TokenSegment(last.path, last.dtype, last.offset, last.stop - take, last.stop))
            if take < last.tokens:
                segments.append(TokenSegment(last.path, last.dtype, last.offset, last.start, last.stop - take))
            need -= take
    writer = ShardWriter(tmp / f"{arm.name}.val.tok", vocab)
    try:
        copy_ids(val_segments, writer.append)
        n_val = writer.finish()
    finally:
        writer.close()
    stats = {
        "kind": "tokens",
        "files": len(train) + len(val),
        "format": sorted({tf.format for tf in train + val}),
        "train_tokens": sum(s.tokens for s in segments),
        "val_tokens": n_val,
        "val_split": not val,
    }
    return segments, stats

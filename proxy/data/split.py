"""The rules that choose an arm's validation tokens and the tokenizer's training sample, written once.

Both are decided document by document (piece by piece for the sample) from
a hash of the bytes alone, so that they stream: no rule needs the whole
corpus in memory, or its order, or the number of workers reading it.

**Validation split** (per arm, ~99/1):

1. A document goes to validation when the first 8 bytes of the SHA-256 of
   its UTF-8 bytes, as a number, fall in the first VAL_FRACTION of their
   range, and it is at most VAL_FRACTION of the arm's source bytes (so a
   few huge documents never make up the split).
2. Then, while validation holds fewer than `val_target(tokens)` tokens
   (max(1%, min(16Ki, 10%)) of the arm's tokens), the last tokens of the
   training stream move to its end. An arm of one huge document, or of
   token files (which have no documents), is split by this step alone.

**Tokenizer sample**: a piece of training text is in the sample when the
SHA-256 of SAMPLE_SALT and its bytes falls below `sample_rate` of the range,
the rate being SAMPLE_BYTES over the text sources' bytes (1: everything,
for corpora below SAMPLE_BYTES); pieces are taken in order until the sample
holds 2 x SAMPLE_BYTES.
"""

from __future__ import annotations

import hashlib
import math

from .tokenizer import SAMPLE_BYTES

VAL_FRACTION = 0.01
VAL_MIN_TOKENS = 16 * 1024  # ... but at least this many validation tokens where the arm has 10x that
VAL_MAX_FRACTION = 0.1
VAL_HASH_LIMIT = int(VAL_FRACTION * 2**64)
SAMPLE_SALT = b"microgpt-tokenizer-sample\0"
SAMPLE_CAP = 2 * SAMPLE_BYTES
SPLIT_SETTINGS = {
    "fraction": VAL_FRACTION,
    "min_tokens": VAL_MIN_TOKENS,
    "max_fraction": VAL_MAX_FRACTION,
    "method": "sha256-doc-then-tail-v2",
}
TRAIN, VAL = "train", "val"


def hash64(data: bytes) -> int:
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "big")


def val_doc_max(arm_bytes: int) -> int:
    """The largest document that may go to validation by its hash."""
    return int(VAL_FRACTION * arm_bytes)


def by_hash(size: int, digest: bytes, largest: int) -> str:
    """TRAIN or VAL for one document of `size` bytes whose SHA-256 is `digest` (rule 1)."""
    if size > largest:
        return TRAIN
    return VAL if int.from_bytes(digest[:8], "big") < VAL_HASH_LIMIT else TRAIN


def val_target(total_tokens: int) -> int:
    """How many validation tokens an arm of `total_tokens` holds at least (rule 2)."""
    return max(math.ceil(VAL_FRACTION * total_tokens), min(VAL_MIN_TOKENS, int(VAL_MAX_FRACTION * total_tokens)))


def tail_tokens(train_tokens: int, val_tokens: int) -> int:
    """How many tokens move from the end of the training stream to validation (rule 2)."""
    return max(0, min(train_tokens, val_target(train_tokens + val_tokens) - val_tokens))


def sample_rate(text_bytes: int) -> float:
    return min(1.0, SAMPLE_BYTES / text_bytes) if text_bytes > 0 else 1.0


def in_sample(piece: str, rate: float) -> bool:
    if rate >= 1.0:
        return True
    return hash64(SAMPLE_SALT + piece.encode("utf-8", "surrogatepass")) < int(rate * 2**64)

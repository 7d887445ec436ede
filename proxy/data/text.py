"""Text as the preparation reads it: what counts as text, and where a long text may be cut.

**Binary data is not text.** A file with a NUL byte, or whose first 64 KiB
are more than 10% control bytes, is token ids or some other binary format
that happens to decode (a uint16 token file whose ids are all below 128 is
valid UTF-8, every other byte NUL): a `file` or `jsonl` source refuses it
with one line pointing at the `tokens` source; a `glob` or `dir` skips it,
as it skips files that are not UTF-8.

**Long texts are cut where the tokenizer would cut them anyway**, so that no
piece held in memory or encoded at once is much longer than PIECE_CHARS,
whatever the size of a document. A cut goes right before a newline that
follows a printable ASCII character other than a space, or right before the
`\r\n` that follows one (a file with Windows line ends has no newline right
after a printable character): GPT-2's byte-level pre-tokenizer (ours, and
GPT-2's own) always ends a pre-token there (no pattern of it runs from a
non-space character into whitespace, and what follows is matched the same
without what came before), so a document
encoded in pieces gives the same tokens as encoded whole. Where no such
place exists within SEARCH_CHARS of the nominal cut (a megabyte without a
line break), the cut goes at the nominal place (a character boundary). The
places are a function of the text alone: the same input is cut the same
way, whatever the number of workers.

**No word is longer than WORD_CHARS.** A pre-token of GPT-2's pattern lies
within one run of non-whitespace characters (plus at most one space before
it) or one run of whitespace, and BPE's cost grows with a word's length
without bound (a 4 MiB word encoded in 1 MiB pieces took 520 MB; training
a tokenizer on a 16 MiB one never ended). So a run of either kind longer than WORD_CHARS is cut every
WORD_CHARS characters from its start, and its parts are pieces of their own:
such a text's tokens are those of its parts, not of the whole (text with
no such run, which is all ordinary text, is not affected). With PIECE_CHARS,
this bounds what one encode call is given, whatever a document holds.
"""

from __future__ import annotations

import codecs
import re
from typing import AnyStr, BinaryIO

PIECE_CHARS = 1 << 20  # a long text is encoded in pieces of about this many characters (or bytes)
SEARCH_CHARS = 1 << 16  # how far past the nominal cut a newline is looked for
WORD_CHARS = 1 << 12  # a run of non-whitespace (or of whitespace) characters is cut every this many
# A maximal run longer than WORD_CHARS: the lookbehind fails at once inside a run, so the scan is linear.
_LONG_RUN = re.compile(rf"(?<!\S)\S{{{WORD_CHARS + 1},}}|(?<!\s)\s{{{WORD_CHARS + 1},}}")
BINARY_HEAD = 64 * 1024  # bytes looked at for control characters
MAX_CONTROL = 0.10  # ... more than this share of them, and it is not text
_CONTROL = bytes(b for b in range(32) if b not in b"\t\n\v\f\r\x1b") + b"\x7f"
TOKENS_HINT = 'for token ids use a {"tokens": ...} source (docs/EXPERIMENTS.md)'


def binary_reason(data: bytes, head: bool = True) -> str | None:
    """Why `data` is binary, not text, or None: a NUL byte anywhere, or (with `head`, the start of a file)
    mostly control bytes in its first BINARY_HEAD bytes."""
    if b"\0" in data:
        return "binary data (NUL bytes), not text"
    if head:
        sample = data[:BINARY_HEAD]
        control = len(sample) - len(sample.translate(None, _CONTROL))
        if sample and control > MAX_CONTROL * len(sample):
            return f"binary data ({100 * control / len(sample):.0f}% control bytes), not text"
    return None


def _printable(c: int) -> bool:
    return 0x21 <= c <= 0x7E


def _code(c: int | str) -> int:
    return c if isinstance(c, int) else ord(c)


def safe_cut(text: AnyStr, nominal: int) -> int:
    """The first place at or after `nominal` (within SEARCH_CHARS) right before a newline, or a `\r\n`,
    that follows a printable non-space ASCII character; else `nominal` itself (moved past UTF-8
    continuation bytes when `text` is bytes). `len(text)` when `nominal` is at or past the end."""
    n = len(text)
    if nominal >= n:
        return n
    newline: AnyStr = b"\n" if isinstance(text, bytes) else "\n"
    limit = min(n, nominal + SEARCH_CHARS)
    i = text.find(newline, max(nominal, 1), limit)
    while i != -1:
        before = _code(text[i - 1])
        if _printable(before):
            return i
        if before == 0x0D and i - 1 >= max(nominal, 1) and _printable(_code(text[i - 2])):
            return i - 1
        i = text.find(newline, i + 1, limit)
    if isinstance(text, bytes):
        while nominal < n and 0x80 <= text[nominal] < 0xC0:
            nominal += 1
    return nominal


def word_cuts(text: str) -> list[int]:
    """The places inside runs longer than WORD_CHARS where they are cut: every WORD_CHARS characters from
    each such run's start."""
    return [cut for run in _LONG_RUN.finditer(text) for cut in range(run.start() + WORD_CHARS, run.end(), WORD_CHARS)]


def pieces(text: str, size: int = PIECE_CHARS) -> list[str]:
    """`text` cut into pieces of about `size` characters at safe places (safe_cut), and wherever a run is
    cut (word_cuts); one piece when short and without such a run."""
    cuts = set(word_cuts(text))
    start = 0
    while len(text) - start > size:
        start = safe_cut(text, start + size)
        cuts.add(start)
    bounds = [0, *sorted(cuts), len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def decode_strict(data: bytes, where: str, offset: int = 0) -> str:
    """UTF-8 text, or ValueError naming `where` and the byte (`offset` is where `data` starts in its file)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{where}: not UTF-8 text ({e.reason} at byte {offset + e.start}); {TOKENS_HINT}") from None


def file_is_text(f: BinaryIO, size: int, block: int = 1 << 22) -> str | None:
    """Why the open binary file `f` (read from where it is) is not text, or None: binary_reason on its head,
    then NUL bytes and UTF-8 validity block by block (bounded memory, whatever its size)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    first = True
    read = 0
    while True:
        chunk = f.read(block)
        if not chunk:
            break
        reason = binary_reason(chunk, head=first)
        if reason:
            return reason
        try:
            decoder.decode(chunk, final=False)
        except UnicodeDecodeError as e:
            return f"not UTF-8 text ({e.reason} near byte {read + e.start})"
        read += len(chunk)
        first = False
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError as e:
        return f"not UTF-8 text ({e.reason} at the end)"
    return None

"""The mixing suite's realistic low-quality documents, made deterministically from real text on the machine.

Each is one of the suite's corpora (scripts/mixing/corpora.py writes them as
files the proxy reads like any data): text whose loss falls at first and then
stops teaching anything a target arm needs, the kinds of junk a real corpus
holds (the builtin random_tokens and repeated_names sources are the trivially
worthless kinds):

- shuffled_words: the standard library's docstrings, each document's words in
  a fixed shuffled order (real words, no sentences);
- boilerplate: short paragraphs of the license texts every Debian system ships
  (/usr/share/common-licenses), a small pool of them repeated in every
  document, as page footers and license headers are across a crawl;
- near_duplicates: a few dozen real docstring paragraphs, each copied many
  times with small edits (a word dropped, doubled or swapped with its
  neighbour, a digit changed);
- man_pages_de: the German manual pages of the system (/usr/share/man/de),
  roff source: another language (and a markup) than the target arms.

Every order and every edit comes from SHA-256 of fixed strings, never from a
random generator, so the documents are the same on every machine that has the
same input files.
"""

from __future__ import annotations

import gzip
import hashlib
import re
import zlib
from collections.abc import Callable
from pathlib import Path

LICENSES_DIR = Path("/usr/share/common-licenses")
MAN_DE_DIR = Path("/usr/share/man/de")

BOILERPLATE_POOL = 48  # paragraphs of license text in the pool
BOILERPLATE_MAX_CHARS = 400  # ... each at most this long (notices, not whole licenses)
BOILERPLATE_DOCS = 3000  # documents, each ...
BOILERPLATE_PARTS = 3  # ... this many pool paragraphs

NEAR_DUP_SOURCES = 64  # docstring paragraphs copied ...
NEAR_DUP_COPIES = 48  # ... this many times each, every copy with ...
NEAR_DUP_EDIT_RATE = 0.08  # ... about this share of its words edited
NEAR_DUP_MIN_CHARS, NEAR_DUP_MAX_CHARS = 200, 600


def _digest(*parts) -> bytes:
    return hashlib.sha256(":".join(map(str, parts)).encode()).digest()


def _unit(*parts) -> float:
    """A number in [0, 1) that is a pure function of `parts`."""
    return int.from_bytes(_digest(*parts)[:8], "little") / 2.0**64


def _hash_order(items: list, *salt) -> list:
    """`items` sorted by a hash of (salt, position): a fixed shuffle."""
    return [items[i] for i in sorted(range(len(items)), key=lambda i: _digest(*salt, i))]


def _paragraphs(text: str) -> list[str]:
    return [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]


# ---------------------------------------------------------------- which files


def license_files() -> list[Path]:
    """The license texts (regular files, not the links between them), sorted by name."""
    if not LICENSES_DIR.is_dir():
        return []
    return sorted(p for p in LICENSES_DIR.iterdir() if p.is_file() and not p.is_symlink())


def man_de_files() -> list[Path]:
    """The German manual pages (gzip-compressed roff), sorted by their path under MAN_DE_DIR."""
    if not MAN_DE_DIR.is_dir():
        return []
    return sorted(
        (p for p in MAN_DE_DIR.rglob("*.gz") if p.is_file() and not p.is_symlink()),
        key=lambda p: p.relative_to(MAN_DE_DIR).as_posix(),
    )


# ---------------------------------------------------------------- documents


def shuffled_words(docstrings: list[str]) -> list[str]:
    """Each document's words (split on white space) in a fixed order of their own."""
    out = []
    for n, doc in enumerate(docstrings):
        words = doc.split()
        out.append(" ".join(_hash_order(words, "shuffled-words", n)))
    return out


def boilerplate(files: list[Path], read: Callable[[Path], str]) -> list[str]:
    """BOILERPLATE_DOCS documents, each BOILERPLATE_PARTS paragraphs drawn from a pool of
    BOILERPLATE_POOL short license paragraphs (the pool in a fixed order, distinct paragraphs
    only)."""
    seen, short = set(), []
    for p in files:
        for para in _paragraphs(read(p)):
            if len(para) <= BOILERPLATE_MAX_CHARS and para not in seen:
                seen.add(para)
                short.append(para)
    pool = _hash_order(short, "boilerplate-pool")[:BOILERPLATE_POOL]
    if not pool:
        return []
    return [
        "\n\n".join(pool[int(_unit("boilerplate", d, j) * len(pool))] for j in range(BOILERPLATE_PARTS))
        for d in range(BOILERPLATE_DOCS)
    ]


def _edit(words: list[str], *salt) -> list[str]:
    """About NEAR_DUP_EDIT_RATE of the words edited: dropped, doubled, swapped with the next, or a
    digit added to it, each chosen by a hash of (salt, position)."""
    out, i = [], 0
    while i < len(words):
        w = words[i]
        u = _unit(*salt, i)
        if u >= NEAR_DUP_EDIT_RATE:
            out.append(w)
        else:
            kind = int(u / NEAR_DUP_EDIT_RATE * 4)
            if kind == 1:
                out += [w, w]
            elif kind == 2 and i + 1 < len(words):
                out += [words[i + 1], w]
                i += 1
            elif kind == 3:
                out.append(w + str(int(_unit(*salt, i, "digit") * 10)))
            # kind 0: dropped
        i += 1
    return out


def near_duplicates(docstrings: list[str]) -> list[str]:
    """NEAR_DUP_SOURCES docstring paragraphs of moderate length (a fixed choice), each copied
    NEAR_DUP_COPIES times with small edits; the copies in a fixed shuffled order."""
    paragraphs = [
        p for doc in docstrings for p in _paragraphs(doc) if NEAR_DUP_MIN_CHARS <= len(p) <= NEAR_DUP_MAX_CHARS
    ]
    chosen = _hash_order(sorted(set(paragraphs)), "near-dup-choice")[:NEAR_DUP_SOURCES]
    copies = [
        " ".join(_edit(p.split(), "near-dup", n, c)) for n, p in enumerate(chosen) for c in range(NEAR_DUP_COPIES)
    ]
    return _hash_order(copies, "near-dup-order")


def man_page_text(path: Path) -> str | None:
    """A gzip-compressed manual page's roff source (None when it is not UTF-8 text)."""
    try:
        return gzip.decompress(path.read_bytes()).decode("utf-8")
    except (OSError, EOFError, zlib.error, UnicodeDecodeError):
        return None

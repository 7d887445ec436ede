#!/usr/bin/env python3
"""The mixing suite's corpora: its low-quality arms' documents (lowquality.py), written as files the proxy reads.

    python scripts/mixing/corpora.py              # build every corpus (eval_mixing.py builds those it needs)
    python scripts/mixing/corpora.py --dir DIR    # elsewhere

The suite's experiments (experiments/MIXING-*.json) name these files, and the
proxy reads them as it reads any user's data (docs/EXPERIMENTS.md,
"Sources"): they are evaluation data, not part of the experiment schema. They
are made from the machine's own text (the Python standard library's
docstrings, Debian's license texts and German manual pages), so they are built
on the machine, not committed: into CORPORA_DIR (ignored by git), each written
durably (a temporary file, fsync, rename, fsync of the directory) and only
when its bytes differ from the file's, so building again writes nothing, and a
file damaged or edited by hand is made again.

Each corpus holds its documents in order, empty ones left out (the proxy drops
them too). Three are JSON Lines (`{"text": ...}` per line); the German pages
are a gzip-compressed Parquet file, which keeps their train/validation split
as it was when they were a builtin source, and with it the token stream the
committed results were trained on (docs/DATA-MIXING.md, "The corpora", says
why; tests/unit/scripts/mixing/test_corpora.py checks it for every corpus).

Exit status: 0 when every corpus asked for is on disk, 1 when one cannot be
made (its material is missing) or written (one line naming it), 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

if __name__ == "__main__":  # run as a script: the repository (proxy) and scripts/ (mixing) importable
    sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parents[1])]

from mixing import lowquality
from proxy.atomic import atomic_write_bytes, make_dirs
from proxy.config.experiment import load_experiment
from proxy.data.builtin_sources import module_docstrings, module_name, stdlib_files, stdlib_root
from proxy.safe_fs import open_regular

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
CORPORA_DIR = EXPERIMENTS / "mixing-corpora"  # the experiments name their files relative to their own directory
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
# gzip: the German pages' file stays about as large as their gzip files were (docs/DATA-MIXING.md, "The corpora")
PARQUET_COMPRESSION = "gzip"


class CorpusError(RuntimeError):
    """A corpus that cannot be made (its material is not on the machine) or written; one line."""


# ---------------------------------------------------------------- the material


def machine_text(p: Path) -> str | None:
    """A file of the machine's own text as text, or None when it is binary (holds a NUL) or not UTF-8: such a
    file is skipped, as the proxy's glob source skips it."""
    with open_regular(p, None) as f:
        data = f.read()
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


@functools.cache  # two corpora are made of them
def docstrings() -> list[str]:
    """The standard library's docstrings, one document per module (as the builtin stdlib_docstrings reads them)."""
    root = stdlib_root()
    docs = [
        module_docstrings(text, module_name(p.relative_to(root).as_posix()))
        for p in stdlib_files()
        if (text := machine_text(p)) is not None
    ]
    docs = [d for d in docs if d]
    if not docs:
        raise CorpusError(f"no docstrings in the standard library under {root}")
    return docs


def boilerplate_documents() -> list[str]:
    files = lowquality.license_files()
    if not files:
        raise CorpusError(f"boilerplate: no license texts under {lowquality.LICENSES_DIR}")
    return lowquality.boilerplate(files, lambda p: machine_text(p) or "")


def german_documents() -> list[str]:
    files = lowquality.man_de_files()
    if not files:
        raise CorpusError(f"man_pages_de: no manual pages under {lowquality.MAN_DE_DIR}")
    return [t for p in files if (t := lowquality.man_page_text(p)) is not None]


# ---------------------------------------------------------------- the file formats


def jsonl_bytes(docs: list[str]) -> bytes:
    """One `{"text": ...}` line per document (the proxy's jsonl source, field "text")."""
    return "".join(json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in docs).encode("utf-8")


def parquet_bytes(docs: list[str]) -> bytes:
    """One row per document in a column "text" (the proxy's parquet source); needs pyarrow."""
    try:
        import pyarrow as pa  # noqa: PLC0415 - optional dependency, needed by this corpus alone
        import pyarrow.parquet as pq  # noqa: PLC0415
    except ImportError:
        raise CorpusError(
            "man_pages_de: writing Parquet needs pyarrow, which is not installed: pip install 'microgpt[parquet]'"
        ) from None
    out = io.BytesIO()
    pq.write_table(pa.table({"text": docs}), out, compression=PARQUET_COMPRESSION)
    return out.getvalue()


# ---------------------------------------------------------------- the corpora


@dataclass(frozen=True)
class Corpus:
    name: str
    file: str  # its file name in the corpora directory
    documents: Callable[[], list[str]]
    encode: Callable[[list[str]], bytes]


CORPORA = (
    Corpus("shuffled_words", "shuffled_words.jsonl", lambda: lowquality.shuffled_words(docstrings()), jsonl_bytes),
    Corpus("boilerplate", "boilerplate.jsonl", boilerplate_documents, jsonl_bytes),
    Corpus("near_duplicates", "near_duplicates.jsonl", lambda: lowquality.near_duplicates(docstrings()), jsonl_bytes),
    Corpus("man_pages_de", "man_pages_de.parquet", german_documents, parquet_bytes),
)
BY_NAME = {c.name: c for c in CORPORA}


def corpus_bytes(corpus: Corpus) -> bytes:
    return corpus.encode([d for d in corpus.documents() if d])


def build(corpus: Corpus, directory: Path = CORPORA_DIR) -> bool:
    """Write `corpus` into `directory` unless the file there holds these bytes already; whether it wrote."""
    data = corpus_bytes(corpus)
    path = directory / corpus.file
    try:
        if path.is_file() and not path.is_symlink() and path.read_bytes() == data:
            return False
    except OSError:
        pass  # unreadable: made again
    try:
        make_dirs(directory)
        atomic_write_bytes(path, data)
    except OSError as e:
        raise CorpusError(f"{corpus.name}: cannot write {path} ({e.strerror or e})") from None
    return True


def needed_by(experiment: Path, directory: Path = CORPORA_DIR) -> list[Corpus]:
    """The corpora in `directory` whose files the experiment's sources name (ExperimentError: not an experiment)."""
    exp = load_experiment(experiment, check_sources=False)  # the corpora are what may be missing
    named = {
        Path(value)
        for arm in exp.arms
        for src in arm.sources
        for _field, value, _what in src.resolved(experiment.resolve().parent).path_fields()
    }
    return [c for c in CORPORA if (directory.resolve() / c.file) in named]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=CORPORA_DIR, help=f"where they go (default {CORPORA_DIR})")
    ap.add_argument("corpus", nargs="*", help=f"which ({', '.join(BY_NAME)}; default: all)")
    args = ap.parse_args(argv)
    unknown = [n for n in args.corpus if n not in BY_NAME]
    if unknown:
        print(f"corpora: unknown corpus {', '.join(unknown)} (known: {', '.join(BY_NAME)})", file=sys.stderr)
        return EXIT_USAGE
    for corpus in [BY_NAME[n] for n in args.corpus] or CORPORA:
        try:
            wrote = build(corpus, args.dir)
        except CorpusError as e:
            print(f"corpora: {e}", file=sys.stderr)
            return EXIT_FAILED
        print(f"corpora: {args.dir / corpus.file} {'written' if wrote else 'unchanged'}")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())

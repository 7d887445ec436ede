"""scripts/mixing/lowquality.py: the mixing suite's realistic low-quality documents, made from the machine's text
(scripts/mixing/corpora.py reads the material and writes the corpora)."""

from __future__ import annotations

import gzip

import pytest
from mixing import corpora, lowquality

from proxy.config.sources import parse_source
from proxy.data.source_readers import load_documents


def test_the_docstrings_are_the_builtin_stdlib_docstrings():
    """The material of shuffled_words and near_duplicates: the documents the proxy's stdlib_docstrings reads."""
    assert corpora.docstrings() == load_documents(parse_source({"builtin": "stdlib_docstrings"}), ".")


def test_shuffled_words_keep_each_document_s_words():
    docs = corpora.docstrings()
    shuffled = lowquality.shuffled_words(docs)
    assert len(shuffled) == len(docs)
    assert all(sorted(a.split()) == sorted(b.split()) for a, b in zip(docs, shuffled, strict=True))
    assert sum(a.split() != b.split() for a, b in zip(docs, shuffled, strict=True)) > 0.9 * len(docs)
    assert lowquality.shuffled_words(docs) == shuffled


def test_near_duplicates_are_copies_with_small_edits():
    docs = lowquality.near_duplicates(corpora.docstrings())
    assert len(docs) == lowquality.NEAR_DUP_SOURCES * lowquality.NEAR_DUP_COPIES
    assert len(set(docs)) > 0.9 * len(docs)  # copies differ from each other ...
    words = [set(d.split()) for d in docs]
    close = [max(len(w & v) / len(w | v) for j, v in enumerate(words) if j != i) for i, w in enumerate(words[:50])]
    assert min(close) > 0.7  # ... by a few words
    assert lowquality.near_duplicates(corpora.docstrings()) == docs


def test_boilerplate_repeats_a_small_pool_of_license_paragraphs(tmp_path, monkeypatch):
    docs = corpora.boilerplate_documents()
    assert len(docs) == lowquality.BOILERPLATE_DOCS
    pool = {p for d in docs for p in d.split("\n\n")}
    assert len(pool) <= lowquality.BOILERPLATE_POOL and max(map(len, pool)) <= lowquality.BOILERPLATE_MAX_CHARS
    assert corpora.boilerplate_documents() == docs
    # made from the files on the machine: another license text, another corpus file; none is one clear error
    licenses = tmp_path / "licenses"
    licenses.mkdir()
    (licenses / "A").write_text("Permission is granted.\n\nNo warranty.\n")
    (licenses / "B").write_bytes(b"\0binary")  # not text: skipped
    monkeypatch.setattr(lowquality, "LICENSES_DIR", licenses)
    corpus = corpora.BY_NAME["boilerplate"]
    assert {p for d in corpora.boilerplate_documents() for p in d.split("\n\n")} == {
        "Permission is granted.",
        "No warranty.",
    }
    assert corpora.build(corpus, tmp_path / "out")
    before = (tmp_path / "out" / corpus.file).read_bytes()
    (licenses / "A").write_text("Permission is granted.\n")
    assert corpora.build(corpus, tmp_path / "out") and (tmp_path / "out" / corpus.file).read_bytes() != before
    monkeypatch.setattr(lowquality, "LICENSES_DIR", tmp_path / "none")
    with pytest.raises(corpora.CorpusError, match="no license texts under"):
        corpora.boilerplate_documents()


def test_german_man_pages(tmp_path, monkeypatch):
    pages = tmp_path / "de" / "man1"
    pages.mkdir(parents=True)
    (pages / "ls.1.gz").write_bytes(gzip.compress(b".TH LS 1\n.SH BEZEICHNUNG\nls \\- Verzeichnisinhalte auflisten\n"))
    (pages / "bad.1.gz").write_bytes(gzip.compress(b"\xff\xfe not utf-8"))
    (pages / "broken.1.gz").write_bytes(b"not gzip")
    monkeypatch.setattr(lowquality, "MAN_DE_DIR", tmp_path / "de")
    docs = corpora.german_documents()
    assert docs == [".TH LS 1\n.SH BEZEICHNUNG\nls \\- Verzeichnisinhalte auflisten\n"]  # the others skipped
    monkeypatch.setattr(lowquality, "MAN_DE_DIR", tmp_path / "none")
    with pytest.raises(corpora.CorpusError, match="no manual pages under"):
        corpora.german_documents()

"""scripts/mixing/corpora.py: the suite's corpora written as files the proxy reads, durably and only when their
bytes change; the suite's experiments name them; their train/validation split is the one the committed results
were trained on."""

from __future__ import annotations

import hashlib
import json
import os

import pytest
from mixing import corpora, lowquality
from mixing.suite import SUITE

from proxy.config.config_file import ExperimentError
from proxy.config.sources import parse_source
from proxy.data.builtin_sources import stdlib_files
from proxy.data.source_readers import load_documents
from proxy.data.split import by_hash, val_doc_max

KIND = {".jsonl": "jsonl", ".parquet": "parquet"}


def test_the_proxy_reads_each_corpus_as_its_documents(tmp_path):
    """Every corpus, written, is read back by the proxy's own source kind as the same documents in order."""
    for corpus in corpora.CORPORA:
        assert corpora.build(corpus, tmp_path)
        path = tmp_path / corpus.file
        source = parse_source({KIND[path.suffix]: str(path)})
        assert load_documents(source, tmp_path) == [d for d in corpus.documents() if d], corpus.name
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(c.file for c in corpora.CORPORA)  # no temp left


def test_building_again_writes_nothing_and_a_damaged_file_is_made_again(tmp_path):
    corpus = corpora.BY_NAME["near_duplicates"]
    path = tmp_path / corpus.file
    assert corpora.build(corpus, tmp_path)
    first, stat = path.read_bytes(), path.stat()
    assert not corpora.build(corpus, tmp_path)
    assert (path.stat().st_ino, path.stat().st_mtime_ns) == (stat.st_ino, stat.st_mtime_ns)  # not rewritten
    path.write_bytes(first[:-100])  # cut short
    assert corpora.build(corpus, tmp_path) and path.read_bytes() == first
    path.unlink()
    path.symlink_to(tmp_path / "elsewhere")  # a link is replaced, never written through
    assert corpora.build(corpus, tmp_path) and not path.is_symlink() and path.read_bytes() == first
    assert not (tmp_path / "elsewhere").exists()
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    with pytest.raises(corpora.CorpusError, match="near_duplicates: cannot write .*a-file/near_duplicates.jsonl"):
        corpora.build(corpus, blocked)


def test_the_suite_names_every_corpus_and_nothing_else():
    named = {m.name: [c.name for c in corpora.needed_by(m.experiment)] for m in SUITE}
    assert named == {
        "good": [],
        "sizes": [],
        "shuffled": ["shuffled_words"],
        "lowquality": ["boilerplate", "near_duplicates", "man_pages_de"],
        "worthless": [],
    }
    with pytest.raises(ExperimentError):
        corpora.needed_by(corpora.EXPERIMENTS / "no-such-experiment.json")


def _material_bytes(name: str) -> int:
    """What the builtin source each corpus replaces counted as its bytes: the files it read on disk."""
    files = {
        "shuffled_words": stdlib_files,
        "near_duplicates": stdlib_files,
        "boilerplate": lowquality.license_files,
        "man_pages_de": lowquality.man_de_files,
    }[name]()
    return sum(p.stat().st_size for p in files)


@pytest.mark.parametrize("name", [c.name for c in corpora.CORPORA])
def test_each_document_goes_to_validation_as_it_did(tmp_path, name):
    """The preparation sends a document to validation by its hash only if it is at most 1% of its arm's
    source bytes on disk (proxy/data/split.py). The corpus file is another source than the builtin it replaces, of
    another size: every document must still go where it went, or the suite's token stream (and the committed
    summary, docs/bench/mixing-cpu.json) is another."""
    corpus = corpora.BY_NAME[name]
    corpora.build(corpus, tmp_path)
    raws = [d.encode() for d in corpus.documents() if d]
    then, now = val_doc_max(_material_bytes(name)), val_doc_max((tmp_path / corpus.file).stat().st_size)
    for raw in raws:
        digest = hashlib.sha256(raw).digest()
        assert by_hash(len(raw), digest, now) == by_hash(len(raw), digest, then), (name, len(raw), then, now)


def test_the_command_line(tmp_path, capsys):
    assert corpora.main(["--dir", str(tmp_path), "boilerplate"]) == corpora.EXIT_OK
    assert os.listdir(tmp_path) == ["boilerplate.jsonl"] and "written" in capsys.readouterr().out
    assert corpora.main(["--dir", str(tmp_path), "boilerplate"]) == corpora.EXIT_OK
    assert "boilerplate.jsonl unchanged" in capsys.readouterr().out
    assert corpora.main(["--dir", str(tmp_path), "german"]) == corpora.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown corpus german (known: shuffled_words" in err
    first = json.loads((tmp_path / "boilerplate.jsonl").read_text().splitlines()[0])
    assert list(first) == ["text"]

"""Data: sources, tokenizer, train/val split, preparation and its cache."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import pytest

from proxy.config.config_file import ExperimentError
from proxy.config.experiment import load_experiment, parse_experiment
from proxy.config.sources import parse_source
from proxy.data import (
    DataError,
    SourceError,
    Tokenizer,
    data_key,
    load_documents,
    prepare_data,
    source_files,
    train_tokenizer,
)
from proxy.data.progress_bars import ProgressBars
from proxy.data.split import VAL, by_hash, val_doc_max
from proxy.data.tokenizer import EOT
from proxy.formats.shard import read_shard


def SourceConfig(**fields):  # noqa: N802 - reads like the old constructor: one source from its JSON keys
    return parse_source(fields)


def train_tokens(data, arm):
    """An arm's training tokens (one shard for a text arm)."""
    (segment,) = data.train[arm]
    return segment.array()


ROOT = Path(__file__).resolve().parents[2]


def small_experiment(sources_a, sources_b, vocab=300, ctx=16, name="small"):
    return parse_experiment(
        {
            "name": name,
            "model": {"vocab": vocab, "ctx": ctx, "dim": 16, "layers": 1, "heads": 2},
            "train": {"batch": 2, "max_steps": 10, "lr": 1e-3, "min_lr": 1e-4, "warmup": 1, "seed": 1, "eval_rows": 2},
            "arms": [{"name": "a", "sources": sources_a}, {"name": "b", "sources": sources_b}],
        }
    )


@pytest.fixture
def corpus(tmp_path):
    d = tmp_path / "corpus"
    (d / "sub").mkdir(parents=True)
    (d / ".hidden").mkdir()
    for i in range(30):
        (d / f"m{i:02d}.py").write_text(f"def f{i}(x):\n    return x * {i}  # number {i}\n" * (20 + i))
    (d / "sub" / "z.py").write_text("class Z:\n    pass\n" * 50)
    (d / "notes.txt").write_text("some notes\n")
    (d / ".hidden" / "h.py").write_text("hidden = True\n")
    (d / "bin.py").write_bytes(b"\xff\xfe\x00binary")
    with open(tmp_path / "docs.jsonl", "w") as f:
        for i in range(200):
            f.write(
                json.dumps({"text": f"Document {i}: the quick brown fox jumps over {i} lazy dogs. " * 5, "id": i})
                + "\n"
            )
            if i % 50 == 0:
                f.write("\n")
    return tmp_path


# --- sources ----------------------------------------------------------------


def test_dir_source(corpus):
    src = SourceConfig(dir="corpus", suffix=".py")
    files = source_files(src, corpus)
    rel = [p.relative_to(corpus / "corpus").as_posix() for p in files]
    assert rel == sorted(rel) and "sub/z.py" in rel and not any(r.startswith(".") for r in rel)
    assert "notes.txt" not in rel
    docs = load_documents(src, corpus)
    assert len(docs) == 31  # bin.py (not UTF-8) skipped
    assert docs[0].startswith("def f0(x):")


def test_file_glob_jsonl_sources(corpus):
    assert load_documents(SourceConfig(file="corpus/notes.txt"), corpus) == ["some notes\n"]
    g = load_documents(SourceConfig(glob="corpus/**/*.py"), corpus)
    assert len(g) == 31 and g == load_documents(SourceConfig(dir="corpus", suffix=".py"), corpus)
    j = load_documents(SourceConfig(jsonl="docs.jsonl"), corpus)
    assert len(j) == 200 and j[3].startswith("Document 3:")
    assert load_documents(SourceConfig(jsonl="docs.jsonl", field="text", max_chars=100), corpus)[0] == j[0][:100]


def test_source_errors(corpus):
    with pytest.raises(SourceError, match="no such file 'absent.txt'"):
        load_documents(SourceConfig(file="absent.txt"), corpus)
    with pytest.raises(SourceError, match="matches no file"):
        load_documents(SourceConfig(glob="corpus/*.rs"), corpus)
    with pytest.raises(SourceError, match="no files ending with '.rs'"):
        load_documents(SourceConfig(dir="corpus", suffix=".rs"), corpus)
    with pytest.raises(SourceError, match=r"bin.py: binary data \(NUL bytes\), not text; .*\{\"tokens\": \.\.\.\}"):
        load_documents(SourceConfig(file="corpus/bin.py"), corpus)
    (corpus / "latin1.txt").write_bytes("café au lait\n".encode("latin-1"))
    with pytest.raises(SourceError, match=r"latin1.txt: not UTF-8 text \(invalid continuation byte at byte 3\)"):
        load_documents(SourceConfig(file="latin1.txt"), corpus)
    with pytest.raises(SourceError, match=r"docs.jsonl:1: no 'body' field"):
        load_documents(SourceConfig(jsonl="docs.jsonl", field="body"), corpus)
    (corpus / "bad.jsonl").write_text('{"text": "ok"}\n{oops\n')
    with pytest.raises(SourceError, match=r"bad.jsonl:2: not JSON"):
        load_documents(SourceConfig(jsonl="bad.jsonl"), corpus)


def test_builtin_sources():
    code = load_documents(SourceConfig(builtin="stdlib_code", modules=["json"]), ".")
    assert len(code) >= 4 and any("def dumps(" in d for d in code)
    docs = load_documents(SourceConfig(builtin="stdlib_docstrings", modules=["json"]), ".")
    assert any(d.startswith("json\nJSON (JavaScript Object Notation)") for d in docs)
    assert any("json.dumps\nSerialize ``obj``" in d for d in docs)
    topics = load_documents(SourceConfig(builtin="pydoc_topics"), ".")
    assert len(topics) > 50 and sum(map(len, topics)) > 100_000
    assert load_documents(SourceConfig(builtin="pydoc_topics"), ".") == topics  # deterministic
    with pytest.raises(SourceError, match="no standard library source files"):
        load_documents(SourceConfig(builtin="stdlib_code", modules=["no_such_module_xyz"]), ".")


# --- tokenizer ----------------------------------------------------------------


def test_tokenizer_train_roundtrip(tmp_path, corpus):
    docs = load_documents(SourceConfig(dir="corpus", suffix=".py"), corpus)
    tok = train_tokenizer(docs, 300)
    assert tok.vocab_size == 300 and tok.trained_size <= 300 and tok.eot_id == 0
    for s in ["def f1(x):\n    return x", "héllo ☃ wörld \t\n", "", "\x00\x01 bytes"]:
        ids = tok.encode(s)
        assert all(0 <= i < 300 for i in ids)
        assert tok.decode(ids) == s
    assert len(tok.encode("def f1(x):\n    return x")) < len("def f1(x):\n    return x")  # merges learned
    tok.save(tmp_path / "t.json")
    again = Tokenizer.load(tmp_path / "t.json", 300)
    assert again.encode("def f7(x):") == tok.encode("def f7(x):")
    assert train_tokenizer(docs, 300).to_str() == tok.to_str()  # deterministic
    assert tok.decode([tok.eot_id]) == "<|endoftext|>"
    assert tok.decode([299, 65535]) == tok.decode([299])  # untrained ids decode to nothing


# --- split (proxy/data/split.py) ------------------------------------------------


def split_of(tmp_path, docs, name="split"):
    """Prepare one arm of JSON Lines documents (the other arm a fixed file): its val text and train text."""
    src = tmp_path / f"{name}.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    (tmp_path / "other.txt").write_text("other arm text\n" * 500)
    exp = small_experiment([{"jsonl": src.name}], [{"file": "other.txt"}], name=name)
    data = prepare_data(exp, tmp_path, tmp_path / f"cache-{name}", progress=False, workers=1)
    val = read_shard(data.val_shards["a"])[0]
    return data, data.tokenizer.decode(train_tokens(data, "a").tolist()), data.tokenizer.decode(val.tolist())


def test_split_many_documents(tmp_path):
    docs = [f"doc {i} " * (50 + i % 7) for i in range(3000)]
    data, train, val = split_of(tmp_path, docs)
    stats = data.stats["a"]
    total = stats["train_tokens"] + stats["val_tokens"]
    assert 0.01 * total <= stats["val_tokens"] <= 0.15 * total
    # rule 1: whole documents by their hash, in order; rule 2: then the tail of the training stream
    largest = val_doc_max((tmp_path / "split.jsonl").stat().st_size)
    chosen = [d for d in docs if by_hash(len(d), hashlib.sha256(d.encode()).digest(), largest) == VAL]
    assert 10 <= len(chosen) == stats["val_docs"] < 100
    head = "".join(d + EOT for d in chosen)
    assert val.startswith(head)
    assert train + val[len(head) :] == "".join(d + EOT for d in docs if d not in chosen)
    # the split depends on content, not on position
    _data, _train, reversed_val = split_of(tmp_path, list(reversed(docs)), "reversed")
    assert reversed_val.startswith("".join(d + EOT for d in reversed(chosen)))


def test_split_single_document(tmp_path):
    doc = "line of text\n" * 100_000
    data, train, val = split_of(tmp_path, [doc])
    assert data.stats["a"]["val_docs"] == 0 and train + val == doc + "<|endoftext|>"
    assert 0.009 * len(doc) <= len(val) <= 0.1 * len(doc)  # the tail of the stream


# --- preparation and cache ------------------------------------------------------


def test_prepare_and_cache(tmp_path, corpus):
    exp = small_experiment([{"dir": "corpus", "suffix": ".py"}], [{"jsonl": "docs.jsonl"}])
    err = io.StringIO()
    data = prepare_data(exp, corpus, tmp_path / "cache", progress=ProgressBars(True, err))
    assert not data.cached
    log = err.getvalue()
    assert "training tokenizer" in log and "encoding 2 arm(s)" in log and "\x1b" not in log
    assert "skipped 1 file(s) that are not text (first: " in log and "bin.py: binary data (NUL bytes)" in log
    for arm in ("a", "b"):
        tr = train_tokens(data, arm)
        va, vocab = read_shard(data.val_shards[arm])
        assert vocab == 300 and tr.size > 1000 and va.size >= 17
        assert int(tr.max()) < 300
        assert data.stats[arm]["train_tokens"] == tr.size
    text = data.tokenizer.decode(read_shard(data.val_shards["b"])[0][:40].tolist())
    assert "Document " in text

    # second call: no work, same files
    err2 = io.StringIO()
    again = prepare_data(exp, corpus, tmp_path / "cache", progress=ProgressBars(True, err2))
    assert again.cached and again.path == data.path and again.train == data.train
    assert err2.getvalue() == ""
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [data.path.name]

    # content changes the key; moving the data does not
    k1 = data_key(exp, corpus)
    moved = tmp_path / "moved"
    (moved).mkdir()
    import shutil

    shutil.copytree(corpus / "corpus", moved / "corpus")
    shutil.copy(corpus / "docs.jsonl", moved / "docs.jsonl")
    assert data_key(exp, moved) == k1
    (moved / "corpus" / "m03.py").write_text("changed = 1\n")
    assert data_key(exp, moved) != k1
    bigger = small_experiment([{"dir": "corpus", "suffix": ".py"}], [{"jsonl": "docs.jsonl"}], vocab=310)
    assert data_key(bigger, corpus) != k1


def test_prepare_rebuilds_damaged_cache(tmp_path, corpus):
    exp = small_experiment([{"dir": "corpus", "suffix": ".py"}], [{"jsonl": "docs.jsonl"}])
    data = prepare_data(exp, corpus, tmp_path / "cache", progress=False)
    Path(data.train["a"][0].path).write_bytes(b"junk")
    again = prepare_data(exp, corpus, tmp_path / "cache", progress=False)
    assert not again.cached
    assert train_tokens(again, "a").size == data.stats["a"]["train_tokens"]


def test_prepare_errors(tmp_path, corpus):
    exp = small_experiment([{"file": "corpus/absent.txt"}], [{"jsonl": "docs.jsonl"}])
    with pytest.raises(DataError, match="arm 'a': file source: no such file"):
        prepare_data(exp, corpus, tmp_path / "cache", progress=False)
    tiny = small_experiment([{"file": "corpus/notes.txt"}], [{"jsonl": "docs.jsonl"}], ctx=64)
    with pytest.raises(DataError, match="arm 'a' has .* train and .* val tokens; ctx 64 needs"):
        prepare_data(tiny, corpus, tmp_path / "cache", progress=False)
    assert not any(p.name.startswith(".tmp") for p in (tmp_path / "cache").iterdir())


def test_tiny_experiment_prepares(tmp_path):
    exp = load_experiment(ROOT / "experiments" / "TINY-TRAIN.json")
    data = prepare_data(exp, ROOT / "experiments", tmp_path / "cache", progress=False)
    assert set(data.train) == set(exp.arm_names)
    for arm in exp.arm_names:
        assert data.stats[arm]["val_tokens"] >= 2000
        assert data.stats[arm]["train_tokens"] >= 20 * data.stats[arm]["val_tokens"] // 10
    ids = data.tokenizer.encode("def main():\n    import json\n")
    assert max(ids) < exp.model.vocab
    assert data.tokenizer.decode(ids) == "def main():\n    import json\n"


def test_the_format_1_key_is_the_old_versions(tmp_path):
    """A run trained before runs froze their data finds its data by the key format 1 gave them (pinned: the
    value the version before computed for these files)."""
    from proxy.data.prepare import v1_key

    (tmp_path / "corpus.txt").write_text("hello world, this is a tiny corpus.\n" * 200)
    (tmp_path / "d.jsonl").write_text("".join(f'{{"t": "doc {i}"}}\n' for i in (1, 2, 3)))
    exp = parse_experiment(
        {
            "name": "V1",
            "model": {"vocab": 300, "ctx": 16, "dim": 16, "layers": 1, "heads": 2},
            "train": {
                "batch": 2,
                "max_steps": 10,
                "lr": 0.001,
                "min_lr": 0.0001,
                "warmup": 1,
                "seed": 1,
                "eval_rows": 2,
            },
            "arms": [
                {"name": "a", "sources": [{"file": "corpus.txt"}, {"jsonl": "d.jsonl", "field": "t"}]},
                {"name": "b", "sources": [{"dir": ".", "suffix": ".txt", "max_chars": 1000}]},
            ],
        }
    )
    assert v1_key(exp, tmp_path) == "21b65c2959ab3733c1c73ffac5f1aa1c7a57c39a233bdd0d1b6b319b78bdc0c1"


# --- named validation documents (`val`, `val_split`) ------------------------------


def _write_saved(root: Path, splits: dict[str, list[str]]) -> None:
    """A DatasetDict as `save_to_disk` writes it: dataset_dict.json and a directory of Arrow files per split."""
    import pyarrow as pa  # noqa: PLC0415 - the [parquet] extra

    root.mkdir()
    (root / "dataset_dict.json").write_text(json.dumps({"splits": list(splits)}))
    for split, rows in splits.items():
        (root / split).mkdir()
        table = pa.table({"text": rows})
        with pa.OSFile(str(root / split / "data.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table)
        (root / split / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data.arrow"}]}))


def test_every_text_kind_takes_its_validation_documents(tmp_path):
    """Each text kind's `val` (hf_dataset: `val_split`) is read as the kind reads its own files, and is the arm's
    whole validation split: every training document trains, nothing is split off by hash or tail."""
    pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow is the [parquet] extra")
    import pyarrow as pa  # noqa: PLC0415

    train_docs = [f"training text number {i} " * (30 + i % 5) for i in range(40)]
    val_docs = [f"held out text {i} " * 20 for i in range(6)]
    (tmp_path / "train").mkdir()
    (tmp_path / "val").mkdir()
    for i, d in enumerate(train_docs):
        (tmp_path / "train" / f"t{i:02d}.txt").write_text(d)
    for i, d in enumerate(val_docs):
        (tmp_path / "val" / f"v{i:02d}.txt").write_text(d)
    (tmp_path / "train.txt").write_text("".join(train_docs))
    (tmp_path / "val.txt").write_text("".join(val_docs))
    for name, docs in (("train", train_docs), ("val", val_docs)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
        pq.write_table(pa.table({"text": docs}), tmp_path / f"{name}.parquet")
    _write_saved(tmp_path / "saved", {"train": train_docs, "validation": val_docs})
    (tmp_path / "other.txt").write_text("other arm text\n" * 500)
    whole = ["".join(train_docs)], ["".join(val_docs)]
    kinds = {
        "file": ({"file": "train.txt", "val": "val.txt"}, *whole),
        "glob": ({"glob": "train/*.txt", "val": "val/*.txt"}, train_docs, val_docs),
        "dir": ({"dir": "train", "val": "val"}, train_docs, val_docs),
        "jsonl": ({"jsonl": "train.jsonl", "val": "val.jsonl"}, train_docs, val_docs),
        "parquet": ({"parquet": "train.parquet", "val": "val.parquet"}, train_docs, val_docs),
        "hf_dataset": ({"hf_dataset": "saved", "val_split": "validation"}, train_docs, val_docs),
    }
    for kind, (source, want_train, want_val) in kinds.items():
        exp = small_experiment([source], [{"file": "other.txt"}], name=f"val-{kind}")
        data = prepare_data(exp, tmp_path, tmp_path / f"cache-{kind}", progress=False, workers=1)
        val = data.tokenizer.decode(read_shard(data.val_shards["a"])[0].tolist())
        train = data.tokenizer.decode(train_tokens(data, "a").tolist())
        assert val == "".join(d + EOT for d in want_val), kind
        assert train == "".join(d + EOT for d in want_train), kind
        stats = data.stats["a"]
        assert stats["val_named"] and stats["val_tail_tokens"] == 0 and stats["val_docs"] == len(want_val), kind
    # the named files are part of the data's identity: other validation text is other data
    exp = small_experiment([kinds["file"][0]], [{"file": "other.txt"}], name="val-file")
    before = data_key(exp, tmp_path)
    (tmp_path / "val.txt").write_text("changed validation text " * 40)
    assert data_key(exp, tmp_path) != before


def test_named_validation_errors_are_one_line(tmp_path):
    (tmp_path / "a.txt").write_text("text " * 100)
    exp = small_experiment([{"file": "a.txt", "val": "absent.txt"}], [{"file": "a.txt"}]).model_dump(exclude_none=True)
    (tmp_path / "exp.json").write_text(json.dumps(exp))
    with pytest.raises(ExperimentError, match=r"arms\[0\]\.sources\[0\]\.val: no such file 'absent.txt'"):
        load_experiment(tmp_path / "exp.json")
    with pytest.raises(ValueError, match="val_split 'train' is the training split itself"):
        SourceConfig(hf_dataset="saved", val_split="train")
    with pytest.raises(ValueError, match="unknown key 'val'"):
        SourceConfig(builtin="stdlib_code", val="x.txt")

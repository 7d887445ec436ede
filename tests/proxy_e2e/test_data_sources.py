"""Every source kind end to end through `proxy run`, and each one's bad input: one line, exit 2.

The data are made here from real text (the standard library, the docs): a
tokenizer.json trained with HF tokenizers, token files encoded with it in
nanoGPT's, llm.c's and NumPy's formats, a Parquet file and a `save_to_disk`
directory. Nothing is downloaded.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from proxy.data.builtin_sources import stdlib_files
from proxy.data.tokenizer import train_tokenizer
from proxy.formats.token_files import LLMC_MAGIC

from .conftest import REPO, Proxy, proxy_env, read_entries, run_args, run_cmd

VOCAB = 512
TRAIN = dict(
    batch=4,
    max_steps=30,
    lr=3e-3,
    min_lr=3e-4,
    warmup=5,
    seed=7,
    ckpt_every=10,
    eval_every=10,
    eval_rows=4,
    sample_every=10,
    threads=1,
)


def texts(limit: int) -> list[str]:
    out, size = [], 0
    for p in stdlib_files(["json", "textwrap", "string", "functools", "argparse", "collections", "pathlib"]):
        out.append(p.read_text(encoding="utf-8"))
        size += len(out[-1])
        if size > limit:
            break
    return out


def llmc(ids: np.ndarray) -> bytes:
    header = np.zeros(256, dtype="<i4")
    header[:3] = LLMC_MAGIC, 1, ids.size
    return header.tobytes() + ids.astype("<u2").tobytes()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    """tokenizer.json, train.bin/val.bin (nanoGPT), shard.bin (llm.c), ids.npy (uint32), docs.parquet, saved/."""
    pa = pytest.importorskip("pyarrow", reason="pyarrow is the [parquet] extra (pip install '.[test]')")
    import pyarrow.parquet as pq

    d = tmp_path_factory.mktemp("sources")
    docs = texts(600_000)
    tok = train_tokenizer(docs[:3], VOCAB)
    (d / "tokenizer.json").write_text(tok.to_str())
    ids = np.concatenate([np.array(tok.encode(t) + [tok.eot_id], dtype=np.uint16) for t in docs])
    third = ids.size // 3
    (d / "train.bin").write_bytes(ids[:third].tobytes())
    (d / "val.bin").write_bytes(ids[third : third + 3000].tobytes())
    (d / "shard.bin").write_bytes(llmc(ids[third : 2 * third]))
    np.save(d / "ids.npy", ids[2 * third :].astype(np.uint32))
    markdown = [p.read_text() for p in sorted((REPO / "docs").glob("*.md"))]
    rows = [para for text in markdown for para in text.split("\n\n") if para.strip()]
    pq.write_table(pa.table({"text": rows, "n": list(range(len(rows)))}), d / "docs.parquet", row_group_size=200)
    saved = d / "saved"
    saved.mkdir()
    table = pa.table({"text": rows[::-1]})
    with (
        pa.OSFile(str(saved / "data-00000-of-00001.arrow"), "wb") as sink,
        pa.ipc.new_stream(sink, table.schema) as writer,
    ):
        writer.write_table(table, max_chunksize=100)
    (saved / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}))
    (saved / "dataset_info.json").write_text("{}")
    return d


def experiment(directory: Path, name: str, arms: list[dict], tokenizer: str | None = "tokenizer.json", **train) -> Path:
    exp = {
        "name": name,
        "model": {"vocab": VOCAB, "ctx": 32, "dim": 32, "layers": 2, "heads": 4},
        "train": {**TRAIN, **train},
        "arms": arms,
        "samples": {"prompts": ["def ", "The "], "max_new": 16, "temperature": 0.8, "top_k": 40, "count": 1},
    }
    if tokenizer is not None:
        exp["tokenizer"] = tokenizer
    path = directory / f"{name}.json"
    path.write_text(json.dumps(exp, indent=1))
    return path


ALL_KINDS = [
    {"name": "nanogpt", "sources": [{"tokens": "train.bin", "val": "val.bin"}]},
    {"name": "llmc", "sources": [{"tokens": "shard.bin"}]},
    {"name": "npy", "sources": [{"tokens": "ids.npy"}]},
    {"name": "parquet", "sources": [{"parquet": "docs.parquet"}]},
    {"name": "saved", "sources": [{"hf_dataset": "saved"}]},
]


def test_every_source_kind_trains(engine, data_cache, data_dir, tmp_path):
    exp = experiment(data_dir, "KINDS", ALL_KINDS)
    run = tmp_path / "run"
    proxy = Proxy(run_args(exp, run), data_cache).start()
    assert proxy.wait() == 0, proxy.output()
    entries = read_entries(run)
    steps = [e for e in entries if e["type"] == "step"]
    evals = {e["step"]: e for e in entries if e["type"] == "eval"}
    names = [a["name"] for a in ALL_KINDS]
    assert len(steps) == 30 and sorted(evals) == [10, 20, 30]
    assert all(set(e["arms"]) == set(names) for e in evals.values())
    assert {a for e in steps for a in e["arms"]} == set(names)  # every arm was drawn from
    # the run holds the given tokenizer byte for byte; its samples decode with it
    assert (run / "data" / "tokenizer.json").read_bytes() == (data_dir / "tokenizer.json").read_bytes()
    definition = json.loads((run / "data" / "data.json").read_text())
    assert definition["tokenizer"]["given"] == str(data_dir / "tokenizer.json")
    assert [s["kind"] for a in names for s in definition["arms"][a]["sources"]] == [
        "tokens",
        "tokens",
        "tokens",
        "parquet",
        "hf_dataset",
    ]
    audits = json.loads((run / ".samples.json").read_text())
    assert audits and all(s["completion"] for s in audits[-1]["samples"])
    # proxy eval reproduces the logged evaluation bit for bit, from the run alone
    result = run_cmd(["eval", "--run-dir", str(run), "--step", "30", "--engine", engine.flag, "--json"], data_cache)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["arms"] == evals[30]["arms"]


def test_nanogpt_validation_tokens_are_the_val_file(engine, data_cache, data_dir, tmp_path):
    exp = experiment(data_dir, "VALFILE", ALL_KINDS[:1], max_steps=2, eval_every=2, sample_every=0)
    run = tmp_path / "run"
    assert Proxy(run_args(exp, run), data_cache).start().wait() == 0
    frozen = np.frombuffer((run / "data" / "nanogpt.val.tok").read_bytes()[32:], dtype="<u2")
    assert np.array_equal(frozen, np.fromfile(data_dir / "val.bin", dtype="<u2"))


def test_named_validation_of_parquet_and_a_dataset_split(engine, data_cache, data_dir, tmp_path):
    """A Parquet source's `val` files and a DatasetDict's `val_split` are the arms' validation tokens, frozen in
    the run: each arm's val shard decodes to exactly the named rows, each followed by the end-of-text token."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from proxy.data.tokenizer import Tokenizer

    rows = pq.read_table(data_dir / "docs.parquet").column("text").to_pylist()
    held = rows[:40]
    pq.write_table(pa.table({"text": held}), tmp_path / "held.parquet")
    shutil.copy(data_dir / "docs.parquet", tmp_path / "docs.parquet")
    shutil.copy(data_dir / "tokenizer.json", tmp_path / "tokenizer.json")
    saved = tmp_path / "saved"
    (saved / "train").mkdir(parents=True)
    (saved / "validation").mkdir()
    (saved / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "validation"]}))
    for split, table in (("train", pa.table({"text": rows[::-1]})), ("validation", pa.table({"text": held[::-1]}))):
        with pa.OSFile(str(saved / split / "d.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table)
        (saved / split / "state.json").write_text(json.dumps({"_data_files": [{"filename": "d.arrow"}]}))
    arms = [
        {"name": "pq", "sources": [{"parquet": "docs.parquet", "val": "held.parquet"}]},
        {"name": "hf", "sources": [{"hf_dataset": "saved", "val_split": "validation"}]},
    ]
    exp = experiment(tmp_path, "NAMEDVAL", arms, max_steps=4, eval_every=4, sample_every=0)
    run = tmp_path / "run"
    proxy = Proxy(run_args(exp, run), data_cache).start()
    assert proxy.wait() == 0, proxy.output()
    tok = Tokenizer.from_json((tmp_path / "tokenizer.json").read_bytes(), VOCAB, "tokenizer.json")
    for arm, docs in (("pq", held), ("hf", held[::-1])):
        frozen = np.frombuffer((run / "data" / f"{arm}.val.tok").read_bytes()[32:], dtype="<u2")
        want = [i for d in docs for i in tok.encode(d) + [tok.eot_id]]
        assert frozen.tolist() == want, arm
    assert [e["step"] for e in read_entries(run) if e["type"] == "eval"] == [4]


def last_line_error(result, code: int) -> str:
    """The error: exit `code`, no traceback, the one line at the end of stderr (progress lines may come first:
    the error was found while the data were prepared)."""
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert lines and lines[-1].startswith("proxy: "), result.stderr
    assert all(not ln.startswith("proxy: ") for ln in lines[:-1]), result.stderr
    return lines[-1]


def test_bad_sources_are_one_line_and_exit_2(engine, data_cache, data_dir, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(data_dir, bad)
    ids = np.fromfile(bad / "train.bin", dtype="<u2")
    (bad / "cut.bin").write_bytes(llmc(ids[:5000])[:-100])
    big = ids[:5000].copy()
    big[4321] = VOCAB + 7
    (bad / "big.bin").write_bytes(big.tobytes())
    cases = [
        ("wrong magic", [{"tokens": "train.bin", "format": "llmc"}], "train.bin: not an llm.c shard (magic"),
        ("truncated", [{"tokens": "cut.bin"}], "cut.bin: truncated: its header says 5000 tokens"),
        (
            "ids >= vocab",
            [{"tokens": "big.bin"}],
            f"big.bin: token id {VOCAB + 7} at position 4321 is at or above model.vocab {VOCAB}",
        ),
        ("missing column", [{"parquet": "docs.parquet", "column": "body"}], "no column 'body' (columns: text, n)"),
        (
            "binary as text",
            [{"file": "train.bin"}],
            'train.bin: binary data (NUL bytes), not text; for token ids use a {"tokens": ...} source',
        ),
        (
            "unknown kind",
            [{"parquett": "docs.parquet"}],
            "unknown key 'parquett'; a source is one of file, glob, dir, jsonl, parquet, hf_dataset, tokens, builtin",
        ),
    ]
    for i, (case, sources, needle) in enumerate(cases):
        exp = experiment(bad, f"BAD{i}", [{"name": "a", "sources": sources}])
        line = last_line_error(run_cmd(run_args(exp, tmp_path / f"run{i}"), data_cache, timeout=120), 2)
        assert needle in line, (case, line)
    exp = experiment(bad, "NOTOK", [{"name": "a", "sources": [{"tokens": "train.bin"}]}], tokenizer=None)
    line = last_line_error(run_cmd(run_args(exp, tmp_path / "notok"), data_cache, timeout=60), 2)
    assert "reads token files: the experiment must name their tokenizer" in line


def test_pyarrow_absent_is_one_line_with_the_install_hint(engine, data_cache, data_dir, tmp_path):
    """The import of pyarrow made to fail in a child process: one line, the install hint, exit 2."""
    exp = experiment(data_dir, "NOARROW", [{"name": "p", "sources": [{"parquet": "docs.parquet"}]}])
    code = (
        "import sys; sys.modules['pyarrow'] = None; from proxy.cli import main; "
        f"sys.exit(main({json.dumps(run_args(exp, tmp_path / 'run'))}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=proxy_env(tmp_path / "cache"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    line = last_line_error(result, 2)
    assert (
        line.startswith("proxy: arm 'p': parquet ")
        and "docs.parquet' needs pyarrow, which is not installed: pip install 'microgpt[parquet]'" in line
    )

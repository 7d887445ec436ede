#!/usr/bin/env python3
"""Data preparation at scale: ours against a nanoGPT-style preparation, same text, same tokenizer.

1. **Corpus**: real text found on this machine, one document per file: the Python installation's `.py`,
   `.txt`, `.rst` and `.md` files, `/usr/share/doc` (gzip'ed files decompressed), the man pages
   (decompressed); files that are not UTF-8 text are left out. Written under --corpus (default
   /tmp/microgpt-bench-corpus, never in the repository) as `base/NNNNNN.txt`; the corpus of --gb GB is
   `corpus-<bytes>/r00/`, `r01/`, ...: hard links to them, repeated as often as it takes. Built once.
2. **The tokenizer**: our preparation trains it (a byte-level BPE of --vocab tokens on its bounded sample),
   timed as the run "ours, training the tokenizer".
3. **Side by side**, each in its own process, the corpus read once beforehand (so both read it from the
   page cache), every core:
   - **ours**: `prepare_data` with that tokenizer given (`"tokenizer"`), one `dir` arm, a fresh cache;
   - **peer** (nanoGPT's prepare.py with HF tokenizers): a `multiprocessing` Pool of every core (spawned),
     each worker reading its batch of documents and encoding it with `encode_batch` (HF tokenizers'
     own threads off in the workers: faster here than on, measured), `<|endoftext|>` after each
     document; the main process collects the ids and writes them into a uint16 `np.memmap`.
   Each reports its wall time, MB/s (corpus bytes / wall), its peak RSS (the process and its workers
   summed, sampled every 0.1 s) and its token count; the two counts must agree (the same documents,
   the same tokenizer: our pieces encode as the whole documents do).

    python scripts/bench_data.py --gb 0.05 --label small               # develop on a small corpus
    nice -n 0 python scripts/bench_data.py --gb 2 --label '2 GB' --json docs/bench/data-cpu.json
    python scripts/bench_data.py --render docs/bench/data-cpu.json --doc docs/PERFORMANCE.md

Goals: ours under 2 GB peak RSS on at least 2 GB of text, at least 1.0x the peer's MB/s.
"""

from __future__ import annotations

import argparse
import gzip
import json
import multiprocessing
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cuda_bench_report import Markers, ReportError, load_labelled_runs, print_and_keep, render_into_doc  # noqa: E402
from machine_info import git_commit, machine_line  # noqa: E402

MARKERS = Markers("bench_data table", "scripts/bench_data.py")
TEXT_SUFFIXES = (".py", ".txt", ".rst", ".md")
BATCH_BYTES = 4 << 20  # the peer's batch of documents (ours: proxy/data/source_readers.py UNIT_BYTES)
SAMPLE_S = 0.1


# ---------------------------------------------------------------------------------------------- corpus


def _candidates() -> list[Path]:
    import sysconfig

    roots = [Path(sysconfig.get_paths()["stdlib"]), Path("/usr/share/doc"), Path("/usr/share/man")]
    out = []
    for root in roots:
        for dirpath, _dirs, files in os.walk(root):
            for name in files:
                p = Path(dirpath) / name
                if p.is_symlink() or not p.is_file():
                    continue
                if root.name == "man" and name.endswith(".gz") or root.name == "doc" or name.endswith(TEXT_SUFFIXES):
                    out.append(p)
    return sorted(out)


def _text_of(path: Path) -> str | None:
    from proxy.data.text import binary_reason  # noqa: PLC0415

    try:
        data = path.read_bytes()
        if path.suffix == ".gz":
            data = gzip.decompress(data)
        if binary_reason(data) is not None:
            return None
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
        return None
    return text if text.strip() else None


def build_corpus(root: Path, gb: float) -> tuple[Path, list[Path], int]:
    """(the corpus directory, its files in document order, their total bytes): `root/base/` holds every
    document found (made once); `root/corpus-<bytes>/r00/`, `r01/`, ... hard links to them, the first ones
    up to `gb` GB, or all of them as often as it takes."""
    target = int(gb * 1e9)
    base = root / "base"
    if not base.is_dir():
        tmp = root / ".base-tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        n = 0
        for p in _candidates():
            text = _text_of(p)
            if text is not None:
                (tmp / f"{n:06d}.txt").write_text(text, encoding="utf-8")
                n += 1
        tmp.rename(base)
    corpus = root / f"corpus-{target}"
    if not corpus.is_dir():
        tmp = root / f".corpus-{target}-tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        base_files = sorted(base.iterdir())
        copy, size = 0, 0
        while size < target:
            (tmp / f"r{copy:02d}").mkdir(parents=True)
            for p in base_files:
                os.link(p, tmp / f"r{copy:02d}" / p.name)
                size += p.stat().st_size
                if size >= target:
                    break
            copy += 1
        tmp.rename(corpus)
    files = sorted(corpus.rglob("*.txt"), key=lambda p: p.relative_to(corpus).as_posix())  # the dir source's order
    return corpus, files, sum(p.stat().st_size for p in files)


def read_through(files: list[Path]) -> float:
    """Read every file once (into the page cache); the seconds it took."""
    t0 = time.perf_counter()
    for p in files:
        with open(p, "rb") as f:
            while f.read(1 << 22):
                pass
    return time.perf_counter() - t0


# ---------------------------------------------------------------------------------------------- sides


def side_ours(
    corpus: Path, tokenizer: str | None, vocab: int, workers: int, cache: Path, out_tokenizer: str | None
) -> dict:
    from proxy.config.experiment import parse_experiment  # noqa: PLC0415
    from proxy.data.prepare import prepare_data  # noqa: PLC0415

    exp = {
        "name": "bench-data",
        "model": {"vocab": vocab, "ctx": 64, "dim": 64, "layers": 1, "heads": 1},
        "train": {"batch": 1, "max_steps": 1, "lr": 1e-3, "min_lr": 1e-4, "warmup": 0, "seed": 1, "eval_rows": 1},
        "arms": [{"name": "corpus", "sources": [{"dir": str(corpus), "suffix": ".txt"}]}],
    }
    if tokenizer:
        exp["tokenizer"] = tokenizer
    t0 = time.perf_counter()
    data = prepare_data(parse_experiment(exp), corpus, cache, progress=True, workers=workers)
    wall = time.perf_counter() - t0
    if out_tokenizer:
        Path(out_tokenizer).write_bytes(data.tokenizer_json)
    stats = data.stats["corpus"]
    return {"wall_s": wall, "tokens": stats["train_tokens"] + stats["val_tokens"], "docs": stats["docs"]}


_peer_tokenizer = None


def _peer_init(tokenizer_json: str) -> None:
    global _peer_tokenizer
    from tokenizers import Tokenizer  # noqa: PLC0415

    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _peer_tokenizer = Tokenizer.from_str(tokenizer_json)


def _peer_encode(paths: list[str]) -> np.ndarray:
    texts = []
    for p in paths:
        with open(p, encoding="utf-8", newline="") as f:  # the text as it is (no newline translation)
            texts.append(f.read())
    eot = _peer_tokenizer.token_to_id("<|endoftext|>")
    ids = []
    for enc in _peer_tokenizer.encode_batch(texts, add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(eot)
    return np.array(ids, dtype=np.uint16)


def side_peer(files: list[str], tokenizer: str, workers: int, out: Path) -> dict:
    batches, batch, size = [], [], 0
    for p in files:
        batch.append(p)
        size += os.path.getsize(p)
        if size >= BATCH_BYTES:
            batches.append(batch)
            batch, size = [], 0
    if batch:
        batches.append(batch)
    t0 = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(workers, _peer_init, (Path(tokenizer).read_text(),)) as pool:
        arrays = list(pool.imap(_peer_encode, batches))
    n = sum(a.size for a in arrays)
    mm = np.memmap(out, dtype=np.uint16, mode="w+", shape=(n,))
    at = 0
    for a in arrays:
        mm[at : at + a.size] = a
        at += a.size
    mm.flush()
    del mm
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "tokens": int(n), "docs": len(files)}


def run_side(argv: list[str]) -> dict:
    """One side in its own process, its peak RSS (process and workers, summed) sampled from here."""
    proc = subprocess.Popen([sys.executable, __file__, *argv], stdout=subprocess.PIPE, text=True)
    root = psutil.Process(proc.pid)
    peak = 0
    while proc.poll() is None:
        try:
            tree = [root] + root.children(recursive=True)
            peak = max(peak, sum(p.memory_info().rss for p in tree if p.is_running()))
        except psutil.Error:
            pass
        time.sleep(SAMPLE_S)
    out = proc.stdout.read()
    if proc.returncode != 0:
        raise SystemExit(f"bench_data: the side {argv[1]} failed (exit {proc.returncode})")
    result = json.loads(out.strip().splitlines()[-1])
    result["peak_rss_bytes"] = peak
    return result


def _side_main(args) -> int:
    import resource  # noqa: PLC0415

    if args.side == "peer":
        files = Path(args.files).read_text().splitlines()
        result = side_peer(files, args.tokenizer, args.workers, Path(args.out))
    else:
        result = side_ours(
            Path(args.corpus), args.tokenizer, args.vocab, args.workers, Path(args.cache), args.out_tokenizer
        )
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    result["main_maxrss_bytes"] = own.ru_maxrss * 1024
    # CPU seconds of the process and its workers (reaped): what the work cost, whatever else the machine ran
    result["cpu_s"] = own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
    print(json.dumps(result))
    return 0


# ---------------------------------------------------------------------------------------------- report


def _cells(side: dict, corpus_bytes: int) -> list[str]:
    return [
        f"{side['wall_s']:.0f} s",
        f"{corpus_bytes / side['wall_s'] / 1e6:.2f}",
        f"{side['cpu_s']:.0f} s",
        f"{side['peak_rss_bytes'] / 2**30:.2f} GiB",
    ]


def render_table(runs: list[dict]) -> str:
    lines = [
        "| run | commit | corpus | vocab | workers | ours: wall | MB/s | CPU | peak RSS | peer: wall | MB/s | CPU "
        "| peak RSS | ours / peer (MB/s) | ours, training the tokenizer: wall | MB/s | CPU | peak RSS | load |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    try:
        for r in runs:
            b = r["corpus_bytes"]
            train = r.get("ours_training")
            cells = [
                r["label"],
                f"`{r['commit']}`",
                f"{b / 1e9:.2f} GB, {r['documents']:,} documents",
                str(r["vocab"]),
                str(r["workers"]),
                *_cells(r["ours"], b),
                *_cells(r["peer"], b),
                f"**{r['peer']['wall_s'] / r['ours']['wall_s']:.2f}x**",
                *(_cells(train, b) if train else ["-", "-", "-", "-"]),
                f"{r['load'][0]:.1f}-{r['load'][1]:.1f}",
            ]
            lines.append("| " + " | ".join(cells) + " |")
        notes = [
            "",
            "MB/s: corpus bytes over wall seconds; CPU: user and system seconds of the process and its "
            "workers; peak RSS: the process and its workers, summed, sampled every 0.1 s; load: the load "
            "average at the start and the end. Machine: "
            + "; ".join(sorted({r["machine"] for r in runs}))
            + ". Commands, in order:",
            "",
        ]
        commands = [f"- `{r['command']}`" for r in runs]
    except (KeyError, TypeError, ZeroDivisionError) as exc:
        raise ReportError(f"a run is malformed ({exc!r})") from None
    return "\n".join(lines + notes + commands)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, default=Path("/tmp/microgpt-bench-corpus"))
    ap.add_argument("--gb", type=float, default=2.0, help="corpus size (default 2)")
    ap.add_argument("--vocab", type=int, default=16384)
    ap.add_argument("--workers", type=int, default=None, help="for both sides (default: every core)")
    ap.add_argument(
        "--skip-training",
        action="store_true",
        help="train the tokenizer on a small corpus first, not on this one (the side-by-side runs are the same)",
    )
    ap.add_argument("--label", default="bench", help="the run's name in the results file and the table")
    ap.add_argument("--json", type=Path, metavar="FILE", help="add the result to this results file")
    ap.add_argument("--render", type=Path, metavar="FILE", help="render FILE's table; measure nothing")
    ap.add_argument("--doc", type=Path, help="with --render: put the table between this document's markers")
    ap.add_argument("--side", choices=("ours", "peer"), help=argparse.SUPPRESS)
    for hidden in ("--files", "--tokenizer", "--out", "--cache", "--out-tokenizer"):
        ap.add_argument(hidden, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.side:
        args.workers = args.workers or len(os.sched_getaffinity(0))
        return _side_main(args)
    if args.render is not None:
        return render_into_doc(
            args.doc, lambda: render_table(load_labelled_runs(args.render)), args.render, MARKERS, "bench_data"
        )

    workers = args.workers or len(os.sched_getaffinity(0))
    load_before = os.getloadavg()[0]
    corpus, files, corpus_bytes = build_corpus(args.corpus, args.gb)
    print(
        f"bench_data: corpus {corpus}: {len(files):,} documents, {corpus_bytes / 1e9:.2f} GB; "
        f"read once in {read_through(files):.0f} s; {workers} workers; load {load_before:.1f}",
        flush=True,
    )
    common = ["--vocab", str(args.vocab), "--workers", str(workers)]
    with tempfile.TemporaryDirectory(prefix="bench-data-") as tmp:
        tmp = Path(tmp)
        tokenizer = tmp / "tokenizer.json"
        training = None
        if not args.skip_training:
            training = run_side(
                [
                    "--side",
                    "ours",
                    "--corpus",
                    str(corpus),
                    "--cache",
                    str(tmp / "cache-train"),
                    "--out-tokenizer",
                    str(tokenizer),
                    *common,
                ]
            )
            shutil.rmtree(tmp / "cache-train")
            print(f"ours, training the tokenizer: {training}", flush=True)
        else:
            small = tmp / "small"
            small.mkdir()
            for i, p in enumerate(files[:2000]):
                os.link(p, small / f"{i:06d}.txt")
            run_side(
                [
                    "--side",
                    "ours",
                    "--corpus",
                    str(small),
                    "--cache",
                    str(tmp / "cache-small"),
                    "--out-tokenizer",
                    str(tokenizer),
                    *common,
                ]
            )
            shutil.rmtree(tmp / "cache-small")
        ours = run_side(
            [
                "--side",
                "ours",
                "--corpus",
                str(corpus),
                "--tokenizer",
                str(tokenizer),
                "--cache",
                str(tmp / "cache"),
                *common,
            ]
        )
        shutil.rmtree(tmp / "cache")
        print(f"ours: {ours}", flush=True)
        (tmp / "files.txt").write_text("\n".join(map(str, files)))
        peer = run_side(
            [
                "--side",
                "peer",
                "--files",
                str(tmp / "files.txt"),
                "--tokenizer",
                str(tokenizer),
                "--out",
                str(tmp / "peer.bin"),
                *common,
            ]
        )
        print(f"peer: {peer}", flush=True)
    if ours["tokens"] != peer["tokens"]:
        print(f"bench_data: token counts differ: ours {ours['tokens']:,}, peer {peer['tokens']:,}", file=sys.stderr)
        return 1
    report = {
        "label": args.label,
        "commit": git_commit(REPO),
        "machine": machine_line(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": "python scripts/bench_data.py " + shlex.join(sys.argv[1:]),
        "corpus_bytes": corpus_bytes,
        "documents": len(files),
        "vocab": args.vocab,
        "workers": workers,
        "ours": ours,
        "peer": peer,
        "ours_training": training,
        "load": [load_before, os.getloadavg()[0]],
    }
    ratio = peer["wall_s"] / ours["wall_s"]
    print(
        f"ours {corpus_bytes / ours['wall_s'] / 1e6:.2f} MB/s, peak RSS {ours['peak_rss_bytes'] / 2**30:.2f} GiB; "
        f"peer {corpus_bytes / peer['wall_s'] / 1e6:.2f} MB/s, peak RSS {peer['peak_rss_bytes'] / 2**30:.2f} GiB; "
        f"ours/peer {ratio:.2f}x; {ours['tokens']:,} tokens each"
    )
    print_and_keep(report, args.json, "bench_data")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""docs/ is reference: every repository path a doc names exists, no doc reads as a diary, and the "one step,
end to end" list in ARCHITECTURE.md names functions that exist."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])

# A path is named from one of the repository's own top-level directories (run directories, build outputs and the
# like are not repository files).
TOP_DIRS = ("microgpt", "proxy", "dashboard", "scripts", "tests", "docs", "experiments")
PATH_RE = re.compile(r"(?<![\w./<-])((?:{})/[\w./-]*[\w/])".format("|".join(TOP_DIRS)))

# Files a doc names as the output of a command it describes, not yet produced in this tree. Each is written by
# the command named beside it (a benchmark or the GPU script), so it exists once that command has run.
OUTPUTS = {
    "docs/bench/cuda-h100.json": "scripts/cuda_bench_report.py merge (docs/CUDA.md, Benchmark)",
    "docs/reliability-cuda.json": "copied from the kill storms' results on a GPU (docs/CUDA.md)",
    "docs/bench/data-cpu.json": "scripts/bench_data.py --json (docs/PERFORMANCE.md, Data preparation)",
    "experiments/mixing-corpora/": "scripts/mixing/corpora.py, ignored by git (docs/DATA-MIXING.md, The corpora)",
}

# A user's own files in the examples of a doc (an error message, a command line), not repository files.
EXAMPLES = {
    "experiments/x.json": "docs/EXPERIMENTS.md: a user's experiment in an example error message",
    "experiments/FINETUNE.json": "docs/OPERATIONS.md: a user's experiment in an example command",
}

# Status, plans and sessions belong in the issue notes, not in reference docs.
DIARY = re.compile(
    r"\b(this|next|a|the|future|later|previous|earlier|last|each|every) (GPU )?session\b"
    r"|no GPU was available|GPU was not available|not yet (tried|measured|done|run)|not measured\b.*\byet\b"
    r"|\bissue \d+\b|\bas filed\b",
    re.IGNORECASE,
)


def _named_paths(text: str) -> set[str]:
    names = set()
    for m in PATH_RE.finditer(text):
        path = m.group(1).rstrip(".")
        after = text[m.end(1) : m.end(1) + 3].lstrip("-._")
        if after[:1] in ("*", "<", "{") or "NNN" in path:  # a pattern (`MIXING-*.json`, `<arm>.tok`), not a file
            continue
        names.add(path)
    return names


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_named_path_exists(doc: Path):
    missing = sorted(
        p
        for p in _named_paths(doc.read_text(encoding="utf-8"))
        if not (ROOT / p).exists() and p not in OUTPUTS and p not in EXAMPLES
    )
    assert not missing, f"{doc.relative_to(ROOT)} names paths that do not exist: {missing}"


def test_the_path_check_can_fail():
    assert _named_paths("see `proxy/no_such_module.py` and proxy/formats/frames.py.") == {
        "proxy/no_such_module.py",
        "proxy/formats/frames.py",
    }
    assert _named_paths("`experiments/MIXING-*.json`, `docs/bench/<name>.json`") == set()
    assert not (ROOT / "proxy/no_such_module.py").exists()


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_no_diary_text(doc: Path):
    hits = [
        f"line {n}: {line.strip()}"
        for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1)
        if DIARY.search(line)
    ]
    assert not hits, f"{doc.relative_to(ROOT)} has session, status or plan text: {hits}"


def test_the_diary_check_can_fail():
    for line in (
        "Left for the next GPU session.",
        "no GPU was available to this session",
        "Ideas not yet tried: caching",
        "Issue 10, as filed",
        "Not yet run on a GPU",
    ):
        assert DIARY.search(line), line
    assert not DIARY.search("`scripts/gpu_session.sh` writes session.log")


# "One step, end to end": `file:function` or `file:Class.method`.
HOP_RE = re.compile(r"`((?:{})/[\w./-]+):([A-Za-z_][\w.]*)`".format("|".join(TOP_DIRS)))


def _end_to_end_hops() -> list[tuple[str, str]]:
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    start = text.index("## One step, end to end")
    section = text[start : text.index("\n## ", start + 1)]
    return HOP_RE.findall(section)


def _python_defines(path: Path, dotted: str) -> bool:
    scope: list[ast.stmt] = ast.parse(path.read_text(encoding="utf-8")).body
    for part in dotted.split("."):
        found = [
            n for n in scope if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == part
        ]
        if not found:
            return False
        scope = found[0].body
    return True


def _c_defines(path: Path, name: str) -> bool:
    # A definition: the name, its parameter list, then the body's brace (a call or a prototype has no brace).
    return (
        re.search(rf"^[\w \t*]*\b{re.escape(name)}\([^;{{]*\)\s*\{{", path.read_text(encoding="utf-8"), re.MULTILINE)
        is not None
    )


def test_end_to_end_list_is_long_enough():
    hops = _end_to_end_hops()
    assert len(hops) >= 12, hops
    assert hops[0] == ("proxy/cli.py", "main")
    assert hops[-1] == ("proxy/formats/loss_log.py", "LossLogWriter.append")


@pytest.mark.parametrize("path,name", _end_to_end_hops(), ids=lambda v: str(v))
def test_end_to_end_function_exists(path: str, name: str):
    file = ROOT / path
    assert file.is_file(), path
    defined = _python_defines(file, name) if file.suffix == ".py" else _c_defines(file, name)
    assert defined, f"docs/ARCHITECTURE.md, 'One step, end to end': {path} defines no {name}"


def test_the_function_check_can_fail():
    assert not _python_defines(ROOT / "proxy/cli.py", "no_such_function")
    assert not _c_defines(ROOT / "microgpt/train.h", "mg_no_such_function")
    assert _c_defines(ROOT / "microgpt/train.h", "mg_train_step")

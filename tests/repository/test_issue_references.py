"""Code and comments say what a thing is for, not which tracker issue asked for it: an issue number means
nothing to a reader without the tracker (the commit history keeps that link)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE_DIRS = ("proxy", "dashboard", "scripts", "tests", "microgpt", "experiments")
SUFFIXES = {".py", ".c", ".h", ".cu", ".cuh", ".cpp", ".sh", ".js", ".html", ".css", ".json", ".mk"}
ISSUE_REFERENCE = re.compile(r"\bissues? #?\d+\b", re.IGNORECASE)
# The repository tests that show their own checks can fail quote such text on purpose.
QUOTING = {Path("tests/repository/test_docs.py"), Path("tests/repository/test_issue_references.py")}


def _source_files() -> list[Path]:
    files = []
    for top in SOURCE_DIRS:
        for path in sorted((ROOT / top).rglob("*")):
            if path.is_file() and path.suffix in SUFFIXES and path.relative_to(ROOT) not in QUOTING:
                files.append(path)
    return files


def test_no_source_cites_an_issue_number():
    hits = []
    for path in _source_files():
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if ISSUE_REFERENCE.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert not hits, "issue numbers in the source (say what they mean instead):\n" + "\n".join(hits)


def test_the_issue_check_can_fail():
    for line in ("# added for issue 12", "see Issue #24", "(issues 36 and 39)"):
        assert ISSUE_REFERENCE.search(line), line
    assert not ISSUE_REFERENCE.search("an issue with 3 ranks")

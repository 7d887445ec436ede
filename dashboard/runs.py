"""Which run directories the dashboard shows, and how a URL names one.

A URL names a run by its index (0, 1, ...) or by its name (the directory's
base name, made URL-safe and unique), never by a path. Lookup is a dict
lookup: there is no way to turn a URL into a file system path.
"""

from __future__ import annotations

import re
from pathlib import Path

from proxy.rundir.layout import EXPERIMENT, LOSS_LOG, STATE

from .run_index import RunIndex

NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,100}$")
RUN_MARKERS = (EXPERIMENT, LOSS_LOG, STATE)  # any of these makes a directory a run the page can show


def is_run_dir(path: Path) -> bool:
    return any((path / m).is_file() for m in RUN_MARKERS)


def expand(dirs: list[Path]) -> list[Path]:
    """Run directories from what the user named: a run directory itself, or a
    directory of runs (like `runs/`) whose children are run directories.
    Duplicates (same real path) are dropped; order is kept."""
    out: list[Path] = []
    seen: set[Path] = set()
    for d in dirs:
        d = Path(d).resolve()
        candidates = [d]
        if d.is_dir() and not is_run_dir(d):
            children = sorted(c.resolve() for c in d.iterdir() if c.is_dir() and is_run_dir(c))
            if children:
                candidates = children
        for c in candidates:
            if c not in seen:
                seen.add(c)
                out.append(c)
    return out


def safe_name(base: str, taken: set[str]) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]", "_", base)[:90].strip(".") or "run"
    if name.isdigit():
        name = "run" + name
    cand, k = name, 2
    while cand in taken:
        cand, k = f"{name}-{k}", k + 1
    return cand


class Registry:
    """The fixed list of runs this server was started with."""

    def __init__(self, dirs: list[Path]):
        self.runs: list[RunIndex] = []
        self.by_name: dict[str, RunIndex] = {}
        for i, d in enumerate(dirs):
            d = Path(d).resolve()
            name = safe_name(d.name, set(self.by_name))
            run = RunIndex(i, name, d)
            self.runs.append(run)
            self.by_name[name] = run

    def lookup(self, key: str) -> RunIndex | None:
        """The run an index or a name refers to; None for anything else."""
        if not isinstance(key, str) or not NAME_RE.match(key):
            return None
        if key.isdigit() and len(key) < 6:
            i = int(key)
            return self.runs[i] if i < len(self.runs) else None
        return self.by_name.get(key)

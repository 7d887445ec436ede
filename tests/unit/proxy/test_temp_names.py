"""proxy/temp_names.py and atomic.py's use of it: temp names no one can predict, created exclusively, and
the leftovers of dead processes removed without following a symlink (the fault suite's temp_scenarios.py
runs the same against real commands)."""

from __future__ import annotations

import os
import subprocess
import sys

from proxy import temp_names
from proxy.atomic import atomic_write_bytes, write_new


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_names_are_unpredictable_and_match_their_patterns(tmp_path):
    names = {temp_names.file_name("x.json") for _ in range(100)}
    assert len(names) == 100 and all(temp_names.FILE_PATTERN.match(n) for n in names)
    d = temp_names.make_dir(tmp_path, "data", temp_names.DATA_TMP)
    assert d.is_dir() and not d.is_symlink() and temp_names.DIR_PATTERN.match(d.name)
    assert d.name.startswith(f".data.tmp-{os.getpid()}-")
    # the engine's checkpoint temps and the run's own files are no temp names of the proxy
    for name in (".step_000100.bin.tmp", ".loss.json", "step_000100.bin", ".tmp-abc-12-34", "data", ".state.json"):
        assert not temp_names.is_temp(name), name


def test_an_atomic_write_never_follows_a_planted_temp_name(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"precious")
    run = tmp_path / "run"
    run.mkdir()
    for pid in range(1, 200):  # what the old, predictable `.<name>.<pid>.tmp` would have been
        (run / f"..state.json.{pid}.tmp").symlink_to(outside)
    (run / ".state.json").symlink_to(outside)  # the target itself a link: replaced, not written through
    atomic_write_bytes(run / ".state.json", b"new")
    write_new(run / "receipt.json", b"receipt")
    assert outside.read_bytes() == b"precious"
    assert not (run / ".state.json").is_symlink() and (run / ".state.json").read_bytes() == b"new"
    assert (run / "receipt.json").read_bytes() == b"receipt"


def test_leftovers_of_dead_processes_are_removed_and_links_never_followed(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    run = tmp_path / "run"
    run.mkdir()
    dead, live = _dead_pid(), os.getppid()
    (run / f"..state.json.{dead}.tmp").write_text("half")
    (run / f".data.tmp-{dead}-{'a' * 16}").mkdir()
    (run / f".data.tmp-{dead}-{'a' * 16}" / "link").symlink_to(outside)
    (run / f".data.old-{dead}").symlink_to(outside)
    (run / f"..state.json.{live}.tmp").write_text("a live writer's")
    (run / "notes.txt").write_text("the user's")
    removed = temp_names.remove_leftovers(run)
    assert removed == sorted([f"..state.json.{dead}.tmp", f".data.tmp-{dead}-{'a' * 16}", f".data.old-{dead}"])
    assert sorted(p.name for p in run.iterdir()) == sorted([f"..state.json.{live}.tmp", "notes.txt"])
    assert (outside / "keep.txt").read_text() == "keep"


def test_kinds_limit_what_is_removed_beside_a_target(tmp_path):
    dead = _dead_pid()
    for name in (f".a.fork-{dead}", f".b.export-{dead}", f".c.tmp-{dead}", f".d.{dead}.tmp"):
        (tmp_path / name).mkdir()
    removed = temp_names.remove_leftovers(tmp_path, (temp_names.FORK, temp_names.EXPORT))
    assert removed == [f".a.fork-{dead}", f".b.export-{dead}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".c.tmp-{dead}", f".d.{dead}.tmp"]

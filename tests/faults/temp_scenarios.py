"""Temp names planted, temp leftovers of kill -9, a fork's frozen data.

- Temp names planted before a command runs: 300 symlinks `RUN/.data.tmp-<n>` to a directory outside (the
  data freeze once wrote its files there and left RUN/data a link to it), the same names as regular files
  and directories, `.<to>.fork-<n>` beside a fork's target, `.<out>.export-<n>` beside an export's,
  `archive/.pivot_<s>.tmp-<n>` (once "Cannot call rmtree on a symbolic link"), `..state.json.<n>.tmp`
  and the engine's `checkpoints/.step_<s>.bin.tmp` linked to a file outside. Every command exits 0, its
  result is a real directory of the run (or the target), nothing outside changes, the runs finish as the
  reference.
- Leftovers: a process that made the proxy's temp files and directories (proxy/temp_names.py, and the
  older names `.NAME.fork-PID`, `.NAME.export-PID`, `..state.json.PID.tmp`, one a symlink out) killed with
  SIGKILL: the next fork, export and run remove them (a symlink unlinked, its target untouched); those of
  a live process stay. And real `proxy fork`, `proxy export` and `proxy run` processes SIGKILLed while their
  first temp exists (held there by a test hook): the same command again removes it.
- A fork's frozen data: a fork of a finished run is accepted by `run` (finishing as the reference), `eval`
  and `export`; frozen data they would refuse (a tokenizer or a shard replaced, data.json's hashes
  updated) is refused by `fork` with one line and no fork made, as by them.

Real processes against real run directories, in a pid namespace of their own (sandbox.py): the temp names
hold pids, and there the pids 1..300 planted are the scenario's own namespace's.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import struct
import subprocess
import sys
from pathlib import Path

from harness.engine import Hang

from .nesting_scenarios import CAPS
from .path_scenarios import tree, unchanged
from .process_scenarios import _env
from .proxy_checks import one_line_exit, proxy_cmd, run_cmd
from .proxy_harness import REPO, ProxyEnv, compare_with_reference, expected_resume, no_traceback
from .proxy_scenarios import copy_run, relaunch_and_compare
from .sandbox import require_namespace
from .scenarios import Outcome, tail_lines

PLANTED_CLASS = "temp names planted (symlinks, files, directories)"
LEFTOVER_CLASS = "temp files and directories left by kill -9"
FORK_DATA_CLASS = "a fork's frozen data (accepted by run, eval, export; refused alike)"

PIDS = range(1, 301)  # every pid a short-lived process of a fresh namespace gets


def _outside(workdir: Path, name: str) -> tuple[Path, dict]:
    """A directory outside every run, holding one file, and its content now."""
    d = workdir / name
    d.mkdir()
    (d / "precious.txt").write_text("precious\n")
    return d, tree(d)


def _ok(argv: list, out: Outcome, where: str) -> None:
    """`argv` exits 0 without a traceback."""
    try:
        rc, p = run_cmd(argv)
    except Hang as exc:
        out.fail(f"{where}: {exc}")
    no_traceback(p, out, where)
    if rc != 0:
        out.fail(f"{where}: exit {rc}: {tail_lines(p.stderr + chr(10).join(p.lines))}")


def _real_dir(path: Path, out: Outcome, where: str) -> None:
    if path.is_symlink() or not path.is_dir():
        out.fail(f"{where}: {path} is {'a symlink' if path.is_symlink() else 'no directory'}", data_lost=1)


def _links(directory: Path, name, target: Path) -> None:
    for n in PIDS:
        (directory / name(n)).symlink_to(target)


# ---------------------------------------------------------------------------
# planted temp names


def planted_temp_names(env: dict, template: str, workdir: str) -> Outcome:
    """See the module's docstring (the first item)."""
    require_namespace()
    env, template, workdir = _env(env), Path(template), Path(workdir)
    out = Outcome(PLANTED_CLASS, "planted-temp-names")

    out.begin_fault()  # the data freeze of a new run: 300 symlinks
    outside, before = _outside(workdir, "outside-data")
    fresh = workdir / "fresh"
    fresh.mkdir()
    _links(fresh, lambda n: f".data.tmp-{n}", outside)
    _new_run(env, fresh, out, "[300 .data.tmp-<n> symlinks]")
    unchanged(outside, before, out, "[300 .data.tmp-<n> symlinks]")

    out.begin_fault()  # the same names as files and directories, and the old data's names as symlinks
    outside, before = _outside(workdir, "outside-old")
    mixed = workdir / "mixed"
    mixed.mkdir()
    for n in PIDS:
        if n % 2:
            (mixed / f".data.tmp-{n}").write_text("planted\n")
        else:
            (mixed / f".data.tmp-{n}").mkdir()
            (mixed / f".data.tmp-{n}" / "data.json").write_text("planted\n")
        (mixed / f".data.old-{n}").symlink_to(outside)
    _new_run(env, mixed, out, "[.data.tmp-<n> files and directories, .data.old-<n> symlinks]")
    unchanged(outside, before, out, "[.data.old-<n> symlinks]")

    out.begin_fault()  # fork
    outside, before = _outside(workdir, "outside-fork")
    _links(workdir, lambda n: f".forked.fork-{n}", outside)
    forked = workdir / "forked"
    _ok(proxy_cmd("fork", "--run-dir", env.ref, "--at", 24, "--to", forked), out, "[.forked.fork-<n> symlinks]")
    _real_dir(forked, out, "[fork]")
    unchanged(outside, before, out, "[.forked.fork-<n> symlinks]")

    out.begin_fault()  # export
    outside, before = _outside(workdir, "outside-export")
    _links(workdir, lambda n: f".exported.export-{n}", outside)
    exported = workdir / "exported"
    _ok(
        proxy_cmd("export", "--run-dir", env.ref, "--out", exported, "--cache-dir", env.cache),
        out,
        "[.exported.export-<n> symlinks]",
    )
    _real_dir(exported, out, "[export]")
    unchanged(outside, before, out, "[.exported.export-<n> symlinks]")

    out.begin_fault()  # an offline pivot's archive
    outside, before = _outside(workdir, "outside-archive")
    run = copy_run(template, workdir / "pivot")
    step = expected_resume(run)
    (run / "archive").mkdir(exist_ok=True)
    _links(run / "archive", lambda n: f".pivot_{step}.tmp-{n}", outside)
    caps = workdir / "caps.json"
    caps.write_text(json.dumps(CAPS))
    _ok(proxy_cmd("pivot", "--run-dir", run, "--caps", caps), out, "[archive/.pivot_<s>.tmp-<n> symlinks]")
    _real_dir(run / "archive" / f"pivot_{step}", out, "[pivot]")
    unchanged(outside, before, out, "[archive/.pivot_<s>.tmp-<n> symlinks]")

    out.begin_fault()  # the proxy's temp files and the engine's checkpoint temp, linked to a file outside
    outside, before = _outside(workdir, "outside-files")
    run = copy_run(template, workdir / "files")
    _links(run, lambda n: f"..state.json.{n}.tmp", outside / "precious.txt")
    step = expected_resume(run) + env.ckpt_every
    (run / "checkpoints" / f".step_{step:06d}.bin.tmp").symlink_to(outside / "precious.txt")
    relaunch_and_compare(env, run, out, "[..state.json.<n>.tmp and .step_<s>.bin.tmp symlinks]")
    unchanged(outside, before, out, "[..state.json.<n>.tmp and .step_<s>.bin.tmp symlinks]")
    return out.close()


def _new_run(env: ProxyEnv, run: Path, out: Outcome, where: str) -> None:
    """`proxy run` of a new run in `run`: exit 0, RUN/data a real directory that verifies, the reference's
    result."""
    try:
        rc, p = env.run(run, timeout=300)
    except Hang as exc:
        out.fail(f"{where}: {exc}")
    no_traceback(p, out, where)
    if rc != 0:
        out.fail(f"{where}: exit {rc}: {tail_lines(p.stderr)}")
    _real_dir(run / "data", out, where)
    rc, v = run_cmd(proxy_cmd("verify", "--run-dir", run))
    no_traceback(v, out, f"{where} verify")
    if rc != 0 or "verified" not in "\n".join(v.lines):
        out.fail(f"{where} verify: exit {rc}: {v.lines[-3:]}")
    compare_with_reference(env, run, out, where=where)


# ---------------------------------------------------------------------------
# leftovers of kill -9

_LEAVE = """
import os, signal, sys
from pathlib import Path
from proxy import temp_names as t

run, forks, exports, outside, step = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4], sys.argv[5]
pid = os.getpid()
os.write(t.create_file(run, ".state.json")[0], b"half a snapshot")
(run / f"..state.json.{pid}.tmp").write_bytes(b"older name")
(t.make_dir(run, "data", t.DATA_TMP) / "tokenizer.json").write_bytes(b"half")
t.make_dir(run, "data", t.DATA_OLD)
os.symlink(outside, run / f".data.tmp-{pid}")
t.create_file(run / "checkpoints", "step_000000.bin")
(run / "archive").mkdir(exist_ok=True)
(t.make_dir(run / "archive", f"pivot_{step}", t.ARCHIVE_TMP) / ".samples.json").write_bytes(b"[]")
(run / "archive" / f".pivot_{step}.tmp-{pid}").mkdir()
(t.make_dir(forks, "forked", t.FORK) / "checkpoints").mkdir()
(forks / f".forked.fork-{pid}").mkdir()
os.symlink(outside, forks / f".linked.fork-{pid}")
(t.make_dir(exports, "exported", t.EXPORT) / "model.safetensors").write_bytes(b"half")
(exports / f".exported.export-{pid}").mkdir()
print("made", flush=True)
os.kill(pid, signal.SIGKILL)
"""


def _temps(directory: Path) -> list[str]:
    from proxy.temp_names import is_temp

    return sorted(p.name for p in directory.iterdir() if is_temp(p.name)) if directory.is_dir() else []


def kill9_leftovers(env: dict, template: str, workdir: str) -> Outcome:
    """See the module's docstring (the second item)."""
    require_namespace()
    env, template, workdir = _env(env), Path(template), Path(workdir)
    out = Outcome(LEFTOVER_CLASS, "kill9-leftovers")
    run = copy_run(template, workdir / "run")
    forks, exports = workdir / "forks", workdir / "exports"
    forks.mkdir()
    exports.mkdir()
    outside, before = _outside(workdir, "outside")
    step = expected_resume(run)
    penv = dict(os.environ, PYTHONPATH=str(REPO))
    child = subprocess.run(
        [sys.executable, "-c", _LEAVE, str(run), str(forks), str(exports), str(outside), str(step)],
        env=penv,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if child.returncode != -9 or "made" not in child.stdout:
        out.fail(f"the leaving process: exit {child.returncode}: {child.stderr[-500:]}")
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    try:
        kept = [
            run / f"..state.json.{live.pid}.tmp",
            forks / f".forked.fork-{live.pid}",
            exports / f".exported.export-{live.pid}",
        ]
        kept[0].write_bytes(b"a live writer's")
        kept[1].mkdir()
        kept[2].mkdir()
        left = {d: _temps(d) for d in (run, run / "checkpoints", run / "archive", forks, exports)}
        out.note("left by the killed process", {str(d.relative_to(workdir)): n for d, n in left.items()})

        out.begin_fault()
        _ok(proxy_cmd("fork", "--run-dir", run, "--at", step, "--to", forks / "forked"), out, "[fork]")
        out.begin_fault()
        _ok(
            proxy_cmd("export", "--run-dir", run, "--out", exports / "exported", "--cache-dir", env.cache),
            out,
            "[export]",
        )
        out.begin_fault()
        relaunch_and_compare(env, run, out, "[run]")
        for d in (run, run / "checkpoints", run / "archive", forks, exports):
            remaining = [n for n in _temps(d) if str(live.pid) not in n]
            if remaining:
                out.fail(f"{d.relative_to(workdir)}: leftovers not removed: {remaining[:4]}")
        for path in kept:
            if not path.exists():
                out.fail(f"a live process's temp {path.relative_to(workdir)} was removed", data_lost=1)
        unchanged(outside, before, out, "[a leftover symlink out]")
    finally:
        live.kill()
        live.wait()
    return out.close()


# A real `python -m proxy` command held the moment it has made its first temp directory (or, with
# `.state.json` named, its first temp file for it), so that SIGKILL lands while that temp exists.
_HELD = """
import sys, time
from proxy import temp_names as t
from proxy.cli import main

made_dir, made_file = t.make_dir, t.create_file
def held(name):
    print("TEMP", name, flush=True)
    time.sleep(600)
def make_dir(*a, **k):
    d = made_dir(*a, **k)
    held(d)
    return d
def create_file(directory, target, dir_fd=None):
    fd, name = made_file(directory, target, dir_fd)
    if target == sys.argv[1]:
        held(name)
    return fd, name
t.make_dir, t.create_file = make_dir, create_file
sys.exit(main(sys.argv[2:]))
"""


def _killed_holding(argv: list, hold: str, out: Outcome, where: str) -> Path:
    """`python -m proxy *argv`, SIGKILLed while the temp it made first exists; that temp's path."""
    penv = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-c", _HELD, hold, *map(str, argv)],
        env=penv,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        line = ""
        while not line.startswith("TEMP "):
            line = proc.stdout.readline()
            if not line:
                out.fail(f"{where}: the command ended without making a temp: {proc.stderr.read()[-500:]}")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: the command and any engine it started
        proc.wait()
    temp = Path(line[5:].strip())
    return temp if temp.is_absolute() else Path(argv[argv.index("--run-dir") + 1]) / temp


def real_kill9_leftovers(env: dict, template: str, workdir: str) -> Outcome:
    """`proxy fork`, `proxy export` and `proxy run` each SIGKILLed while their temp exists (the fork's and the
    export's directory beside the target, the run's `..state.json.<pid>.<random>.tmp`): the same command
    again removes it and finishes (the run as the reference)."""
    require_namespace()
    env, template, workdir = _env(env), Path(template), Path(workdir)
    out = Outcome(LEFTOVER_CLASS, "real-kill9-leftovers")
    run = copy_run(template, workdir / "run")
    cache = ("--cache-dir", env.cache)
    commands = [
        ("fork", ["fork", "--run-dir", run, "--at", expected_resume(run), "--to", workdir / "forked"], ""),
        ("export", ["export", "--run-dir", run, "--out", workdir / "exported", *cache], ""),
        ("run", env.argv(run)[3:], ".state.json"),
    ]
    for what, argv, hold in commands:
        out.begin_fault()
        temp = _killed_holding(argv, hold, out, f"[{what}]")
        if not temp.exists():
            out.fail(f"[{what}]: killed, but its temp {temp} is not there to clean")
        out.bump("temps left by kill -9")
        if what == "run":
            relaunch_and_compare(env, run, out, "[run after kill -9]")
        else:
            _ok(proxy_cmd(*argv), out, f"[{what} after kill -9]")
        if os.path.lexists(temp):
            out.fail(f"[{what} after kill -9]: {temp.name} not removed")
    return out.close()


# ---------------------------------------------------------------------------
# a fork's frozen data


def _replace_frozen(run: Path, name: str, data: bytes) -> None:
    """RUN/data/<name> replaced by `data`, data.json's size and SHA-256 for it updated to match."""
    (run / "data" / name).write_bytes(data)
    definition = json.loads((run / "data" / "data.json").read_text())
    entries = [definition["tokenizer"]] + [arm["val"] for arm in definition["arms"].values()]
    for entry in entries:
        if entry["file"] == name:
            entry.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    (run / "data" / "data.json").write_text(json.dumps(definition, indent=1))


def fork_data(env: dict, template: str, workdir: str) -> Outcome:
    """See the module's docstring (the third item)."""
    require_namespace()
    env, template, workdir = _env(env), Path(template), Path(workdir)
    out = Outcome(FORK_DATA_CLASS, "fork-data")
    cache = ("--cache-dir", env.cache)

    out.begin_fault()  # a fork, then run, eval and export of it
    forked = workdir / "forked"
    _ok(proxy_cmd("fork", "--run-dir", env.ref, "--at", 24, "--to", forked), out, "[fork]")
    _ok(proxy_cmd("eval", "--run-dir", forked, *cache), out, "[eval of the fork]")
    _ok(proxy_cmd("export", "--run-dir", forked, "--out", workdir / "export", *cache), out, "[export of the fork]")
    relaunch_and_compare(env, forked, out, "[run of the fork]", 0, expect_resume=24)

    shard = (run_val := copy_run(env.ref, workdir / "bad-shard")) / "data" / "dots.val.tok"
    raw = bytearray(shard.read_bytes())
    struct.pack_into("<H", raw, 32 + 12, 5000)  # past the 32-byte header: an id the model's 300 cannot hold
    _replace_frozen(run_val, "dots.val.tok", bytes(raw))
    tok = copy_run(env.ref, workdir / "bad-tokenizer")
    _replace_frozen(tok, "tokenizer.json", b'{"model": {}}')
    for run, needle in ((run_val, "dots.val.tok"), (tok, "tokenizer.json")):
        target = workdir / f"fork-of-{run.name}"
        for what, argv in (
            ("fork", proxy_cmd("fork", "--run-dir", run, "--at", 24, "--to", target)),
            ("eval", proxy_cmd("eval", "--run-dir", run, *cache)),
        ):
            out.begin_fault()
            rc, p = run_cmd(argv)
            out.note(f"{run.name}: {what}", one_line_exit(p, rc, 2, needle, out, f"[{run.name}: {what}]"))
        if target.exists() or _temps(workdir):
            out.fail(f"[{run.name}: fork]: the refused fork left {target.name} or a temp: {_temps(workdir)}")
    return out.close()

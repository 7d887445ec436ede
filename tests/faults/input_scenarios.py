"""Inputs outside the run that cannot be read as they claim: `proxy eval --data` given a device, a FIFO, a
huge file or a directory; data sources that refuse to be read (EACCES, EIO, EINVAL, EISDIR, ENOTDIR).

Each must end with one line on stderr and exit 2, at once, within a memory limit, without a traceback,
and change nothing in the run. The adversarial test saw `--data /dev/zero` grow until MemoryError, a FIFO
hang, and PermissionError / OSError tracebacks from hashing a source.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

from harness.engine import Child, Hang

from .path_scenarios import tree
from .proxy_checks import memory_limit, one_line_exit, proxy_cmd, run_cmd
from .proxy_harness import ProxyEnv, write_fault_experiment
from .proxy_scenarios import copy_run
from .scenarios import ENGINE, REPO, Outcome

INPUT_CLASS = "unreadable inputs (eval --data, data sources)"
SPARSE_BYTES = 2 << 30


def as_file_owner(argv: list[str]) -> list[str]:
    """argv run so that a file's permission bits bind (root passes them all): in a user namespace that maps
    this uid to an unprivileged one, which then owns our files but has no capability over them."""
    if os.geteuid() != 0:
        return argv
    return ["unshare", "--user", "--map-user=1000", "--map-group=1000", "--", *argv]


def _run(argv: list[str]) -> tuple[int, Child]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    p = Child(argv, cwd=REPO, new_session=True, parse_events=False, env=env, preexec_fn=memory_limit())
    return p.finish(60), p


def eval_data(env: ProxyEnv, template: Path, workdir: Path) -> Outcome:
    """`proxy eval --data X` for X /dev/zero, a FIFO, a 2 GiB sparse file, a directory, /proc/self/mem:
    exit 2 with one line naming X, under RLIMIT_AS 8 GiB, in seconds; the run unchanged. A small text
    file evaluates (exit 0)."""
    out = Outcome(INPUT_CLASS, "eval-data")
    run = copy_run(template, workdir / "run")
    for corpus in env.experiment.parent.glob("*.txt"):  # the run's sources resolve against the run directory
        shutil.copy(corpus, run / corpus.name)
    fifo = workdir / "fifo"
    os.mkfifo(fifo)
    sparse = workdir / "huge.txt"
    with open(sparse, "wb") as f:
        f.truncate(SPARSE_BYTES)
    folder = workdir / "folder"
    folder.mkdir()
    before = tree(run)
    for what, target in (
        ("/dev/zero", "/dev/zero"),
        ("a FIFO", fifo),
        ("a 2 GiB file", sparse),
        ("a directory", folder),
        ("/proc/self/mem", "/proc/self/mem"),
    ):
        out.begin_fault()
        t0 = time.monotonic()
        argv = proxy_cmd("eval", "--run-dir", run, "--cache-dir", env.cache, "--engine", ENGINE.flag, "--data", target)
        try:
            rc, p = run_cmd(argv, preexec_fn=memory_limit())
        except Hang as exc:
            out.fail(f"[--data {what}]: {exc}")
        line = one_line_exit(p, rc, 2, "--data", out, f"[--data {what}]")
        out.note(f"--data {what}", f"{line} ({time.monotonic() - t0:.1f} s)")
    if tree(run) != before:
        out.fail("eval --data changed the run directory", data_lost=1)
    text = workdir / "text.txt"
    text.write_text("alpha beta gamma delta epsilon zeta eta theta. " * 40)
    rc, p = run_cmd(
        proxy_cmd("eval", "--run-dir", run, "--cache-dir", env.cache, "--engine", ENGINE.flag, "--data", text)
    )
    if rc != 0:
        out.fail(f"[--data a text file]: exit {rc}: {p.stderr_lines()[-2:]}")
    return out.close()


def unreadable_sources(env: ProxyEnv, workdir: Path) -> Outcome:
    """An arm whose source is a file the user may not read (EACCES), a directory the user may not list,
    /proc/self (EINVAL on a file in it), /proc/self/mem (EIO), a directory named as a file (EISDIR), a
    path through a file (ENOTDIR): `proxy run` exits 2 with one line naming the file, never a traceback."""
    out = Outcome(INPUT_CLASS, "unreadable-sources")
    exp_dir = workdir / "exp"
    base = json.loads(write_fault_experiment(exp_dir).read_text())
    secret = exp_dir / "secret.txt"
    secret.write_text("a file nobody may read\n")
    secret.chmod(0)
    locked = exp_dir / "locked"
    locked.mkdir()
    (locked / "doc.txt").write_text("inside a directory nobody may list\n")
    locked.chmod(0)
    (exp_dir / "folder.txt").mkdir()
    cases = [
        ("a file without read permission (EACCES)", {"file": "secret.txt"}, "secret.txt", True),
        ("a directory without permission", {"dir": "locked"}, "locked", True),
        ("a dir source of /proc/self", {"dir": "/proc/self"}, "/proc/self", False),
        ("/proc/self/mem (EIO)", {"file": "/proc/self/mem"}, "/proc/self/mem", False),
        ("a directory as a file source (EISDIR)", {"file": "folder.txt"}, "folder.txt", False),
        ("a path through a file (ENOTDIR)", {"file": "dots.txt/child"}, "dots.txt/child", False),
    ]
    try:
        for i, (what, source, needle, owner) in enumerate(cases):
            out.begin_fault()
            exp = json.loads(json.dumps(base))
            exp["arms"][0]["sources"] = [source]
            path = exp_dir / f"case-{i}.json"
            path.write_text(json.dumps(exp))
            cache, run = workdir / f"cache-{i}", workdir / f"run-{i}"
            argv = [
                sys.executable,
                "-m",
                "proxy",
                "run",
                str(path),
                "--run-dir",
                str(run),
                "--no-dashboard",
                "--cache-dir",
                str(cache),
                "--engine",
                ENGINE.flag,
            ]
            try:
                rc, p = _run(as_file_owner(argv) if owner else argv)
            except Hang as exc:
                out.fail(f"[{what}]: {exc}")
            line = one_line_exit(p, rc, 2, needle, out, f"[{what}]")
            out.note(what, line)
    finally:
        secret.chmod(0o644)
        locked.chmod(0o755)
        shutil.rmtree(workdir / "exp", ignore_errors=True)
    return out.close()

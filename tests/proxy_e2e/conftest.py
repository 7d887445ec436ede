"""Shared helpers for the proxy's end-to-end suite: real proxies, the real engine.

Every test runs `python -m proxy ...` as a child process in its own session
(so a test can SIGKILL the proxy's whole process group, as a crash would),
against experiments derived from experiments/TINY-TRAIN.json: the same model
and data, fewer steps, frequent checkpoints, one engine thread (the box is
small and shared). A missing engine is a failure with a clear message, never
a skip: CI must not go green without one.

The engine is the CPU one unless MICROGPT_TEST_ENGINE names another
(harness/engines.py), and every `proxy run` names it (`run_args`): a run
that does not is refused before it starts. A test that acts mid-run holds
the engine at a step with a frame gate (harness/gate.py, the `gate`
fixture) instead of racing it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from harness.engine import Child, Hang
from harness.engines import EngineUnderTest, engine_under_test
from harness.gate import Gate
from harness.reaction import react
from proxy.formats.checkpoint import read_checkpoint

REPO = Path(__file__).resolve().parents[2]
ENGINE = engine_under_test()
TINY = REPO / "experiments" / "TINY-TRAIN.json"
RUN_TIMEOUT = 300.0  # seconds one proxy run may take on a busy 2-core box


@pytest.fixture(scope="session")
def engine() -> EngineUnderTest:
    if ENGINE.problem:
        pytest.fail(f"{ENGINE.problem} (tests/proxy_e2e needs an engine: `make cpu`)", pytrace=False)
    return ENGINE


@pytest.fixture
def gate(engine, tmp_path) -> Gate:
    """A frame gate in front of the engine under test, open until the test sets a hold."""
    return Gate(tmp_path / "gate", engine.path)


def run_args(
    experiment: Path | None, run_dir: Path, *extra, engine: str | None = None, dashboard: bool = False
) -> list[str]:
    """`proxy run` arguments naming the engine: the engine under test, or `engine` (a gate's flag), and the rank
    count: `--ranks 1` unless `extra` gives one (what the test runs, never what the machine has)."""
    args = ["run"] + ([str(experiment)] if experiment is not None else [])
    args += ["--run-dir", str(run_dir), "--engine", engine or ENGINE.flag]
    ranks = [] if "--ranks" in map(str, extra) else ["--ranks", "1"]
    return args + ([] if dashboard else ["--no-dashboard"]) + ranks + [str(a) for a in extra]


def require_engine_flag(args: list[str]) -> None:
    """Every proxy run in the tests says which engine it drives, never what the machine has."""
    if args and args[0] == "run" and "--engine" not in args:
        pytest.fail(f"`proxy {' '.join(args)}` names no engine: build its arguments with run_args()", pytrace=False)


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory) -> Path:
    """One prepared-data cache for the whole session (TINY's data are built once)."""
    return tmp_path_factory.mktemp("data-cache")


def make_experiment(directory: Path, name: str, **train) -> Path:
    """A copy of TINY-TRAIN with `train` overrides (threads defaults to 1)."""
    exp = json.loads(TINY.read_text())
    exp["name"] = name
    exp["train"].setdefault("threads", 1)
    exp["train"].update(train)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    path.write_text(json.dumps(exp, indent=1))
    return path


def proxy_env(cache: Path) -> dict:
    env = dict(os.environ)
    env["MICROGPT_CACHE"] = str(cache)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclass
class Proxy:
    """One `python -m proxy ...` child in its own session (harness.engine.Child: its output read as it comes).
    `start()` launches it; a second `start()` launches the same command again (a relaunch)."""

    args: list[str]
    cache: Path
    child: Child | None = None
    started: ClassVar[list] = []

    def start(self) -> Proxy:
        require_engine_flag(self.args)
        Proxy.started.append(self)
        self.child = Child(
            [sys.executable, "-m", "proxy", *self.args],
            REPO,
            env=proxy_env(self.cache),
            new_session=True,
            parse_events=False,
            timeout=RUN_TIMEOUT,
        )
        return self

    @property
    def proc(self) -> subprocess.Popen:
        return self.child.proc

    def wait(self, timeout: float = RUN_TIMEOUT) -> int:
        try:
            return self.child.finish(timeout)
        except Hang:  # its session too: a process of it may be what holds stdout open
            self.kill_group()
            pytest.fail(
                f"proxy {' '.join(self.args)} did not finish in {timeout:.0f}s\n"
                f"stdout: {self.stdout()[-3000:]}\nstderr: {self.stderr()[-3000:]}"
            )

    def kill_group(self, sig: int = signal.SIGKILL) -> None:
        self.child.killpg(sig)

    def running(self) -> bool:
        return self.child is not None and self.child.alive()

    def stdout(self) -> str:
        self.child.poll_lines()
        return "".join(line + "\n" for line in self.child.lines)

    def stderr(self) -> str:
        return self.child.stderr

    def output(self) -> str:
        return f"--- stdout\n{self.stdout()}\n--- stderr\n{self.stderr()}"


@pytest.fixture(autouse=True)
def _reap_proxies():
    """A failing test must not leave a proxy (or its engine, in its own session) running."""
    yield
    while Proxy.started:
        proxy = Proxy.started.pop()
        if proxy.running():
            proxy.kill_group()
            proxy.proc.wait(30)
        if "--run-dir" in proxy.args:
            run_dir = Path(proxy.args[proxy.args.index("--run-dir") + 1])
            try:
                pid = engine_pid(run_dir)
            except (OSError, ValueError, KeyError):
                continue
            try:
                ours = str(run_dir).encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                ours = False
            if ours and pid_alive(pid):
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def run_cmd(args: list[str], cache: Path, timeout: float = RUN_TIMEOUT) -> subprocess.CompletedProcess:
    """A proxy command run to completion (status, stop, a whole run, ...)."""
    require_engine_flag(args)
    return subprocess.run(
        [sys.executable, "-m", "proxy", *args],
        cwd=REPO,
        env=proxy_env(cache),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def one_line_error(result, code: int) -> str:
    """The one stderr line of a command that failed with `code` (no traceback, nothing else)."""
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


def read_entries(run_dir: Path) -> list[dict]:
    """Every complete line of .loss.json (a torn last line is skipped, as readers must)."""
    out = []
    path = run_dir / ".loss.json"
    if not path.exists():
        return out
    for line in path.read_bytes().split(b"\n"):
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out


def assert_same_checkpoint(a: Path, b: Path) -> None:
    """Two checkpoints of two runs hold bit-identical weights and AdamW moments."""
    ca, cb = read_checkpoint(a), read_checkpoint(b)
    for region in ("weights", "m", "v"):
        x, y = getattr(ca, region), getattr(cb, region)
        assert np.array_equal(x.view(np.uint32), y.view(np.uint32)), f"{region} differ: {a} and {b}"


def last_steps(run_dir: Path) -> dict[int, dict]:
    """The last step entry per step."""
    steps = {}
    for e in read_entries(run_dir):
        if e.get("type") == "step":
            steps[e["step"]] = e
    return steps


def max_logged_step(run_dir: Path) -> int:
    return max(last_steps(run_dir), default=0)


def wait_for(predicate, timeout: float, what: str, proxy: Proxy | None = None, poll: float = 0.02):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            react()
            return value
        if proxy is not None and not proxy.running():
            pytest.fail(f"proxy exited (rc {proxy.proc.returncode}) while waiting for {what}\n{proxy.output()}")
        time.sleep(poll)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}" + (f"\n{proxy.output()}" if proxy else ""))


def engine_pid(run_dir: Path) -> int:
    return int(json.loads((run_dir / ".engine.json").read_text())["pid"])


def state(run_dir: Path) -> dict:
    return json.loads((run_dir / ".state.json").read_text())


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is not alive
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
    return True

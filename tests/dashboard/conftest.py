"""Fixtures for the dashboard suite: free ports, a live run directory, a real
uvicorn server in a subprocess, and Debian's Chromium driven by Playwright.

No browser is ever downloaded: Playwright launches /usr/bin/chromium. Browser
tests are skipped (with that reason) only when /usr/bin/chromium is absent.

Test files are named test_dashboard_*.py and this directory has no
__init__.py, so nothing here can shadow the real `dashboard` package.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from dashboard.synthetic import SyntheticRun

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = REPO / "test-artifacts"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def port() -> int:
    return free_port()


def make_run(root: Path, steps: int = 300, pivot: int | None = None, seed: int = 0) -> SyntheticRun:
    """A run directory as the proxy leaves it: experiment, phases, some steps and evals (each a 5 s stall
    the wall clock sees), state, samples."""
    run = SyntheticRun(root, seed=seed, t0=time.time() - steps * 0.35, audit_every=50, audit_ms=5000.0)
    run.write_experiment(max_steps=100000)
    run.add_phase(0)
    run.append_steps(steps, eval_every=50)
    if pivot:
        run.add_phase(pivot, policy="polish")
    run.write_checkpoint(steps)
    run.write_samples([steps // 2, steps])
    run.write_state()
    return run


@pytest.fixture
def run_dir(tmp_path) -> SyntheticRun:
    return make_run(tmp_path / "run-a")


class LiveWriter:
    """Keeps a run directory growing in a background thread, like a training proxy."""

    def __init__(self, run: SyntheticRun, rate: float = 20.0):
        self.run = run
        self.rate = rate
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(1.0 / self.rate):
            self.run.append_steps(1, eval_every=50)
            if self.run.step % 10 == 0:
                self.run.write_state()

    def __enter__(self) -> LiveWriter:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@pytest.fixture
def live_writer():
    writers = []

    def start(run: SyntheticRun, rate: float = 20.0) -> LiveWriter:
        w = LiveWriter(run, rate).__enter__()
        writers.append(w)
        return w

    yield start
    for w in writers:
        w.__exit__(None, None, None)


class Server:
    def __init__(self, proc: subprocess.Popen, url: str, log: Path):
        self.proc, self.url, self.log = proc, url, log

    def get(self, path: str, **kw) -> httpx.Response:
        return httpx.get(self.url + path.lstrip("/"), timeout=10, **kw)

    def wait_indexed(self, timeout: float = 30.0) -> list[dict]:
        deadline = time.monotonic() + timeout
        while True:
            runs = self.get("/api/runs").json()
            if all(r["indexed"] for r in runs):
                return runs
            if time.monotonic() > deadline:
                raise AssertionError(f"server did not index in {timeout}s: {runs}")
            time.sleep(0.05)


def start_server(run_dirs: list[Path], port: int, log: Path, extra: list[str] | None = None) -> Server:
    cmd = [sys.executable, "-m", "dashboard", "--port", str(port), "--poll", "0.5"]
    for d in run_dirs:
        cmd += ["--run-dir", str(d)]
    cmd += extra or []
    out = open(log, "wb")
    proc = subprocess.Popen(
        cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONUNBUFFERED="1")
    )
    out.close()
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"dashboard exited {proc.returncode}: {log.read_text()}")
        try:
            if httpx.get(url + "healthz", timeout=1).status_code == 200:
                return Server(proc, url, log)
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"dashboard did not start: {log.read_text()}")


@pytest.fixture
def server_factory(tmp_path):
    servers: list[Server] = []

    def start(run_dirs: list[Path], port: int | None = None, extra: list[str] | None = None) -> Server:
        s = start_server(
            [Path(d) for d in run_dirs], port or free_port(), tmp_path / f"dashboard-{len(servers)}.log", extra
        )
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.proc.terminate()
        try:
            s.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            s.proc.kill()
            s.proc.wait()


def assert_not_blank(png: Path, min_colours: int = 20) -> None:
    """A screenshot or a downloaded chart has something drawn on it: many colours, not all one."""
    from PIL import Image

    img = Image.open(png).convert("RGB")
    colours = img.getcolors(maxcolors=1 << 22) or []
    assert len(colours) >= min_colours, f"{png.name}: {len(colours)} colours"
    top = max(n for n, _c in colours)
    assert top < 0.995 * img.width * img.height, f"{png.name}: one colour almost everywhere"


@pytest.fixture(scope="session")
def browser():
    if not CHROMIUM.exists():
        pytest.skip(
            "browser tests need Debian's /usr/bin/chromium (absent here); scripts/install_test_deps.sh installs it"
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    ctx = browser.new_context(viewport={"width": 1400, "height": 1300})
    pg = ctx.new_page()
    pg.console_errors = []
    pg.on("console", lambda m: pg.console_errors.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda e: pg.console_errors.append(f"pageerror: {e}"))
    yield pg
    ctx.close()

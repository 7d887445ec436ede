"""`proxy dashboard` arguments (dashboard.server.main) and spawn()."""

from __future__ import annotations

import socket
import subprocess
import sys

import httpx

from conftest import REPO, free_port, make_run
from dashboard import server


def run_main(args: list[str], cwd) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dashboard", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )


def test_missing_run_dir_is_one_line_and_exit_2(tmp_path):
    r = run_main(["--run-dir", str(tmp_path / "nope")], tmp_path)
    assert r.returncode == 2 and r.stderr.strip() == f"dashboard: run directory not found: {tmp_path / 'nope'}"
    r = run_main([], tmp_path)  # no --run-dir and no runs/ here
    assert r.returncode == 2 and "no run directory found under runs/" in r.stderr


def test_port_in_use_is_one_line_and_exit_2(tmp_path):
    run = make_run(tmp_path / "run-a", steps=10)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = run_main(["--run-dir", str(run.root), "--port", str(port)], tmp_path)
    assert r.returncode == 2 and r.stderr.startswith(f"dashboard: cannot listen on 127.0.0.1:{port}")
    assert "Traceback" not in r.stderr


def test_default_is_most_recent_run_and_spawn(tmp_path, monkeypatch):
    make_run(tmp_path / "runs" / "old", steps=10)
    new = make_run(tmp_path / "runs" / "new", steps=20)
    monkeypatch.chdir(tmp_path)
    assert server.resolve_run_dirs(None) == [new.root]
    assert server.resolve_run_dirs([str(tmp_path / "runs")]) == [
        (tmp_path / "runs" / "new").resolve(),
        (tmp_path / "runs" / "old").resolve(),
    ]
    port = free_port()
    proc, url = server.spawn([new.root], port=port, log_path=tmp_path / "dashboard.log")
    try:
        assert url == f"http://127.0.0.1:{port}/"
        assert httpx.get(url + "api/runs/0", timeout=10).json()["name"] == "new"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_url_and_loopback_helpers():
    assert server.url_for("0.0.0.0", 80) == "http://127.0.0.1:80/"
    assert server.url_for("::1", 8000) == "http://[::1]:8000/"
    assert server.is_loopback("127.0.0.1") and server.is_loopback("localhost") and server.is_loopback("::1")
    assert not server.is_loopback("0.0.0.0") and not server.is_loopback("192.168.1.5")

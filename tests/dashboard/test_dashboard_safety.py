"""Against a real uvicorn server: no URL reads outside the run directories.

Requests are sent over a raw socket so that no client library normalizes the
path ("..", encoded slashes) before the server sees it.
"""

from __future__ import annotations

import os
import socket

from conftest import make_run

SECRET = "TOP-SECRET-OUTSIDE-THE-RUN"


def raw_get(port: int, target: str, host: str = "127.0.0.1") -> tuple[int, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(f"GET {target} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


TRAVERSALS = [
    "/api/runs/../../etc/passwd",
    "/api/runs/..%2F..%2Fetc%2Fpasswd",
    "/api/runs/%2e%2e%2f%2e%2e%2fetc%2fpasswd",
    "/api/runs/%252e%252e%252fetc%252fpasswd",
    "/api/runs/..%5c..%5cetc%5cpasswd",
    "/api/runs//etc/passwd",
    "/api/runs/%2Fetc%2Fpasswd",
    "/api/runs/%2Fetc%2Fpasswd/series",
    "/api/runs/../../etc/passwd/state",
    "/api/runs/..",
    "/api/runs/../series",
    "/api/runs/run-a/../../../etc/passwd",
    "/api/runs/0/series?from=/etc/passwd",
    "/api/stream?runs=/etc/passwd",
    "/api/stream?runs=..",
    "/static/../../../../etc/passwd",
    "/static/..%2f..%2f..%2fetc%2fpasswd",
    "/static/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
    "/static//etc/passwd",
    "/static/vendor/../../app.py",
    "/../../../etc/passwd",
    "/%2e%2e/%2e%2e/etc/passwd",
    "/etc/passwd",
    "/api/runs/secret",
    "/api/runs/0/checkpoints/..%2F..%2Fsecret.txt",
    "/api/runs/0/file?path=/etc/passwd",
    "//etc/passwd",
    "http://127.0.0.1/etc/passwd",
]


def test_traversal_attempts_are_refused(tmp_path, server_factory):
    run = make_run(tmp_path / "run-a")
    (tmp_path / "secret").write_text(SECRET)
    (tmp_path / "secret.txt").write_text(SECRET)
    srv = server_factory([run.root])
    port = int(srv.url.rsplit(":", 1)[1].strip("/"))
    for target in TRAVERSALS:
        status, body = raw_get(port, target)
        assert status in (400, 404, 422), (target, status, body[:200])
        assert b"root:" not in body and SECRET.encode() not in body, target
    status, _ = raw_get(port, "/api/runs/0")
    assert status == 200


def test_dns_rebinding_host_is_refused(tmp_path, server_factory):
    run = make_run(tmp_path / "run-a")
    srv = server_factory([run.root])
    port = int(srv.url.rsplit(":", 1)[1].strip("/"))
    assert raw_get(port, "/api/runs", host="attacker.example")[0] == 403
    assert raw_get(port, "/api/runs", host="localhost")[0] == 200


def test_symlinked_and_special_sidecars_are_not_read(tmp_path, server_factory):
    run = make_run(tmp_path / "run-a")
    outside = tmp_path / "outside.json"
    outside.write_text('{"step": 1, "status": "' + SECRET + '"}')
    state = run.root / ".state.json"
    state.unlink()
    state.symlink_to(outside)
    (run.root / "phases.json").unlink()
    os.mkfifo(run.root / "phases.json")  # would block a naive reader forever
    ck = run.root / "checkpoints"
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "step_000999.bin").write_bytes(b"x")
    os.rename(ck, tmp_path / "ck-real")
    ck.symlink_to(tmp_path / "elsewhere")
    srv = server_factory([run.root])
    srv.wait_indexed()
    assert srv.get("/api/runs/0/state").json()["value"] is None
    assert srv.get("/api/runs/0/phases").json()["value"] is None
    assert srv.get("/api/runs/0/checkpoints").json() == []
    assert SECRET not in srv.get("/api/runs/0/state").text
    assert srv.get("/api/runs/0").json()["steps"] == 300  # the log itself is fine

"""The JSON endpoints, in process (FastAPI TestClient, lifespan and watcher running)."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from conftest import make_run
from dashboard.app import LOOPBACK_HOSTS, create_app


@pytest.fixture
def client(tmp_path):
    a = make_run(tmp_path / "run-a", steps=400, pivot=250)
    b = make_run(tmp_path / "run-b", steps=200, seed=1)
    app = create_app([a.root, b.root], allowed_hosts=set(LOOPBACK_HOSTS), poll_s=0.2)
    with TestClient(app, base_url="http://127.0.0.1:8000") as c:
        deadline = time.monotonic() + 20
        while not all(r["indexed"] for r in c.get("/api/runs").json()):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        c.runs = (a, b)
        yield c


def test_runs_by_index_and_name(client):
    runs = client.get("/api/runs").json()
    assert [r["name"] for r in runs] == ["run-a", "run-b"]
    assert runs[0]["steps"] == 400 and runs[0]["last_step"] == 400 and runs[0]["evals"] == 8
    assert runs[0]["arms"] == ["stdlib_code", "stdlib_docs", "web_text"]
    assert runs[0]["max_steps"] == 100000
    assert client.get("/api/runs/1").json()["name"] == "run-b"
    assert client.get("/api/runs/run-b").json()["index"] == 1
    for bad in ("2", "nope", "..", "99999999"):
        assert client.get(f"/api/runs/{bad}").status_code in (404, 422), bad


def test_series_overview_and_zoom(client):
    p = client.get("/api/runs/0/series?width=100").json()
    assert not p["raw"] and p["n"] <= 100 and p["offset"] > 0 and p["last_step"] == 400
    assert sum(p["rows"]) == 400 and set(p["mix"]) == {"stdlib_code", "stdlib_docs", "web_text"}
    assert len(p["loss"]["min"]) == len(p["loss"]["max"]) == p["n"]
    z = client.get("/api/runs/0/series?from=100&to=149&width=100").json()
    assert z["raw"] and z["step"] == list(range(100, 150))
    assert client.get("/api/runs/0/series?width=5").status_code == 422
    assert client.get("/api/runs/0/series?from=-1").status_code == 422


def test_evals_sidecars_checkpoints(client):
    e = client.get("/api/runs/0/evals").json()
    assert e["step"] == [50, 100, 150, 200, 250, 300, 350, 400] and set(e["arms"]) == {
        "stdlib_code",
        "stdlib_docs",
        "web_text",
    }
    st = client.get("/api/runs/0/state").json()["value"]
    assert st["step"] == 400 and st["engine"]["kind"] == "cpu"
    ph = client.get("/api/runs/0/phases").json()["value"]
    assert [p["start_step"] for p in ph] == [0, 250]
    sm = client.get("/api/runs/0/samples?limit=1").json()["value"]
    assert len(sm) == 1 and sm[0]["step"] == 400 and sm[0]["samples"][1]["completion"].startswith("<script>")
    ck = client.get("/api/runs/0/checkpoints").json()
    assert ck == [{"name": "step_000400.bin", "step": 400, "bytes": 4096, "mtime": ck[0]["mtime"]}]


def test_sidecar_rename_is_picked_up(client):
    a, _ = client.runs
    v0 = client.get("/api/runs/0/state").json()["version"]
    a.append_steps(5)
    a.write_state(status="stopped")
    a.write_checkpoint(405)
    deadline = time.monotonic() + 5
    while True:
        st = client.get("/api/runs/0/state").json()
        ck = client.get("/api/runs/0/checkpoints").json()
        if st["version"] > v0 and st["value"]["status"] == "stopped" and len(ck) == 2:
            break
        assert time.monotonic() < deadline, st
        time.sleep(0.05)
    assert client.get("/api/runs/0").json()["last_step"] == 405


def test_read_only_and_host_check(client):
    assert client.post("/api/runs").status_code == 405
    assert client.delete("/api/runs/0").status_code == 405
    assert client.get("/api/runs", headers={"host": "evil.example:8000"}).status_code == 403
    assert client.get("/api/runs", headers={"host": "localhost:8000"}).status_code == 200
    r = client.get("/")
    assert r.status_code == 200 and "default-src 'self'" in r.headers["content-security-policy"]
    assert r.headers["x-content-type-options"] == "nosniff"


def test_static_allowlist(client):
    assert client.get("/static/app.js").status_code == 200
    assert client.get("/static/vendor/uPlot.iife.min.js").status_code == 200
    assert "MIT" in client.get("/static/vendor/uPlot.LICENSE").text
    for bad in ("/static/../app.py", "/static/%2e%2e/app.py", "/static/nope.js", "/static//etc/passwd"):
        assert client.get(bad).status_code == 404, bad


def test_file_events_alone_keep_it_live(tmp_path):
    """With the backstop poll out of the way (60 s), watchdog events must carry every change."""
    run = make_run(tmp_path / "run-a", steps=100)
    app = create_app([run.root], poll_s=60)
    with TestClient(app) as c:
        deadline = time.monotonic() + 20
        while c.get("/api/runs/0").json()["last_step"] != 100:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        run.append_steps(1)
        run.write_state(status="finished")  # temp file + rename over .state.json
        run.add_phase(90, policy="polish")  # phases.json, same way
        run.write_checkpoint(101)
        t = time.monotonic()
        while True:
            info = c.get("/api/runs/0").json()
            st = c.get("/api/runs/0/state").json()["value"]
            ph = c.get("/api/runs/0/phases").json()["value"]
            ck = c.get("/api/runs/0/checkpoints").json()
            if info["last_step"] == 101 and st["status"] == "finished" and len(ph) == 2 and len(ck) == 2:
                break
            assert time.monotonic() - t < 2.0, (info["last_step"], st["status"], len(ph), len(ck))
            time.sleep(0.02)


def test_classify_changed_paths():
    from dashboard.watch import classify

    root = "/r"
    assert classify(root, "/r/.loss.json") == "log"
    assert classify(root, "/r/.state.json") == "side"
    assert classify(root, "/r/phases.json") == "side"
    assert classify(root, "/r/checkpoints/step_000100.bin") == "side"
    assert classify(root, "/r/checkpoints/.step_000100.bin.tmp") is None
    assert classify(root, "/r/.state.json.123.tmp") is None
    assert classify(root, "/r/engine.log") is None
    assert classify(root, "/r/archive/pivot_100/.state.json") is None


def test_columns_and_every_column_in_the_series(client):
    from dashboard.columns import ENVELOPE_COLS, columns_payload

    cols = client.get("/api/columns").json()
    assert cols == columns_payload()
    for path in ("/api/runs/0/series?width=100", "/api/runs/0/series?from=10&to=20&width=100"):
        p = client.get(path).json()
        for c in cols:
            col = p[c["name"]]["mean"] if c["name"] in ENVELOPE_COLS else p[c["name"]]
            assert len(col) == p["n"] > 0, (path, c["name"])

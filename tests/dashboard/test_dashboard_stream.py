"""Server-sent events from a real server: new entries only, resume, torn lines, replacement."""

from __future__ import annotations

import json
import os
import queue
import threading
import time

import httpx

from conftest import make_run


class SSE:
    """Reads a server-sent event stream in a thread; events land in a queue."""

    def __init__(self, url: str, headers: dict | None = None):
        self.q: queue.Queue = queue.Queue()
        self._response = None
        self.url, self.headers = url, headers or {}
        self._stop = False
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        try:
            with httpx.Client(timeout=httpx.Timeout(10, read=None)) as c:
                with c.stream("GET", self.url, headers=self.headers) as r:
                    self._response = r
                    self.q.put(("status", r.status_code, None))
                    ev, data, eid = None, [], None
                    for line in r.iter_lines():
                        if self._stop:
                            return
                        if line == "":
                            if ev or data:
                                self.q.put((ev or "message", json.loads("\n".join(data)) if data else None, eid))
                            ev, data = None, []
                        elif line.startswith("event: "):
                            ev = line[7:]
                        elif line.startswith("data: "):
                            data.append(line[6:])
                        elif line.startswith("id: "):
                            eid = line[4:]
        except Exception as exc:  # noqa: BLE001 - the server went away or we closed it
            self.q.put(("closed", repr(exc), None))

    def next(self, kind: str, timeout: float = 5.0, pred=lambda d: True):
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"no {kind} event within {timeout}s"
            ev, data, eid = self.q.get(timeout=left)
            if ev == kind and pred(data):
                return data, eid

    def close(self) -> None:
        self._stop = True
        r = getattr(self, "_response", None)
        if r is not None:
            try:
                r.close()
            except Exception:  # noqa: BLE001
                pass  # the reader thread (a daemon) ends when the server closes the stream


def steps_of(events: list[dict]) -> list[int]:
    return [s for d in events for s in d["steps"]["step"]]


def collect_steps(sse: SSE, until: int, timeout: float = 5.0) -> tuple[list[int], str]:
    got, eid = [], None
    while not got or got[-1] < until:
        d, eid = sse.next("entries", timeout)
        got += d["steps"]["step"]
    return got, eid


def test_push_new_entries_and_resume_from_last_event_id(tmp_path, server_factory):
    run = make_run(tmp_path / "run-a", steps=100)
    srv = server_factory([run.root])
    info = srv.wait_indexed()[0]
    at = f"{info['generation']}.{info['offset']}"
    sse = SSE(srv.url + f"api/stream?runs=0&at={at}")
    assert sse.next("status")[0] == 200
    side, _ = sse.next("sidecar", pred=lambda d: d["kind"] == "state")
    assert side["value"]["step"] == 100
    t = time.monotonic()
    run.append_steps(3)
    got, eid = collect_steps(sse, 103)
    assert got == [101, 102, 103]  # only what is new, nothing from before the offset
    assert time.monotonic() - t < 2.0
    sse.close()

    run.append_steps(4)  # written while disconnected
    sse2 = SSE(srv.url + f"api/stream?runs=0&at={at}", headers={"Last-Event-ID": eid})
    got, _ = collect_steps(sse2, 107)
    assert got == [104, 105, 106, 107]  # resumed at the last offset: no gap, no repeat
    sse2.close()


def stream_of_a_new_run(tmp_path, server_factory, runs: str):
    """A run of 50 steps, a server indexing it, and a stream of `runs` past its hello."""
    run = make_run(tmp_path / "run-a", steps=50)
    srv = server_factory([run.root])
    srv.wait_indexed()
    sse = SSE(srv.url + f"api/stream?runs={runs}")
    sse.next("hello")
    return run, srv, sse


def test_torn_line_is_held_until_its_newline(tmp_path, server_factory):
    run, srv, sse = stream_of_a_new_run(tmp_path, server_factory, "run-a")
    line = run.step_line(51)
    run.append_text(line[:20])
    time.sleep(1.2)  # the server saw the partial line (events and a poll) ...
    assert srv.get("/api/runs/0").json()["last_step"] == 50
    run.append_text(line[20:])
    run.step = 51
    got, _ = collect_steps(sse, 51)
    assert got == [51]
    run.append_text("\x00\x01 not json\n")  # a garbage line is skipped, later lines still arrive
    run.append_steps(1)
    got, _ = collect_steps(sse, 52)
    assert got == [52]
    sse.close()


def test_replaced_log_sends_reset(tmp_path, server_factory):
    run, srv, sse = stream_of_a_new_run(tmp_path, server_factory, "0")
    tmp = run.root / ".loss.json.new"
    tmp.write_text("".join(run.step_line(s) for s in range(1, 11)))
    os.replace(tmp, run.root / ".loss.json")
    d, _ = sse.next("reset", timeout=5)
    assert d["reason"] == "replaced" and d["generation"] == 2
    deadline = time.monotonic() + 5
    while srv.get("/api/runs/0").json()["last_step"] != 10:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    sse.close()


def test_far_behind_client_gets_reset_not_a_flood(tmp_path, server_factory):
    run = make_run(tmp_path / "run-a", steps=50)
    srv = server_factory([run.root])
    srv.wait_indexed()
    run.append_steps(12000)  # about 4 MB: more than one push may carry
    srv.wait_indexed()
    deadline = time.monotonic() + 20
    while srv.get("/api/runs/0").json()["last_step"] != 12050:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    sse = SSE(srv.url + "api/stream?runs=0&at=1.0")
    d, _ = sse.next("reset", timeout=10)
    assert d["reason"] == "behind"
    sse.close()

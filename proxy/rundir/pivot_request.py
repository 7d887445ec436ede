"""The live pivot's files: request, claim, answer (docs/FORMATS.md, "The live pivot's files").

`proxy pivot` writes RUN/.pivot_request.json atomically and signals the
proxy (SIGUSR2); the proxy claims it by renaming it to .pivot_claimed.json
(so a `proxy pivot` that gives up can still withdraw a request nobody took)
and answers in .pivot_response.json with the request's id.
"""

from __future__ import annotations

import os
import time
import uuid

from ..atomic import atomic_write_json
from ..formats import bounded_json
from .layout import RunDir


def write_request(run: RunDir, caps: dict, floors: dict, policy: str, caps_file: str) -> str:
    """`proxy pivot`'s side: leave a request for the running proxy; returns its id."""
    request_id = uuid.uuid4().hex
    atomic_write_json(
        run.pivot_request,
        {
            "id": request_id,
            "caps": caps,
            "floors": floors,
            "policy": policy,
            "caps_file": caps_file,
            "pid": os.getpid(),
            "time": time.time(),
        },
    )
    return request_id


def withdraw_request(run: RunDir) -> bool:
    """`proxy pivot`'s side: withdraw our unclaimed request; False when the proxy has already claimed it."""
    try:
        run.pivot_request.unlink()
        return True
    except FileNotFoundError:
        return False


def read_response(run: RunDir, request_id: str) -> dict | None:
    """`proxy pivot`'s side: the answer to our request, or None while there is none."""
    try:
        obj = bounded_json.loads(run.read_small(run.pivot_response))
    except (OSError, ValueError, RecursionError):  # UnsafeFileError is a ValueError: no answer there
        return None
    return obj if isinstance(obj, dict) and obj.get("id") == request_id else None


def claim_request(run: RunDir) -> dict | None:
    """The proxy's side: take the request (rename it to .pivot_claimed.json) and read it; None if there is none."""
    try:
        os.rename(run.pivot_request, run.pivot_claimed)
    except FileNotFoundError:
        return None
    try:
        obj = bounded_json.loads(run.read_small(run.pivot_claimed))
    except (OSError, ValueError, RecursionError):  # UnsafeFileError is a ValueError: a malformed request
        obj = None
    return obj if isinstance(obj, dict) else {"id": None, "malformed": True}


def answer_request(run: RunDir, request: dict | None, ok: bool, message: str, **fields: object) -> None:
    """The proxy's side: write the answer and drop the claimed request."""
    obj = {"id": (request or {}).get("id"), "ok": ok, "message": message, **fields}
    atomic_write_json(run.pivot_response, obj)
    try:
        run.pivot_claimed.unlink()
    except FileNotFoundError:
        pass

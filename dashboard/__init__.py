"""microgpt's live dashboard: a read-only web page over one or more run directories.

`create_app(run_dirs)` builds the FastAPI app (dashboard.app); `serve()` and
`main(argv)` run it under uvicorn (dashboard.server). docs/DASHBOARD.md
describes what the page shows, the endpoints and the safety rules.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the app's modules (FastAPI, uvicorn) load only when a function here is called
    from fastapi import FastAPI

__all__ = ["create_app", "serve", "main"]


def create_app(run_dirs: list[Path], *, allowed_hosts: set[str] | None = None, poll_s: float = 1.0) -> FastAPI:
    from .app import create_app as _create_app

    return _create_app(run_dirs, allowed_hosts=allowed_hosts, poll_s=poll_s)


def serve(
    run_dirs: list[Path],
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    poll_s: float = 1.0,
    announce: Callable[[str], object] | None = None,
    log_level: str = "warning",
) -> None:
    from .server import serve as _serve

    return _serve(run_dirs, host=host, port=port, poll_s=poll_s, announce=announce, log_level=log_level)


def main(argv: list[str] | None = None) -> int:
    from .server import main as _main

    return _main(argv)

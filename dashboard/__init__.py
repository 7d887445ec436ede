"""microgpt's live dashboard: a read-only web page over one or more run directories.

`create_app(run_dirs)` builds the FastAPI app (dashboard.app); `serve()` and
`main(argv)` run it under uvicorn (dashboard.server). docs/DASHBOARD.md
describes what the page shows, the endpoints and the safety rules.
"""

from __future__ import annotations

__all__ = ["create_app", "serve", "main"]


def create_app(run_dirs, **kwargs):
    from .app import create_app as _create_app

    return _create_app(run_dirs, **kwargs)


def serve(run_dirs, host: str = "127.0.0.1", port: int = 8000, **kwargs):
    from .server import serve as _serve

    return _serve(run_dirs, host=host, port=port, **kwargs)


def main(argv=None) -> int:
    from .server import main as _main

    return _main(argv)

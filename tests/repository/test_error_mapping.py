"""Errors carry their exit code (proxy/errors.py) and cli.py maps them to one line and an exit status: no
module of proxy/ catches an error only to raise it again as `ProxyError(str(exc), CODE)`. (A handler that
adds to the message, `ProxyError(f"cannot pivot: {exc}")`, says something new and stays.)"""
from __future__ import annotations

import ast
from pathlib import Path

from proxy.config.errors import ExperimentError
from proxy.data.batches import BatchError
from proxy.data.prepare import DataError
from proxy.errors import EXIT_FAILURE, EXIT_USAGE, ProxyError
from proxy.rundir.layout import RunDirError
from proxy.rundir.lock import RunInUse
from proxy.safe_fs import UnsafeFileError
from proxy.supervision.engine_process import EngineError

ROOT = Path(__file__).resolve().parents[2]


def _is_str_of(node: ast.AST, name: str) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "str"
            and len(node.args) == 1 and isinstance(node.args[0], ast.Name) and node.args[0].id == name)


def rewraps(tree: ast.AST) -> list[int]:
    """Lines of `except ... as exc: raise ProxyError(str(exc), ...)`."""
    found = []
    for handler in ast.walk(tree):
        if not isinstance(handler, ast.ExceptHandler) or handler.name is None:
            continue
        for stmt in ast.walk(handler):
            if (isinstance(stmt, ast.Raise) and isinstance(stmt.exc, ast.Call)
                    and isinstance(stmt.exc.func, ast.Name) and stmt.exc.func.id == "ProxyError"
                    and stmt.exc.args and _is_str_of(stmt.exc.args[0], handler.name)):
                found.append(stmt.lineno)
    return found


def test_no_error_is_wrapped_again_only_for_its_exit_code():
    found = {str(p.relative_to(ROOT)): lines for p in sorted((ROOT / "proxy").rglob("*.py"))
             if (lines := rewraps(ast.parse(p.read_text(encoding="utf-8"))))}
    assert not found, f"errors re-raised as ProxyError(str(exc), ...) instead of carrying their code: {found}"


def test_the_rewrap_check_can_fail():
    code = "try:\n    f()\nexcept KeyError as exc:\n    raise ProxyError(str(exc), 2) from None\n"
    assert rewraps(ast.parse(code)) == [4]
    assert rewraps(ast.parse(code.replace("str(exc)", 'f"cannot: {exc}"'))) == []


def test_each_error_carries_its_exit_code():
    for error in (RunDirError, ExperimentError, DataError, BatchError, EngineError):
        assert issubclass(error, ProxyError) and error("x").code == EXIT_USAGE, error
    assert RunInUse("x").code == EXIT_FAILURE and isinstance(RunInUse("x"), RunDirError)
    assert UnsafeFileError("p", "a FIFO").code == EXIT_USAGE  # a ValueError the dashboard shares, not a ProxyError
    assert ProxyError("x").code == EXIT_FAILURE and ProxyError("x", EXIT_USAGE).code == EXIT_USAGE
    for error in (ExperimentError, DataError, BatchError):  # still caught as ValueError where they were
        assert issubclass(error, ValueError)

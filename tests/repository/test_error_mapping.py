"""Errors carry their exit code (proxy/errors.py) and cli.py maps them to one line and an exit status.

Outside cli.py an `except` clause of proxy/ does one of two things: it turns an exception from outside the
project (an OSError, a library's error) into an error of ours whose class carries the code, where it
happened; or it notes what was being done (`exc.add_note(...)`) and raises the same error again. It never
raises the base `ProxyError` (choosing a line and a code is cli.py's job), and never catches one of our
errors to raise another in its place."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from proxy.config.config_file import ExperimentError
from proxy.data.batches import BatchError
from proxy.data.prepare import DataError
from proxy.errors import EXIT_FAILURE, EXIT_USAGE, ProxyError, one_line
from proxy.formats.checkpoint import CheckpointError
from proxy.rundir.layout import RunDirError
from proxy.rundir.lock import PivotInFlight, RunInUse
from proxy.safe_fs import UnsafeFileError
from proxy.supervision.engine_process import EngineError

ROOT = Path(__file__).resolve().parents[2]
MAPPING = "proxy/cli.py"  # the one place that turns an error into a line and an exit status


def _raised_name(node: ast.Raise) -> str | None:
    """The class a `raise X(...)` / `raise mod.X(...)` builds; None for a bare `raise` or `raise exc`."""
    if not isinstance(node.exc, ast.Call):
        return None
    func = node.exc.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _caught(handler: ast.ExceptHandler, namespace: dict) -> list[type]:
    """The classes an except clause names, resolved in its module's namespace."""
    nodes = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type] if handler.type else []
    found = []
    for node in nodes:
        try:
            value = eval(compile(ast.Expression(node), "<except>", "eval"), namespace)  # a name or mod.Name
        except (NameError, AttributeError):
            continue
        if isinstance(value, type):
            found.append(value)
    return found


def violations(tree: ast.AST, namespace: dict) -> list[str]:
    """Each handler that raises the base ProxyError, or catches one of ours and raises another."""
    found = []
    for handler in ast.walk(tree):
        if not isinstance(handler, ast.ExceptHandler):
            continue
        ours = [c.__name__ for c in _caught(handler, namespace) if issubclass(c, ProxyError)]
        for node in ast.walk(handler):
            if not isinstance(node, ast.Raise):
                continue
            name = _raised_name(node)
            if name == "ProxyError":
                found.append(f"line {node.lineno}: raises ProxyError in an except clause")
            elif name is not None and ours:
                found.append(f"line {node.lineno}: catches {', '.join(ours)} and raises {name} in its place")
    return found


def test_errors_are_mapped_in_cli_only():
    found = {}
    for path in sorted((ROOT / "proxy").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        if rel in (MAPPING, "proxy/__main__.py"):  # __main__ runs the command line when imported
            continue
        module = importlib.import_module(rel.removesuffix(".py").replace("/", ".").removesuffix(".__init__"))
        lines = violations(ast.parse(path.read_text(encoding="utf-8")), vars(module))
        if lines:
            found[rel] = lines
    assert not found, f"errors re-raised by hand instead of carrying their code to cli.py: {found}"


def test_the_check_can_fail():
    namespace = {"RunDirError": RunDirError, "KeyError": KeyError}
    rewrap = "try:\n    f()\nexcept KeyError as exc:\n    raise ProxyError(f'cannot: {exc}', 2) from None\n"
    assert violations(ast.parse(rewrap), namespace) == ["line 4: raises ProxyError in an except clause"]
    replace = "try:\n    f()\nexcept RunDirError as exc:\n    raise DataError(str(exc)) from None\n"
    assert violations(ast.parse(replace), namespace) == [
        "line 4: catches RunDirError and raises DataError in its place"
    ]
    translate = "try:\n    f()\nexcept KeyError as exc:\n    raise DataError(f'no arm {exc}') from None\n"
    note = "try:\n    f()\nexcept RunDirError as exc:\n    exc.add_note('cannot fork')\n    raise\n"
    assert violations(ast.parse(translate), namespace) == [] and violations(ast.parse(note), namespace) == []


def test_each_error_carries_its_exit_code():
    for error in (RunDirError, ExperimentError, DataError, BatchError, EngineError, CheckpointError):
        assert issubclass(error, ProxyError) and error("x").code == EXIT_USAGE, error
    assert RunInUse("x").code == EXIT_FAILURE and isinstance(RunInUse("x"), RunDirError)
    assert PivotInFlight("x").code == EXIT_FAILURE
    assert UnsafeFileError("p", "a FIFO").code == EXIT_USAGE  # a ValueError the dashboard shares, not a ProxyError
    assert ProxyError("x").code == EXIT_FAILURE and ProxyError("x", EXIT_USAGE).code == EXIT_USAGE
    for error in (ExperimentError, DataError, BatchError, CheckpointError):  # still caught as ValueError
        assert issubclass(error, ValueError)


def test_the_line_holds_the_notes_outermost_first():
    error = RunDirError("history gap at step 40")
    error.add_note("check_history")
    error.add_note("cannot fork runs/a")
    assert one_line(error) == "cannot fork runs/a: check_history: history gap at step 40" and error.code == EXIT_USAGE
    missing = FileNotFoundError(2, "No such file or directory", "runs/a/x")
    missing.add_note("fork")
    assert one_line(missing) == "fork: runs/a/x: No such file or directory"

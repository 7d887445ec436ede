"""Reading an experiment or caps file, and one line per bad one: `path: problem; problem` (pydantic's errors
turned into phrases)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from ..errors import EXIT_USAGE, ProxyError
from ..formats import bounded_json
from ..safe_fs import UnsafeFileError, read_regular
from .strict import TAG

CONFIG_FILE_LIMIT = 1 << 20  # the largest experiment or caps file read (and the frozen copy in a run)


class ExperimentError(ProxyError, ValueError):
    """A bad experiment or caps file. The message is one line naming the file and each problem."""

    code = EXIT_USAGE


_TYPE_WORDS = {
    "int_type": "an integer",
    "int_from_float": "an integer",
    "int_parsing": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "string_type": "a string",
    "bool_type": "true or false",
    "list_type": "a list",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
}


def _loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def quoted(name: Any) -> str:
    """A name (a key, an arm) quoted for a message as repr() does, cut to 40 characters."""
    text = str(name)
    return repr(text if len(text) <= 40 else text[:37] + "...")


def short(value: Any) -> str:
    """A value as JSON for a message, cut to 40 characters (a message is one readable line whatever the input)."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _phrase(err: ErrorDetails) -> str:
    # a validator's name, or the kind of a source (its tag in the union), is no part of the field path
    loc = tuple(p for p in err.get("loc", ()) if not (isinstance(p, str) and p.startswith(("function-", TAG))))
    kind = err.get("type", "")
    where = _loc(loc)
    if kind == "extra_forbidden":
        parent, key = _loc(loc[:-1]), loc[-1] if loc else "?"
        return f"{parent + ': ' if parent else ''}unknown key {quoted(key)}"
    if kind == "missing":
        return f"{where}: missing (required)"
    if kind in _TYPE_WORDS:
        return f"{where}: expected {_TYPE_WORDS[kind]}, got {short(err.get('input'))}"
    msg = err.get("msg", "invalid")
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    elif msg.startswith("Assertion failed, "):
        msg = msg[len("Assertion failed, ") :]
    else:
        msg = msg[0].lower() + msg[1:] if msg else msg
        if "input" in err and kind not in ("literal_error",):
            msg += f", got {short(err['input'])}"
        elif kind == "literal_error":
            msg += f", got {short(err.get('input'))}"
    return f"{where}: {msg}" if where else msg


def format_validation_error(err: ValidationError) -> list[str]:
    """Each problem pydantic found, as `where: what`, in order, without repeats."""
    seen: list[str] = []
    for e in err.errors(include_url=False):
        p = _phrase(e)
        if p not in seen:
            seen.append(p)
    return seen


MAX_PROBLEMS = 10  # problems named in one message; the rest are counted


def config_error(path: Path | str, problems: list[str]) -> ExperimentError:
    """The error for `path` naming its problems (the first MAX_PROBLEMS), on one line."""
    shown = "; ".join(p.replace("\n", " ") for p in problems[:MAX_PROBLEMS])
    more = f"; and {len(problems) - MAX_PROBLEMS} more" if len(problems) > MAX_PROBLEMS else ""
    return ExperimentError(f"{path}: {shown}{more}")


def read_json(path: Path) -> Any:
    """The parsed JSON of a config file; ExperimentError when it is missing, unreadable or not JSON."""
    try:
        text = read_regular(path, CONFIG_FILE_LIMIT).decode("utf-8")
    except FileNotFoundError:
        raise config_error(path, ["no such file"]) from None
    except UnsafeFileError as e:
        raise config_error(path, [e.reason]) from None
    except (OSError, UnicodeDecodeError) as e:
        raise config_error(path, [f"cannot read: {e}"]) from None
    try:
        return bounded_json.loads(text)
    except bounded_json.TooDeep as e:
        raise config_error(path, [f"not JSON this reader takes: {e}"]) from None
    except json.JSONDecodeError as e:
        raise config_error(path, [f"not JSON: {e.msg} at line {e.lineno} column {e.colno}"]) from None
    except RecursionError:
        raise config_error(path, ["not JSON this reader takes: nested too deeply"]) from None

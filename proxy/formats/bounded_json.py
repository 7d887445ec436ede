"""The one JSON parser for what the proxy reads: json.loads with a nesting limit checked first.

Python's json module recurses once per `[` or `{`, so a line of 200,000 `[`
(well under any size cap) ends in a RecursionError, which is no ValueError
and escapes every handler of a malformed file as a traceback. Every JSON the
project reads from a run directory, the cache, an experiment, a caps file, a
checkpoint's metadata or an engine frame goes through `loads` here: the text's
bracket depth (outside strings) is counted first, cheaply and exactly, and a
depth over MAX_DEPTH raises TooDeep, a json.JSONDecodeError, so each reader
treats it as it treats any malformed JSON: the loss log skips the line as
damaged, a file reader refuses the file with its one line and exit code.
tests/repository/test_json_reads.py keeps every other json.load(s) out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from itertools import accumulate
from typing import Any

MAX_DEPTH = 64  # far above any file the project writes (an experiment nests 4 deep), far below the recursion limit

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)  # a JSON string, escapes included
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


class TooDeep(json.JSONDecodeError):
    """JSON nested deeper than MAX_DEPTH: malformed, for every reader."""

    def __init__(self, doc: str):
        super().__init__(f"JSON nested deeper than {MAX_DEPTH} levels", doc[:64], 0)
        self.args = (self.msg,)  # one short line, without json's "line 1 column 1 (char 0)"


def depth(text: str) -> int:
    """How deep `text`'s arrays and objects nest (brackets inside strings not counted)."""
    if text.count("[") + text.count("{") == 0:
        return 0
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(0, max(accumulate(1 if c in "[{" else -1 for c in brackets), default=0))


def loads(
    data: str | bytes | bytearray,
    *,
    parse_constant: Callable[[str], object] | None = None,
    parse_float: Callable[[str], object] | None = None,
) -> Any:  # parsed JSON: any of its value types, which each caller checks
    """json.loads(data) with json.loads's `parse_constant` and `parse_float` hooks, or TooDeep when it nests
    deeper than MAX_DEPTH."""
    text = data.decode(json.detect_encoding(data), "surrogatepass") if isinstance(data, (bytes, bytearray)) else data
    if text.count("[") + text.count("{") > MAX_DEPTH and depth(text) > MAX_DEPTH:  # the count: a cheap bound
        raise TooDeep(text)
    return json.loads(text, parse_constant=parse_constant, parse_float=parse_float)

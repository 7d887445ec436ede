"""The base of every schema a user writes, and the bounds on the text in it (docs/EXPERIMENTS.md, "Bounds").

A path or pattern is at most PATH_MAX characters; a word (a suffix, a field or
column name, a module name, a split) at most 255. Every later use holds by
these: a message quotes at most 40 characters of a value it rejects, and a
path it cannot find whole.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from ..run_names import MAX_ARMS, MAX_NAME  # noqa: F401  (the bounds of names, with the file names)

MAX_PATH = 4096  # characters of a source path or pattern (PATH_MAX)
MAX_WORD = 255  # characters of a suffix, a JSON Lines field, a column, a module name, a split
TAG = "="  # how a tagged union's member shows in pydantic's error paths; config/config_file.py drops it

PathText = Annotated[str, Field(max_length=MAX_PATH)]
Word = Annotated[str, Field(max_length=MAX_WORD)]


class StrictModel(BaseModel):
    """Unknown keys and values of the wrong type are errors, never coerced."""

    model_config = ConfigDict(extra="forbid", strict=True)

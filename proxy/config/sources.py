"""The kinds of data source an arm may name: one definition (docs/EXPERIMENTS.md, "Sources").

A source is a JSON object with exactly one kind key (`{"file": "a.txt"}`,
`{"tokens": "train.bin", "val": "val.bin"}`), plus that kind's options. Each
kind is one model below; `SOURCE_KINDS` maps the kind key to it, and
`SourceConfig` is their tagged union, which pydantic picks from by that key.
The data side (proxy/data/source_files.py and source_readers.py) dispatches on `kind` through
its own tables of files and readers, one entry per kind here.

What each kind's documents are: text (read, split, encoded with the
tokenizer) or token ids (`tokens`, `builtin: random_tokens`: never encoded,
and no part of a trained tokenizer). A token source is its arm's only source.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Union, get_args

from pydantic import BeforeValidator, Discriminator, Field, Tag, TypeAdapter, model_validator

from .strict import TAG, PathText, StrictModel, Word

TEXT, TOKENS = "text", "tokens"  # what a source's documents are
FILE, DIRECTORY, PATTERN = "file", "directory", "pattern"  # what a path field names

# Built-in sources. random_tokens is the one whose documents are token ids, not text: it is made after the
# tokenizer and trains no part of it.
BuiltinName = Literal["stdlib_code", "stdlib_docstrings", "pydoc_topics", "random_tokens", "repeated_names"]
BUILTIN_SOURCES: tuple[str, ...] = get_args(BuiltinName)
TOKEN_BUILTINS = ("random_tokens",)
STDLIB_BUILTINS = ("stdlib_code", "stdlib_docstrings")
MAX_MODULES = 1000
TokenFormat = Literal["uint16", "llmc", "npy"]  # formats/token_files.py
TOKEN_FORMATS: tuple[str, ...] = get_args(TokenFormat)


class Source(StrictModel):
    """What every kind has: its kind key (the class's `kind`), and what its documents are."""

    kind: ClassVar[str]
    holds: ClassVar[str] = TEXT

    @property
    def target(self) -> str:
        """The value of the kind key: a path, a pattern or a built-in name."""
        return getattr(self, self.kind)

    @property
    def is_text(self) -> bool:
        return self.holds == TEXT

    def path_fields(self) -> list[tuple[str, str, str]]:
        """(field, value, FILE | DIRECTORY | PATTERN) of every field that names files, relative paths resolved
        against the experiment file's directory."""
        return []

    def resolved(self, base_dir: str | os.PathLike) -> Source:
        """A copy whose path fields are absolute (relative ones joined to `base_dir`)."""
        update = {
            name: os.path.normpath(value if os.path.isabs(value) else os.path.join(os.path.abspath(base_dir), value))
            for name, value, _what in self.path_fields()
        }
        return self.model_copy(update=update)

    def options(self) -> dict[str, Any]:
        """Everything but where the files are: what the fingerprint of the source holds besides their bytes."""
        paths = {name for name, _value, _what in self.path_fields()}
        out = self.model_dump(exclude=paths, exclude_none=True)
        out["kind"] = self.kind
        return out

    def describe(self) -> str:
        return f"{self.kind} {self.target!r}"

    def val_part(self) -> Source | None:
        """The text source of the validation documents the user named (`val`, `val_split`), read as this kind
        reads its own: then no document of the arm is split off for validation. None: none named (a token
        file's `val` is read in place, proxy/data/token_arms.py)."""
        return None

    @model_validator(mode="after")
    def _paths_not_empty(self) -> Source:
        for name, value, _what in self.path_fields():
            if value == "":
                raise ValueError(f"{name} must not be empty")
        return self


class TextSource(Source):
    """A source of text documents: `max_chars` keeps documents in order until that many characters."""

    max_chars: int | None = Field(default=None, ge=1)


class NamedVal(TextSource):
    """A kind whose `val` names its validation documents: a file, a pattern or a directory (`val_is`) read
    as the kind reads its own (docs/EXPERIMENTS.md, "Sources")."""

    val: PathText | None = None
    val_is: ClassVar[str] = FILE  # what `val` names

    def path_fields(self) -> list[tuple[str, str, str]]:
        return [(self.kind, self.target, self.val_is)] + ([("val", self.val, self.val_is)] if self.val else [])

    def val_part(self) -> Source | None:
        if self.val is None:
            return None
        return self.model_copy(update={self.kind: self.val, "val": None, "max_chars": None})


class FileSource(NamedVal):
    """The whole file is one document (UTF-8 text; binary data is refused)."""

    kind: ClassVar[str] = "file"
    val_is: ClassVar[str] = FILE
    file: PathText


class GlobSource(NamedVal):
    """Every matching file (recursive `**`), sorted by path, one document each; files that are not text skipped."""

    kind: ClassVar[str] = "glob"
    val_is: ClassVar[str] = PATTERN
    glob: PathText


class DirSource(NamedVal):
    """Every file under the directory whose name ends with `suffix` (default: any), hidden ones skipped,
    sorted by relative path, one document each; files that are not text skipped."""

    kind: ClassVar[str] = "dir"
    val_is: ClassVar[str] = DIRECTORY
    dir: PathText
    suffix: Word | None = None


class JsonlSource(NamedVal):
    """One document per non-blank line: the string in `field` (default "text")."""

    kind: ClassVar[str] = "jsonl"
    val_is: ClassVar[str] = FILE
    jsonl: PathText
    field: Word | None = None


class ParquetSource(NamedVal):
    """One document per row of a string column of Parquet files (a path or a pattern, sorted); needs pyarrow."""

    kind: ClassVar[str] = "parquet"
    val_is: ClassVar[str] = PATTERN
    parquet: PathText
    column: Word = "text"


class HFDatasetSource(TextSource):
    """A Hugging Face `save_to_disk` directory (Arrow files and their JSON): one document per row of a string
    column; a DatasetDict's `split` (default "train"), and `val_split` the split of its validation documents.
    Read with pyarrow, not the `datasets` package."""

    kind: ClassVar[str] = "hf_dataset"
    hf_dataset: PathText
    split: Word | None = None
    column: Word = "text"
    val_split: Word | None = None  # the DatasetDict's split of the validation documents ("validation")

    def path_fields(self) -> list[tuple[str, str, str]]:
        return [("hf_dataset", self.hf_dataset, DIRECTORY)]

    def val_part(self) -> Source | None:
        if self.val_split is None:
            return None
        return self.model_copy(update={"split": self.val_split, "val_split": None, "max_chars": None})

    @model_validator(mode="after")
    def _val_is_another_split(self) -> HFDatasetSource:
        if self.val_split is not None and self.val_split == (self.split or "train"):
            raise ValueError(f"val_split {self.val_split!r} is the training split itself")
        return self


class TokensSource(Source):
    """Token ids already made: nanoGPT's raw uint16 `.bin`, llm.c's shards, `.npy` of uint16/uint32 (a path
    or a pattern, in sorted order), memory-mapped. `val`: the validation tokens (else split off the end);
    `format`: one of TOKEN_FORMATS (default: told by the file's first bytes). Needs the experiment's
    tokenizer, so that samples and exports decode."""

    kind: ClassVar[str] = "tokens"
    holds: ClassVar[str] = TOKENS
    tokens: PathText
    val: PathText | None = None
    format: TokenFormat | None = None

    def path_fields(self) -> list[tuple[str, str, str]]:
        return [("tokens", self.tokens, PATTERN)] + ([("val", self.val, PATTERN)] if self.val is not None else [])


class BuiltinSource(TextSource):
    """Real text present on any machine with Python, or the curation tests' sources (docs/EXPERIMENTS.md)."""

    kind: ClassVar[str] = "builtin"
    builtin: BuiltinName
    modules: list[Word] | None = Field(default=None, max_length=MAX_MODULES)  # stdlib_*: only these

    @property
    def is_text(self) -> bool:
        return self.builtin not in TOKEN_BUILTINS

    @model_validator(mode="after")
    def _options_apply(self) -> BuiltinSource:
        if self.modules is not None and self.builtin not in STDLIB_BUILTINS:
            raise ValueError(f"modules applies only to builtin {' and '.join(STDLIB_BUILTINS)}")
        if self.modules is not None and (not self.modules or not all(self.modules)):
            raise ValueError("modules must be a non-empty list of module names")
        if self.max_chars is not None and not self.is_text:
            raise ValueError(f"max_chars does not apply to builtin {self.builtin} (its documents are tokens)")
        return self


SOURCE_KINDS: dict[str, type[Source]] = {
    cls.kind: cls
    for cls in (
        FileSource,
        GlobSource,
        DirSource,
        JsonlSource,
        ParquetSource,
        HFDatasetSource,
        TokensSource,
        BuiltinSource,
    )
}
KIND_LIST = ", ".join(SOURCE_KINDS)


def _kind_of(value: Any) -> str | None:
    """The union's discriminator: the one kind key of a JSON object (or a model's kind)."""
    if isinstance(value, Source):
        return TAG + value.kind
    if isinstance(value, dict):
        kinds = [k for k in SOURCE_KINDS if k in value]
        return TAG + kinds[0] if len(kinds) == 1 else None
    return None


def _one_kind(value: Any) -> Any:
    """Before the union: exactly one kind key, and no key that kind does not take (each named in the message)."""
    if not isinstance(value, dict):
        return value
    kinds = [k for k in SOURCE_KINDS if k in value]
    if len(kinds) != 1:
        strangers = [k for k in value if not any(k in cls.model_fields for cls in SOURCE_KINDS.values())]
        if not kinds and strangers:
            raise ValueError(f"unknown key {str(strangers[0])[:40]!r}; a source is one of {KIND_LIST}")
        got = f" (got {', '.join(kinds)})" if kinds else ""
        raise ValueError(f"a source needs exactly one of {KIND_LIST}{got}")
    cls = SOURCE_KINDS[kinds[0]]
    unknown = [k for k in value if k not in cls.model_fields]
    if unknown:
        takes = [kinds[0]] + [f for f in cls.model_fields if f != kinds[0]]
        raise ValueError(f"unknown key {str(unknown[0])[:40]!r} (a {kinds[0]} source takes {', '.join(takes)})")
    return value


if TYPE_CHECKING:  # the type checker cannot read a Union built at run time: the same kinds, spelled out
    SourceConfig = (
        FileSource
        | GlobSource
        | DirSource
        | JsonlSource
        | ParquetSource
        | HFDatasetSource
        | TokensSource
        | BuiltinSource
    )
else:
    SourceConfig = Annotated[
        # A Union built from a tuple at run time: there is no `|` spelling of it.
        Union[tuple(Annotated[cls, Tag(TAG + kind)] for kind, cls in SOURCE_KINDS.items())],  # noqa: UP007
        Discriminator(
            _kind_of, custom_error_type="source_kind", custom_error_message=f"a source needs exactly one of {KIND_LIST}"
        ),
        BeforeValidator(_one_kind),
    ]
_ADAPTER: TypeAdapter[SourceConfig] = TypeAdapter(SourceConfig)


def parse_source(obj: dict) -> Source:
    """One source from its JSON object (pydantic's ValidationError when it is not one)."""
    return _ADAPTER.validate_python(obj)


def is_token_source(src: Source) -> bool:
    """A source whose documents are token ids (a token file, random_tokens), never text."""
    return not src.is_text


def path_problem(field: str, text: str, what: str, base_dir: str | os.PathLike) -> str | None:
    """Why a path field names nothing (relative to `base_dir`), or None."""
    import glob as _glob  # noqa: PLC0415 - only the check needs it

    p = Path(base_dir) / text
    if what == FILE and not p.is_file():
        return f"{field}: no such file {text!r} (looked at {p})"
    if what == DIRECTORY and not p.is_dir():
        return f"{field}: no such directory {text!r} (looked at {p})"
    if what == PATTERN:
        pattern = text if os.path.isabs(text) else str(p)
        if not any(Path(m).is_file() for m in _glob.glob(pattern, recursive=True)):
            return f"{field}: pattern {text!r} matches no file (looked for {pattern})"
    return None

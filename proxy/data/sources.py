"""Data sources: resolve a SourceConfig to an ordered list of documents (str).

Kinds (docs/EXPERIMENTS.md, "Sources"):

- {"file": path}: the whole file is one document.
- {"glob": pattern}: every matching file (recursive `**` allowed), sorted by path; one document each.
- {"dir": path, "suffix": ".py"}: every file under the directory (hidden ones skipped) whose
  name ends with `suffix` (default: any), sorted by relative path; one document each.
- {"jsonl": path, "field": "text"}: one document per line, the string in `field`.
- {"builtin": "stdlib_code" | "stdlib_docstrings" | "pydoc_topics"}: real text present on
  any machine with Python: the standard library's source, its docstrings (one document per
  module), and the language reference topics that `help()` shows (pydoc_data.topics).
- {"builtin": "repeated_names"}: a duplicate-heavy source for curation tests: the
  qualified name of each documented public function and class of a few modules written in C
  (`math.isclose`), a few hundred documents of a few tokens, repeated REPEATS times in a
  fixed shuffled order: quickly learned, then worth nothing.
- {"builtin": "random_tokens"}: an unlearnable source for curation tests: token ids uniform
  over the trained vocabulary, made by `random_token_documents` once the tokenizer exists
  (they are not text, so they train no part of it).
- {"builtin": "shuffled_words" | "boilerplate" | "near_duplicates" | "man_pages_de"}:
  realistic low-quality text for curation tests, made from real text on the machine
  (lowquality.py): docstrings with their words shuffled, license paragraphs repeated as
  boilerplate, docstring paragraphs copied with small edits, German manual pages.

Relative paths are resolved against the experiment file's directory. The order
of documents is deterministic (sorted paths, file order). Every kind also takes
`max_chars`: documents are kept in order until that many characters (the last
one cut to fit). Files in a glob or directory that are not UTF-8 text are
skipped; an explicit file or JSON Lines file that is not UTF-8 is an error.
"""
from __future__ import annotations

import ast
import glob as _glob
import hashlib
import importlib
import inspect
import json
import os
import sys
import sysconfig
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from ..config.experiment import TOKEN_SOURCES, SourceConfig
from . import lowquality

# Bump when what a builtin source extracts changes (part of the cache key).
EXTRACTOR_VERSION = 1

# Low-quality sources made from the docstrings (all modules; `modules` does not apply to them).
FROM_DOCSTRINGS = {"shuffled_words": lowquality.shuffled_words, "near_duplicates": lowquality.near_duplicates}

_STDLIB_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__", "pydoc_data"}

# repeated_names: modules implemented in C in CPython (their members are defined in no .py file).
REPEATED_MODULES = ("builtins", "sys", "math", "cmath", "itertools", "time", "gc")
REPEATS = 40

# random_tokens: documents of DOC_TOKENS ids; the train and val splits are separate streams.
RANDOM_DOC_TOKENS = 1024
RANDOM_DOCS = {"train": 256, "val": 16}


class SourceError(ValueError):
    """A source that cannot be read; the message is one line saying which and why."""


def describe(src: SourceConfig) -> str:
    return f"{src.kind} {src.target!r}"


# ---------------------------------------------------------------------------
# Which files a source reads, in document order.

def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _module_name(rel: str) -> str:
    mod = rel[:-3].replace("/", ".")
    return mod[: -len(".__init__")] if mod.endswith(".__init__") else mod


def stdlib_files(modules: Optional[list[str]] = None) -> list[Path]:
    """The standard library's .py files (no tests, no site-packages), sorted by relative path."""
    root = stdlib_root()
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root)
        dirnames[:] = [d for d in dirnames if d not in _STDLIB_SKIP_DIRS and not d.startswith((".", "config-"))]
        for fn in filenames:
            if not fn.endswith(".py"):
                continue
            rel = (rel_dir / fn).as_posix()
            if modules is not None:
                name = _module_name(rel)
                if not any(name == m or name.startswith(m + ".") for m in modules):
                    continue
            out.append((rel, Path(dirpath) / fn))
    out.sort()
    return [p for _, p in out]


def _pydoc_topics_file() -> Path:
    import pydoc_data.topics as topics  # noqa: PLC0415 - stdlib, imported on demand
    return Path(topics.__file__)


def source_files(src: SourceConfig, base_dir: Path | str) -> list[Path]:
    """The files `src` reads, in document order; SourceError when there are none."""
    base = Path(base_dir)
    kind, target = src.kind, src.target
    if kind in ("file", "jsonl"):
        p = base / target
        if not p.is_file():
            raise SourceError(f"{kind} source: no such file {target!r} (looked at {p})")
        return [p]
    if kind == "glob":
        pattern = target if os.path.isabs(target) else str(base / target)
        matches = sorted({os.path.normpath(m) for m in _glob.glob(pattern, recursive=True)})
        files = [Path(m) for m in matches if Path(m).is_file()]
        if not files:
            raise SourceError(f"glob source: pattern {target!r} matches no file (looked for {pattern})")
        return files
    if kind == "dir":
        root = base / target
        if not root.is_dir():
            raise SourceError(f"dir source: no such directory {target!r} (looked at {root})")
        found = []
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            for fn in filenames:
                if fn.startswith(".") or (src.suffix is not None and not fn.endswith(src.suffix)):
                    continue
                p = Path(dirpath) / fn
                if p.is_file():  # a FIFO or a device would block or never end
                    found.append((p.relative_to(root).as_posix(), p))
        found.sort()
        if not found:
            what = f"files ending with {src.suffix!r}" if src.suffix else "files"
            raise SourceError(f"dir source: no {what} under {target!r} (looked at {root})")
        return [p for _, p in found]
    if kind == "builtin":
        if target in ("repeated_names", "random_tokens"):
            return []  # made in memory: the Python version in the fingerprint fixes them
        if target == "boilerplate":
            files = lowquality.license_files()
            if not files:
                raise SourceError(f"builtin boilerplate: no license texts under {lowquality.LICENSES_DIR}")
            return files
        if target == "man_pages_de":
            files = lowquality.man_de_files()
            if not files:
                raise SourceError(f"builtin man_pages_de: no manual pages under {lowquality.MAN_DE_DIR}")
            return files
        if target in ("stdlib_code", "stdlib_docstrings", *FROM_DOCSTRINGS):
            files = stdlib_files(src.modules)
            if not files:
                which = f" matching modules {src.modules}" if src.modules else ""
                raise SourceError(f"builtin {target}: no standard library source files{which} under {stdlib_root()}")
            return files
        if target == "pydoc_topics":
            try:
                return [_pydoc_topics_file()]
            except ImportError as e:
                raise SourceError(f"builtin pydoc_topics: pydoc_data.topics is not available ({e})") from None
    raise SourceError(f"unknown source kind {kind!r}")


def source_fingerprint(src: SourceConfig, base_dir: Path | str,
                       file_hash: Optional[Callable[[Path], str]] = None) -> str:
    """A content hash of everything that determines this source's documents:
    its options and the bytes of each file it reads (not where they live)."""
    file_hash = file_hash or hash_file
    h = hashlib.sha256()
    options = src.model_dump(exclude={"file", "glob", "dir", "jsonl"}, exclude_none=True)
    options["kind"] = src.kind
    if src.kind == "builtin":
        options["python"] = list(sys.version_info[:3])
        options["extractor"] = EXTRACTOR_VERSION
    h.update(json.dumps(options, sort_keys=True).encode())
    root = Path(base_dir) / src.target if src.kind == "dir" else stdlib_root()
    for p in source_files(src, base_dir):
        if src.kind in ("dir", "builtin"):  # names matter: order, and module names in docstrings
            try:
                name = p.relative_to(root).as_posix()
            except ValueError:
                name = p.name
            h.update(b"\0name\0" + os.fsencode(name))
        h.update(b"\0file\0" + file_hash(p).encode())
    return h.hexdigest()


def hash_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------------------
# Documents.

def _read_text(p: Path, strict: bool) -> Optional[str]:
    data = p.read_bytes()
    if not strict and b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        if strict:
            raise SourceError(f"{p}: not UTF-8 text ({e.reason} at byte {e.start})") from None
        return None


def _jsonl_documents(p: Path, field: str) -> list[str]:
    docs = []
    text = _read_text(p, strict=True)
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise SourceError(f"{p}:{lineno}: not JSON ({e.msg})") from None
        if not isinstance(obj, dict) or field not in obj:
            raise SourceError(f"{p}:{lineno}: no {field!r} field")
        value = obj[field]
        if not isinstance(value, str):
            raise SourceError(f"{p}:{lineno}: field {field!r} is {type(value).__name__}, not a string")
        docs.append(value)
    return docs


def _docstrings(text: str, module: str) -> str:
    """All docstrings of one module, in source order, each headed by its qualified name."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return ""
    parts = []

    def visit(node, qual: str) -> None:
        doc = ast.get_docstring(node, clean=True)
        if doc:
            parts.append(f"{qual}\n{doc}")
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, f"{qual}.{child.name}")

    visit(tree, module)
    return "\n\n".join(parts)


def repeated_names() -> list[str]:
    """The qualified names of REPEATED_MODULES' documented public functions and classes
    (`math.isclose`: a few hundred documents of a few tokens, like a site's menu entries),
    repeated REPEATS times: every pass in its own fixed order (sorted by a hash of pass and
    position, so the same on every machine)."""
    unique = []
    for module_name in REPEATED_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            raise SourceError(f"builtin repeated_names: module {module_name} is not available ({e})") from None
        for name in sorted(vars(module)):
            obj = getattr(module, name)
            if name.startswith("_") or not (inspect.isroutine(obj) or inspect.isclass(obj)):
                continue
            doc = obj.__doc__
            if isinstance(doc, str) and doc.strip():
                unique.append(f"{module_name}.{name}")
    docs = []
    for rep in range(REPEATS):
        order = sorted(range(len(unique)), key=lambda i: hashlib.sha256(f"{rep}:{i}".encode()).digest())
        docs.extend(unique[i] for i in order)
    return docs


def random_token_documents(split: str, vocab_size: int, eot_id: int) -> list[np.ndarray]:
    """The random_tokens documents of one split: RANDOM_DOCS[split] arrays of RANDOM_DOC_TOKENS
    ids, uniform over [0, vocab_size) without `eot_id`, from SHAKE-256 of the split's name (the
    same bytes on every machine; the modulo bias of 32-bit draws is below 1e-6)."""
    n = RANDOM_DOCS[split] * RANDOM_DOC_TOKENS
    raw = hashlib.shake_256(f"microgpt-random-tokens:{split}".encode()).digest(4 * n)
    ids = np.frombuffer(raw, dtype="<u4").astype(np.int64) % (vocab_size - 1)
    ids += ids >= eot_id  # skip the separator
    return list(ids.astype(np.uint16).reshape(RANDOM_DOCS[split], RANDOM_DOC_TOKENS))


def is_token_source(src: SourceConfig) -> bool:
    """A source whose documents are token ids made after the tokenizer (random_tokens)."""
    return src.builtin in TOKEN_SOURCES


def _limit(docs: list[str], max_chars: Optional[int]) -> list[str]:
    if max_chars is None:
        return docs
    out, total = [], 0
    for d in docs:
        if total >= max_chars:
            break
        if total + len(d) > max_chars:
            d = d[: max_chars - total]
        out.append(d)
        total += len(d)
    return out


def load_documents(src: SourceConfig, base_dir: Path | str,
                   on_file: Optional[Callable[[int], None]] = None) -> list[str]:
    """The documents of one source, in deterministic order (empty ones dropped).

    `on_file(nbytes)` is called after each file read (for progress bars)."""
    if is_token_source(src):
        raise SourceError(f"{describe(src)}: its documents are token ids (random_token_documents), not text")
    files = source_files(src, base_dir)
    docs: list[str] = []
    kind = src.kind
    if kind == "builtin" and src.builtin == "repeated_names":
        docs = repeated_names()
    elif kind == "builtin" and src.builtin == "boilerplate":
        docs = lowquality.boilerplate(files, lambda p: _read_text(p, strict=False) or "")
        if on_file:
            on_file(sum(p.stat().st_size for p in files))
    elif kind == "builtin" and src.builtin == "man_pages_de":
        for p in files:
            text = lowquality.man_page_text(p)
            if text is not None:
                docs.append(text)
            if on_file:
                on_file(p.stat().st_size)
    elif kind == "builtin" and src.builtin in FROM_DOCSTRINGS:
        root = stdlib_root()
        docstrings = []
        for p in files:
            text = _read_text(p, strict=False)
            if text is not None:
                docstrings.append(_docstrings(text, _module_name(p.relative_to(root).as_posix())))
            if on_file:
                on_file(p.stat().st_size)
        docs = FROM_DOCSTRINGS[src.builtin]([d for d in docstrings if d])
    elif kind == "builtin" and src.builtin == "pydoc_topics":
        import pydoc_data.topics as topics  # noqa: PLC0415
        docs = [topics.topics[k] for k in sorted(topics.topics)]
        if on_file:
            on_file(files[0].stat().st_size)
    else:
        root = stdlib_root()
        for p in files:
            if kind == "jsonl":
                docs.extend(_jsonl_documents(p, src.field or "text"))
            elif kind == "builtin":
                text = _read_text(p, strict=False)
                if text is not None:
                    if src.builtin == "stdlib_docstrings":
                        text = _docstrings(text, _module_name(p.relative_to(root).as_posix()))
                    docs.append(text)
            else:
                text = _read_text(p, strict=(kind == "file"))
                if text is not None:
                    docs.append(text)
            if on_file:
                on_file(p.stat().st_size)
    docs = _limit([d for d in docs if d], src.max_chars)
    if not docs:
        raise SourceError(f"{describe(src)}: no text documents")
    return docs


def source_bytes(src: SourceConfig, base_dir: Path | str) -> int:
    """Total size of the files `src` reads (for progress bars)."""
    return sum(p.stat().st_size for p in source_files(src, base_dir))

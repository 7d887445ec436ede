"""The built-in sources' material (docs/EXPERIMENTS.md, "Sources"): the standard library's files and docstrings,
the language reference topics, and the documents made in memory (repeated_names, random_tokens).
source_readers.py plans and reads them like any source.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
import os
import sysconfig
from pathlib import Path

import numpy as np

from ..config.sources import BuiltinSource
from .work_units import SourceError

_STDLIB_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__", "pydoc_data"}

# repeated_names: modules implemented in C in CPython (their members are defined in no .py file).
REPEATED_MODULES = ("builtins", "sys", "math", "cmath", "itertools", "time", "gc")
REPEATS = 40

# random_tokens: documents of DOC_TOKENS ids; the train and val splits are separate streams.
RANDOM_DOC_TOKENS = 1024
RANDOM_DOCS = {"train": 256, "val": 16}


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def module_name(rel: str) -> str:
    mod = rel[:-3].replace("/", ".")
    return mod[: -len(".__init__")] if mod.endswith(".__init__") else mod


def stdlib_files(modules: list[str] | None = None) -> list[Path]:
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
                name = module_name(rel)
                if not any(name == m or name.startswith(m + ".") for m in modules):
                    continue
            out.append((rel, Path(dirpath) / fn))
    out.sort()
    return [p for _, p in out]


def pydoc_topics_file() -> Path:
    import pydoc_data.topics as topics  # noqa: PLC0415 - stdlib, imported on demand

    return Path(topics.__file__)


def builtin_files(src: BuiltinSource, _base: Path) -> list[Path]:
    if src.builtin in ("repeated_names", "random_tokens"):
        return []  # made in memory: the Python version in the fingerprint fixes them
    if src.builtin in ("stdlib_code", "stdlib_docstrings"):
        files = stdlib_files(src.modules)
        if not files:
            which = f" matching modules {src.modules}" if src.modules else ""
            raise SourceError(f"builtin {src.builtin}: no standard library source files{which} under {stdlib_root()}")
        return files
    try:
        return [pydoc_topics_file()]
    except ImportError as e:
        raise SourceError(f"builtin pydoc_topics: pydoc_data.topics is not available ({e})") from None


def module_docstrings(text: str, module: str) -> str:
    """All docstrings of one module, in source order, each headed by its qualified name."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return ""
    parts = []

    def visit(node: ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef, qual: str) -> None:
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
    docs: list[str] = []
    for rep in range(REPEATS):
        order = sorted(range(len(unique)), key=lambda i: hashlib.sha256(f"{rep}:{i}".encode()).digest())
        docs.extend(unique[i] for i in order)
    return docs


def pydoc_topics() -> list[str]:
    import pydoc_data.topics as topics  # noqa: PLC0415

    return [topics.topics[k] for k in sorted(topics.topics)]


def random_token_documents(split: str, vocab_size: int, eot_id: int) -> list[np.ndarray]:
    """The random_tokens documents of one split: RANDOM_DOCS[split] arrays of RANDOM_DOC_TOKENS
    ids, uniform over [0, vocab_size) without `eot_id`, from SHAKE-256 of the split's name (the
    same bytes on every machine; the modulo bias of 32-bit draws is below 1e-6)."""
    n = RANDOM_DOCS[split] * RANDOM_DOC_TOKENS
    raw = hashlib.shake_256(f"microgpt-random-tokens:{split}".encode()).digest(4 * n)
    ids = np.frombuffer(raw, dtype="<u4").astype(np.int64) % (vocab_size - 1)
    ids += ids >= eot_id  # skip the separator
    return list(ids.astype(np.uint16).reshape(RANDOM_DOCS[split], RANDOM_DOC_TOKENS))

"""One owner per piece of `proxy run`'s state: RunContext (proxy/supervision/context.py) is the only code that
assigns its fields or changes the containers it holds (its methods `new_bandit`, `start_phase`,
`next_segment`, `reject_checkpoint`, `record_eval`, ...). The other modules read them and call those methods.

Checked over proxy/ by the AST: an assignment `ctx.FIELD = ...` or `self.ctx.FIELD = ...` (also in a tuple, an
augmented or an annotated assignment), an item assignment `ctx.FIELD[...] = ...`, or a mutating call
(`add`, `append`, `update`, ...) on a FIELD that is a plain dict, list or set. Objects that own themselves
(the report, the writer, the samples file, the signal counts) are called, not assigned here, and are not
RunContext fields' containers in this sense."""

from __future__ import annotations

import ast
import dataclasses
import typing
from pathlib import Path

from proxy.supervision.context import RunContext

ROOT = Path(__file__).resolve().parents[2]
OWNER = "proxy/supervision/context.py"
FIELDS = {f.name for f in dataclasses.fields(RunContext)}
HINTS = typing.get_type_hints(RunContext)
CONTAINERS = {name for name, hint in HINTS.items() if typing.get_origin(hint) in (dict, list, set)}
MUTATORS = {"add", "append", "extend", "insert", "update", "pop", "popitem", "clear", "discard", "remove", "setdefault"}


def _ctx_field(node: ast.AST) -> str | None:
    """FIELD when `node` is `ctx.FIELD` or `self.ctx.FIELD` and FIELD is RunContext's."""
    if not isinstance(node, ast.Attribute) or node.attr not in FIELDS:
        return None
    base = node.value
    if isinstance(base, ast.Name) and base.id == "ctx":
        return node.attr
    if (
        isinstance(base, ast.Attribute)
        and base.attr == "ctx"
        and isinstance(base.value, ast.Name)
        and base.value.id == "self"
    ):
        return node.attr
    return None


def writes(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for target in targets:
            for t in target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]:
                name = _ctx_field(t.value if isinstance(t, ast.Subscript) else t)
                if name is not None:
                    found.append((node.lineno, name))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
            name = _ctx_field(node.func.value)
            if name in CONTAINERS:
                found.append((node.lineno, name))
    return found


def test_only_run_context_changes_its_fields():
    assert {"bandit", "caps", "floors", "phases", "samples", "launch_number"} <= FIELDS
    assert {"caps", "floors", "rejected", "eval_loss"} <= CONTAINERS
    offenders = []
    for path in sorted((ROOT / "proxy").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        if rel == OWNER:
            continue
        for line, name in writes(ast.parse(path.read_text(encoding="utf-8"))):
            offenders.append(f"{rel}:{line}: ctx.{name}")
    assert not offenders, "RunContext's fields changed outside RunContext: " + "; ".join(offenders)


def test_the_check_can_fail():
    code = (
        "ctx.bandit, ctx.caps = 1, 2\nself.ctx.launch_number += 1\nctx.eval_loss[3] = 1.0\n"
        "ctx.rejected.add('x')\nctx.writer.append(e)\nseg.last_step = 4\n"
    )
    assert writes(ast.parse(code)) == [
        (1, "bandit"),
        (1, "caps"),
        (2, "launch_number"),
        (3, "eval_loss"),
        (4, "rejected"),
    ]

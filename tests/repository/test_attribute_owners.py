"""One owner per object: no code in proxy/ assigns an attribute of an object it does not own.

An object's fields change in its own methods (`self.x = ...`), or, for a record written to disk, the caller
builds a new value (`dataclasses.replace`, pydantic's `model_copy(update=...)`). Checked over proxy/ by the
AST: every assignment target (plain, tuple or list, augmented, annotated, `for`, `with`, `del`, and
`setattr(obj, ...)`) that is an attribute `B.a`, or an item of one (`B.a[k]`, `B.a[k][j]`), must have for its
base `B` either

- `self` or `cls` (the object's own method), or
- a name bound in the same function only to what a call returned (`verdict = PathVerdict(...)`,
  `merged = definition.model_copy(deep=True)`): an object that function made and has not yet handed out;

or be listed in ALLOWED below. Anything deeper (`x.a.b = ...`, `x.a[k].b = ...`, `self.ctx.report.status =
...`) changes an object that `x` or `self` merely holds, and is refused whoever `x` is. An item of a plain
name (`out[k] = ...`) is a local container's and is not checked.

The live state of `proxy run` (RunContext, RunReport, EngineLaunch, MixtureSchedule, SignalCounts) is also
checked for the other way to change a field: a mutating call on one of its containers (`seg.outstanding.append(...)`,
`ctx.rejected.add(...)`) outside the object's own methods.
"""

from __future__ import annotations

import ast
import typing
from collections import deque
from pathlib import Path

from proxy.bandit.schedule import MixtureSchedule
from proxy.supervision.context import RunContext
from proxy.supervision.launch import EngineLaunch
from proxy.supervision.report import RunReport
from proxy.supervision.signals import SignalCounts

ROOT = Path(__file__).resolve().parents[2]
OWN = {"self", "cls"}
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
# (file, the assignment as written): things outside the proxy's own objects, each with why.
ALLOWED = {
    # the worker process's environment, set before HF tokenizers starts its thread pool (a third-party setting
    # read from the environment, not an object of the proxy)
    ("proxy/data/workers.py", "os.environ['TOKENIZERS_PARALLELISM']"),
    # tqdm's module-wide switch for its monitor thread (third-party; see the comment there)
    ("proxy/data/progress_bars.py", "tqdm.monitor_interval"),
}


def _targets(node: ast.AST) -> list[ast.expr]:
    """What `node` assigns to or deletes, tuples and lists unpacked, starred targets included."""
    if isinstance(node, ast.Assign):
        found = list(node.targets)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For, ast.AsyncFor, ast.comprehension)):
        found = [node.target]
    elif isinstance(node, (ast.With, ast.AsyncWith)):
        found = [item.optional_vars for item in node.items if item.optional_vars is not None]
    elif isinstance(node, ast.Delete):
        found = list(node.targets)
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" and node.args:
        found = [ast.Attribute(value=node.args[0], attr="?", ctx=ast.Store(), lineno=node.lineno)]
    else:
        return []
    out = []
    while found:
        t = found.pop()
        if isinstance(t, (ast.Tuple, ast.List)):
            found.extend(t.elts)
        elif isinstance(t, ast.Starred):
            found.append(t.value)
        else:
            out.append(t)
    return out


def _changed_object(target: ast.expr) -> ast.expr | None:
    """The base B of an attribute target `B.a` or of an item of one (`B.a[k]`); None for a plain name or an
    item of one (`x`, `x[k]`)."""
    while isinstance(target, ast.Subscript):
        target = target.value
    return target.value if isinstance(target, ast.Attribute) else None


def _bindings(scope: ast.AST) -> dict[str, list[ast.AST | None]]:
    """Every name bound directly in `scope` (a function or the module, not its nested functions) -> the
    value of each binding when it is a plain `name = value` assignment, else None (a parameter, a loop
    variable, a `with ... as`, an unpacking, an augmented assignment, an import)."""
    out: dict[str, list[ast.AST | None]] = {}
    if isinstance(scope, FUNCTIONS):
        a = scope.args
        for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]:
            if arg is not None:
                out.setdefault(arg.arg, []).append(None)
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        if isinstance(node, (*FUNCTIONS, ast.ClassDef)):
            if not isinstance(node, ast.Lambda):
                out.setdefault(node.name, []).append(None)
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            out.setdefault(node.id, []).append(None)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                out.setdefault((alias.asname or alias.name).split(".")[0], []).append(None)
        elif isinstance(node, ast.NamedExpr):
            out.setdefault(node.target.id, []).append(node.value)
            todo.append(node.value)
            continue
        elif isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets):
            for t in node.targets:
                out.setdefault(t.id, []).append(node.value)
            todo.append(node.value)
            continue
        todo.extend(ast.iter_child_nodes(node))
    return out


def _made_here(name: str, scopes: list[ast.AST], bindings: dict[int, dict]) -> bool:
    """Whether `name`, as seen from the innermost of `scopes`, is bound only to what calls returned in the
    function that binds it."""
    for scope in reversed(scopes):
        values = bindings[id(scope)].get(name)
        if values is not None:
            return isinstance(scope, FUNCTIONS) and all(isinstance(v, ast.Call) for v in values)
    return False


def foreign_assignments(tree: ast.Module, allowed: set[str] = frozenset()) -> list[tuple[int, str]]:
    """(line, target) of every assignment in `tree` to an attribute of an object the code does not own."""
    bindings: dict[int, dict] = {}
    found = []

    def visit(node: ast.AST, scopes: list[ast.AST]) -> None:
        if isinstance(node, (ast.Module, *FUNCTIONS)):
            scopes = scopes + [node]
            bindings[id(node)] = _bindings(node)
        for target in _targets(node):
            base = _changed_object(target)
            if base is None:
                continue
            if isinstance(base, ast.Name) and (base.id in OWN or _made_here(base.id, scopes, bindings)):
                continue
            text = ast.unparse(target)
            if text not in allowed:
                found.append((target.lineno, text))
        for child in ast.iter_child_nodes(node):
            visit(child, scopes)

    visit(tree, [])
    return sorted(found)


def test_no_module_assigns_attributes_of_objects_it_does_not_own():
    files = sorted((ROOT / "proxy").rglob("*.py"))
    assert len(files) > 80, "the scan found too few modules to mean anything"
    offenders = []
    for path in files:
        rel = str(path.relative_to(ROOT))
        allowed = {text for where, text in ALLOWED if where == rel}
        for line, text in foreign_assignments(ast.parse(path.read_text(encoding="utf-8")), allowed):
            offenders.append(f"{rel}:{line}: {text}")
    assert not offenders, (
        "attributes assigned outside their object's own methods (add a method that says "
        "what happened, or build a new value):\n" + "\n".join(offenders)
    )


def test_every_allowed_assignment_is_still_there():
    """An allowance whose assignment is gone is removed with it, so the list stays short and true."""
    for where, text in ALLOWED:
        tree = ast.parse((ROOT / where).read_text(encoding="utf-8"))
        assert any(text in {ast.unparse(t) for t in _targets(node)} for node in ast.walk(tree)), (where, text)


# The live state of `proxy run`: their container fields change only in their own methods, like their other
# fields (a call such as `seg.outstanding.append(...)` elsewhere is an assignment in all but name).
STATE_CLASSES = (RunContext, RunReport, EngineLaunch, MixtureSchedule, SignalCounts)
MUTATORS = {
    "add",
    "append",
    "appendleft",
    "clear",
    "difference_update",
    "discard",
    "extend",
    "extendleft",
    "insert",
    "intersection_update",
    "pop",
    "popitem",
    "popleft",
    "remove",
    "reverse",
    "rotate",
    "setdefault",
    "sort",
    "symmetric_difference_update",
    "update",
}


def _container_fields() -> set[str]:
    out = set()
    for cls in STATE_CLASSES:
        for name, hint in typing.get_type_hints(cls).items():
            if (typing.get_origin(hint) or hint) in (dict, list, set, deque):
                out.add(name)
    return out


def foreign_mutations(tree: ast.Module, fields: set[str]) -> list[tuple[int, str]]:
    """(line, call) of every mutating call `B.FIELD.m(...)` on one of `fields` whose base B is not self."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
            held = node.func.value
            if (
                isinstance(held, ast.Attribute)
                and held.attr in fields
                and not (isinstance(held.value, ast.Name) and held.value.id in OWN)
            ):
                found.append((node.lineno, ast.unparse(node.func)))
    return found


def test_no_module_changes_the_run_state_containers_of_another():
    fields = _container_fields()
    assert {"outstanding", "mixtures", "requests", "dropped_arms", "rejected"} <= fields
    offenders = []
    for path in sorted((ROOT / "proxy").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        for line, call in foreign_mutations(ast.parse(path.read_text(encoding="utf-8")), fields):
            offenders.append(f"{rel}:{line}: {call}(...)")
    assert not offenders, "the run's state changed outside its owner's methods:\n" + "\n".join(offenders)


def test_the_container_check_can_fail():
    code = "seg.outstanding.append(x)\nself.ctx.rejected.add(p)\nself.requests.pop(1)\nctx.writer.append(e)\n"
    assert foreign_mutations(ast.parse(code), {"outstanding", "rejected", "requests"}) == [
        (1, "seg.outstanding.append"),
        (2, "self.ctx.rejected.add"),
    ]


CAUGHT = """
def handler(ctx, seg, report, state):
    seg.last_step = 4
    seg.ckpt_pending, seg.ckpt_pending_step = True, 4
    report.tokens += 10
    report.engine.alive = False
    ctx.report.message: str = "x"
    seg.mixtures[3] = None
    del seg.mixtures[3]
    for seg.last_step in range(3):
        pass
    setattr(state, "step", 1)
    local = ctx.report
    local.status = "stopped"
    copy = make()
    copy = ctx.report
    copy.status = "stopped"

class Supervisor:
    def loop(self):
        self.ctx.report.engine.alive = False
        self.segment.hung = True
        made = Thing()
        made.part.x = 1

def outer():
    made = Thing()
    def inner(made):
        made.x = 1
"""
PASSED = """
class Report:
    def set_status(self, status):
        self.status = status
        self.counts[status] = 1
        (self.a, self.b), self.c = (1, 2), 3

    @classmethod
    def load(cls):
        index = cls()
        index.steps[4] = (0, 0)
        return index

def judge():
    verdict = Verdict()
    verdict.status = "passed"
    merged = definition.model_copy(deep=True)
    merged.arms["a"] = arm
    out = {}
    out["x"] = 1
    def inner():
        verdict.detail = "closure over a made object"
"""


def test_the_check_can_fail():
    assert [text for _line, text in foreign_assignments(ast.parse(CAUGHT))] == [
        "seg.last_step",
        "seg.ckpt_pending",
        "seg.ckpt_pending_step",
        "report.tokens",
        "report.engine.alive",
        "ctx.report.message",
        "seg.mixtures[3]",
        "seg.mixtures[3]",
        "seg.last_step",
        "state.?",
        "local.status",
        "copy.status",
        "self.ctx.report.engine.alive",
        "self.segment.hung",
        "made.part.x",
        "made.x",
    ]
    assert foreign_assignments(ast.parse(PASSED)) == []

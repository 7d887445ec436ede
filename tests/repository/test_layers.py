"""Layers that only look down: each part of proxy/ imports only the parts declared below it, and proxy/
imports nothing of dashboard/ (the layer above it, which reads run directories through the proxy's modules).

The imports are read with `ast`, every one of them: at the top of a module, inside a function (a lazy
import), relative or absolute. A string handed to importlib is no import; proxy/cli.py's dispatch to
proxy/commands/ is the one such, and it looks down too.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROXY = ROOT / "proxy"

# proxy's parts, lowest first: a subpackage by its name, a top-level module by its name. A module may import
# its own part and any part before it in this list, nothing after it.
LAYERS = (
    "errors",
    "stop_signals",
    "safe_fs",
    "temp_names",
    "atomic",
    "processes",
    "gpu_identity",  # the shared leaves
    "run_names",
    "divergence",
    "dashboard_address",  # rules written once: file names and caps, sane losses
    "formats",  # on-disk and wire formats
    "config",  # what a user writes
    "bandit",
    "arguments",  # the command line (rundir/lock_holder.py reads one the proxy's way)
    "data",
    "rundir",
    "qualification_checks",
    "qualification_compare",
    "qualification",
    "qualification_fp8",  # train.precision fp8 on the CUDA engine: its own check
    "supervision",
    "tracking",  # follows the run's records off the training path (commands/run.py starts it)
    "commands",
    "cli",
    "__main__",
    "__init__",
)


def part_of(module: tuple[str, ...]) -> str:
    """The layer of a module given as its dotted parts after `proxy` (("rundir", "layout") -> "rundir")."""
    return module[0] if module else "__init__"


def imported_modules(path: Path, top: Path) -> list[tuple[str, ...]]:
    """Every module `path` (under the package directory `top`) imports, as its full dotted parts (a relative
    import resolved)."""
    package = path.relative_to(top.parent).with_suffix("").parts[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [tuple(alias.name.split(".")) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else ()
            target = base + tuple(node.module.split(".")) if node.module else base
            if node.module is None:  # `from . import x`: x may be a module of the package
                found += [target + (alias.name,) for alias in node.names]
            else:
                found.append(target)
    return found


def violations(top: Path = PROXY) -> list[str]:
    found = []
    for path in sorted(top.rglob("*.py")):
        name = path.relative_to(top.parent)
        own = part_of(path.relative_to(top).with_suffix("").parts)
        assert own in LAYERS, f"{name}: its part {own!r} is not in LAYERS (declare where it sits)"
        for module in imported_modules(path, top):
            where = f"{name} imports {'.'.join(module)}"
            if module[0] == "dashboard":
                found.append(f"{where}: proxy/ never imports dashboard/")
            elif module[0] == "proxy":
                target = part_of(module[1:])
                if target not in LAYERS:
                    found.append(f"{where}: {target!r} is not in LAYERS")
                elif LAYERS.index(target) > LAYERS.index(own):
                    found.append(f"{where}: {target} sits above {own}")
    return found


def test_proxy_imports_only_downward():
    assert len(list(PROXY.rglob("*.py"))) > 50, "the scan found too few modules to mean anything"
    found = violations()
    assert not found, "imports that look up:\n" + "\n".join(found)


def test_the_scan_catches_an_upward_import(tmp_path: Path):
    """The reader resolves relative imports, lazy ones included: a planted `from ..rundir import` inside a
    function of formats/ is seen as formats importing rundir, and `import dashboard.server` as dashboard."""
    top = tmp_path / "proxy"
    (top / "formats").mkdir(parents=True)
    (top / "formats" / "checkpoint.py").write_text(
        "from ..run_names import checkpoint_name\nfrom . import bounded_json\n"
    )
    planted = top / "formats" / "planted_for_the_test.py"
    planted.write_text("def f():\n    from ..rundir.layout import STATE\n    import dashboard.server\n")
    found = violations(top)
    assert len(found) == 2, found  # the downward imports of checkpoint.py pass
    assert any("planted_for_the_test.py imports proxy.rundir.layout: rundir sits above formats" in f for f in found)
    assert any("planted_for_the_test.py imports dashboard.server: proxy/ never imports dashboard/" in f for f in found)

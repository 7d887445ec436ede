"""Each engine's table names every slot: microgpt/engine.h's MgEngineOps, declared once per engine with
designated initialisers, so that grep finds who implements a slot (docs/ENGINE.md, "Source layout").

Nothing here runs the engine: the sources are read as text."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ENGINE = Path(__file__).resolve().parents[2] / "microgpt"
ENGINES = {"microgpt_cpu.c": ("cpu_ops", "cpu_"), "microgpt_cuda.cu": ("gpu_ops", "gpu_")}


def _source(name: str) -> str:
    return re.sub(r"//[^\n]*", "", (ENGINE / name).read_text(encoding="utf-8"))


def slots() -> list[str]:
    """The function slots of MgEngineOps, in declaration order."""
    m = re.search(r"typedef\s+struct\s*\{(.*?)\}\s*MgEngineOps\s*;", _source("engine.h"), re.DOTALL)
    assert m, "no MgEngineOps in microgpt/engine.h"
    names = re.findall(r"\(\s*\*\s*(\w+)\s*\)\s*\(", m.group(1))
    assert names, "MgEngineOps has no function slots"
    return names


def table(source: str, name: str) -> list[tuple[str, str]]:
    """The `.slot = value` pairs of `static const MgEngineOps name = {...};`, in order."""
    m = re.search(rf"static\s+const\s+MgEngineOps\s+{name}\s*=\s*\{{(.*?)\}};", source, re.DOTALL)
    assert m, f"no `static const MgEngineOps {name}` table"
    return re.findall(r"\.(\w+)\s*=\s*(\w+)", m.group(1))


@pytest.mark.parametrize("file", sorted(ENGINES))
def test_the_table_names_every_slot_in_order(file: str):
    ops, prefix = ENGINES[file]
    source = _source(file)
    pairs = table(source, ops)
    # Every slot, once, in the struct's order (C++ requires the order; C readers expect it).
    assert [slot for slot, _ in pairs] == slots()
    for slot, value in pairs:
        # A slot is empty or the engine's function of the same name, defined in this file.
        assert value == "NULL" or value == prefix + slot, (file, slot, value)
        if value != "NULL":
            assert re.search(rf"^static\s[^;{{]*\b{value}\(", source, re.MULTILINE), f"{file} defines no {value}"


@pytest.mark.parametrize("file", sorted(ENGINES))
def test_the_table_is_fixed_at_build_time(file: str):
    """Options change flags (MgEngineCaps), never a slot: no slot is assigned at run time, nothing is pasted."""
    source = _source(file)
    for slot in slots():
        assert not re.search(rf"(->|\.)ops\s*->\s*{slot}\s*=[^=]", source), (file, slot)
        assert not re.search(rf"eng\s*->\s*{slot}\s*=[^=]", source), (file, slot)
    for header in ("train.h", "engine.h", file):
        assert "##" not in _source(header), f"token pasting in microgpt/{header}"


def test_the_parsers_can_fail():
    assert "forward_backward" in slots() and "kv_forward" in slots()
    with pytest.raises(AssertionError):
        table(_source("microgpt_cpu.c"), "no_such_ops")
    pairs = table("static const MgEngineOps x = {\n .init = a_init,\n .update = NULL,\n};", "x")
    assert pairs == [("init", "a_init"), ("update", "NULL")]

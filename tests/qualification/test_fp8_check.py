"""The CUDA engine's FP8 check (proxy/qualification_fp8.py), with the fake engine (fake_engine.py) playing
the CUDA engine: FP8 whose losses stay within the bound of bf16's is used; one whose gap is too large, or
an engine build without FP8, falls back to bf16 with one line; the CPU engine uses FP8 unchecked, and
`auto` adds no flag."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from proxy.formats.engine_cli import PRECISION_FLAGS
from proxy.qualification_fp8 import FP8_LOSS_BOUND, precision_flags

from .test_qualification import MODEL, SETTINGS

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


@pytest.fixture
def fake(tmp_path, monkeypatch) -> Path:
    exe = tmp_path / "bin" / "microgpt_cuda"
    exe.parent.mkdir()
    exe.write_text(
        f"#!{sys.executable}\nimport runpy, sys\nsys.path.insert(0, {str(REPO)!r})\n"
        f"runpy.run_path({str(HERE / 'fake_engine.py')!r}, run_name='__main__')\n"
    )
    exe.chmod(0o755)
    for name in ("FAKE_LOG", "FAKE_BREAK", "FAKE_AVAILABLE", "FAKE_FP8"):
        monkeypatch.delenv(name, raising=False)
    return exe


def choose(exe: Path, kind: str = "cuda", precision: str = "fp8") -> tuple[list[str], list[str], list[str]]:
    said: list[str] = []
    warned: list[str] = []
    flags = precision_flags(precision, kind, exe, SETTINGS, MODEL, said.append, warned.append)
    return flags, said, warned


def test_fp8_within_the_bound_is_used(fake, monkeypatch):
    monkeypatch.setenv("FAKE_FP8", f"gap:{FP8_LOSS_BOUND / 2}")
    flags, said, warned = choose(fake)
    assert flags == list(PRECISION_FLAGS["fp8"]) == ["--precision", "fp8"]
    assert not warned and said[-1].startswith("precision: fp8 (loss within 0.005")


@pytest.mark.parametrize(
    ("fake_fp8", "why"),
    [
        (f"gap:{FP8_LOSS_BOUND * 3}", "loss off by 0.03 of bf16's within 12 steps (bound 0.01)"),
        (f"gap:{-FP8_LOSS_BOUND * 2}", "loss off by 0.02 of bf16's"),
        ("ignored", "the engine ran bf16, not fp8"),
        ("missing", "the fp8 check failed (exit 2: microgpt: error: --precision fp8 is not built"),
    ],
)
def test_fp8_failing_its_check_falls_back_to_bf16_with_one_line(fake, monkeypatch, fake_fp8, why):
    monkeypatch.setenv("FAKE_FP8", fake_fp8)
    flags, _, warned = choose(fake)
    assert flags == []
    assert len(warned) == 1 and warned[0].startswith("train.precision fp8 failed its check: "), warned
    assert why in warned[0] and warned[0].endswith("; training in bf16"), warned[0]


def test_the_bf16_check_crashing_means_bf16(fake):
    fake.write_text("#!/bin/sh\necho 'microgpt: error: no CUDA device' >&2\nexit 2\n")
    flags, _, warned = choose(fake)
    assert flags == [] and warned == [
        "train.precision fp8 failed its check: the bf16 check failed (exit 2: microgpt: error: no CUDA device); "
        "training in bf16"
    ]


def test_cpu_engine_and_auto_take_no_check(tmp_path):
    missing = tmp_path / "no-engine"  # never started: neither case runs a check
    assert choose(missing, kind="cpu")[0] == ["--precision", "fp8"]
    assert choose(missing, kind="cuda", precision="auto") == ([], [], [])
    assert choose(missing, kind="cpu", precision="auto") == ([], [], [])

"""Qualification of the CUDA engine's fast paths (proxy/qualification.py), on the CPU side: a fake
engine (fake_engine.py) plays the CUDA engine's part in the checks, with paths that pass, fail their
tolerances, crash, hang, are not in the build, or differ between two runs; the verdict is cached per
(GPU, build, shape); a run records its choice and a relaunch keeps it."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from proxy import qualification as qual
from proxy.formats.qualification_record import read_qualification
from proxy.rundir.layout import RunDir

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
MODEL = {"vocab": 64, "ctx": 16, "dim": 16, "layers": 2, "heads": 2, "batch": 2, "grad_accum": 1}
SETTINGS = ["--vocab", "64", "--ctx", "16", "--dim", "16", "--layers", "2", "--heads", "2", "--batch", "2",
            "--grad-accum", "1", "--steps", "100", "--lr", "0.001"]
ALL_FAST = ["--attention", "cudnn", "--fused", "on", "--cuda-graph", "on"]


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """An executable fake engine, a log of its invocations, and a clean environment for it."""
    exe = tmp_path / "bin" / "microgpt_cuda"
    exe.parent.mkdir()
    exe.write_text(f"#!{sys.executable}\nimport runpy, sys\nsys.path.insert(0, {str(REPO)!r})\n"
                   f"runpy.run_path({str(HERE / 'fake_engine.py')!r}, run_name='__main__')\n")
    exe.chmod(0o755)
    log = tmp_path / "invocations.log"
    monkeypatch.setenv("FAKE_LOG", str(log))
    monkeypatch.delenv("FAKE_BREAK", raising=False)
    monkeypatch.delenv("FAKE_AVAILABLE", raising=False)
    return exe, log


def invocations(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def qualify(exe: Path, cache: Path, lines: list[str], **kw):
    return qual.qualify(exe, SETTINGS, MODEL, cache, lines.append, **kw)


def statuses(q) -> dict[str, str]:
    return {v.path: v.status for v in q.verdicts}


def test_every_fast_path_passes(fake, tmp_path):
    exe, log = fake
    lines: list[str] = []
    q = qualify(exe, tmp_path / "cache", lines)
    assert q.flags == ALL_FAST
    assert statuses(q) == {"attention cudnn": "passed", "fused kernels": "passed", "CUDA graph": "passed",
                           "all chosen paths": "passed"}
    assert all(v.bitwise for v in q.verdicts)
    # flash is not checked once cudnn passed; each fast path runs twice, the verified path once
    assert len(invocations(log)) == 1 + 2 * 4
    assert q.device == "Fake GPU (sm_90, 132 SMs, 79.6 GiB)" and q.shape["precision"] == "bf16"
    assert qual.failure_lines(q) == []


def test_a_path_out_of_tolerance_is_not_used(fake, tmp_path, monkeypatch):
    exe, _ = fake
    monkeypatch.setenv("FAKE_BREAK", "cudnn:grads")
    q = qualify(exe, tmp_path / "cache", [])
    assert statuses(q)["attention cudnn"] == "failed"
    assert statuses(q)["attention flash"] == "passed"
    assert q.flags == ["--attention", "flash", "--fused", "on", "--cuda-graph", "on"]
    (line,) = qual.failure_lines(q)
    assert line.startswith("fast path attention cudnn failed its check on Fake GPU")
    assert "gradient of wte at cosine" in line and "minimum 0.99" in line


def test_a_loss_off_by_more_than_the_tolerance(fake, tmp_path, monkeypatch):
    exe, _ = fake
    monkeypatch.setenv("FAKE_BREAK", "fused:loss")
    q = qualify(exe, tmp_path / "cache", [])
    assert statuses(q)["fused kernels"] == "failed"
    assert "CUDA graph" not in statuses(q)  # it needs the fused kernels
    assert q.flags == ["--attention", "cudnn", "--fused", "off", "--cuda-graph", "off"]
    (line,) = qual.failure_lines(q)
    assert "fused kernels" in line and "off by 0.1" in line and "tolerance 0.02" in line


@pytest.mark.parametrize("how, says", [("crash", "signal 11"), ("exit", "exit 5: microgpt: error: CUDA error")])
def test_a_path_whose_check_crashes(fake, tmp_path, monkeypatch, how, says):
    exe, _ = fake
    monkeypatch.setenv("FAKE_BREAK", f"flash:{how}")
    monkeypatch.setenv("FAKE_AVAILABLE", "flash,fused,graph")  # a build without cuDNN
    q = qualify(exe, tmp_path / "cache", [])
    assert statuses(q)["attention cudnn"] == "unavailable"
    assert statuses(q)["attention flash"] == "crashed"
    assert q.flags == ["--attention", "naive", "--fused", "on", "--cuda-graph", "on"]
    (line,) = qual.failure_lines(q)
    assert "attention flash" in line and says in line


def test_a_hung_check_is_killed(fake, tmp_path, monkeypatch):
    exe, _ = fake
    monkeypatch.setenv("FAKE_BREAK", "graph:hang")

    def runner(binary, settings, flags, model, workdir):  # a short limit for the path that hangs
        hangs = flags[flags.index("--cuda-graph") + 1] == "on"
        return qual.run_check(binary, settings, flags, model, workdir, timeout=3.0 if hangs else qual.CHECK_TIMEOUT_S)

    q = qualify(exe, tmp_path / "cache", [], runner=runner)
    assert statuses(q)["CUDA graph"] == "crashed"
    assert "no gradients within 3 s (killed)" in qual.failure_lines(q)[0]
    assert q.flags == ["--attention", "cudnn", "--fused", "on", "--cuda-graph", "off"]


def test_two_runs_must_be_bitwise_equal(fake, tmp_path, monkeypatch):
    exe, _ = fake
    monkeypatch.setenv("FAKE_BREAK", "fused:nondet")
    q = qualify(exe, tmp_path / "cache", [])
    fused = next(v for v in q.verdicts if v.path == "fused kernels")
    assert fused.status == "failed" and fused.bitwise is False and "two runs differ" in fused.detail
    assert fused.min_cosine > 0.99  # within tolerance: only the repeat failed it


def test_paths_that_pass_alone_but_not_together(fake, tmp_path, monkeypatch):
    exe, _ = fake
    monkeypatch.setenv("FAKE_BREAK", "together:loss")
    q = qualify(exe, tmp_path / "cache", [])
    assert statuses(q)["all chosen paths"] == "failed"
    assert q.flags == qual.VERIFIED_FLAGS


def test_the_verdict_is_cached_per_gpu_build_and_shape(fake, tmp_path, monkeypatch):
    exe, log = fake
    cache = tmp_path / "cache"
    first = qualify(exe, cache, [])
    n = len(invocations(log))
    lines: list[str] = []
    monkeypatch.setenv("FAKE_BREAK", "cudnn:grads")  # would fail now: the cache is what answers
    again = qualify(exe, cache, lines)
    assert again.flags == first.flags
    assert len(invocations(log)) == n + 1  # only the verified check, which names the GPU
    assert any("checked on this GPU, build and shape before" in line for line in lines)
    # another shape is checked afresh
    other = dict(MODEL, batch=3)
    qual.qualify(exe, [*SETTINGS[:-6], "--batch", "3", *SETTINGS[-4:]], other, cache, [].append)
    assert len(invocations(log)) > n + 2


def test_a_run_records_its_choice_and_a_resume_keeps_it(fake, tmp_path, monkeypatch):
    exe, log = fake
    run = RunDir(tmp_path / "run")
    run.create()
    said, warned = [], []
    flags = qual.run_engine_paths(run, exe, SETTINGS, MODEL, tmp_path / "cache", said.append, warned.append)
    assert flags == ALL_FAST and not warned
    record = read_qualification(run.qualification, within=run.root)
    assert record.flags == ALL_FAST
    n = len(invocations(log))
    # The relaunch: the cache is gone and cuDNN would now fail; the record decides, nothing runs.
    for f in (tmp_path / "cache").rglob("*.json"):
        f.unlink()
    monkeypatch.setenv("FAKE_BREAK", "cudnn:grads")
    again = qual.run_engine_paths(run, exe, SETTINGS, MODEL, tmp_path / "cache", said.append, warned.append)
    assert again == ALL_FAST and len(invocations(log)) == n and not warned
    assert any(".qualification.json" in line for line in said)


def test_a_new_build_is_checked_again(fake, tmp_path, monkeypatch):
    exe, log = fake
    run = RunDir(tmp_path / "run")
    run.create()
    qual.run_engine_paths(run, exe, SETTINGS, MODEL, tmp_path / "cache", [].append, [].append)
    exe.write_text(exe.read_text() + "# rebuilt\n")
    monkeypatch.setenv("FAKE_BREAK", "cudnn:grads")
    warned: list[str] = []
    flags = qual.run_engine_paths(run, exe, SETTINGS, MODEL, tmp_path / "cache", [].append, warned.append)
    assert flags[:2] == ["--attention", "flash"]
    assert any("engine build changed" in w for w in warned)
    assert any("attention cudnn failed its check" in w for w in warned)


@pytest.mark.parametrize("content", [b"{not json", b'{"version": 1}', b"x" * (70 << 10)])
def test_a_damaged_record_is_checked_again(fake, tmp_path, content):
    exe, _ = fake
    run = RunDir(tmp_path / "run")
    run.create()
    run.qualification.write_bytes(content)
    warned: list[str] = []
    flags = qual.run_engine_paths(run, exe, SETTINGS, MODEL, tmp_path / "cache", [].append, warned.append)
    assert flags == ALL_FAST
    assert len(warned) == 1 and ".qualification.json" in warned[0] and "\n" not in warned[0]
    assert json.loads(run.qualification.read_text())["flags"] == ALL_FAST


def test_the_verified_path_crashing_means_the_verified_path(fake, tmp_path, monkeypatch):
    exe, _ = fake
    exe.write_text("#!/bin/sh\necho 'microgpt: error: no CUDA device' >&2\nexit 2\n")
    lines: list[str] = []
    q = qualify(exe, tmp_path / "cache", lines)
    assert q.flags == qual.VERIFIED_FLAGS
    assert "exit 2: microgpt: error: no CUDA device" in lines[0]

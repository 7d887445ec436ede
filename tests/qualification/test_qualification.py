"""Qualification of the CUDA engine's fast paths (proxy/qualification.py), on the CPU side: a fake
engine (fake_engine.py) plays the CUDA engine's part in the checks, with paths that pass, or fail in each
way a path can be wrong (a gradient scale, a learning rate off or stale, a step not applied, other
sampled tokens, other checkpoint bytes, a crash, a hang, two runs that differ); the verdict is cached per
environment; a run records its verdict and a relaunch keeps it; and no planted record puts anything on the
engine's command line but the flag table's flags for paths that passed."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from proxy import qualification as qual
from proxy.formats.engine_cli import PATH_SWITCHES, VERIFIED_FLAGS, FastPath, path_flags
from proxy.formats.qualification_record import Verdict, read_qualification
from proxy.gpu_identity import GpuIdentity, GpuIdentityError
from proxy.qualification_compare import MOMENT_RTOL, UPDATE_RTOL
from proxy.rundir.layout import RunDir
from proxy.safe_fs import file_sha256

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
MODEL = {"vocab": 64, "ctx": 16, "dim": 16, "layers": 2, "heads": 2, "batch": 2, "grad_accum": 1}
SETTINGS = [
    "--vocab",
    "64",
    "--ctx",
    "16",
    "--dim",
    "16",
    "--layers",
    "2",
    "--heads",
    "2",
    "--batch",
    "2",
    "--grad-accum",
    "1",
    "--steps",
    "100",
    "--lr",
    "0.001",
    "--min-lr",
    "0.0001",
    "--warmup",
    "10",
    "--beta1",
    "0.9",
    "--beta2",
    "0.95",
    "--eps",
    "1e-08",
    "--weight-decay",
    "0.1",
    "--grad-clip",
    "1.0",
    "--seed",
    "1337",
]
ALL_FAST = ["--attention", "cudnn", "--fused", "on", "--cuda-graph", "on"]
GPU = GpuIdentity("Fake GPU", "999.01")
# The check's processes when every path passes: the verified run, two of cuDNN, fused and the graph,
# one of the KV cache and one of the snapshot, two of everything together.
ALL_PASS_PROCESSES = 1 + 2 * 3 + 1 + 1 + 2


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """An executable fake engine, a log of its invocations, a fake GPU identity and a clean environment."""
    exe = tmp_path / "bin" / "microgpt_cuda"
    exe.parent.mkdir()
    exe.write_text(
        f"#!{sys.executable}\nimport runpy, sys\nsys.path.insert(0, {str(REPO)!r})\n"
        f"runpy.run_path({str(HERE / 'fake_engine.py')!r}, run_name='__main__')\n"
    )
    exe.chmod(0o755)
    log = tmp_path / "invocations.log"
    monkeypatch.setenv("FAKE_LOG", str(log))
    monkeypatch.delenv("FAKE_BREAK", raising=False)
    monkeypatch.delenv("FAKE_AVAILABLE", raising=False)
    monkeypatch.setattr(qual, "read_gpu_identity", lambda: GPU)
    return exe, log


def invocations(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def qualify(exe: Path, cache: Path, lines: list[str] | None = None, **kw):
    return qual.qualify(exe, SETTINGS, MODEL, cache, (lines if lines is not None else []).append, **kw)


def verdicts(q) -> dict[str, str]:
    return {p.value: c.verdict.value for p, c in q.paths.items()}


def new_run(tmp_path: Path) -> RunDir:
    run = RunDir(tmp_path / "run")
    run.create()
    return run


def run_paths(run: RunDir, exe: Path, cache: Path, said: list | None = None, warned: list | None = None) -> list[str]:
    return qual.run_engine_paths(
        run,
        exe,
        SETTINGS,
        MODEL,
        cache,
        (said if said is not None else []).append,
        (warned if warned is not None else []).append,
    )


# ------------------------------------------------------------------ the flag table


def test_the_flag_table_is_the_only_source_of_path_flags():
    assert VERIFIED_FLAGS == [
        "--attention",
        "naive",
        "--fused",
        "off",
        "--cuda-graph",
        "off",
        "--sample-recompute",
        "--sync-snapshot",
    ]
    assert path_flags(list(FastPath)[:1] + list(FastPath)[2:]) == ALL_FAST
    assert path_flags([FastPath.KV_CACHE]) == VERIFIED_FLAGS[:6] + ["--sync-snapshot"]
    for bad in ([FastPath.ATTENTION_CUDNN, FastPath.ATTENTION_FLASH], [FastPath.CUDA_GRAPH]):
        with pytest.raises(ValueError):
            path_flags(bad)
    assert set(PATH_SWITCHES) == set(FastPath)


# ------------------------------------------------------------------ checks that pass


def test_every_fast_path_passes(fake, tmp_path):
    exe, log = fake
    lines: list[str] = []
    q = qualify(exe, tmp_path / "cache", lines)
    assert verdicts(q) == {
        "attention_cudnn": "passed",
        "fused": "passed",
        "cuda_graph": "passed",
        "kv_cache": "passed",
        "async_snapshot": "passed",
    }
    assert q.together is not None and q.together.verdict == Verdict.PASSED
    assert q.engine_flags() == ALL_FAST
    assert len(invocations(log)) == ALL_PASS_PROCESSES  # flash is not checked once cuDNN passed
    fused = q.paths[FastPath.FUSED].figures
    assert fused.bitwise and fused.loss_diff < 1e-3 and fused.m_rel < 1e-3 and fused.element_excess < 1
    assert q.paths[FastPath.KV_CACHE].figures.tokens_equal and q.paths[FastPath.ASYNC_SNAPSHOT].figures.bytes_equal
    assert q.environment.gpu == "Fake GPU" and q.environment.build == file_sha256(exe)[1]
    assert qual.failure_lines(q) == []
    assert any("checking the CUDA engine's fast paths on Fake GPU" in line for line in lines)


# ------------------------------------------------------------------ each way a path can be wrong

WRONG = {  # FAKE_BREAK: (the path whose check must fail, words its line must hold)
    "fused:scale": ("fused", "m of"),  # the update is scale-free: only the moments see it
    "cudnn:update": ("attention_cudnn", "update of"),
    "graph:stalelr": ("cuda_graph", "update of"),
    "fused:skip": ("fused", "off by"),
    "cudnn:grads": ("attention_cudnn", "wte"),
    "fused:loss": ("fused", "loss off by 0.1"),
    "fused:nondet": ("fused", "two runs differ"),
    "kv:tokens": ("kv_cache", "sampled tokens differ from the recompute path's"),
    "snapshot:bytes": ("async_snapshot", "checkpoint bytes differ from the synchronous writer's at step 6"),
}


@pytest.mark.parametrize("breaks", list(WRONG))
def test_a_wrong_path_is_detected_and_not_used(fake, tmp_path, monkeypatch, breaks):
    exe, _ = fake
    monkeypatch.setenv("FAKE_BREAK", breaks)
    path, words = WRONG[breaks]
    q = qualify(exe, tmp_path / "cache")
    assert verdicts(q)[path] == "failed"
    assert FastPath(path) not in q.chosen()
    line = next(line for line in qual.failure_lines(q) if f"fast path {path} " in line)
    assert words in line and "\n" not in line, line
    flags = q.engine_flags()
    assert flags == path_flags(q.chosen())
    if breaks == "fused:scale":  # what a cosine of the gradients or a weights-only check passes
        assert q.paths[FastPath.FUSED].figures.update_rel < UPDATE_RTOL
        assert q.paths[FastPath.FUSED].figures.m_rel > MOMENT_RTOL


def test_a_path_not_in_the_build_is_unavailable_and_the_next_is_tried(fake, tmp_path, monkeypatch):
    exe, _ = fake
    monkeypatch.setenv("FAKE_AVAILABLE", "flash,fused,graph")
    q = qualify(exe, tmp_path / "cache")
    assert verdicts(q)["attention_cudnn"] == "unavailable" and verdicts(q)["attention_flash"] == "passed"
    assert q.engine_flags() == ["--attention", "flash", "--fused", "on", "--cuda-graph", "on"]
    assert qual.failure_lines(q) == []


@pytest.mark.parametrize("how, says", [("crash", "signal 11"), ("exit", "exit 5: microgpt: error: CUDA error")])
def test_a_path_whose_check_crashes_runs_once(fake, tmp_path, monkeypatch, how, says):
    exe, log = fake
    monkeypatch.setenv("FAKE_BREAK", f"flash:{how}")
    monkeypatch.setenv("FAKE_AVAILABLE", "flash,fused,graph")  # a build without cuDNN
    q = qualify(exe, tmp_path / "cache")
    assert verdicts(q)["attention_flash"] == "crashed"
    assert sum(" flash " in line for line in invocations(log)) == 1
    assert q.engine_flags() == ALL_FAST[:1] + ["naive"] + ALL_FAST[2:]
    (line,) = qual.failure_lines(q)
    assert "attention_flash" in line and says in line


def test_a_hung_check_is_killed_within_its_limit_once(fake, tmp_path, monkeypatch):
    exe, log = fake
    monkeypatch.setenv("FAKE_BREAK", "graph:hang")
    limit = 15.0  # the fake's honest checks take a second or two on a busy 2-core machine
    started = time.monotonic()
    q = qualify(exe, tmp_path / "cache", timeout=limit)
    took = time.monotonic() - started
    assert verdicts(q)["cuda_graph"] == "crashed"
    assert "no result within 15 s (killed)" in q.paths[FastPath.CUDA_GRAPH].detail
    assert sum("graph=True" in line for line in invocations(log)) == 1  # not run a second time
    assert took < 2 * limit  # the hung check cost one limit, not two
    assert q.engine_flags() == ["--attention", "cudnn", "--fused", "on", "--cuda-graph", "off"]
    assert qual.CHECK_TIMEOUT_S == 120.0


def test_paths_that_pass_alone_but_not_together(fake, tmp_path, monkeypatch):
    exe, _ = fake
    monkeypatch.setenv("FAKE_BREAK", "together:loss")
    q = qualify(exe, tmp_path / "cache")
    assert q.together.verdict == Verdict.FAILED
    assert q.chosen() == [] and q.engine_flags() == VERIFIED_FLAGS
    assert any("failed together" in line for line in qual.failure_lines(q))


def test_the_verified_path_crashing_means_the_verified_path(fake, tmp_path):
    exe, _ = fake
    exe.write_text("#!/bin/sh\necho 'microgpt: error: no CUDA device' >&2\nexit 2\n")
    lines: list[str] = []
    assert qualify(exe, tmp_path / "cache", lines) is None
    assert "exit 2: microgpt: error: no CUDA device" in lines[-1]
    run = new_run(tmp_path)
    assert run_paths(run, exe, tmp_path / "cache") == VERIFIED_FLAGS
    assert not run.qualification.exists()


def test_an_engine_on_another_gpu_than_nvml_names_qualifies_nothing(fake, tmp_path, monkeypatch):
    exe, log = fake
    monkeypatch.setattr(qual, "read_gpu_identity", lambda: GpuIdentity("Other GPU", "999.01"))
    lines: list[str] = []
    assert qualify(exe, tmp_path / "cache", lines) is None
    assert len(invocations(log)) == 1 and "not on 'Other GPU'" in lines[-1]


def test_no_gpu_identity_means_the_verified_path(fake, tmp_path, monkeypatch):
    exe, log = fake

    def unreadable():
        raise GpuIdentityError("cannot load libnvidia-ml.so.1 (not found)")

    monkeypatch.setattr(qual, "read_gpu_identity", unreadable)
    run = new_run(tmp_path)
    warned: list[str] = []
    assert run_paths(run, exe, tmp_path / "cache", warned=warned) == VERIFIED_FLAGS
    assert len(warned) == 1 and "libnvidia-ml.so.1" in warned[0]
    assert invocations(log) == [] and not run.qualification.exists()


# ------------------------------------------------------------------ the cache and the run's record


def test_the_verdict_is_cached_per_environment(fake, tmp_path, monkeypatch):
    exe, log = fake
    cache = tmp_path / "cache"
    first = qualify(exe, cache)
    n = len(invocations(log))
    lines: list[str] = []
    monkeypatch.setenv("FAKE_BREAK", "cudnn:update")  # would fail now: the cache is what answers
    again = qualify(exe, cache, lines)
    assert again == first and len(invocations(log)) == n  # no engine started at all
    assert any("checked on this GPU, driver, build, cuDNN and shape before" in line for line in lines)
    monkeypatch.setattr(qual, "read_gpu_identity", lambda: GpuIdentity("Fake GPU", "999.02"))  # a new driver
    newer = qualify(exe, cache)
    assert verdicts(newer)["attention_cudnn"] == "failed" and len(invocations(log)) > n


def test_a_run_records_its_verdict_and_a_resume_keeps_it(fake, tmp_path, monkeypatch):
    exe, log = fake
    run = new_run(tmp_path)
    said, warned = [], []
    assert run_paths(run, exe, tmp_path / "cache", said, warned) == ALL_FAST and not warned
    assert read_qualification(run.qualification, within=run.root).engine_flags() == ALL_FAST
    n = len(invocations(log))
    for f in (tmp_path / "cache").rglob("*.json"):  # the relaunch: no cache, cuDNN would fail now
        f.unlink()
    monkeypatch.setenv("FAKE_BREAK", "cudnn:update")
    assert run_paths(run, exe, tmp_path / "cache", said, warned) == ALL_FAST
    assert len(invocations(log)) == n and not warned
    assert any(".qualification.json" in line for line in said)


def test_a_new_build_is_checked_again(fake, tmp_path, monkeypatch):
    exe, _ = fake
    run = new_run(tmp_path)
    run_paths(run, exe, tmp_path / "cache")
    exe.write_text(exe.read_text() + "# rebuilt\n")
    monkeypatch.setenv("FAKE_BREAK", "cudnn:update")
    warned: list[str] = []
    flags = run_paths(run, exe, tmp_path / "cache", warned=warned)
    assert flags[:2] == ["--attention", "flash"]
    assert any("engine build changed" in w for w in warned)
    assert any("attention_cudnn failed its check" in w for w in warned)


@pytest.mark.parametrize("content", [b"{not json", b'{"version": 2}', b"x" * (70 << 10), b"[" * 100000])
def test_a_damaged_record_is_checked_again(fake, tmp_path, content):
    exe, _ = fake
    run = new_run(tmp_path)
    run.qualification.write_bytes(content)
    warned: list[str] = []
    assert run_paths(run, exe, tmp_path / "cache", warned=warned) == ALL_FAST
    assert len(warned) == 1 and ".qualification.json" in warned[0] and "\n" not in warned[0]
    assert read_qualification(run.qualification).engine_flags() == ALL_FAST

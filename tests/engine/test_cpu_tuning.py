"""The CPU engine gives the same bits whatever CPU the compiler tunes it for (docs/ENGINE.md,
"Determinism"). `-march=native` picks a vector width and which a*b+c to fuse by CPU model; were the
results to follow, a run (and the committed mixing summary, docs/bench/mixing-cpu.json) would reproduce
only on the CPU model it was made on. Built here from the same source with the tunings of other CPUs
(the instruction set stays this machine's, so every build runs here), the engine must train the same
losses and write the same checkpoint bytes.
"""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path

import pytest

from harness.data import make_shard
from harness.engine import parse_events, run_once
from harness.shape import standalone_args

from .conftest import cpu_only
from .test_resume import EVERY, MID, outcome

REPO = Path(__file__).resolve().parents[2]
TUNING = "the CPU engine's build flags"


def cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def tunings() -> dict[str, str]:
    """Name -> the Makefile's CPU_ARCH for one build."""
    out = {
        "native": "-march=native",
        "tuned for Zen 3": "-march=native -mtune=znver3",
        "tuned for Ice Lake server": "-march=native -mtune=icelake-server",
        "512-bit vectors preferred": "-march=native -mprefer-vector-width=512",
        "128-bit vectors preferred": "-march=native -mprefer-vector-width=128",
    }
    if {"avx2", "fma"} <= cpu_flags():  # an x86-64-v3 build runs here: the AVX2 kernels, no AVX-512
        out["x86-64-v3"] = "-march=x86-64-v3"
    return out


@cpu_only(TUNING)
@pytest.mark.skipif(platform.machine() != "x86_64", reason="the tunings compared are x86-64 CPUs'")
def test_cpu_tuning_does_not_change_results(tmp_path):
    builds = {}
    for name, arch in tunings().items():
        out = tmp_path / f"build{len(builds)}"
        builds[name] = (
            out / "microgpt_cpu",
            subprocess.Popen(
                ["make", "-s", "-C", str(REPO), "cpu", f"BUILD={out}", f"CPU_ARCH={arch}"],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            ),
        )
    for name, (_binary, make) in builds.items():
        log = make.communicate(timeout=600)[0].decode()
        assert make.returncode == 0, f"{name}: the build failed:\n{log}"

    shard = make_shard(tmp_path / "data.tok", MID.vocab, n_tokens=50_000)
    results = {}
    for name, (binary, _make) in builds.items():
        run = tmp_path / f"run{len(results)}"
        run.mkdir()
        res = run_once(binary, standalone_args(MID, shard, run / "ck", EVERY, "--threads", 2), cwd=run)
        assert res.returncode == 0, f"{name}: {res.stderr.decode()}"
        results[name] = (outcome(parse_events(res.stdout)), (run / "ck" / f"step_{MID.steps:06d}.bin").read_bytes())

    losses, final = results["native"]
    assert sorted(losses) == list(range(1, MID.steps + 1))
    for name, (got, got_final) in results.items():
        diff = {s: (got.get(s), losses[s]) for s in losses if got.get(s) != losses[s]}
        assert not diff, f"{name} vs native: losses differ from step {min(diff)}: {diff[min(diff)]}"
        assert got_final == final, f"{name} vs native: the final checkpoint bytes differ"

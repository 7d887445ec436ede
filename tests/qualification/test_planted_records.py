"""A planted `.qualification.json` or cached verdict puts nothing on the engine's command
line but the flag table's flags (engine_cli.PATH_SWITCHES) for paths that passed, and only where its
environment matches; and the GPU's identity is read through NVML's own calls (a fake libnvidia-ml.so.1
built here), without an engine."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from proxy import qualification as qual
from proxy.formats.engine_cli import PATH_SWITCHES, VERIFIED_FLAGS, FastPath
from proxy.formats.qualification_record import Check, Qualification, Verdict
from proxy.gpu_identity import cudnn_version
from proxy.safe_fs import file_sha256

from .test_qualification import ALL_FAST, GPU, MODEL, REPO, fake, new_run, run_paths  # noqa: F401

HERE = Path(__file__).resolve().parent
TINY = REPO / "experiments" / "TINY-TRAIN.json"
TABLE_WORDS = set(VERIFIED_FLAGS) | {w for entry in PATH_SWITCHES.values() for w in entry.fast}


def attack(build: str, elsewhere: Path) -> dict:
    """A forged record: the binary's real SHA-256 and flags that write outside the run."""
    return {
        "version": 1,
        "device": "Fake GPU",
        "build": build,
        "shape": {**MODEL, "precision": "bf16"},
        "flags": [
            "--attention",
            "naive",
            "--ckpt-dir",
            str(elsewhere),
            "--dump-logits",
            str(elsewhere / "precious.txt"),
        ],
        "verdicts": [],
        "loss_tolerance": 0.02,
        "cosine_min": 0.99,
        "created": 0.0,
    }


def forged(env, **paths: Verdict) -> dict:
    """A well-formed record for `env` whose paths (and their check together) say what `paths` says."""
    checks = {FastPath(p): Check(verdict=v, detail="forged") for p, v in paths.items()}
    return Qualification(
        environment=env, paths=checks, together=Check(verdict=Verdict.PASSED, detail="forged"), created=0.0
    ).model_dump(mode="json")


def assert_table_only(flags: list[str]) -> None:
    assert set(flags) <= TABLE_WORDS, flags


def environment_of(exe: Path):
    return qual.Environment(
        gpu=GPU.gpu, driver=GPU.driver, build=file_sha256(exe)[1], cudnn=cudnn_version(), shape=MODEL
    )


# ------------------------------------------------------------------ at the function that builds the flags


def variants(exe: Path, elsewhere: Path) -> dict[str, dict]:
    env = environment_of(exe)
    genuine = forged(env, attention_cudnn=Verdict.PASSED)
    return {
        "version 1 with flags": attack(env.build, elsewhere),
        "flags beside the verdicts": {**genuine, "flags": attack(env.build, elsewhere)["flags"]},
        "flags inside a check": {
            **genuine,
            "paths": {
                "attention_cudnn": {"verdict": "passed", "detail": "", "flags": ["--dump-logits", str(elsewhere / "x")]}
            },
        },
        "an unknown path": {**genuine, "paths": {"--ckpt-dir " + str(elsewhere): {"verdict": "passed", "detail": ""}}},
        "an unknown verdict": {**genuine, "paths": {"fused": {"verdict": "trust me", "detail": ""}}},
        "a forged build hash": forged(env.model_copy(update={"build": "0" * 64}), attention_cudnn=Verdict.PASSED),
        "a build that is no hash": {**genuine, "environment": {**genuine["environment"], "build": "--dump-logits"}},
    }


@pytest.mark.parametrize("where", ["run", "cache"])
@pytest.mark.parametrize(
    "variant",
    [
        "version 1 with flags",
        "flags beside the verdicts",
        "flags inside a check",
        "an unknown path",
        "an unknown verdict",
        "a forged build hash",
        "a build that is no hash",
    ],
)
def test_a_planted_record_is_refused_and_checked_again(fake, tmp_path, variant, where):
    exe, log = fake
    elsewhere = tmp_path / "elsewhere"
    run, cache = new_run(tmp_path), tmp_path / "cache"
    planted = run.qualification if where == "run" else qual.cache_path(cache, environment_of(exe))
    planted.parent.mkdir(parents=True, exist_ok=True)
    planted.write_text(json.dumps(variants(exe, elsewhere)[variant]))
    said, warned = [], []
    flags = run_paths(run, exe, cache, said, warned)
    assert flags == ALL_FAST  # what the checks found, not what the file said
    assert_table_only(flags)
    assert invocations_hold_no(log, str(elsewhere))
    lines = warned if where == "run" else said
    if variant != "a forged build hash":
        assert any("not a qualification record" in line and "\n" not in line for line in lines), lines
    else:
        assert any("engine build" in line for line in lines), lines


def invocations_hold_no(log: Path, text: str) -> bool:
    return text not in log.read_text()


@pytest.mark.parametrize("where", ["run", "cache"])
def test_a_matching_forged_verdict_gets_only_the_table_flags(fake, tmp_path, where):
    """A record that validates and matches this environment can only choose among the named paths."""
    exe, log = fake
    run, cache = new_run(tmp_path), tmp_path / "cache"
    planted = run.qualification if where == "run" else qual.cache_path(cache, environment_of(exe))
    planted.parent.mkdir(parents=True, exist_ok=True)
    everything = {p.value: Verdict.PASSED for p in FastPath}  # both attentions: no set the table can run
    planted.write_text(json.dumps(forged(environment_of(exe), **everything)))
    flags = run_paths(run, exe, cache)
    assert flags == VERIFIED_FLAGS
    if where == "run":
        assert not log.exists()  # the record answered: no check ran
    planted.write_text(json.dumps(forged(environment_of(exe), fused=Verdict.PASSED, cuda_graph=Verdict.PASSED)))
    if where == "cache":
        run.qualification.unlink()
    assert run_paths(run, exe, cache) == [
        "--attention",
        "naive",
        "--fused",
        "on",
        "--cuda-graph",
        "on",
        "--sample-recompute",
        "--sync-snapshot",
    ]


# ------------------------------------------------------------------ NVML, through its own calls


@pytest.fixture(scope="module")
def fake_nvml(tmp_path_factory) -> Path:
    """A directory holding a fake libnvidia-ml.so.1 (fake_nvml.c), for LD_LIBRARY_PATH."""
    out = tmp_path_factory.mktemp("nvml")
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-O1", "-o", str(out / "libnvidia-ml.so.1"), str(HERE / "fake_nvml.c")], check=True
    )
    return out


def identity_in_child(nvml: Path | None, **env) -> str:
    child_env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH")}
    child_env.update(env, PYTHONPATH=str(REPO))
    if nvml is not None:
        child_env["LD_LIBRARY_PATH"] = str(nvml)
    code = (
        "from proxy.gpu_identity import read_gpu_identity, GpuIdentityError\n"
        "try:\n    print(read_gpu_identity())\nexcept GpuIdentityError as e:\n    print('error:', e)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code], env=child_env, capture_output=True, text=True, check=True
    ).stdout.strip()


def test_the_gpu_identity_comes_from_nvml(fake_nvml):
    assert identity_in_child(fake_nvml) == "GpuIdentity(gpu='Fake GPU', driver='999.01')"
    assert "gpu='Fake GPU #2'" in identity_in_child(fake_nvml, CUDA_VISIBLE_DEVICES="2,0")
    assert "gpu='Fake GPU GPU-5a1c'" in identity_in_child(fake_nvml, CUDA_VISIBLE_DEVICES="GPU-5a1c")
    assert identity_in_child(fake_nvml, CUDA_VISIBLE_DEVICES="") == "error: CUDA_VISIBLE_DEVICES='' names no device"
    assert "error: NVML device 7 failed" in identity_in_child(fake_nvml, CUDA_VISIBLE_DEVICES="7")
    if not Path("/dev/nvidiactl").exists():  # a machine with a driver has the real library
        assert identity_in_child(None).startswith("error: cannot load libnvidia-ml.so.1")


# ------------------------------------------------------------------ through `proxy run --engine cuda`


def test_proxy_run_keeps_planted_flags_off_the_engine(fake_nvml, tmp_path):
    """The planted-record attack through the real command: a copy of the proxy whose build/microgpt_cuda logs its
    arguments and runs the CPU engine; NVML (the fake) names the CPU engine's device, so the whole
    qualification runs against a real engine. Both planted files are refused, nothing is written outside
    the run, and the engine's arguments hold only the table's path flags."""
    cpu = REPO / "build" / "microgpt_cpu"
    if not cpu.is_file():
        pytest.skip("build/microgpt_cpu is not built (make cpu)")
    repo = tmp_path / "repo"
    shutil.copytree(REPO / "proxy", repo / "proxy", ignore=shutil.ignore_patterns("__pycache__"))
    argv_log = tmp_path / "engine-argv.log"
    wrapper = repo / "build" / "microgpt_cuda"
    wrapper.parent.mkdir()
    wrapper.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$*\" >> '{argv_log}'\nexec '{cpu}' \"$@\"\n")
    wrapper.chmod(0o755)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "precious.txt").write_text("precious\n")
    exp = json.loads(TINY.read_text())
    exp["train"].update(max_steps=20, ckpt_every=10, eval_every=10, sample_every=10, threads=1, warmup=2)
    exp_path = tmp_path / "PLANTED.json"
    exp_path.write_text(json.dumps(exp))
    run_dir, cache = tmp_path / "run", tmp_path / "cache"
    run_dir.mkdir()
    build = file_sha256(wrapper)[1]
    (run_dir / ".qualification.json").write_text(json.dumps(attack(build, elsewhere)))
    shape = {k: int({**exp["model"], **exp["train"]}[k]) for k in qual.SHAPE_KEYS}
    env = qual.Environment(gpu="cpu", driver="999.01", build=build, cudnn=cudnn_version(), shape=shape)
    cached = qual.cache_path(cache, env)
    cached.parent.mkdir(parents=True)
    cached.write_text(json.dumps(attack(build, elsewhere)))
    child_env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    child_env.update(
        PYTHONPATH=str(repo),
        MICROGPT_CACHE=str(cache),
        LD_LIBRARY_PATH=str(fake_nvml),
        FAKE_NVML_NAME="cpu",
        PYTHONUNBUFFERED="1",
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "proxy",
            "run",
            str(exp_path),
            "--run-dir",
            str(run_dir),
            "--engine",
            "cuda",
            "--no-dashboard",
        ],
        cwd=tmp_path,
        env=child_env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(p.name for p in elsewhere.iterdir()) == ["precious.txt"]
    assert (elsewhere / "precious.txt").read_text() == "precious\n"
    assert (run_dir / "checkpoints" / "step_000020.bin").is_file()
    launches = argv_log.read_text().splitlines()
    assert launches and not any(str(elsewhere) in line or "--dump-logits" in line for line in launches)
    run_launch = [line for line in launches if str(run_dir / "checkpoints") in line]
    assert run_launch and all(line.endswith("--attention naive --fused off --cuda-graph off") for line in run_launch)
    assert "not a qualification record" in result.stderr  # the run's record, refused in one line
    assert "ignoring the cached verdict" in result.stdout + result.stderr
    record = json.loads((run_dir / ".qualification.json").read_text())
    assert record["version"] == 2 and "flags" not in record
    assert {p: c["verdict"] for p, c in record["paths"].items()} == {
        "attention_cudnn": "unavailable",
        "attention_flash": "unavailable",
        "fused": "unavailable",
        "kv_cache": "passed",
        "async_snapshot": "passed",
    }

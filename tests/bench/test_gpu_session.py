"""scripts/gpu_session.sh without a GPU (docs/CUDA.md, "What a GPU lease runs"): the dry run of both
lease calls in the GPU image's Python environment, the refusal of a plan over its budget, the carried
cuDNN object's stamp refusing a mismatch in one line, and the import blocker the dry run relies on.

The dry run needs nvcc (it builds the engine) and ../shared/peers/llm.c (it carries llm.c); without
nvcc it is skipped. Its first run downloads the carried wheels (.whl/) and compiles
build/attention_cudnn.o; later runs reuse both."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_session.sh"
CARRY = [sys.executable, str(REPO / "scripts" / "cudnn_carry.py")]
LEASE_BUDGET = 540  # the seconds a lease call may take (the device tool's 600 s, less the transfers)

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc: the dry run builds the CUDA engine")


def session(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(SCRIPT), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )


# ---------------------------------------------------------------------------
# the dry run of each call


@needs_nvcc
@pytest.mark.xdist_group("gpu_session")  # one worker: both write .gpu-carry/ and .whl/ (prepare)
@pytest.mark.parametrize("plan", ["lease", "lease2"])
def test_dry_run_passes_within_the_lease_budget(plan, tmp_path):
    out = session("--dry-run", "--out", str(tmp_path), plan, timeout=900)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-4000:]
    banner = re.search(r"^== plan \(dry run\): (.*): (\d+) s of a (\d+) s budget ==$", text, re.M)
    assert banner, text[:2000]
    assert int(banner.group(2)) <= int(banner.group(3)) <= LEASE_BUDGET
    summary = text[text.index("== summary (dry run)") :]
    phases = re.findall(r"^(\S+)\s+(ok|FAILED.*?|TIMED OUT|skipped.*?)\s+\d+ s$", summary, re.M)
    planned = [p.split(" ")[0] for p in banner.group(1).split(", ") if not p.startswith("summary")]
    assert [name for name, _ in phases] == planned and all(status == "ok" for _, status in phases), summary
    # Every test the call runs was collected in the image's environment, none with an error.
    collected = re.findall(r"^(\d+) tests? collected", text, re.M)
    assert collected and all(int(n) > 0 for n in collected), text[-4000:]
    assert not re.search(r"errors? during collection|^ERROR ", text, re.M)
    assert "gpu_session: using the carried cuDNN object" in text
    assert "wheels installed: pydantic" in text
    bench = sorted(p.name for p in tmp_path.glob("bench-*.json"))
    assert bench == (["bench-124m.json", "bench-12m.json"] if plan == "lease" else ["bench-b32.json"])
    assert (tmp_path / "cuda-unknown.json").is_file() and (tmp_path / "summary.txt").is_file()
    if plan == "lease2":
        assert "llm.c's Makefile gets past its cuDNN check" in text
        # The link that gets it past is made where llm.c is built, and not left in the carried tree.
        assert not os.path.lexists(REPO / ".gpu-carry" / "llm.c" / "cudnn-frontend")


# ---------------------------------------------------------------------------
# the budget


@pytest.mark.parametrize(
    "args, says",
    [
        (["--budget", "300", "lease"], "the plan needs 540 s"),
        (["--budget", "500", "lease2"], "over the 500 s budget"),
        (["lease", "lease2"], "over the 540 s budget"),
        (["build", "test-e2e"], "the plan needs 800 s"),
        (["--budget", "600", "lease"], "--budget 600 is over 570 s"),
        (["--dry-run", "check"], "nothing to do for the check phase"),
        (["lease", "bogus"], "unknown phase or argument 'bogus'"),
    ],
)
def test_a_plan_over_its_budget_is_refused_in_one_line(args, says, tmp_path):
    out = session("--out", str(tmp_path / "out"), *args)
    assert out.returncode == 2 and out.stdout == "", out
    assert len(out.stderr.strip().splitlines()) == 1 and says in out.stderr, out.stderr
    assert not (tmp_path / "out").exists()  # refused before anything ran or was written


# ---------------------------------------------------------------------------
# the carried cuDNN object's stamp


def installed(dist: str) -> bool:
    try:
        metadata.version(dist)
        return True
    except metadata.PackageNotFoundError:
        return False


@pytest.mark.skipif(
    not (installed("nvidia-cudnn-cu13") and installed("nvidia-cudnn-frontend")),
    reason="no nvidia-cudnn-cu13 / nvidia-cudnn-frontend wheel (scripts/install_test_deps.sh)",
)
def test_the_stamp_refuses_a_mismatch_in_one_line(tmp_path):
    frontend = Path(str(metadata.distribution("nvidia-cudnn-frontend").locate_file("include")))
    obj, stamp = tmp_path / "attention_cudnn.o", tmp_path / "attention_cudnn.json"
    obj.write_bytes(b"an object file")
    assert subprocess.run([*CARRY, "write", str(obj), str(stamp)], timeout=60).returncode == 0
    ok = subprocess.run(
        [*CARRY, "check", str(obj), str(stamp), str(frontend)], capture_output=True, text=True, timeout=60
    )
    assert ok.returncode == 0 and ok.stdout == "", ok
    good = json.loads(stamp.read_text())
    here = metadata.version("nvidia-cudnn-cu13")

    def check_with(says: str, text: str | None = None, **changed) -> None:
        stamp.write_text(text if text is not None else json.dumps({**good, **changed}))
        out = subprocess.run(
            [*CARRY, "check", str(obj), str(stamp), str(frontend)], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 1 and len(out.stdout.strip().splitlines()) == 1 and says in out.stdout, out

    check_with(f"compiled against nvidia-cudnn-cu13 9.0.0.1, this machine has {here}", cudnn="9.0.0.1")
    check_with("compiled against cudnn-frontend 0.1.0", frontend="0.1.0")
    check_with("older than microgpt/cuda/attention_cudnn.*", sources_sha256="0" * 64)
    check_with("is not the object its stamp describes", object_sha256="0" * 64)
    check_with("not a cuDNN object stamp", text="{not json")
    check_with("not a cuDNN object stamp", text=json.dumps({"cudnn": here}))


# ---------------------------------------------------------------------------
# the GPU image's import surface


def test_the_blocker_refuses_what_the_image_lacks_unless_a_carried_wheel_brings_it(tmp_path):
    allow = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gpu_image.py"), "allow"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.strip()
    assert {"numpy", "torch", "pytest", "_pytest"} <= set(allow.split(",")) and "pydantic" not in allow.split(",")
    env = dict(os.environ, GPU_IMAGE_ALLOW=allow, PYTHONPATH=f"{REPO / 'scripts' / 'gpu_image_site'}:{REPO}")
    code = "import json, numpy, pytest, proxy.atomic\nimport pydantic"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "No module named 'pydantic' (the GPU image does not have it" in out.stderr
    # Without the carried wheels, the GPU tests do not even collect there (the failure the dry run
    # exists to catch before a lease).
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            str(REPO / "tests" / "gpu" / "test_fast_paths.py"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(env, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1"),
    )
    assert out.returncode != 0 and "error" in out.stdout and "No module named 'pydantic'" in out.stdout, out.stdout
    # A package in the carried wheels' target directory (not a site-packages directory) imports.
    site = tmp_path / "site"
    (site / "pydantic").mkdir(parents=True)
    (site / "pydantic" / "__init__.py").write_text("CARRIED = True\n")
    env["PYTHONPATH"] += f":{site}"
    out = subprocess.run(
        [sys.executable, "-c", "import pydantic; print(pydantic.CARRIED)"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr


@needs_nvcc
@pytest.mark.xdist_group("gpu_session")
@pytest.mark.skipif(
    not installed("nvidia-cudnn-cu13"), reason="no nvidia-cudnn-cu13 wheel (scripts/install_test_deps.sh)"
)
def test_the_build_refuses_the_carried_object_on_another_cudnn_in_one_line(tmp_path):
    # The GPU machine's nvidia-cudnn-cu13 is another version: a distribution record of that version,
    # first on PYTHONPATH, is what importlib.metadata (the stamp's check) finds there.
    prepared = session("--out", str(tmp_path / "prepare"), "prepare", timeout=600)
    assert prepared.returncode == 0, (prepared.stdout + prepared.stderr)[-3000:]
    fake = tmp_path / "image" / "nvidia_cudnn_cu13-9.0.0.1.dist-info"
    fake.mkdir(parents=True)
    (fake / "METADATA").write_text("Metadata-Version: 2.1\nName: nvidia-cudnn-cu13\nVersion: 9.0.0.1\n")
    out = subprocess.run(
        [str(SCRIPT), "--out", str(tmp_path / "build"), "build"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, PYTHONPATH=f"{fake.parent}:{REPO}"),
    )
    here = metadata.version("nvidia-cudnn-cu13")
    lines = [line for line in (out.stdout + out.stderr).splitlines() if "carried" in line]
    assert lines == [
        f"gpu_session: the carried cuDNN object was compiled against nvidia-cudnn-cu13 {here}, this "
        f"machine has 9.0.0.1: not using it (make compiles build/attention_cudnn.o here)"
    ], out.stdout
    assert out.returncode == 0, out.stdout[-3000:]  # the build goes on: make decides what to compile


def test_the_wheels_phase_installs_one_fitting_wheel_per_project(tmp_path):
    from packaging.tags import sys_tags

    here = next(iter(sys_tags()))  # this interpreter's most preferred tag
    names = [
        f"core-2.0-{here.interpreter}-{here.abi}-{here.platform}.whl",  # fits
        "core-2.0-cp399-cp399-manylinux_2_17_x86_64.whl",  # another Python's: left out
        "pure-1.0-py3-none-any.whl",
    ]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    cli = [sys.executable, str(REPO / "scripts" / "gpu_image.py"), "installable", str(tmp_path)]
    out = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and sorted(Path(p).name for p in out.stdout.split()) == sorted([names[0], names[2]])
    (tmp_path / "only-1.0-cp399-cp399-manylinux_2_17_x86_64.whl").write_bytes(b"")
    out = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "no wheel in" in out.stderr and ": only (" in out.stderr

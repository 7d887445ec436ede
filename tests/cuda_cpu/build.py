"""Builds the kernel checks of tests/cuda_cpu: the CUDA engine's kernels, from
their own source in microgpt/cuda/, compiled by the host compiler with the
CPU execution layer (cuda_on_cpu.h), in two variants:

  hazard  the kernel units with GCC's -fsanitize=thread instrumentation, whose
          hooks cuda_on_cpu.cpp implements (the ThreadSanitizer runtime is not
          linked): every load and store of kernel code feeds the shadow of
          shared and global memory that finds hazards.
  asan    everything with AddressSanitizer and UndefinedBehaviorSanitizer
          (-fno-sanitize-recover: the first report ends the run).

Each links the kernel units (kernels_*.cpp: the checks, including the op
headers), the runtime, the driver (cuda_cpu_check.cpp) and cpu_ops.c (the
CPU engine's ops from microgpt_cpu.c). No nvcc: only the host compilers
(CXX, default g++; CC, default gcc). Objects are rebuilt when a file they
include or their flags change.

    python tests/cuda_cpu/build.py [hazard] [asan]     # prints the binaries

The mutation check (test_mutations.py) builds a mutated copy of microgpt/
with source_root, reusing the unmutated support objects.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
BUILD = REPO / "build" / "cuda_cpu"

KERNEL_UNITS = ("kernels_ops", "kernels_attention", "kernels_flash")
SUPPORT_UNITS = ("cuda_on_cpu", "cuda_cpu_check")  # C++, independent of microgpt/cuda/
CPU_OPS = "cpu_ops"  # C: microgpt_cpu.c

CXXFLAGS = ["-std=c++17", "-O1", "-g1", "-fstrict-aliasing", "-Wall", "-Wno-unknown-pragmas"]
# As the engine is built (Makefile CFLAGS), so the ops are the engine's.
CFLAGS = ["-std=gnu11", "-O2", "-march=native", "-fopenmp", "-g1", "-w"]
SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all"]


class BuildError(RuntimeError):
    """A compile or link failed; the message holds the command and its output."""


@dataclass(frozen=True)
class Variant:
    kernel_flags: tuple[str, ...]
    support_flags: tuple[str, ...]
    c_flags: tuple[str, ...]
    link_flags: tuple[str, ...]


VARIANTS = {
    "hazard": Variant(
        kernel_flags=("-DCUDA_ON_CPU_HAZARDS", "-fsanitize=thread"),
        support_flags=("-DCUDA_ON_CPU_HAZARDS",),
        c_flags=(),
        link_flags=(),
    ),
    "asan": Variant(
        kernel_flags=tuple(SANITIZE), support_flags=tuple(SANITIZE), c_flags=tuple(SANITIZE), link_flags=tuple(SANITIZE)
    ),
}


def _compilers() -> tuple[str, str]:
    return os.environ.get("CXX", "g++"), os.environ.get("CUDA_CPU_CC", "gcc")


def _stale(target: Path, deps: list[Path], stamp: Path, command: list[str]) -> bool:
    """True when target must be rebuilt: missing, older than a dependency, or built by another command."""
    if (
        not target.exists()
        or not stamp.exists()
        or stamp.read_text() != hashlib.sha256("\0".join(command).encode()).hexdigest()
    ):
        return True
    t = target.stat().st_mtime
    return any(not d.exists() or d.stat().st_mtime > t for d in deps)


def _depfile_deps(depfile: Path) -> list[Path]:
    if not depfile.exists():
        return []
    text = depfile.read_text().replace("\\\n", " ")
    _, _, rest = text.partition(":")
    return [Path(p) for p in rest.split()]


def _run(command: list[str], cwd: Path) -> None:
    out = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    if out.returncode != 0:
        raise BuildError(f"{shlex.join(command)}\n{out.stdout}{out.stderr}")


def _compile(source: Path, obj: Path, command: list[str], cwd: Path) -> None:
    depfile, stamp = obj.with_suffix(".d"), obj.with_suffix(".cmd")
    full = [*command, "-MMD", "-MF", str(depfile), "-c", str(source), "-o", str(obj)]
    if not _stale(obj, [source, *_depfile_deps(depfile)], stamp, command):
        return
    obj.parent.mkdir(parents=True, exist_ok=True)
    _run(full, cwd)
    stamp.write_text(hashlib.sha256("\0".join(command).encode()).hexdigest())


@dataclass
class Plan:
    """What building one variant takes: its compiles, then its link."""

    compiles: list[tuple[Path, Path, list[str]]]  # (source, object, command)
    objects: list[Path]
    binary: Path
    link: list[str]
    cwd: Path


def plan(
    variant: str,
    *,
    source_root: Path = REPO,
    out: Path | None = None,
    kernel_units: tuple[str, ...] = KERNEL_UNITS,
    support_from: Path | None = None,
) -> Plan:
    """The build of one variant's check binary.

    source_root: the tree whose tests/cuda_cpu/ and microgpt/ are compiled.
    support_from: a build directory whose support objects (runtime, driver,
    CPU ops) to link instead of building them here.
    """
    v = VARIANTS[variant]
    cxx, cc = _compilers()
    src = source_root / "tests" / "cuda_cpu"
    out = out or BUILD / variant
    support = support_from or out
    compiles = [(src / f"{u}.cpp", out / f"{u}.o", [cxx, *CXXFLAGS, *v.kernel_flags]) for u in kernel_units]
    if support_from is None:
        compiles += [(src / f"{u}.cpp", out / f"{u}.o", [cxx, *CXXFLAGS, *v.support_flags]) for u in SUPPORT_UNITS]
        compiles.append((src / f"{CPU_OPS}.c", out / f"{CPU_OPS}.o", [cc, *CFLAGS, *v.c_flags]))
    objects = [out / f"{u}.o" for u in kernel_units]
    objects += [support / f"{u}.o" for u in SUPPORT_UNITS] + [support / f"{CPU_OPS}.o"]
    binary = out / "cuda_cpu_check"
    link = [cxx, "-no-pie", "-fopenmp", *v.link_flags, *map(str, objects), "-o", str(binary), "-lm"]
    return Plan(compiles, objects, binary, link, source_root)


def build_all(plans: list[Plan], jobs: int | None = None) -> list[Path]:
    """Carries out the plans (when out of date), every compile of every plan
    sharing one pool of jobs (default: the CPU count); returns the binaries."""
    with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 2) as pool:
        # The longest compiles first: the sanitizer builds of the kernel units.
        work = sorted(
            (c + (p.cwd,) for p in plans for c in p.compiles),
            key=lambda c: "-fsanitize=address,undefined" not in c[2] or "kernels_" not in c[0].name,
        )
        for f in [pool.submit(_compile, *w) for w in work]:
            f.result()
    for p in plans:
        stamp = p.binary.with_suffix(".link")  # (cuda_cpu_check.cmd is the driver object's)
        if _stale(p.binary, p.objects, stamp, p.link):
            _run(p.link, p.cwd)
            stamp.write_text(hashlib.sha256("\0".join(p.link).encode()).hexdigest())
    return [p.binary for p in plans]


def build(variant: str, *, jobs: int | None = None, **where) -> Path:
    """Builds (when out of date) the check binary of one variant; returns its path (see plan)."""
    return build_all([plan(variant, **where)], jobs)[0]


def main(argv: list[str]) -> int:
    variants = argv or list(VARIANTS)
    for name in variants:
        if name not in VARIANTS:
            print(f"build.py: unknown variant '{name}' (one of {', '.join(VARIANTS)})", file=sys.stderr)
            return 2
    try:
        for binary in build_all([plan(name) for name in variants]):
            print(binary)
    except BuildError as exc:
        print(f"build.py: build failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The engine's command line, exit codes and the CUDA engine's fast-path flags (docs/ENGINE.md, docs/FORMATS.md
"Engine exit codes", docs/CUDA.md "Qualification").

Every argv that starts an engine is built here: the proxy's, the tests' and
the benchmarks'. A setting is a long flag named after it (`grad_accum` ->
`--grad-accum`); floats are written with `repr`, which round-trips exactly,
so the engine parses the very float the experiment holds.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

# Model and optimizer settings, in the order they are written.
SETTINGS = (
    "vocab",
    "ctx",
    "dim",
    "layers",
    "heads",
    "batch",
    "grad_accum",
    "steps",
    "lr",
    "min_lr",
    "lr_schedule",
    "decay_fraction",
    "warmup",
    "beta1",
    "beta2",
    "eps",
    "weight_decay",
    "grad_clip",
    "seed",
    "threads",
)
STDIN = "-"  # `--data -`: proxy mode, frames on stdin and events on stdout

MAX_STEP = 0x7FFFFFFF  # the engine's steps are int32 (--steps, a checkpoint's header): no step is larger

# Exit codes: why an engine ended.
EXIT_OK, EXIT_USAGE, EXIT_CHECKPOINT, EXIT_PROTOCOL, EXIT_IO, EXIT_NUMERICS = 0, 2, 3, 4, 5, 6
EXIT_MEANINGS = {
    EXIT_OK: "normal exit",
    EXIT_USAGE: "usage error",
    EXIT_CHECKPOINT: "checkpoint error",
    EXIT_PROTOCOL: "protocol error",
    EXIT_IO: "I/O error",
    EXIT_NUMERICS: "non-finite loss, gradient or state",
}


def flag(setting: str) -> str:
    return "--" + setting.replace("_", "-")


def _value(value: str | int | float) -> str:
    if isinstance(value, str):  # a name (--lr-schedule wsd)
        return value
    return repr(float(value)) if isinstance(value, float) else str(int(value))


def setting_flags(**settings: str | int | float | None) -> list[str]:
    """`--flag value` for every setting given that is not None, in SETTINGS order."""
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        raise ValueError(f"not engine settings: {', '.join(unknown)}")
    out: list[str] = []
    for name in SETTINGS:
        value = settings.get(name)
        if value is not None:
            out += [flag(name), _value(value)]
    return out


def meta_text(meta: object) -> str:
    """The `--meta` JSON (embedded in every checkpoint): compact, keys sorted, so it is deterministic."""
    return json.dumps(meta, sort_keys=True, separators=(",", ":"))


def engine_args(
    ckpt_dir: str | os.PathLike,
    *,
    data: str | os.PathLike = STDIN,
    resume: str | os.PathLike | None = None,
    ckpt_every: int | None = None,
    ckpt_every_seconds: float | None = None,
    meta: Mapping[str, object] | None = None,
    settings: Sequence[str] = (),
    extra: Iterable[object] = (),
) -> list[str]:
    """The arguments after the binary: data, checkpoint directory, resume, cadences, metadata, settings, extra."""
    args = ["--data", str(data), "--ckpt-dir", str(ckpt_dir)]
    if resume is not None:
        args += ["--resume", str(resume)]
    if ckpt_every is not None:
        args += ["--ckpt-every", str(int(ckpt_every))]
    if ckpt_every_seconds is not None:
        args += ["--ckpt-every-seconds", repr(float(ckpt_every_seconds))]
    if meta is not None:
        args += ["--meta", meta_text(meta)]
    return args + list(settings) + [str(a) for a in extra]


def exit_description(code: int | None) -> str:
    """How an engine ended, for a person: `exit 4 (protocol error)`, `killed by SIGKILL`."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit {code} ({EXIT_MEANINGS.get(code, 'failure')})"


# ------------------------------------------------------------------ the CUDA engine's fast paths


class FastPath(str, Enum):
    """The CUDA engine's named fast paths: the only names a qualification verdict holds
    (docs/CUDA.md, "Qualification")."""

    ATTENTION_CUDNN = "attention_cudnn"
    ATTENTION_FLASH = "attention_flash"
    FUSED = "fused"
    CUDA_GRAPH = "cuda_graph"
    KV_CACHE = "kv_cache"
    ASYNC_SNAPSHOT = "async_snapshot"


@dataclass(frozen=True)
class PathSwitch:
    switch: str  # the engine setting the path turns; one path per switch at a time
    fast: tuple[str, ...]  # the flags that select the path
    needs: tuple[FastPath, ...] = ()  # paths it runs on top of


# The engine setting of each switch on the verified path, in the order they are written.
VERIFIED_SWITCHES = {
    "attention": ("--attention", "naive"),
    "fused": ("--fused", "off"),
    "cuda_graph": ("--cuda-graph", "off"),
    "sampling": ("--sample-recompute",),
    "snapshot": ("--sync-snapshot",),
}
# Every flag a fast path puts on the engine's command line: this table, nothing else.
PATH_SWITCHES = {
    FastPath.ATTENTION_CUDNN: PathSwitch("attention", ("--attention", "cudnn")),
    FastPath.ATTENTION_FLASH: PathSwitch("attention", ("--attention", "flash")),
    FastPath.FUSED: PathSwitch("fused", ("--fused", "on")),
    FastPath.CUDA_GRAPH: PathSwitch("cuda_graph", ("--cuda-graph", "on"), needs=(FastPath.FUSED,)),
    FastPath.KV_CACHE: PathSwitch("sampling", ()),  # the engine's default: the KV cache
    FastPath.ASYNC_SNAPSHOT: PathSwitch("snapshot", ()),  # the engine's default: the asynchronous copy
}


def path_flags(paths: Iterable[FastPath | str]) -> list[str]:
    """The CUDA engine's path flags running `paths` (FastPath members) and the verified path for every
    other switch. Two paths on one switch, or a path without the paths it needs, is a programming error."""
    chosen = {FastPath(p) for p in paths}
    by_switch: dict[str, FastPath] = {}
    for p in sorted(chosen, key=list(FastPath).index):
        entry = PATH_SWITCHES[p]
        if entry.switch in by_switch:
            raise ValueError(f"{p.value} and {by_switch[entry.switch].value} both set {entry.switch}")
        missing = [n.value for n in entry.needs if n not in chosen]
        if missing:
            raise ValueError(f"{p.value} needs {', '.join(missing)}")
        by_switch[entry.switch] = p
    flags: list[str] = []
    for switch, verified in VERIFIED_SWITCHES.items():
        flags += PATH_SWITCHES[by_switch[switch]].fast if switch in by_switch else verified
    return flags


VERIFIED_FLAGS = path_flags(())  # what every fast path is compared with, and what a run uses where none qualifies


# ------------------------------------------------------------------ precision

# The engine flags of each `train.precision` (docs/ENGINE.md, "FP8"); `auto` adds none (the engine's default:
# bf16 on a GPU that has it, fp32 on the CPU).
PRECISION_FLAGS: dict[str, tuple[str, ...]] = {"auto": (), "fp8": ("--precision", "fp8")}

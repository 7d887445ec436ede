"""What the benchmark and evaluation scripts say about the machine they ran on."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what `platform` knows, else '?'."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def machine_line() -> str:
    """One line for a results file: CPU count and model, OS."""
    return f"{os.cpu_count()} CPUs ({cpu_model()}), {platform.platform()}"


def git_commit(repo: Path) -> str:
    """The short commit of `repo`, with `+changes` when tracked files outside docs/ differ from it (a
    benchmark writes its results and tables under docs/, which changes nothing it measures); '?'
    without git."""
    try:
        out = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=30
        )
        dirty = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)docs"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"
    return (out.stdout.strip() or "?") + ("+changes" if dirty else "")

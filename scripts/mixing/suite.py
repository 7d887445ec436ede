"""The mixing evaluation suite: the mixes a mixing policy is judged on, each with its purpose.

Every mix is an experiment in experiments/ with the same model, optimizer and
run length; they differ only in their arms, all built on the machine from
real text (docs/EXPERIMENTS.md, "Sources"). The arms marked `target` are the
objective; the others are the worthless or low-quality arms the curation goals
are about (scripts/mixing/summary.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"


@dataclass(frozen=True)
class Mix:
    name: str
    experiment: Path
    purpose: str


SUITE = (
    Mix(
        "good",
        EXPERIMENTS / "MIXING-GOOD.json",
        "good arms only: the standard library's code, its docstrings and the language reference topics, all "
        "targets. Nothing to curate away: any gain must come from mixing good data better than even shares.",
    ),
    Mix(
        "sizes",
        EXPERIMENTS / "MIXING-SIZES.json",
        "good arms of different difficulty and size, all targets: all the code (3.7M tokens), all the "
        "docstrings (0.7M) and a small part of the reference topics (26K), which even shares repeat some "
        "25 times over a run.",
    ),
    Mix(
        "shuffled",
        EXPERIMENTS / "MIXING-SHUFFLED.json",
        "one realistic low-quality arm beside the good ones: the docstrings with their words shuffled (real "
        "words, no sentences), whose loss falls at first and then teaches nothing the targets need.",
    ),
    Mix(
        "lowquality",
        EXPERIMENTS / "MIXING-LOWQUALITY.json",
        "three realistic low-quality arms beside the good ones: license boilerplate repeated across "
        "documents, docstring paragraphs copied with small edits, and German manual pages (another "
        "language, roff markup).",
    ),
    Mix(
        "worthless",
        EXPERIMENTS / "MIXING-WORTHLESS.json",
        "the trivially worthless arms: random tokens (unlearnable) and a few hundred names repeated 40 "
        "times (learned at once).",
    ),
)
BY_NAME = {m.name: m for m in SUITE}

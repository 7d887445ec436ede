"""`.samples.json`: the sample audits, a JSON array rewritten atomically, newest last (docs/FORMATS.md)."""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from ..atomic import atomic_write_json


@dataclass
class Sample:
    prompt: str
    completion: str
    tokens: list[int]


@dataclass
class SampleAudit:
    step: int
    time: float
    samples: list[Sample]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, obj: dict) -> "SampleAudit":
        return cls(step=int(obj["step"]), time=float(obj.get("time", 0.0)),
                   samples=[Sample(str(s.get("prompt", "")), str(s.get("completion", "")),
                                   [int(t) for t in s.get("tokens", [])]) for s in obj.get("samples", [])])


def read_audits(path: str | os.PathLike) -> list[SampleAudit]:
    """The audits in a `.samples.json`; [] when it is absent or not a list of audits."""
    try:
        raw = json.loads(Path(path).read_text())
        return [SampleAudit.from_dict(a) for a in raw] if isinstance(raw, list) else []
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return []


class SamplesFile:
    """`.samples.json`: a JSON array of audits, newest last, at most `keep` of them."""

    def __init__(self, path: str | os.PathLike, keep: int = 50):
        self.path = Path(path)
        self.keep = keep
        self.audits: list[SampleAudit] = read_audits(self.path)

    def add(self, audit: SampleAudit) -> None:
        """Add an audit; one for the same step (a replay) is replaced."""
        self.audits = [a for a in self.audits if a.step != audit.step] + [audit]
        self.audits.sort(key=lambda a: a.step)
        self.audits = self.audits[-self.keep:]
        atomic_write_json(self.path, [a.to_dict() for a in self.audits])

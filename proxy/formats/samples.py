"""`.samples.json`: the sample audits, a JSON array rewritten atomically, newest last (docs/FORMATS.md)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ..atomic import atomic_write_bytes, json_bytes
from ..run_names import READ_LIMITS, SAMPLES
from ..safe_fs import UnsafeFileError, read_regular
from . import bounded_json

MAX_TEXT = 4000  # characters of a completion kept in an audit (the dashboard shows as many)


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
    def from_dict(cls, obj: dict) -> SampleAudit:
        return cls(
            step=int(obj["step"]),
            time=float(obj.get("time", 0.0)),
            samples=[
                Sample(str(s.get("prompt", "")), str(s.get("completion", "")), [int(t) for t in s.get("tokens", [])])
                for s in obj.get("samples", [])
            ],
        )


def read_audits(path: str | os.PathLike) -> list[SampleAudit]:
    """The audits in a `.samples.json`; [] when it is absent or not a list of audits. A name that is not
    a regular file within its size cap raises UnsafeFileError."""
    path = Path(path)
    try:
        raw = bounded_json.loads(read_regular(path, READ_LIMITS[SAMPLES], within=path.parent))
        return [SampleAudit.from_dict(a) for a in raw] if isinstance(raw, list) else []
    except UnsafeFileError:
        raise
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return []


class SamplesFile:
    """`.samples.json`: a JSON array of audits, newest last, at most `keep` of them."""

    def __init__(self, path: str | os.PathLike, keep: int = 50):
        self.path = Path(path)
        self.keep = keep
        self.audits: list[SampleAudit] = read_audits(self.path)

    def add(self, audit: SampleAudit) -> None:
        """Add an audit; one for the same step (a replay) is replaced. The oldest are dropped while the
        file would exceed what its readers take (READ_LIMITS): the newest always fits, as the schema
        bounds prompts, counts and lengths (config/experiment.py) and completions are cut to MAX_TEXT."""
        audit = replace(audit, samples=[replace(s, completion=s.completion[:MAX_TEXT]) for s in audit.samples])
        self.audits = [a for a in self.audits if a.step != audit.step] + [audit]
        self.audits.sort(key=lambda a: a.step)
        self.audits = self.audits[-self.keep :]
        data = json_bytes([a.to_dict() for a in self.audits])
        while len(data) > READ_LIMITS[SAMPLES] and len(self.audits) > 1:
            self.audits = self.audits[1:]
            data = json_bytes([a.to_dict() for a in self.audits])
        atomic_write_bytes(self.path, data)

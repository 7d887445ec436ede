"""The proxy's fault environment: a tiny experiment, its uninterrupted reference run, reading the log, the
engine record, and comparing a faulted run with the reference (scenarios.py says how scenarios are built).
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from harness.engine import TIMEOUT, Child, Hang
from harness.reaction import react
from proxy.formats.checkpoint import checkpoint_step, list_checkpoints, verify_checkpoint

from .scenarios import ENGINE, REPO, Outcome, compare_files, tail_lines

# ---------------------------------------------------------------------------
# the proxy: a tiny experiment, its uninterrupted reference run, and helpers


FAULT_EXPERIMENT = {
    "name": "FAULTS-TINY",
    "model": {"vocab": 300, "ctx": 16, "dim": 16, "layers": 1, "heads": 2},
    "train": {
        "batch": 4,
        "grad_accum": 1,
        "max_steps": 48,
        "lr": 0.003,
        "min_lr": 0.0003,
        "warmup": 4,
        "seed": 1337,
        "ckpt_every": 4,
        "eval_every": 16,
        "eval_rows": 4,
        "sample_every": 16,
        "lag": 2,
        "keep_last": 1000,
        "milestone_every": 0,
        "threads": 1,
    },
    "bandit": {"policy": "ucb1"},
    "arms": [
        {"name": "dots", "sources": [{"file": "dots.txt"}]},
        {"name": "semis", "sources": [{"file": "semis.txt"}], "floor": 0.1},
    ],
    "samples": {"prompts": ["alpha "], "max_new": 8, "temperature": 0.8, "top_k": 10, "count": 1},
}
WORDS = (
    "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau "
    "upsilon phi chi psi omega"
).split()


def write_fault_experiment(directory: Path, **train_overrides) -> Path:
    """The experiment file and its two small text corpora (fixed, not seeded: the data never varies)."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(7)
    for fname, end in (("dots.txt", ".\n"), ("semis.txt", ";\n")):
        path = directory / fname
        if not path.exists():
            path.write_text(
                "".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) + end for _ in range(3000))
            )
    exp = json.loads(json.dumps(FAULT_EXPERIMENT))
    exp["train"].update(train_overrides)
    path = directory / "experiment.json"
    path.write_text(json.dumps(exp, indent=1))
    return path


@dataclass
class ProxyEnv:
    root: Path
    experiment: Path
    cache: Path
    ref: Path  # the uninterrupted run directory
    max_steps: int = FAULT_EXPERIMENT["train"]["max_steps"]
    ckpt_every: int = FAULT_EXPERIMENT["train"]["ckpt_every"]
    ref_seconds: float = 0.0

    def argv(self, run_dir: Path, *extra, experiment: Path | None = None, engine: str | None = None) -> list[str]:
        return [
            sys.executable,
            "-m",
            "proxy",
            "run",
            str(experiment or self.experiment),
            "--run-dir",
            str(run_dir),
            "--no-dashboard",
            "--cache-dir",
            str(self.cache),
            "--engine",
            engine or ENGINE.flag,
            "--restart-backoff",
            "0.05",
            # the rank count said, as the engine is: what the test runs, never what the machine has
            *([] if "--ranks" in map(str, extra) else ["--ranks", "1"]),
            *map(str, extra),
        ]

    def start(self, run_dir: Path, *extra, preexec_fn=None, **kw) -> Child:
        """`python -m proxy run` in its own process group (so the whole group can be killed)."""
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        return Child(
            self.argv(run_dir, *extra, **kw),
            cwd=REPO,
            new_session=True,
            parse_events=False,
            env=env,
            preexec_fn=preexec_fn,
        )

    def run(self, run_dir: Path, *extra, timeout: float = 300.0, **kw) -> tuple[int, Child]:
        p = self.start(run_dir, *extra, **kw)
        return p.finish(timeout), p


def prepare_proxy_env(root: Path) -> ProxyEnv:
    """Write the experiment, prepare its data (cached) and run it once, uninterrupted."""
    root.mkdir(parents=True, exist_ok=True)
    exp = write_fault_experiment(root / "exp")
    env = ProxyEnv(root=root, experiment=exp, cache=root / "cache", ref=root / "reference-run")
    t0 = time.monotonic()
    rc, p = env.run(env.ref)
    env.ref_seconds = time.monotonic() - t0
    if rc != 0:
        raise AssertionError(
            f"the uninterrupted reference run `{' '.join(p.argv)}` exited {rc}:\n"
            f"{p.stderr[-2000:]}\n{chr(10).join(p.lines[-20:])}"
        )
    return env


@dataclass
class LogView:
    """`.loss.json` read the way FORMATS.md says: complete JSON objects only, last entry per step wins."""

    steps: dict
    evals: dict
    raw: bytes
    bad_lines: list

    @property
    def max_step(self) -> int:
        return max(self.steps, default=0)


def read_log(path: Path, max_segment: int | None = None) -> LogView:
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raw = b""
    steps, evals, bad = {}, {}, []
    for line in raw.split(b"\n"):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):  # a line nested too deep (nesting_scenarios.py) is damaged too
            bad.append(line)
            continue
        if not isinstance(obj, dict) or obj.get("type") not in ("step", "eval"):
            bad.append(line)
            continue
        try:
            if max_segment is not None and int(obj.get("segment", 0)) > max_segment:
                continue
            (steps if obj["type"] == "step" else evals)[int(obj["step"])] = obj
        except (KeyError, TypeError, ValueError):
            bad.append(line)
    return LogView(steps, evals, raw, bad)


class LogTail:
    """Follows `.loss.json` by byte offset; `max_step` of complete step entries seen so far."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.offset = 0
        self.partial = b""
        self.max_step = 0
        self.by_segment: dict[int, int] = {}  # segment -> highest step logged
        self.first: dict[int, int] = {}  # segment -> first step logged (its resume step + 1)

    def poll(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        for line in lines:
            try:
                obj = json.loads(line)
                if obj.get("type") == "step":
                    s, seg = int(obj["step"]), int(obj.get("segment", 0))
                    self.max_step = max(self.max_step, s)
                    self.by_segment[seg] = max(self.by_segment.get(seg, 0), s)
                    self.first.setdefault(seg, s)
            except (ValueError, AttributeError, TypeError, KeyError):
                pass

    def wait_new_segment(self, after: int, proc: Child, timeout: float = TIMEOUT) -> tuple[int, int] | None:
        """(segment, resume step) of the first segment > `after` that logged a step: a segment's first
        entry is the step after the checkpoint it resumed from (.loss.json's `segment` field).
        None if the proxy exits first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.poll()
            new = sorted(seg for seg in self.first if seg > after)
            if new:
                react()
                return new[0], self.first[new[0]] - 1
            if not proc.alive():
                self.poll()
                new = sorted(seg for seg in self.first if seg > after)
                return (new[0], self.first[new[0]] - 1) if new else None
            time.sleep(0.004)
        raise Hang(f"no new engine segment in the log within {timeout:.0f}s")

    def wait_step(self, target: int, proc: Child, segment: int | None = None, timeout: float = TIMEOUT) -> bool:
        """Until a step entry >= target (of `segment`, if given) is in the log; False if the proxy exits first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            exited = not proc.alive()  # looked at before the log, so that what it logged before exiting counts
            self.poll()
            got = self.by_segment.get(segment, 0) if segment is not None else self.max_step
            if got >= target:
                react()
                return True
            if exited:
                return False
            time.sleep(0.004)
        raise Hang(f"the log did not reach step {target} within {timeout:.0f}s")


def engine_record(run_dir: Path) -> tuple[int, float | None] | None:
    """(pid, create_time) of the engine the proxy launched last (.engine.json)."""
    try:
        rec = json.loads((run_dir / ".engine.json").read_text())
        return int(rec["pid"]), rec.get("create_time")
    except (OSError, ValueError, KeyError, TypeError):
        return None


def engine_alive(rec) -> bool:
    import psutil

    if rec is None:
        return False
    pid, created = rec
    try:
        p = psutil.Process(pid)
        if created is not None and abs(p.create_time() - float(created)) > 0.01:
            return False
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def kill_engine(rec) -> bool:
    """SIGKILL the engine recorded in .engine.json if it is still that process."""
    if not engine_alive(rec):
        return False
    try:
        os.kill(rec[0], signal.SIGKILL)
        return True
    except ProcessLookupError:
        return False


def wait_engine_gone(rec, timeout: float = 90.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not engine_alive(rec):
            return True
        time.sleep(0.02)
    return False


def expected_resume(
    run_dir: Path, max_segment: int | None = None, phase: int = 0, among: set[str] | None = None
) -> int:
    """ARCHITECTURE.md: the newest checkpoint that verifies and whose steps are all in the log. `among`:
    only checkpoints of these names count (those on disk when the proxy chose; by the time a test looks,
    the relaunched engine may have written newer ones)."""
    log = read_log(run_dir / ".loss.json", max_segment)
    for p in list_checkpoints(run_dir / "checkpoints"):
        if among is not None and p.name not in among:
            continue
        s = checkpoint_step(p)
        if verify_checkpoint(p) is None and all(
            t in log.steps and int(log.steps[t].get("phase", 0)) == phase for t in range(1, s + 1)
        ):
            return s
    return 0


def first_resume(run_dir: Path, after_segment: int) -> int | None:
    """The step the first segment after `after_segment` resumed from (its first logged step - 1)."""
    firsts: dict[int, int] = {}
    for line in (run_dir / ".loss.json").read_bytes().split(b"\n"):
        try:
            obj = json.loads(line)
            if obj.get("type") == "step" and int(obj.get("segment", 0)) > after_segment:
                seg = int(obj["segment"])
                firsts[seg] = min(firsts.get(seg, 1 << 62), int(obj["step"]))
        except (ValueError, AttributeError, TypeError, KeyError, RecursionError):  # damaged lines
            continue
    return firsts[min(firsts)] - 1 if firsts else None


COMPARED_STEP_FIELDS = ("loss", "lr", "grad_norm", "tokens", "arms", "mixture")


def compare_with_reference(
    env: ProxyEnv, run_dir: Path, out: Outcome, samples_after: int = 0, where: str = "final"
) -> None:
    """The finished run equals the uninterrupted one: every step entry, every eval, the samples,
    the final checkpoint and every checkpoint both have; no replay mismatch reported."""
    ref, got = read_log(env.ref / ".loss.json"), read_log(run_dir / ".loss.json")
    for s in range(1, env.max_steps + 1):
        a, b = ref.steps.get(s), got.steps.get(s)
        if b is None:
            out.fail(f"{where}: step {s} missing from .loss.json", data_lost=1)
        elif a is None or any(a.get(k) != b.get(k) for k in COMPARED_STEP_FIELDS):
            diff = [k for k in COMPARED_STEP_FIELDS if a is None or a.get(k) != b.get(k)]
            out.fail(f"{where}: step {s} differs from the uninterrupted run in {diff}", data_lost=1)
    for s, a in ref.evals.items():
        b = got.evals.get(s)
        if b is None or (a["loss"], a.get("arms")) != (b["loss"], b.get("arms")):
            out.fail(f"{where}: eval at step {s} {'missing' if b is None else 'differs'}", data_lost=1)
    try:
        state = json.loads((run_dir / ".state.json").read_text())
    except (OSError, ValueError) as exc:
        out.fail(f"{where}: .state.json unreadable after the run: {exc}")
        state = {}
    if state and (state.get("status") != "finished" or int(state.get("replay_mismatch_count") or 0)):
        out.fail(
            f"{where}: .state.json status {state.get('status')!r}, replay mismatches "
            f"{state.get('replay_mismatch_count')} {state.get('replay_mismatches', [])[:2]}"
        )
    ref_samples = _samples(env.ref)
    got_samples = _samples(run_dir)
    for s, toks in ref_samples.items():
        if s > samples_after and got_samples.get(s) != toks:
            out.fail(
                f"{where}: sample audit at step {s} {'missing' if s not in got_samples else 'differs'}", data_lost=1
            )
    final = f"step_{env.max_steps:06d}.bin"
    if not (run_dir / "checkpoints" / final).exists():
        out.fail(f"{where}: final checkpoint {final} missing", data_lost=1)
    compare_files(env.ref / "checkpoints", run_dir / "checkpoints", out, what=f"{where}: ")


def _samples(run_dir: Path) -> dict:
    try:
        audits = json.loads((run_dir / ".samples.json").read_text())
        return {int(a["step"]): [s["tokens"] for s in a["samples"]] for a in audits}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def no_traceback(p: Child, out: Outcome, where: str) -> None:
    text = p.stderr
    if "Traceback (most recent call last)" in text:
        tb = text[text.rindex("Traceback (most recent call last)") :].splitlines()
        files = [ln.strip() for ln in tb if ln.strip().startswith("File ")]
        out.fail(f"{where}: the proxy printed a traceback: {tb[-1].strip()} (at {files[-1] if files else '?'})")


def finish_last_launch(p: Child, out: Outcome) -> None:
    """The scenario's last launch trains to the end: exit 0 within 300 s, no traceback."""
    try:
        rc = p.finish(300)
    except Hang as exc:
        out.fail(str(exc))
    if rc != 0:
        out.fail(f"the last launch exited {rc}: {tail_lines(p.stderr)}")
    no_traceback(p, out, "last launch")

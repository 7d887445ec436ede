"""The runs of a mixing evaluation: one experiment per (policy, seed), trained by the real proxy.

Each run is `python -m proxy run` on a copy of the base experiment whose only
changes are its name, `train.seed` and `bandit.policy`, in its own run
directory under RUNS_DIR (so `proxy dashboard --run-dir RUNS_DIR` overlays
them all). A run that already finished is left as it is (the proxy says
"nothing to do"), and one that was interrupted resumes: running the
evaluation again continues where it stopped.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from proxy.atomic import atomic_write_json
from proxy.config.experiment import load_experiment
from proxy.config.policies import DEFAULT_POLICY
from proxy.config.sources import parse_source

REPO = Path(__file__).resolve().parents[2]
POLL_S = 0.5


@dataclass
class RunSpec:
    policy: str
    seed: int
    name: str
    run_dir: Path
    experiment: Path
    log: Path


@dataclass
class RunResult:
    spec: RunSpec
    returncode: int
    wall_s: float


@dataclass
class LaunchOptions:
    jobs: int = 2
    engine: str = "cpu"
    cache_dir: Path | None = None
    progress: bool = True


def bandit_for(policy: str, base: dict) -> dict:
    """The base experiment's bandit object for `policy`: its parameters where the policy is the base's own."""
    if base.get("policy", DEFAULT_POLICY) == policy:
        return dict(base)
    return {"policy": policy}


def absolute_sources(experiment: dict, experiment_dir: Path) -> dict:
    """A copy whose relative source paths (and tokenizer path) are absolute (the copy lives elsewhere)."""
    out = json.loads(json.dumps(experiment))
    for arm in out.get("arms", []):
        for src in arm.get("sources", []):
            for name, value, _what in parse_source(src).path_fields():  # the kinds' own path fields
                if not os.path.isabs(value):
                    src[name] = str((experiment_dir / value).resolve())
    if out.get("tokenizer") and not os.path.isabs(out["tokenizer"]):
        out["tokenizer"] = str((experiment_dir / out["tokenizer"]).resolve())
    return out


def plan_runs(experiment_path: Path, policies: list[str], seeds: list[int], runs_dir: Path) -> list[RunSpec]:
    """Write one experiment file per (policy, seed) under runs_dir/experiments/; return the runs."""
    base = json.loads(experiment_path.read_text())
    base = absolute_sources(base, experiment_path.resolve().parent)
    (runs_dir / "experiments").mkdir(parents=True, exist_ok=True)
    (runs_dir / "logs").mkdir(parents=True, exist_ok=True)
    specs = []
    for policy in policies:
        for seed in seeds:
            name = f"{base['name']}-{policy}-s{seed}"
            exp = dict(
                base, name=name, train=dict(base["train"], seed=seed), bandit=bandit_for(policy, base.get("bandit", {}))
            )
            path = runs_dir / "experiments" / f"{name}.json"
            if not path.exists() or json.loads(path.read_text()) != exp:
                atomic_write_json(path, exp)
            load_experiment(path)  # one clear line now rather than a failed run later
            specs.append(RunSpec(policy, seed, name, runs_dir / name, path, runs_dir / "logs" / f"{name}.log"))
    return specs


def _step_of(run_dir: Path) -> int:
    """The step a run has reached, from its .state.json (0 when there is none yet)."""
    try:
        return int(json.loads((run_dir / ".state.json").read_text()).get("step", 0))
    except (OSError, ValueError, TypeError, AttributeError):
        return 0


def finished(run_dir: Path, max_steps: int) -> bool:
    """Whether a run reached `max_steps` already (launched again, it is only read)."""
    return _step_of(run_dir) >= max_steps


def _start(spec: RunSpec, options: LaunchOptions) -> subprocess.Popen:
    argv = [
        sys.executable,
        "-m",
        "proxy",
        "run",
        str(spec.experiment),
        "--run-dir",
        str(spec.run_dir),
        "--no-dashboard",
        "--engine",
        options.engine,
    ]
    if options.cache_dir is not None:
        argv += ["--cache-dir", str(options.cache_dir)]
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    with open(spec.log, "ab") as log:
        return subprocess.Popen(
            argv,
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _stop_all(running: dict) -> None:
    """SIGTERM: each proxy checkpoints and exits; the next evaluation resumes from there."""
    for proc, _spec, _t0 in running.values():
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for proc, _spec, _t0 in running.values():
        proc.wait()


@dataclass
class LoadSampler:
    """The 1-minute load average, sampled while the runs train (how busy the machine was)."""

    samples: list[float] = field(default_factory=list)

    def sample(self) -> None:
        self.samples.append(os.getloadavg()[0])

    def summary(self) -> dict:
        s = self.samples or [os.getloadavg()[0]]
        return {"mean": round(sum(s) / len(s), 2), "max": round(max(s), 2), "samples": len(s)}


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def launch(specs: list[RunSpec], max_steps: int, options: LaunchOptions, load: LoadSampler) -> list[RunResult]:
    """Train every run, `options.jobs` at a time, with one progress bar over all their steps. SIGTERM, like
    Ctrl-C, stops the runs in flight cleanly (each checkpoints) before it ends the evaluation: the runs
    live in their own sessions, so nothing else would stop them."""
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return _launch(specs, max_steps, options, load)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _launch(specs: list[RunSpec], max_steps: int, options: LaunchOptions, load: LoadSampler) -> list[RunResult]:
    pending = list(specs)
    running: dict[int, tuple[subprocess.Popen, RunSpec, float]] = {}
    results: list[RunResult] = []
    bar = tqdm(
        total=max_steps * len(specs),
        unit="step",
        disable=not options.progress,
        dynamic_ncols=True,
        desc=f"runs 0/{len(specs)}",
    )
    last_sample = 0.0
    try:
        while pending or running:
            while pending and len(running) < options.jobs:
                spec = pending.pop(0)
                proc = _start(spec, options)
                running[proc.pid] = (proc, spec, time.monotonic())
            for pid, (proc, spec, t0) in list(running.items()):
                if proc.poll() is not None:
                    del running[pid]
                    results.append(RunResult(spec, proc.returncode, time.monotonic() - t0))
            steps = sum(max_steps for r in results) + sum(_step_of(s.run_dir) for _p, s, _t in running.values())
            bar.n = min(steps, bar.total)
            bar.set_description(f"runs {len(results)}/{len(specs)}")
            bar.refresh()
            if time.monotonic() - last_sample >= 10.0:
                load.sample()
                last_sample = time.monotonic()
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        bar.close()
        _stop_all(running)
        raise
    bar.close()
    return results

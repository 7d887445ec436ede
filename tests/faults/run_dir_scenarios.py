"""Fault scenarios beyond the engine: run-directory and command-line files that are not regular files, a
phase history that contradicts the run's records, names beyond their bounds, stop signals before training,
and the smaller cases of docs/RELIABILITY.md (the proxy's own writes failing: storage_scenarios.py).

Like scenarios.py (whose helpers these use), every scenario runs real processes (`python -m proxy`,
the engine binary) against a real run directory, returns an Outcome, and asserts what survives: no
traceback, one line, the exit code, every complete `.loss.json` line and every valid checkpoint
kept, and a relaunch that resumes bit-exactly once the cause is gone.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import replace
from pathlib import Path

from harness.engine import TIMEOUT, Child
from proxy.formats.checkpoint import checkpoint_step, list_checkpoints, verify_checkpoint

from .proxy_checks import (
    REFUSE_TIMEOUT,
    launch,
    launch_and_compare,
    memory_limit,
    one_line_exit,
    proxy_cmd,
    run_cmd,
    run_state,
    start_training,
)
from .proxy_harness import LogTail, ProxyEnv, expected_resume, no_traceback, read_log, write_fault_experiment
from .proxy_scenarios import copy_run, relaunch_and_compare
from .scenarios import Outcome, tail_lines

# ---------------------------------------------------------------------------
# files that are not regular files (or too large, or a symlink out of the run)


def _to_dev_zero(name: str):
    def damage(run: Path) -> str:
        (run / name).unlink()
        os.symlink("/dev/zero", run / name)
        return f"{name} -> /dev/zero"

    return damage


def _to_fifo(name: str):
    def damage(run: Path) -> str:
        (run / name).unlink()
        os.mkfifo(run / name)
        return f"{name} is a FIFO"

    return damage


def _to_sparse(name: str, size: int):
    def damage(run: Path) -> str:
        with open(run / name, "r+b") as f:
            f.truncate(size)
        return f"{name} grown to {size} bytes (sparse)"

    return damage


def _to_outside(name: str):
    def damage(run: Path) -> str:
        outside = run.parent / f"outside-{name}"
        shutil.copy(run / name, outside)
        (run / name).unlink()
        os.symlink(outside, run / name)
        return f"{name} -> {outside} (a valid copy outside the run)"

    return damage


def _newest_checkpoint_to_dev_zero(run: Path) -> str:
    newest = list_checkpoints(run / "checkpoints")[0]
    newest.unlink()
    os.symlink("/dev/zero", newest)
    return f"checkpoints/{newest.name} -> /dev/zero"


# (case, damage, the file the refusal names, or None: the run goes on without it)
UNSAFE_RUN_FILES = [
    ("newest checkpoint is a symlink to /dev/zero", _newest_checkpoint_to_dev_zero, None),
    (".loss.json is a symlink to /dev/zero", _to_dev_zero(".loss.json"), ".loss.json"),
    (".loss.json is a FIFO", _to_fifo(".loss.json"), ".loss.json"),
    (".state.json is a symlink to /dev/zero", _to_dev_zero(".state.json"), ".state.json"),
    (".state.json is 8 GiB (sparse)", _to_sparse(".state.json", 8 << 30), ".state.json"),
    ("phases.json is a symlink to /dev/zero", _to_dev_zero("phases.json"), "phases.json"),
    ("phases.json is a FIFO", _to_fifo("phases.json"), "phases.json"),
    ("phases.json is a symlink out of the run", _to_outside("phases.json"), "phases.json"),
    ("experiment.json is a symlink to /dev/zero", _to_dev_zero("experiment.json"), "experiment.json"),
    (".samples.json is a FIFO", _to_fifo(".samples.json"), ".samples.json"),
]


def _run_files(run: Path) -> dict:
    """Every regular file of a run directory (but its lock) with its bytes, and what each other name is."""
    out = {}
    for p in sorted(run.rglob("*")):
        rel = str(p.relative_to(run))
        if p.name in (".lock", ".pivot.lock"):  # lock files: taken (and emptied) by any command
            continue
        if p.is_symlink():
            out[rel] = ("symlink", os.readlink(p))
        elif p.is_fifo():
            out[rel] = ("fifo",)
        elif p.is_file():
            out[rel] = ("file", p.stat().st_size if p.stat().st_size > (64 << 20) else p.read_bytes())
    return out


def unsafe_run_files(
    env: ProxyEnv,
    template: Path,
    workdir: Path,
    name: str = "proxy-unsafe-run-files",
    fault_class: str = "run-directory files that are devices, FIFOs, huge or symlinks out",
) -> Outcome:
    """A file of a stopped run replaced by a symlink to /dev/zero, a FIFO, an 8 GiB sparse file or a
    symlink out of the run, then the run relaunched under RLIMIT_AS 8 GiB. A checkpoint is skipped with
    one line (the run resumes from the next older one); any other file is refused: exit 2, one last line
    naming it, no traceback, no hang, not one byte of the run changed. With the file restored the
    relaunch finishes bit-identical."""
    out = Outcome(fault_class, name)
    for i, (case, damage, refused) in enumerate(UNSAFE_RUN_FILES):
        run = copy_run(template, workdir / f"case{i}")
        what = damage(run)
        where = f"[{case}]"
        out.begin_fault()
        if refused is None:
            p = relaunch_and_compare(env, run, out, where, expect_resume=expected_resume(run))
            if p is not None and not any("not resuming from" in ln and "not read" in ln for ln in p.stderr_lines()):
                out.fail(f"{where}: the checkpoint was skipped without one line saying why: {p.stderr_lines()[-3:]}")
            continue
        before = _run_files(run)
        t0 = time.monotonic()
        rc, p = launch(lambda: env.run(run, preexec_fn=memory_limit(), timeout=REFUSE_TIMEOUT), out, where)
        out.note(f"{case}: seconds to refuse", round(time.monotonic() - t0, 1))
        line = one_line_exit(p, rc, 2, refused, out, f"{where} ({what})")
        out.note(f"{case}: message", line)
        if _run_files(run) != before:
            out.fail(f"{where}: the refused launch changed the run directory", data_lost=1)
        (run / refused).unlink()
        shutil.copy(template / refused, run / refused)
        relaunch_and_compare(env, run, out, f"{where} restored")
    return out.close()


def unsafe_command_line_files(
    env: ProxyEnv,
    template: Path,
    workdir: Path,
    name: str = "proxy-unsafe-arguments",
    fault_class: str = "command-line files that are devices or FIFOs",
) -> Outcome:
    """`proxy run /dev/zero`, `proxy run FIFO`, `proxy pivot --caps /dev/zero`, `proxy pivot --caps FIFO`,
    `proxy status` of a run whose `.state.json` is /dev/zero: exit 2, one line naming the file, at once
    (under RLIMIT_AS 8 GiB), nothing in the run directory changed."""
    out = Outcome(fault_class, name)
    run = copy_run(template, workdir / "run")
    fifo = workdir / "caps.fifo"
    os.mkfifo(fifo)
    state = workdir / "status-run"
    copy_run(template, state)
    _to_dev_zero(".state.json")(state)
    cases = [
        ("proxy run /dev/zero", env.argv(workdir / "new-run", experiment=Path("/dev/zero")), "/dev/zero"),
        ("proxy run FIFO", env.argv(workdir / "new-run", experiment=fifo), str(fifo)),
        ("proxy pivot --caps /dev/zero", proxy_cmd("pivot", "--run-dir", run, "--caps", "/dev/zero"), "/dev/zero"),
        ("proxy pivot --caps FIFO", proxy_cmd("pivot", "--run-dir", run, "--caps", fifo), str(fifo)),
        ("proxy status (.state.json -> /dev/zero)", proxy_cmd("status", "--run-dir", state, "--json"), ".state.json"),
    ]
    before = _run_files(run)
    for case, argv, named in cases:
        out.begin_fault()
        rc, p = launch(lambda: run_cmd(argv, preexec_fn=memory_limit()), out, f"[{case}]")
        out.note(f"{case}: message", one_line_exit(p, rc, 2, named, out, f"[{case}]"))
        if (workdir / "new-run").exists():
            out.fail(f"[{case}] a run directory was created for a refused experiment")
    if _run_files(run) != before:
        out.fail("the refused commands changed the run directory", data_lost=1)
    return out.close()


# ---------------------------------------------------------------------------
# the phase history


PIVOT_CAPS = {"caps": {"dots": 0.6}, "floors": {"semis": 0.3}, "policy": "exp3"}


def _covered_resume(run: Path, start: int) -> int:
    """The newest checkpoint at or after `start` (the pivot) that verifies and whose steps are all logged,
    steps <= start in phase 0 and later ones in phase 1 (the rule of docs/ARCHITECTURE.md)."""
    log = read_log(run / ".loss.json")
    for p in list_checkpoints(run / "checkpoints"):
        s = checkpoint_step(p)
        if (
            s >= start
            and verify_checkpoint(p) is None
            and all(
                t in log.steps and int(log.steps[t].get("phase", 0)) == (0 if t <= start else 1)
                for t in range(1, s + 1)
            )
        ):
            return s
    return start


def pivoted_runs(env: ProxyEnv, template: Path, workdir: Path) -> tuple[Path, Path, Path, int]:
    """From a stopped run: (before, stopped, reference, c): `before` pivoted offline at its checkpoint c
    (exp3 and new caps), `stopped` that run trained on into phase 1 and stopped by SIGTERM, `reference`
    the pivoted run trained to the end uninterrupted."""
    before = copy_run(template, workdir / "before-pivot")
    caps = workdir / "caps.json"
    caps.write_text(json.dumps(PIVOT_CAPS))
    pivoted = copy_run(template, workdir / "pivoted")
    rc, p = run_cmd(proxy_cmd("pivot", "--run-dir", pivoted, "--caps", caps), timeout=TIMEOUT)
    if rc != 0:
        raise AssertionError(f"offline pivot exited {rc}: {p.stderr_lines()}")
    c = json.loads((pivoted / "phases.json").read_text())[-1]["start_step"]
    reference = copy_run(pivoted, workdir / "reference")
    rc, p = env.run(reference)
    if rc != 0:
        raise AssertionError(f"the pivoted reference run exited {rc}: {tail_lines(p.stderr)}")
    stopped = copy_run(pivoted, workdir / "stopped")
    p = env.start(stopped)
    if not LogTail(stopped / ".loss.json").wait_step(c + 9, p):
        raise AssertionError(f"the pivoted run exited early: {tail_lines(p.stderr)}")
    p.send_signal(signal.SIGTERM)
    if p.finish(TIMEOUT) != 0:
        raise AssertionError(f"SIGTERM to the pivoted run: {tail_lines(p.stderr)}")
    return before, stopped, reference, c


def _phases_edit(edit):
    def damage(run: Path, before: Path) -> str:
        phases = json.loads((run / "phases.json").read_text())
        what = edit(phases[1])
        (run / "phases.json").write_text(json.dumps(phases))
        return what

    return damage


def _later_start(phase: dict) -> str:
    phase["start_step"] += 4
    phase["checkpoint"] = f"checkpoints/step_{phase['start_step']:06d}.bin"
    return f"phase 1 moved to step {phase['start_step']}"


def _other_caps(phase: dict) -> str:
    phase["caps"]["dots"] = 0.9
    return "phase 1's cap of dots edited to 0.9"


def _other_policy(phase: dict) -> str:
    phase["policy"] = "ucb1"
    return "phase 1's policy edited to ucb1"


def _phases_deleted(run: Path, before: Path) -> str:
    (run / "phases.json").unlink()
    return "phases.json deleted"


def _phases_from_before(run: Path, before: Path) -> str:
    shutil.copy(before / "phases.json", run / "phases.json")
    return "phases.json restored from a copy made before the pivot"


HISTORY_CASES = [
    ("phases.json deleted after a pivot", _phases_deleted, ("run", "pivot", "fork")),
    ("phases.json from before the pivot", _phases_from_before, ("run", "pivot", "fork")),
    ("phases.json: the pivot moved to a later step", _phases_edit(_later_start), ("run",)),
    ("phases.json: the new phase's caps edited", _phases_edit(_other_caps), ("run", "pivot")),
    ("phases.json: the new phase's policy edited", _phases_edit(_other_policy), ("run",)),
]


def phase_history(
    env: ProxyEnv,
    template: Path,
    workdir: Path,
    name: str = "proxy-phase-history",
    fault_class: str = "phase history lost or rewritten after a pivot",
) -> Outcome:
    """A run pivoted at step c and trained on into phase 1, then its phases.json deleted, replaced by
    the copy from before the pivot, or edited. `proxy run`, `proxy pivot` and `proxy fork` each refuse
    with one line (exit 2) naming the contradiction with the log, the pivot's receipt or a checkpoint,
    and change nothing: no checkpoint deleted or rewritten, the log untouched, no fork made. With
    phases.json restored the relaunch finishes bit-identical to the pivoted run trained uninterrupted."""
    out = Outcome(fault_class, name)
    before, stopped, reference, c = pivoted_runs(env, template, workdir)
    renv = replace(env, ref=reference)
    caps = workdir / "caps.json"
    out.note("pivot step", c)
    for i, (case, damage, commands) in enumerate(HISTORY_CASES):
        run = copy_run(stopped, workdir / f"case{i}")
        what = damage(run, before)
        out.begin_fault()
        snapshot = _run_files(run)
        argvs = {
            "run": env.argv(run),
            "pivot": proxy_cmd("pivot", "--run-dir", run, "--caps", caps),
            "fork": proxy_cmd("fork", "--run-dir", run, "--at", c + 4, "--to", workdir / f"fork{i}"),
        }
        for command in commands:
            where = f"[{case}: proxy {command}]"
            rc, p = launch(lambda: run_cmd(argvs[command], timeout=TIMEOUT), out, where)
            line = one_line_exit(p, rc, 2, "phases.json", out, where)
            if command == "run":
                out.note(f"{case}: message", line)
        if (workdir / f"fork{i}").exists():
            out.fail(f"[{case}] a fork was made of a run whose history contradicts itself")
        if _run_files(run) != snapshot:
            out.fail(f"[{case}] a refused command changed the run directory ({what})", data_lost=1)
        shutil.copy(stopped / "phases.json", run / "phases.json")
        relaunch_and_compare(renv, run, out, f"[{case}] phases.json restored", expect_resume=_covered_resume(run, c))
    return out.close()


# ---------------------------------------------------------------------------
# names and strings beyond their bounds


def _experiment_with(env: ProxyEnv, directory: Path, edit) -> Path:
    """The fault experiment, edited by `edit(doc)`, next to copies of its corpora."""
    directory.mkdir(parents=True, exist_ok=True)
    for corpus in ("dots.txt", "semis.txt"):
        shutil.copy(env.experiment.parent / corpus, directory / corpus)
    doc = json.loads(env.experiment.read_text())
    edit(doc)
    path = directory / "experiment.json"
    path.write_text(json.dumps(doc))
    return path


def _set(path: tuple, value):
    def edit(doc):
        d = doc
        for key in path[:-1]:
            d = d[key]
        d[path[-1]] = value

    return edit


def _many_arms(n: int):
    def edit(doc):
        doc["arms"] = [{"name": f"arm{i}", "sources": [{"file": "dots.txt"}]} for i in range(n)]

    return edit


# (case, edit, the field the one line names)
OUT_OF_BOUNDS = [
    ("an arm name of 250 characters", _set(("arms", 0, "name"), "a" * 250), "arms[0].name"),
    ("an experiment name of 65 characters", _set(("name",), "N" * 65), "name"),
    ("65 arms", _many_arms(65), "arms"),
    ("a prompt of 1001 characters", _set(("samples", "prompts"), ["p" * 1001]), "samples.prompts[0]"),
    ("17 prompts", _set(("samples", "prompts"), ["p"] * 17), "samples.prompts"),
    ("samples.count 17", _set(("samples", "count"), 17), "samples.count"),
    ("samples.max_new 4097", _set(("samples", "max_new"), 4097), "samples.max_new"),
    (
        "a source path of 5000 characters",
        _set(("arms", 0, "sources", 0, "file"), "d" * 5000),
        "arms[0].sources[0].file",
    ),
    ("an unknown key of 100000 characters", _set(("train", "k" * 100_000), 1), "train: unknown key"),
]


def names_out_of_bounds(
    env: ProxyEnv,
    template: Path,
    workdir: Path,
    name: str = "proxy-bounds",
    fault_class: str = "names and strings beyond their bounds",
) -> Outcome:
    """Each name, string and list of an experiment or caps file has a bound (docs/EXPERIMENTS.md,
    "Bounds"). Beyond it `proxy run` exits 2 with one short line naming the field (no traceback, no run
    directory), and `proxy pivot --caps` with an arm name of 100000 characters exits 2 with one short
    line, the run unchanged. At the bounds (64-character experiment and arm names) a real run trains,
    prepares its data under those names and the dashboard's index lists them."""
    out = Outcome(fault_class, name)
    for i, (case, edit, field) in enumerate(OUT_OF_BOUNDS):
        exp = _experiment_with(env, workdir / f"exp{i}", edit)
        run = workdir / f"run{i}"
        out.begin_fault()
        rc, p = launch(lambda: env.run(run, experiment=exp, timeout=TIMEOUT), out, f"[{case}]")
        line = one_line_exit(p, rc, 2, field, out, f"[{case}]")
        if len(line) > 2000:
            out.fail(f"[{case}] the one line is {len(line)} characters long")
        if run.exists():
            out.fail(f"[{case}] a run directory was created")
        out.note(f"{case}: message", (line or "")[:200])
    # a caps file naming an arm of 100000 characters
    run = copy_run(template, workdir / "pivot-run")
    caps = workdir / "long-caps.json"
    caps.write_text(json.dumps({"caps": {"x" * 100_000: 0.5}}))
    snapshot = _run_files(run)
    out.begin_fault()
    rc, p = run_cmd(proxy_cmd("pivot", "--run-dir", run, "--caps", caps), timeout=TIMEOUT)
    line = one_line_exit(p, rc, 2, "unknown arm", out, "[caps file: an arm name of 100000 characters]")
    if len(line) > 2000:
        out.fail(f"[caps file] the one line is {len(line)} characters long")
    if _run_files(run) != snapshot:
        out.fail("[caps file] the refused pivot changed the run directory", data_lost=1)
    # at the bounds: 64-character names train, and the dashboard lists them
    longest = {"name": "E" * 64, "arms": ["d" * 64, "s" * 63 + "."]}

    def at_bounds(doc):
        doc["name"] = longest["name"]
        for arm, arm_name in zip(doc["arms"], longest["arms"], strict=False):
            arm["name"] = arm_name
        doc["train"]["max_steps"] = 8

    exp = _experiment_with(env, workdir / "exp-bounds", at_bounds)
    run = workdir / "run-bounds"
    out.begin_fault()
    rc, p = env.run(run, experiment=exp, timeout=300)
    no_traceback(p, out, "at the bounds")
    if rc != 0:
        out.fail(f"an experiment at the bounds exited {rc}: {tail_lines(p.stderr)}")
    steps = read_log(run / ".loss.json").steps
    if sorted(steps) != list(range(1, 9)) or set(steps[8].get("mixture", {})) != set(longest["arms"]):
        out.fail(
            f"the run at the bounds logged steps {sorted(steps)}, mixture over "
            f"{set(steps.get(8, {}).get('mixture', {}))}"
        )
    from dashboard.run_index import RunIndex  # the dashboard's own index of the run directory

    index = RunIndex(0, "bounds", run)
    index.refresh_sidecars()
    index.refresh_log()
    info = index.info()
    if info["experiment"] != longest["name"] or sorted(info["arms"]) != sorted(longest["arms"]) or info["steps"] != 8:
        out.fail(
            f"the dashboard's index shows experiment {info['experiment']!r}, arms {info['arms']}, {info['steps']} steps"
        )
    return out.close()


# ---------------------------------------------------------------------------
# signals: a stop before training starts, SIGHUP while training


def _data_temps(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.glob(".tmp-*")) if cache.is_dir() else []


def _wait_stderr(p: Child, needle: str, timeout: float = TIMEOUT) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if needle in p.stderr:
            return True
        if not p.alive():
            return False
        time.sleep(0.002)
    return False


def _dead_pid() -> int:
    """A pid no process has: that of a child that has exited and been reaped."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def stop_before_training(
    env: ProxyEnv,
    workdir: Path,
    name: str = "proxy-stop-before-training",
    fault_class: str = "SIGTERM, SIGHUP, SIGINT before training starts",
) -> Outcome:
    """A new run whose data are being prepared (a fresh cache) gets SIGTERM, SIGHUP or SIGINT: one last
    line saying it was interrupted, exit 130, no traceback, no temp directory left in the cache. A
    temp directory a dead preparation left (an older version, a kill -9) is removed at the next start,
    one of a live process kept; the next launch trains the whole run bit-identical."""
    out = Outcome(fault_class, name)
    run = workdir / "run"
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        cache = workdir / f"cache-{sig.name}"  # empty: the data are prepared while the signal comes
        p = replace(env, cache=cache).start(run)
        if not _wait_stderr(p, "preparing data"):
            out.fail(f"[{sig.name}] the proxy never started preparing data: {tail_lines(p.stderr)}")
        out.begin_fault()
        p.send_signal(sig)
        rc, _ = launch(lambda: (p.finish(TIMEOUT), p), out, f"[{sig.name}]")
        line = one_line_exit(p, rc, 130, f"interrupted by {sig.name}", out, f"[{sig.name}]")
        out.note(f"{sig.name}: last line", line)
        if _data_temps(cache):
            out.fail(f"[{sig.name}] temp directories left in the data cache: {_data_temps(cache)}")
        if list_checkpoints(run / "checkpoints"):
            out.fail(f"[{sig.name}] checkpoints were written before training")
    # stale temp directories: a dead process's is removed, a live one's kept
    cache = env.cache
    dead = cache / f".tmp-{'0' * 24}-{_dead_pid()}-1"
    live = cache / f".tmp-{'1' * 24}-{os.getpid()}-1"
    for d in (dead, live):
        d.mkdir()
        (d / "partial.tok").write_bytes(b"\0" * 1000)
    out.begin_fault()
    launch_and_compare(env, run, out, "the launch after the interruptions")
    if dead.exists() or not live.exists():
        out.fail(
            f"stale temp directory of a dead preparation {'kept' if dead.exists() else 'removed'}; "
            f"a live one's {'kept' if live.exists() else 'removed'}"
        )
    shutil.rmtree(live, ignore_errors=True)
    return out.close()


def sighup_while_training(
    env: ProxyEnv,
    template: Path,
    workdir: Path,
    name: str = "proxy-sighup",
    fault_class: str = "SIGHUP while training (proxy run)",
) -> Outcome:
    """SIGHUP to a training proxy (its terminal closed) stops it as SIGTERM does: the engine checkpoints,
    exit 0, `.state.json` stopped, a line saying how to resume; the relaunch finishes bit-identical."""
    out = Outcome(fault_class, name)
    run = copy_run(template, workdir / "run")
    p = start_training(env, run, out)
    out.begin_fault()
    p.send_signal(signal.SIGHUP)
    rc = p.finish(TIMEOUT)
    no_traceback(p, out, "SIGHUP")
    status = run_state(run).get("status")
    if rc != 0 or status != "stopped" or not any(ln.startswith("stopped at step") for ln in p.lines):
        out.fail(f"SIGHUP: exit {rc}, status {status!r}, last lines {p.lines[-2:]}")
    out.steps_lost += max(0, read_log(run / ".loss.json").max_step - expected_resume(run))
    relaunch_and_compare(env, run, out, "relaunch after SIGHUP")
    return out.close()


# ---------------------------------------------------------------------------
# status --json, bogus checkpoint files, an edited frozen experiment


def _strict_json(text: str):
    """json.loads that refuses NaN and Infinity, as every strict JSON reader does."""

    def refuse(name):
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


NON_FINITE_LINES = [  # a step and an eval past any the run logged, so that they are the newest (within
    # max_steps 48: `proxy status` leaves a step beyond it out, as no step of this run)
    b'{"type": "step", "step": 47, "loss": NaN, "lr": Infinity, "grad_norm": -Infinity, "tokens": 1, "time": 1.0, '
    b'"ms": NaN, "arms": {"dots": NaN}, "mixture": {"dots": Infinity, "semis": 0.5}, "phase": 0, "segment": 9}\n',
    b'{"type": "eval", "step": 47, "loss": Infinity, "arms": {"dots": NaN}, "time": 2.0, "phase": 0, "segment": 9}\n',
]


def status_json_non_finite(
    env: ProxyEnv,
    template: Path,
    workdir: Path,
    name: str = "proxy-status-nan",
    fault_class: str = "NaN and Infinity in .loss.json (proxy status --json)",
) -> Outcome:
    """`.loss.json` holding NaN and Infinity literals (a foreign writer): `proxy status --json` prints
    strict JSON (they are null), exit 0, no traceback; the plain report prints too."""
    out = Outcome(fault_class, name)
    run = copy_run(template, workdir / "run")
    with open(run / ".loss.json", "ab") as f:
        f.writelines(NON_FINITE_LINES)
    out.begin_fault()
    rc, p = run_cmd(proxy_cmd("status", "--run-dir", run, "--json"))
    no_traceback(p, out, "status --json")
    try:
        report = _strict_json("\n".join(p.lines))
        if report.get("loss") is not None or report.get("val_loss") is not None:
            out.fail(f"status --json: loss {report.get('loss')}, val_loss {report.get('val_loss')}; expected null")
    except ValueError as exc:
        out.fail(f"status --json is not strict JSON ({exc}): {p.lines[:3]}")
    if rc != 0:
        out.fail(f"status --json exited {rc}: {p.stderr_lines()}")
    rc, p = run_cmd(proxy_cmd("status", "--run-dir", run))
    no_traceback(p, out, "status")
    if rc != 0:
        out.fail(f"status exited {rc}: {p.stderr_lines()}")
    return out.close()


BOGUS = {"step_000999.bin": "a 0-byte file", "step_000998.bin": "a directory"}


def bogus_checkpoints(
    env: ProxyEnv,
    workdir: Path,
    name: str = "proxy-bogus-checkpoints",
    fault_class: str = "bogus step_NNNNNN.bin files (status, resume, retention)",
) -> Outcome:
    """With keep_last 2, a 0-byte step_000999.bin and a directory step_000998.bin put in a stopped run:
    `proxy status` names the newest real checkpoint, the relaunch skips both with a line each, and
    retention neither counts nor deletes them: the run ends with the same checkpoints the rule keeps
    (the last 2, and the one resumed from), bit-identical to an uninterrupted keep_last 2 run."""
    out = Outcome(fault_class, name)
    exp = write_fault_experiment(workdir / "exp", keep_last=2)
    kenv = replace(env, experiment=exp, ref=workdir / "reference")
    rc, p = kenv.run(kenv.ref)
    if rc != 0:
        out.fail(f"the keep_last 2 reference run exited {rc}: {tail_lines(p.stderr)}")
    run = workdir / "run"
    p = kenv.start(run)
    if not LogTail(run / ".loss.json").wait_step(20, p):
        out.fail(f"the proxy exited early: {tail_lines(p.stderr)}")
    p.send_signal(signal.SIGTERM)
    p.finish(TIMEOUT)
    ck = run / "checkpoints"
    (ck / "step_000999.bin").write_bytes(b"")
    (ck / "step_000998.bin").mkdir()
    out.begin_fault()
    newest = expected_resume(run)
    rc, p = run_cmd(proxy_cmd("status", "--run-dir", run, "--json"))
    shown = json.loads("\n".join(p.lines)).get("last_checkpoint") if rc == 0 else None
    if shown is None or Path(shown).name != f"step_{newest:06d}.bin":
        out.fail(f"proxy status shows {shown} as the newest checkpoint (exit {rc}), expected step_{newest:06d}.bin")
    p = relaunch_and_compare(kenv, run, out, "relaunch with bogus checkpoint files", expect_resume=newest)
    if p is not None:
        skipped = [ln for ln in p.stderr_lines() if "not resuming from" in ln and "step_00099" in ln]
        if len(skipped) != 2:
            out.fail(f"expected one line for each bogus file skipped; got {skipped}")
    kept = {checkpoint_step(q) for q in list_checkpoints(ck) if verify_checkpoint(q) is None}
    want = {env.max_steps - env.ckpt_every, env.max_steps, newest}
    if kept != want:
        out.fail(
            f"retention kept checkpoints {sorted(kept)}, the rule keeps {sorted(want)}", data_lost=len(want - kept)
        )
    if (ck / "step_000999.bin").read_bytes() != b"" or not (ck / "step_000998.bin").is_dir():
        out.fail("a bogus file was deleted or changed (what is not understood is left alone)")
    out.note("checkpoints kept", sorted(kept))
    return out.close()


def _frozen_edit(path: tuple, value):
    def damage(run: Path) -> str:
        doc = json.loads((run / "experiment.json").read_text())
        _set(path, value)(doc)
        (run / "experiment.json").write_text(json.dumps(doc, indent=1))
        return f"{'.'.join(map(str, path))} = {value!r}"

    return damage


# (case, edit, the field the line names): a proxy-side field, an engine flag, a cap
FROZEN_EDITS = [
    ("train.lag edited (proxy side)", _frozen_edit(("train", "lag"), 3), "train.lag"),
    ("train.lr edited (engine flag)", _frozen_edit(("train", "lr"), 0.001), "train.lr"),
    ("a floor edited", _frozen_edit(("arms", 1, "floor"), 0.2), "arms"),
]


def frozen_experiment_edited(
    env: ProxyEnv,
    template: Path,
    workdir: Path,
    name: str = "proxy-frozen-edited",
    fault_class: str = "frozen experiment.json edited by hand",
) -> Outcome:
    """The frozen RUN/experiment.json edited by hand, the run relaunched from it (`proxy run --run-dir`):
    refused at once with one line naming the field (exit 2), no engine started (engine.log unchanged),
    nothing changed. With the edit undone the relaunch finishes bit-identical."""
    out = Outcome(fault_class, name)
    for i, (case, damage, field) in enumerate(FROZEN_EDITS):
        run = copy_run(template, workdir / f"case{i}")
        for corpus in ("dots.txt", "semis.txt"):  # the frozen copy's sources resolve against the run directory
            shutil.copy(env.experiment.parent / corpus, run / corpus)
        original = (run / "experiment.json").read_bytes()
        damage(run)
        snapshot = _run_files(run)
        argv = [a for a in env.argv(run) if a != str(env.experiment)]
        out.begin_fault()
        rc, p = launch(lambda: run_cmd(argv, timeout=TIMEOUT), out, f"[{case}]")
        line = one_line_exit(p, rc, 2, field, out, f"[{case}]")
        out.note(f"{case}: message", line)
        if _run_files(run) != snapshot:
            out.fail(f"[{case}] the refused launch changed the run directory (an engine started?)", data_lost=1)
        (run / "experiment.json").write_bytes(original)
        relaunch_and_compare(env, run, out, f"[{case}] edit undone")
    return out.close()

"""Paths that lead out of the run, names beyond the engine's steps, names that collide, checkpoints of
another experiment.

- `checkpoints/` or `archive/` a symlink to another run (at launch, and swapped in while training): the
  proxy refuses with one line and no file outside the run is written or deleted;
- a valid checkpoint copied to `step_3000000000.bin` and `step_2000000000.bin`: every command stays within
  a memory limit and a time limit, says what it skips, and the run finishes as the reference;
- two experiment changes in the same second: two archive files, neither replacing the original;
- a checkpoint written by another experiment among the run's: `proxy run` refuses to start over it.

Real processes against real run directories, as in run_dir_scenarios.py (whose helpers these use).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from unittest import mock

from harness.engine import TIMEOUT, Hang
from harness.gate import Gate
from proxy.formats.checkpoint import checkpoint_step, list_checkpoints

from .proxy_checks import launch_and_compare, memory_limit, one_line_exit, proxy_cmd, run_cmd
from .proxy_harness import LogTail, ProxyEnv, compare_with_reference, no_traceback, write_fault_experiment
from .proxy_scenarios import copy_run, relaunch_and_compare
from .scenarios import ENGINE, Outcome, tail_lines

SYMLINK_CLASS = "checkpoints/ or archive/ a symlink out of the run"
HUGE_STEP_CLASS = "stray checkpoints with huge step numbers"
ARCHIVE_CLASS = "experiment changes within one second (archive names)"
FOREIGN_CLASS = "a checkpoint of another experiment among the run's"


def tree(root: Path) -> dict[str, bytes | str | None]:
    """Every entry under `root`: a file's bytes, a symlink's target, None for a directory."""
    out: dict[str, bytes | str | None] = {}
    if not root.exists():
        return out
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            out[rel] = os.readlink(p) if p.is_symlink() else (p.read_bytes() if p.is_file() else None)
    return out


def unchanged(root: Path, before: dict, out: Outcome, where: str) -> None:
    now = tree(root)
    changed = sorted(k for k in set(before) | set(now) if before.get(k) != now.get(k))
    if changed:
        out.fail(f"{where}: {root.name} outside the run changed: {changed[:6]}", data_lost=1)


def _newest(run: Path) -> int:
    return max((checkpoint_step(p) for p in list_checkpoints(run / "checkpoints")), default=0)


# ---------------------------------------------------------------------------
# symlinks out of the run


def _refused_then_restored(
    p, rc: int, run: Path, other: Path, before: dict, out: Outcome, what: str, note: str
) -> None:
    """The proxy refused checkpoints/ as a symlink with one line (exit 2) and left the other run as it was;
    then the run's own checkpoints/ is put back."""
    out.note(note, one_line_exit(p, rc, 2, "is a symlink", out, f"[{what}]"))
    unchanged(other, before, out, f"[{what}]")
    (run / "checkpoints").unlink()
    (run / "checkpoints.own").rename(run / "checkpoints")


def symlinked_run_dirs(env: ProxyEnv, template: Path, workdir: Path) -> Outcome:
    """(1) a new run whose checkpoints/ links to a finished run's; (2) a stopped run whose checkpoints/ was
    replaced by that link; (3) a stopped run whose archive/ links elsewhere, relaunched with a changed
    experiment (which archives); (4) a training run whose checkpoints/ is swapped for the link. Each is
    refused with one line (exit 2) and the other run's directory is byte-identical afterwards; restored,
    the run finishes as the reference."""
    out = Outcome(SYMLINK_CLASS, "symlinked-run-dirs")
    other = copy_run(env.ref, workdir / "other")
    before = tree(other)

    out.begin_fault()  # (1) a new run
    fresh = workdir / "fresh"
    fresh.mkdir()
    (fresh / "checkpoints").symlink_to(other / "checkpoints")
    rc, p = run_cmd(env.argv(fresh))
    one_line_exit(p, rc, 2, "is a symlink", out, "[new run, checkpoints/ linked to another run]")
    unchanged(other, before, out, "[new run]")
    if sorted(tree(fresh)) != ["checkpoints"]:
        out.fail(f"[new run]: the refused launch wrote {sorted(tree(fresh))}")

    out.begin_fault()  # (2) a stopped run
    run = copy_run(template, workdir / "stopped")
    (run / "checkpoints").rename(run / "checkpoints.own")
    (run / "checkpoints").symlink_to(other / "checkpoints")
    rc, p = run_cmd(env.argv(run))
    _refused_then_restored(
        p,
        rc,
        run,
        other,
        before,
        out,
        "stopped run, checkpoints/ linked to another run",
        "checkpoints/ a symlink: the line",
    )
    relaunch_and_compare(env, run, out, "[stopped run, restored]")

    out.begin_fault()  # (3) archive/ linked elsewhere, and an experiment change that would archive into it
    run = copy_run(template, workdir / "archive-link")
    elsewhere = workdir / "elsewhere"
    elsewhere.mkdir()
    if (run / "archive").exists():
        shutil.rmtree(run / "archive")
    (run / "archive").symlink_to(elsewhere)
    changed = write_fault_experiment(workdir / "changed-exp", eval_rows=8)
    rc, p = run_cmd(env.argv(run, "--allow-experiment-change", experiment=changed))
    one_line_exit(p, rc, 2, "is a symlink", out, "[archive/ linked elsewhere, experiment changed]")
    if any(elsewhere.iterdir()):
        out.fail(
            f"[archive/ linked elsewhere]: {sorted(x.name for x in elsewhere.iterdir())} written there", data_lost=1
        )
    (run / "archive").unlink()
    launch_and_compare(env, run, out, "[archive/ restored]")

    out.begin_fault()  # (4) swapped in while training
    run = copy_run(template, workdir / "swapped")
    gate = Gate(workdir / "gate", ENGINE.path)
    newest = _newest(run)
    gate.hold_after(newest + 3)  # no checkpoint is due there: the swap lands between two
    proxy = env.start(run, engine=gate.engine_flag)
    if not LogTail(run / ".loss.json").wait_step(newest + 3, proxy):
        out.fail(f"[swap while training]: the proxy exited early: {tail_lines(proxy.stderr)}")
    (run / "checkpoints").rename(run / "checkpoints.own")
    (run / "checkpoints").symlink_to(other / "checkpoints")
    gate.open()
    try:
        rc = proxy.finish(TIMEOUT)
    except Hang as exc:
        out.fail(f"[swap while training]: {exc}")
    _refused_then_restored(
        proxy,
        rc,
        run,
        other,
        before,
        out,
        "swap while training",
        "checkpoints/ swapped for a symlink while training: the line",
    )
    launch_and_compare(env, run, out, "[swap while training, restored]")
    return out.close()


# ---------------------------------------------------------------------------
# step numbers beyond what the engine can hold


def huge_step_numbers(env: ProxyEnv, template: Path, workdir: Path) -> Outcome:
    """The newest valid checkpoint copied to step_3000000000.bin (past the engine's int32 steps: no
    checkpoint name at all) and to step_2000000000.bin (a name whose header holds another step). Every
    command that picks a checkpoint (verify, export, sample, fork, pivot, run) runs under RLIMIT_AS 8 GiB
    and a time limit: no traceback, no MemoryError, the misnamed file passed over with one line; the run
    finishes as the reference, the stray files untouched."""
    out = Outcome(HUGE_STEP_CLASS, "huge-step-numbers")
    newest = list_checkpoints(template / "checkpoints")[0]
    strays = ("step_3000000000.bin", "step_2000000000.bin")

    def planted(name: str) -> Path:
        run = copy_run(template, workdir / name)
        for corpus in env.experiment.parent.glob("*.txt"):  # export and sample resolve sources in the run
            shutil.copy(corpus, run / corpus.name)
        for stray in strays:
            shutil.copy(newest, run / "checkpoints" / stray)
        return run

    run = planted("commands")
    cache = ("--cache-dir", env.cache)
    commands = [
        ("verify", proxy_cmd("verify", "--run-dir", run), 1, "its header holds step"),
        ("export", proxy_cmd("export", "--run-dir", run, "--out", workdir / "export", *cache), 0, None),
        (
            "sample",
            proxy_cmd(
                "sample", "--run-dir", run, "--prompt", "alpha ", "--max-new", 4, "--engine", ENGINE.flag, *cache
            ),
            0,
            None,
        ),
        ("fork", proxy_cmd("fork", "--run-dir", run, "--at", 3_000_000_000, "--to", workdir / "fork"), 0, None),
    ]
    for what, argv, code, needle in commands:
        out.begin_fault()
        t0 = time.monotonic()
        try:
            rc, p = run_cmd(argv, preexec_fn=memory_limit())
        except Hang as exc:
            out.fail(f"[{what}]: {exc}")
        no_traceback(p, out, f"[{what}]")
        text = p.stderr + "\n".join(p.lines)
        if rc != code or (needle and needle not in text) or "MemoryError" in text:
            out.fail(f"[{what}] with stray huge step numbers: exit {rc} (expected {code}): {tail_lines(text)}")
        out.note(f"{what}: seconds", round(time.monotonic() - t0, 2))
    if (workdir / "fork").is_dir():
        forked = list_checkpoints(workdir / "fork" / "checkpoints")
        if [p.name for p in forked] != [newest.name]:
            out.fail(f"[fork --at 3000000000]: forked {[p.name for p in forked]}, expected {newest.name}")

    out.begin_fault()  # an offline pivot
    run = planted("pivot")
    caps = workdir / "caps.json"
    caps.write_text(json.dumps({"caps": {"dots": 0.9, "semis": 0.9}, "floors": {"dots": 0.1, "semis": 0.1}}))
    rc, p = run_cmd(proxy_cmd("pivot", "--run-dir", run, "--caps", caps), preexec_fn=memory_limit())
    no_traceback(p, out, "[pivot]")
    phases = json.loads((run / "phases.json").read_text())
    if rc != 0 or phases[-1].get("start_step") != checkpoint_step(newest):
        out.fail(f"[pivot]: exit {rc}, phases {[ph.get('start_step') for ph in phases]}: {tail_lines(p.stderr)}")

    out.begin_fault()  # the run itself
    run = planted("run")
    try:
        rc, p = env.run(run, timeout=300, preexec_fn=memory_limit())
    except Hang as exc:
        out.fail(f"[run]: {exc}")
    no_traceback(p, out, "[run]")
    said = [ln for ln in p.stderr_lines() if "step_2000000000.bin" in ln and "its header holds step" in ln]
    if rc != 0 or len(said) != 1:
        out.fail(f"[run]: exit {rc}, expected 0 and one line passing over step_2000000000.bin: {p.stderr_lines()[-4:]}")
    else:
        out.note("run: the line", said[0])
    compare_with_reference(env, run, out, where="[run]")
    for stray in strays:
        if (run / "checkpoints" / stray).read_bytes() != newest.read_bytes():
            out.fail(f"[run]: {stray} changed or vanished", data_lost=1)
    return out.close()


# ---------------------------------------------------------------------------
# archive names


def archive_names(env: ProxyEnv, workdir: Path) -> Outcome:
    """Experiment changes archive the replaced frozen experiment as archive/experiment_<second>.json. Two in
    the same second (the clock held still, in-process) must make two files, neither replacing the other;
    two real relaunches of a finished run with two changed experiments (--allow-experiment-change) must
    leave both replaced versions, the original byte for byte. A receipt is never written over an existing
    name nor through a symlink left there."""
    from proxy.atomic import write_new
    from proxy.rundir import frozen
    from proxy.rundir.layout import RunDir

    out = Outcome(ARCHIVE_CLASS, "archive-names")
    out.begin_fault()  # the clock held still
    run = RunDir(workdir / "clock")
    run.create()
    with mock.patch.object(frozen.time, "time", return_value=1_800_000_000.0):
        frozen._archive(run, b"first\n")
        frozen._archive(run, b"second\n")
    got = [(p.name, p.read_bytes()) for p in frozen.replaced_experiments(run)]
    if got != [("experiment_1800000000.json", b"first\n"), ("experiment_1800000000_2.json", b"second\n")]:
        out.fail(f"two archives in one second: {got}", data_lost=1)

    out.begin_fault()  # write_new: never over a name, never through a symlink
    target = workdir / "outside.json"
    target.write_bytes(b"outside\n")
    (workdir / "receipt.json").symlink_to(target)
    try:
        write_new(workdir / "receipt.json", b"receipt\n")
        out.fail("write_new wrote over a symlink left under its name")
    except FileExistsError:
        pass
    if target.read_bytes() != b"outside\n":
        out.fail("write_new wrote through a symlink", data_lost=1)

    out.begin_fault()  # real relaunches of a finished run
    run_dir = copy_run(env.ref, workdir / "finished")
    original = (run_dir / "experiment.json").read_bytes()
    stamps = []
    for i, rows in enumerate((8, 12)):
        changed = write_fault_experiment(workdir / f"exp-{i}", eval_rows=rows)
        rc, p = run_cmd(env.argv(run_dir, "--allow-experiment-change", experiment=changed))
        stamps.append(time.time())
        no_traceback(p, out, f"[change {i + 1}]")
        if rc != 0:
            out.fail(f"[change {i + 1}]: exit {rc}: {tail_lines(p.stderr)}")
    archived = frozen.replaced_experiments(RunDir(run_dir))
    if len(archived) != 2 or archived[0].read_bytes() != original:
        out.fail(
            f"after two changes: archive holds {[p.name for p in archived]}; the original frozen experiment "
            f"{'kept' if archived and archived[0].read_bytes() == original else 'lost'}",
            data_lost=1,
        )
    out.note("two relaunches: archive names", [p.name for p in archived])
    out.note("two relaunches: seconds between them", round(stamps[1] - stamps[0], 2))
    return out.close()


# ---------------------------------------------------------------------------
# a checkpoint of another experiment


def foreign_checkpoint(env: ProxyEnv, template: Path, workdir: Path) -> Outcome:
    """A valid checkpoint of the same model, written by another experiment, copied into a stopped run's
    checkpoints/ under the next step's name (what `proxy run` used to resume from, with 51 determinism
    warnings): `proxy run` refuses with one line (exit 2), changing nothing; `proxy verify` says the next
    launch would stop; moved away, the run finishes as the reference."""
    out = Outcome(FOREIGN_CLASS, "foreign-checkpoint")
    exp = write_fault_experiment(workdir / "other-exp")
    data = json.loads(exp.read_text())
    data["name"] = "SOMEONE-ELSE"
    exp.write_text(json.dumps(data))
    other = workdir / "other-run"
    rc, p = env.run(other, experiment=exp, timeout=300)
    if rc != 0:
        out.fail(f"could not train the other experiment: {tail_lines(p.stderr)}")
    run = copy_run(template, workdir / "run")
    name = f"step_{(_newest(run) // env.ckpt_every + 1) * env.ckpt_every:06d}.bin"  # the next one the run writes
    shutil.copy(other / "checkpoints" / name, run / "checkpoints" / name)

    out.begin_fault()
    before = tree(run)
    rc, p = run_cmd(env.argv(run))
    line = one_line_exit(p, rc, 2, "foreign checkpoint", out, "[proxy run]")
    out.note("the line", line)
    if "SOMEONE-ELSE" not in line or name not in line:
        out.fail(f"[proxy run]: the line names neither the file nor the experiment: {line}")
    if tree(run) != before:
        out.fail("[proxy run]: the refused launch changed the run directory", data_lost=1)
    rc, v = run_cmd(proxy_cmd("verify", "--run-dir", run))
    no_traceback(v, out, "[verify]")
    if rc != 1 or "the next launch would stop" not in "\n".join(v.lines):
        out.fail(f"[verify]: exit {rc}: {v.lines[-3:]}")
    (run / "checkpoints" / name).rename(workdir / name)
    relaunch_and_compare(env, run, out, "[moved away]")
    return out.close()

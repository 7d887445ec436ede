"""Diverged runs: non-finite weights, a loss that leaves every sane bound, a resume point that is not one.

The adversarial test found a checkpoint with 135,168 of 136,960 weights infinite announced, verified and
resumed from in a crash loop, and a run whose loss reached 1.4e15 while finite, whose retention deleted
every good checkpoint. proxy/divergence.py defines "sane"; these scenarios check each half of the rule:

- the engine refuses to write a state with a non-finite weight or moment (exit 6, one line) and to load
  one (exit 3; `--resume latest` falls back past it);
- the proxy stops at the first step whose loss is not sane, and on the engine's exit 6, with one line
  naming the step and the newest sane checkpoint, never restarting the engine; a relaunch resumes there
  and stops the same way (no crash loop); retention (keep_last 1) never deletes the newest sane checkpoint;
  `proxy verify` and every resume pass over a checkpoint that is not sane or not finite.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from harness.data import make_shard
from harness.engine import Hang
from proxy.formats.checkpoint import checkpoint_step, list_checkpoints, verify_checkpoint

from .engine_scenarios import checkpoint_regions, with_crc
from .proxy_checks import one_line_exit, proxy_cmd, run_cmd, temp_files
from .proxy_harness import ProxyEnv, read_log, write_fault_experiment
from .proxy_scenarios import copy_run, relaunch_and_compare
from .scenarios import TINY, Outcome, run_standalone, tail_lines

DIVERGED_CLASS = "diverged runs (non-finite or insane loss and state)"


def _with_infinities(raw: bytes, count: int) -> bytes:
    """A checkpoint whose first `count` weights are +inf, its checksum recomputed: it verifies otherwise."""
    begin, _end = checkpoint_regions(raw)["weights"]
    b = bytearray(raw)
    for i in range(count):
        b[begin + 4 * i : begin + 4 * i + 4] = struct.pack("<f", float("inf"))
    return with_crc(bytes(b))


def _segments_of_launch(run: Path, before: set[int]) -> set[int]:
    return {int(e.get("segment", 0)) for e in read_log(run / ".loss.json").steps.values()} - before


def engine_non_finite(workdir: Path) -> Outcome:
    """The engine alone: (1) a learning rate that makes the first update overflow, a checkpoint due after
    it: exit 6 with one line saying the checkpoint was not written, no checkpoint and no temp file left;
    (2) a valid checkpoint with infinite weights (checksum fixed) given to --resume: exit 3, one line;
    under --resume latest the engine passes over it to the older valid one."""
    out = Outcome(DIVERGED_CLASS, "engine-non-finite")
    shard = make_shard(workdir / "tiny.tok", TINY.vocab)

    out.begin_fault()
    ck = workdir / "overflow"
    huge = TINY.but(steps=1, warmup=0, lr=3.4e38, min_lr=3.4e38)
    rc, p = run_standalone(huge, shard, ck, 1, resume=None)
    errors = [ln for ln in p.stderr.splitlines() if "error" in ln]
    if rc != 6 or len(errors) != 1 or "not written" not in errors[0] or "not finite" not in errors[0]:
        out.fail(
            f"[overflowing update]: exit {rc}, errors {errors}; expected exit 6 and one line saying the "
            "checkpoint was not written"
        )
    else:
        out.note("engine refusing a non-finite state: the line", errors[0])
    left = sorted(p.name for p in ck.iterdir()) if ck.exists() else []
    if left:
        out.fail(f"[overflowing update]: left {left} in the checkpoint directory")

    out.begin_fault()
    good = workdir / "good"
    rc, p = run_standalone(TINY.but(steps=4), shard, good, 2, resume=None)
    if rc != 0:
        out.fail(f"could not train the tiny model: {tail_lines(p.stderr)}")
    bad = _with_infinities((good / "step_000004.bin").read_bytes(), 1000)
    (good / "step_000004.bin").write_bytes(bad)
    rc, p = run_standalone(TINY.but(steps=4), shard, good, 2, resume=good / "step_000004.bin")
    errors = [ln for ln in p.stderr.splitlines() if "error" in ln]
    if rc != 3 or len(errors) != 1 or "not finite" not in errors[0]:
        out.fail(f"[--resume a non-finite checkpoint]: exit {rc}, errors {errors}; expected exit 3, one line")
    rc, p = run_standalone(TINY.but(steps=4), shard, good, 2, resume="latest")
    ready = p.of("ready")
    if rc != 0 or not ready or int(ready[0]["step"]) != 2 or "not finite" not in p.stderr:
        out.fail(
            f"[--resume latest past a non-finite checkpoint]: exit {rc}, resumed "
            f"{ready[0]['step'] if ready else None}: {tail_lines(p.stderr)}"
        )
    return out.close()


def _diverging_experiment(directory: Path, lr: float, **train) -> Path:
    return write_fault_experiment(directory, lr=lr, min_lr=lr / 10, **train)


def proxy_divergence(env: ProxyEnv, template: Path, workdir: Path) -> Outcome:
    """`proxy run` of an experiment whose loss leaves the sane bound at step 6 (lr 1, ckpt_every 1,
    keep_last 1): exit 6 and one last line naming step 6 and the newest sane checkpoint, one engine
    launch, that checkpoint kept by retention; relaunched, it resumes there, replays the same steps bit for
    bit and stops the same way; `proxy verify` resumes from it, passing over the one the stop wrote.
    An lr of 3.4e38 (the engine's own non-finite check, exit 6): the proxy stops at once, one launch.
    A stopped run whose newest checkpoint holds infinite weights (its checksum fixed): the relaunch passes
    over it with one line and finishes as the reference."""
    out = Outcome(DIVERGED_CLASS, "proxy-divergence")

    out.begin_fault()  # the loss leaves the bound
    exp = _diverging_experiment(workdir / "exp-lr1", 1.0, ckpt_every=1, keep_last=1, eval_every=0, sample_every=0)
    run = workdir / "lr1"
    lines = []
    for launch in (1, 2):
        before = {int(e.get("segment", 0)) for e in read_log(run / ".loss.json").steps.values()}
        first_log = read_log(run / ".loss.json").steps
        try:
            rc, p = env.run(run, experiment=exp, timeout=300)
        except Hang as exc:
            out.fail(f"[lr 1, launch {launch}]: {exc}")
        line = one_line_exit(p, rc, 6, "the run diverged at step", out, f"[lr 1, launch {launch}]")
        lines.append(line)
        new = _segments_of_launch(run, before)
        if len(new) != 1:
            out.fail(f"[lr 1, launch {launch}]: {len(new)} engine segments in one launch: the engine was restarted")
        state = json.loads((run / ".state.json").read_text())
        if state.get("status") != "diverged":
            out.fail(f"[lr 1, launch {launch}]: .state.json status {state.get('status')!r}")
        if launch == 2:
            again = read_log(run / ".loss.json").steps
            replayed = [s for s, e in again.items() if s in first_log and e.get("segment") in new]
            differ = [s for s in replayed if any(first_log[s][k] != again[s][k] for k in ("loss", "grad_norm"))]
            if not replayed or differ:
                out.fail(f"[lr 1, relaunch]: replayed steps {replayed}, differing {differ}")
    if len(lines) == 2 and lines[0] and lines[1]:
        out.note("a run whose loss leaves the bound: the line", lines[0])
        if lines[0] != lines[1]:
            out.fail(f"[lr 1]: the relaunch stopped differently: {lines[1]!r} vs {lines[0]!r}")
        kept = sorted(checkpoint_step(p) for p in list_checkpoints(run / "checkpoints"))
        named = [s for s in kept if f"step_{s:06d}.bin" in lines[0]]
        if not named:
            out.fail(
                f"[lr 1]: the newest sane checkpoint the line names is gone (kept {kept}): {lines[0]}", data_lost=1
            )
        out.note("lr 1: checkpoints kept with keep_last 1", kept)
        rc, v = run_cmd(proxy_cmd("verify", "--run-dir", run))
        text = "\n".join(v.lines)
        if not named or f"resumes from checkpoints/step_{named[0]:06d}.bin" not in text or "diverged" not in text:
            out.fail(f"[lr 1, verify]: {v.lines[-4:]}")

    out.begin_fault()  # the engine's own check (non-finite loss): exit 6 from the engine
    exp = _diverging_experiment(workdir / "exp-huge", 3.4e38)
    run = workdir / "huge"
    try:
        rc, p = env.run(run, experiment=exp, timeout=300)
        line = one_line_exit(p, rc, 6, "the run diverged at step", out, "[lr 3.4e38]")
        out.note("the engine's exit 6: the line", line)
        if len(_segments_of_launch(run, set())) > 1:
            out.fail("[lr 3.4e38]: the engine was restarted")
        if "engine" not in (line or ""):
            out.fail(f"[lr 3.4e38]: the line does not say the engine stopped it: {line}")
    except Hang as exc:
        out.fail(f"[lr 3.4e38]: {exc}")
    for p in list_checkpoints(run / "checkpoints"):
        if verify_checkpoint(p) is not None:
            out.fail(f"[lr 3.4e38]: {p.name} left behind does not verify: {verify_checkpoint(p)}")
    if temp_files(run):
        out.fail(f"[lr 3.4e38]: temp files left: {temp_files(run)}")

    out.begin_fault()  # a non-finite checkpoint as the newest of a stopped run
    run = copy_run(template, workdir / "planted")
    newest = list_checkpoints(run / "checkpoints")[0]
    newest.write_bytes(_with_infinities(newest.read_bytes(), 1000))
    rc, v = run_cmd(proxy_cmd("verify", "--run-dir", run))
    row = [ln for ln in v.lines if newest.name in ln and "corrupt" in ln]
    if rc != 1 or not row or "not finite" not in row[0]:
        out.fail(f"[verify of a non-finite checkpoint]: exit {rc}, {v.lines[:6]}")
    p = relaunch_and_compare(env, run, out, "[non-finite newest checkpoint]")
    if p is not None and not any("not resuming from" in ln and "not finite" in ln for ln in p.stderr_lines()):
        out.fail(f"[non-finite newest checkpoint]: passed over without a line: {p.stderr_lines()[-4:]}")
    return out.close()

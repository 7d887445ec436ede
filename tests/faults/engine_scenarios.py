"""The engine's fault scenarios (tests/faults/test_kills.py, test_checkpoints.py, test_disk.py, test_signals.py,
test_fuzz.py): kill storms, corrupt checkpoints, failed writes, signals in a write, malformed frames.

The shared parts (Outcome, the model shapes, the checkpoint watcher) are in scenarios.py, whose
docstring says how every scenario is built and seeded.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.engine import TIMEOUT, Child, Hang
from harness.shape import Shape
from proxy.formats import frames
from proxy.formats.checkpoint import FOOTER_BYTES as FOOTER
from proxy.formats.checkpoint import TRAILER_FIXED_BYTES as TRAILER_FIXED
from proxy.formats.checkpoint import body_bytes, list_checkpoints, verify_checkpoint
from proxy.formats.engine_cli import engine_args

from .scenarios import (
    ENGINE,
    LARGE,
    TINY,
    CkptWatch,
    Outcome,
    compare_files,
    fsize_limit,
    reference_run,
    rng_for,
    run_standalone,
    same_path,
    start_standalone,
    step_record,
    tail_lines,
    temps_in,
)

# ---------------------------------------------------------------------------
# engine scenarios


def engine_kill_storm(
    workdir: Path,
    model: Shape,
    ckpt_every: int,
    n_kills: int,
    modes: dict[str, float],
    name: str,
    fault_class: str,
    ref_every: int | None = None,
) -> Outcome:
    """SIGKILL a standalone engine at seeded random moments, relaunch with `--resume latest`.

    Modes: "startup" (a few ms after exec: loading, stale-temp cleanup), "step" (right after a
    step event), "ckpt" (right after a ckpt event), "write" (after the step event of a
    checkpointing step, at a random offset within the measured write time: inside the write).
    After every kill: every step_*.bin verifies, no valid one vanished. At every launch: it
    resumes from the newest valid checkpoint and no temp file survives. Every step event
    (including replays) equals the uninterrupted run's; at the end the checkpoints are
    byte-identical to the uninterrupted run's.
    """
    out = Outcome(fault_class, name)
    rng = rng_for(name)
    shard, ref_dir, rc, ref = reference_run(workdir, model, ckpt_every if ref_every is None else ref_every)
    if rc != 0:
        out.fail(f"uninterrupted run exited {rc}: {tail_lines(ref.stderr)}")
    ref_steps = {int(e["step"]): step_record(e) for e in ref.of("step")}
    write_ms = max([float(e["ms"]) for e in ref.of("ckpt")] + [5.0])
    ck = workdir / "ck"
    watch = CkptWatch(ck)
    kills = launches = 0
    stale: set[str] = set()
    mode_names, weights = zip(*modes.items(), strict=False)
    while True:
        expect_path, expect_step = watch.newest_valid()
        p = start_standalone(model, shard, ck, ckpt_every)
        launches += 1
        mode = rng.choices(mode_names, weights)[0] if kills < n_kills and expect_step < model.steps - 1 else None
        if mode == "startup":
            time.sleep(rng.uniform(0.0, 0.03))
        else:
            ready = p.wait_event("ready", TIMEOUT)
            if ready is None:
                out.fail(f"launch {launches}: no ready event (rc {p.wait()}): {tail_lines(p.stderr)}")
            if int(ready["step"]) != expect_step or not same_path(ready["resumed_from"], expect_path):
                out.fail(
                    f"launch {launches}: resumed at step {ready['step']} from {ready['resumed_from']}, "
                    f"expected the newest valid checkpoint {expect_path} (step {expect_step})"
                )
            out.end_fault()  # the previous kill is judged once this launch resumed correctly
        if mode is None:
            try:
                rc = p.finish(TIMEOUT)
            except Hang as exc:
                out.fail(f"final launch: {exc}")
            if rc != 0 or not p.of("exit") or p.of("exit")[-1]["reason"] != "done":
                out.fail(f"final launch exited {rc} (events {[e.kind for e in p.events[-3:]]}): {tail_lines(p.stderr)}")
            _check_steps(p, ref_steps, out, f"launch {launches}")
            _check_temps_removed(p, stale, out, f"launch {launches}")
            break
        if mode == "step":
            target = min(model.steps - 1, expect_step + rng.randint(1, 2 * ckpt_every))
            p.wait_event("step", TIMEOUT, lambda e: int(e["step"]) >= target)
            time.sleep(rng.uniform(0.0, 0.004))
        elif mode == "ckpt":
            p.wait_event("ckpt", TIMEOUT, lambda e: int(e["step"]) > expect_step)
        elif mode == "write":
            first = (expect_step // ckpt_every + 1 + rng.randint(0, 1)) * ckpt_every
            target = min(first, (model.steps - 1) // ckpt_every * ckpt_every)
            if target <= expect_step:
                target = expect_step + 1
            p.wait_event("step", TIMEOUT, lambda e: int(e["step"]) >= target)
            time.sleep(rng.uniform(0.0, 1.3 * write_ms / 1000.0))
        killed = p.send_signal(signal.SIGKILL)
        rc = p.wait()
        for e in p.of("ckpt"):
            write_ms = max(write_ms, float(e["ms"]))
        _check_steps(p, ref_steps, out, f"launch {launches}")
        if mode != "startup":
            _check_temps_removed(p, stale, out, f"launch {launches}")
        stale = set(temps_in(ck))  # no engine runs now: every temp file is stale
        if rc != -signal.SIGKILL or not killed:
            out.bump("launches that ended before the kill landed")
            if rc != 0:
                out.fail(f"launch {launches} exited {rc} before it was killed: {tail_lines(p.stderr)}")
            continue
        kills += 1
        out.begin_fault()
        out.bump(f"kills: {mode}")
        if stale:
            out.bump("kills that landed inside a checkpoint write (temp file left)")
        watch.check(out, f"after kill {kills} ({mode})")
        _, newest = watch.newest_valid()
        out.steps_lost += max(0, p.last_step(expect_step) - newest)
    out.note("launches", launches)
    compared = compare_files(ref_dir, ck, out, what="final: ")
    final = f"step_{model.steps:06d}.bin"
    if not (ck / final).exists():
        out.fail(f"final checkpoint {final} missing", data_lost=1)
    elif ref_every is not None:
        compare_files(ref_dir, ck, out, names=[final], what="final: ")
    if ref_every is None:
        ref_names = sorted(p.name for p in list_checkpoints(ref_dir))
        got_names = sorted(p.name for p in list_checkpoints(ck))
        if ref_names != got_names:
            out.fail(
                f"final: checkpoint set differs from the uninterrupted run's: "
                f"missing {sorted(set(ref_names) - set(got_names))}, extra {sorted(set(got_names) - set(ref_names))}",
                data_lost=len(set(ref_names) - set(got_names)),
            )
    out.note("checkpoints compared byte for byte", compared)
    return out.close()


def _check_temps_removed(p: Child, stale: set, out: Outcome, where: str) -> None:
    """An engine that got as far as `ready` removed every stale temp file (and said so on stderr)."""
    for name in sorted(stale):
        if not any("removed stale temp file" in ln and ln.endswith("/" + name) for ln in p.stderr_lines()):
            out.fail(f"{where}: stale temp file {name} was not removed at startup (stderr: {tail_lines(p.stderr)!r})")


def _check_steps(p: Child, ref_steps: dict, out: Outcome, where: str) -> None:
    if p.bad_lines:
        out.fail(f"{where}: stdout lines that are not events: {p.bad_lines[:3]}")
    for e in p.of("step"):
        s = int(e["step"])
        if ref_steps.get(s) != step_record(e):
            out.fail(
                f"{where}: step {s} differs from the uninterrupted run: {step_record(e)} != {ref_steps.get(s)}",
                data_lost=1,
            )


# ---------------------------------------------------------------------------
# corrupted checkpoints


def checkpoint_regions(raw: bytes) -> dict[str, tuple[int, int]]:
    """Byte ranges [begin, end) of every region of a checkpoint with a trailer (docs/FORMATS.md)."""
    n = int(np.frombuffer(raw, "<i4", 1, 4)[0])
    body = body_bytes(n)
    size = len(raw)
    return {
        "step": (0, 4),
        "n_params": (4, 8),
        "weights": (8, 8 + 4 * n),
        "adam_m": (8 + 4 * n, 8 + 8 * n),
        "adam_v": (8 + 8 * n, body),
        "trailer fixed part": (body, body + TRAILER_FIXED),
        "trailer meta JSON": (body + TRAILER_FIXED, size - FOOTER),
        "footer trailer_bytes": (size - FOOTER, size - FOOTER + 8),
        "footer crc": (size - 16, size - 12),
        "footer end magic": (size - 8, size),
    }


# The reasons a rejection may give for each corruption (the engine's and proxy.formats.checkpoint's wording).
SIZE_REASONS = ("truncated", "does not match", "not a microgpt checkpoint", "no end magic", "trailer truncated")
REGION_REASONS = {
    "step": ("checksum mismatch", "not a microgpt checkpoint"),  # the sign bit makes the step negative
    "n_params": SIZE_REASONS,
    "weights": ("checksum mismatch",),
    "adam_m": ("checksum mismatch",),
    "adam_v": ("checksum mismatch",),
    "trailer fixed part": ("checksum mismatch",),
    "trailer meta JSON": ("checksum mismatch",),
    "footer trailer_bytes": ("does not match",),
    "footer crc": ("checksum mismatch",),
    "footer end magic": ("no end magic",),
}


def flip_bit(raw: bytes, bit: int) -> bytes:
    b = bytearray(raw)
    b[bit // 8] ^= 1 << (bit % 8)
    return bytes(b)


def with_crc(raw: bytes) -> bytes:
    """Recompute the footer CRC (so that only a size or shape check can catch a change)."""
    b = bytearray(raw)
    b[-16:-12] = (zlib.crc32(bytes(b[:-16])) & 0xFFFFFFFF).to_bytes(4, "little")
    return bytes(b)


@dataclass
class Corruption:
    name: str
    data: bytes
    reasons: tuple  # expected reason words; empty: loads as a bare ANDREA file (with a warning)
    latest_fallback: bool = True  # under --resume latest the engine skips it and loads the older one


def corruptions(
    valid: bytes, other_shape: bytes, rng: random.Random, flips_per_region: int = 2, truncations: int = 3
) -> list[Corruption]:
    """Every corruption of `valid` (a step-4 checkpoint of TINY) the scenario tries."""
    regions = checkpoint_regions(valid)
    n = int(np.frombuffer(valid, "<i4", 1, 4)[0])
    body = body_bytes(n)
    cases = []
    for region, (begin, end) in regions.items():
        for _ in range(flips_per_region):
            bit = rng.randrange(begin * 8, end * 8)
            cases.append(
                Corruption(f"bit {bit - begin * 8} of {region} flipped", flip_bit(valid, bit), REGION_REASONS[region])
            )
    lengths = {0, 7, body - 1, body + 1, len(valid) - 1}
    while len(lengths) < 5 + truncations:
        cut = rng.randrange(0, len(valid))
        if cut != body:  # exactly the body is a bare ANDREA file, which loads by design
            lengths.add(cut)
    for cut in sorted(lengths):
        cases.append(Corruption(f"truncated to {cut} of {len(valid)} bytes", valid[:cut], SIZE_REASONS))
    # n_params one more, CRC recomputed: only the size check can catch it
    wrong_n = bytearray(valid)
    wrong_n[4:8] = (n + 1).to_bytes(4, "little")
    cases.append(Corruption("n_params + 1 (CRC recomputed)", with_crc(bytes(wrong_n)), SIZE_REASONS))
    # n_params 32 fewer and every region cut to match, CRC recomputed: the trailer's shape disagrees
    k = n - 32
    f = np.frombuffer(valid, "<f4", 3 * n, 8)
    short = (
        np.array([4, k], "<i4").tobytes()
        + f[:k].tobytes()
        + f[n : n + k].tobytes()
        + f[2 * n : 2 * n + k].tobytes()
        + valid[body:]
    )
    cases.append(
        Corruption(
            "n_params 32 fewer, consistent sizes (CRC recomputed)", with_crc(short), ("does not match the shape",)
        )
    )
    cases.append(
        Corruption(
            "a checkpoint of another model shape (dim 16)", other_shape, ("shape mismatch",), latest_fallback=False
        )
    )
    cases.append(
        Corruption(
            "bare ANDREA file of another model shape",
            other_shape[: body_bytes(int(np.frombuffer(other_shape, "<i4", 1, 4)[0]))],
            ("shape mismatch",),
            latest_fallback=False,
        )
    )
    foreign_rng = np.random.default_rng(rng.randrange(2**32))
    cases.append(Corruption("foreign file: empty", b"", SIZE_REASONS))
    cases.append(Corruption("foreign file: text", b"this is not a checkpoint\n" * 20, SIZE_REASONS))
    cases.append(Corruption("foreign file: 4 KiB of random bytes", foreign_rng.bytes(4096), SIZE_REASONS))
    cases.append(Corruption("foreign file: a PNG header", b"\x89PNG\r\n\x1a\n" + foreign_rng.bytes(600), SIZE_REASONS))
    shard = (
        b"MGPTTOKS"
        + (1).to_bytes(4, "little")
        + (64).to_bytes(4, "little")
        + (100).to_bytes(8, "little")
        + bytes(8)
        + foreign_rng.integers(0, 64, 100, dtype="<u2").tobytes()
    )
    cases.append(Corruption("foreign file: a token shard", shard, SIZE_REASONS))
    cases.append(Corruption("bare ANDREA file (no trailer)", valid[:body], ()))
    return cases


def engine_corruption(
    workdir: Path, name: str = "engine-corrupt-checkpoints", fault_class: str = "corrupted checkpoint (engine loader)"
) -> Outcome:
    """Corrupt the newest of two checkpoints in every documented way; resume explicitly and with latest.

    Rejected files: exit 3 with one line naming the reason, the file untouched, nothing written;
    `--resume latest` skips it with a warning and resumes from the older one, and the run ends
    byte-identical to the uninterrupted run. A bare ANDREA file loads with a warning. The Python
    verifier (the proxy's) rejects the same files.
    """
    out = Outcome(fault_class, name)
    rng = rng_for(name)
    model = TINY.but(steps=6)
    shard, ref_dir, rc, ref = reference_run(workdir, model, 2)
    other_dir = workdir / "other"
    rc2, _ = run_standalone(model.but(dim=16, steps=4), shard, other_dir, 0, resume=None)
    if rc or rc2:
        out.fail(f"reference runs failed: {rc} {rc2} {tail_lines(ref.stderr)}")
    valid = (ref_dir / "step_000004.bin").read_bytes()
    final_ref = (ref_dir / "step_000006.bin").read_bytes()
    cases = corruptions(valid, (other_dir / "step_000004.bin").read_bytes(), rng)
    kinds: dict[str, int] = {}
    for case in cases:
        kind = (
            "bit flip"
            if case.name.startswith("bit ")
            else "truncation"
            if case.name.startswith("truncated")
            else "foreign file"
            if case.name.startswith("foreign")
            else case.name
        )
        kinds[kind] = kinds.get(kind, 0) + 1
    out.note("cases", kinds)
    out.note("regions with bit flips", sorted(checkpoint_regions(valid)))
    for i, case in enumerate(cases):
        out.begin_fault()
        where = f"[{case.name}]"
        # the proxy's verifier
        d = workdir / f"case{i:02d}"
        reason = verify_checkpoint(_plant(d / "ck", ref_dir, case.data))
        if case.reasons and (reason is None or not any(r in reason for r in case.reasons)) and case.latest_fallback:
            out.fail(
                f"{where} proxy.formats.checkpoint.verify_checkpoint said {reason!r}, expected one of {case.reasons}"
            )
        # explicit --resume FILE
        target = d / "ck" / "step_000004.bin"
        rc, p = run_standalone(model, shard, d / "ck", 2, resume=target)
        lines = p.stderr_lines()
        if case.reasons:
            if rc != 3:
                out.fail(f"{where} --resume FILE exited {rc}, expected 3; stderr {lines[-3:]}")
            errors = [ln for ln in lines if ln.startswith("microgpt: error:")]
            others = [ln for ln in lines if ln not in errors and not ln.startswith("microgpt: warning:")]
            if others or len(errors) != 1 or not any(r in errors[0] for r in case.reasons):
                out.fail(f"{where} --resume FILE: expected one error line naming one of {case.reasons}; got {lines}")
            if target.read_bytes() != case.data:
                out.fail(f"{where} the rejected file was modified")
            if (d / "ck" / "step_000006.bin").exists() or len(p.of("error")) != 1:
                out.fail(f"{where} a rejected resume wrote a checkpoint or did not emit one error event")
        else:
            ready = p.of("ready")
            if rc != 0 or not ready or int(ready[0]["step"]) != 4 or "no trailer" not in p.stderr:
                out.fail(f"{where} bare file: exit {rc}, ready {ready[:1]}, stderr {lines}")
            elif (d / "ck" / "step_000006.bin").read_bytes() != final_ref:
                out.fail(f"{where} run resumed from the bare file differs from the uninterrupted run", data_lost=1)
        # --resume latest: skip and fall back to step 2 (or load the bare file)
        if not case.latest_fallback:
            continue
        d2 = workdir / f"case{i:02d}-latest"
        _plant(d2 / "ck", ref_dir, case.data)
        rc, p = run_standalone(model, shard, d2 / "ck", 2, resume="latest")
        ready = p.of("ready")
        want = 4 if not case.reasons else 2
        if (
            rc != 0
            or not ready
            or int(ready[0]["step"]) != want
            or not same_path(ready[0]["resumed_from"], d2 / "ck" / f"step_{want:06d}.bin")
        ):
            out.fail(
                f"{where} --resume latest: exit {rc}, ready {ready[0].fields if ready else None}, expected "
                f"a resume from step {want}; stderr {p.stderr_lines()[-3:]}"
            )
        if case.reasons and not any("skipping" in ln and any(r in ln for r in case.reasons) for ln in p.stderr_lines()):
            out.fail(
                f"{where} --resume latest skipped the file without a warning naming the reason: {p.stderr_lines()}"
            )
        out.steps_lost += 4 - want
        got = d2 / "ck" / "step_000006.bin"
        if not got.exists() or got.read_bytes() != final_ref:
            out.fail(
                f"{where} --resume latest: the run's final checkpoint differs from the uninterrupted run's", data_lost=1
            )
        shutil.rmtree(d, ignore_errors=True)
        shutil.rmtree(d2, ignore_errors=True)
    return out.close()


def _plant(ck: Path, ref_dir: Path, newest: bytes) -> Path:
    """A checkpoint dir holding the reference step 2 and `newest` as step 4."""
    ck.mkdir(parents=True, exist_ok=True)
    shutil.copy(ref_dir / "step_000002.bin", ck / "step_000002.bin")
    target = ck / "step_000004.bin"
    target.write_bytes(newest)
    return target


# ---------------------------------------------------------------------------
# full disk and write errors


def try_mount_tmpfs(mountpoint: Path, size_bytes: int) -> str | None:
    """Mount a tmpfs of `size_bytes`; None on success, else why not."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or not shutil.which("mount"):
        return "not root, or no mount(8)"
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(mountpoint)], capture_output=True, text=True
    )
    return None if r.returncode == 0 else (r.stderr.strip() or f"mount exited {r.returncode}")


def umount(mountpoint: Path) -> None:
    subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True)


def _check_failed_save(p: Child, rc: int, ck: Path, before: dict, out: Outcome, where: str, strerror: str) -> None:
    """A checkpoint save that failed: exit 5, one clear line, old checkpoints intact, nothing partial."""
    lines = p.stderr_lines()
    if rc != 5:
        out.fail(f"{where}: exit {rc}, expected 5 (I/O); stderr {lines[-3:]}")
    if len(lines) != 1 or not lines[0].startswith("microgpt: error: checkpoint at step") or strerror not in lines[0]:
        out.fail(
            f"{where}: expected one line 'microgpt: error: checkpoint at step N failed (... {strerror})'; got {lines}"
        )
    errors = p.of("error")
    if len(errors) != 1 or int(errors[0]["code"]) != 5:
        out.fail(f"{where}: expected one error event with code 5; got {[e.fields for e in errors]}")
    now = {q.name: q.read_bytes() for q in list_checkpoints(ck)}
    for name, data in before.items():
        if now.get(name) != data:
            out.fail(f"{where}: {name} changed or vanished after the failed save", data_lost=1)
    extra = sorted(set(now) - set(before))
    if extra:
        out.fail(f"{where}: a failed save left step files a loader would take: {extra}")
    if temps_in(ck):
        out.fail(f"{where}: temp files left behind: {temps_in(ck)}")


def engine_disk_full_tmpfs(
    workdir: Path, name: str = "engine-disk-full-tmpfs", fault_class: str = "full disk during a checkpoint (engine)"
) -> Outcome | str:
    """The checkpoint directory on a tmpfs that holds five checkpoints: the sixth save fails with
    ENOSPC. Then the files are copied to a roomy disk and the run resumes to the end, byte-identical."""
    out = Outcome(fault_class, name)
    model = TINY.but(steps=10)
    shard, ref_dir, rc, ref = reference_run(workdir, model, 1)
    if rc:
        out.fail(f"uninterrupted run exited {rc}")
    size = (ref_dir / "step_000001.bin").stat().st_size
    pages = -(-size // 4096)
    mnt = workdir / "mnt"
    why = try_mount_tmpfs(mnt, (5 * pages + 1) * 4096)
    if why is not None:
        return f"cannot mount a tmpfs here ({why})"
    try:
        ck = mnt / "ck"
        ck.mkdir()
        out.begin_fault()
        rc, p = run_standalone(model, shard, ck, 1, resume="latest")
        saved = [int(e["step"]) for e in p.of("ckpt")]
        before = {q.name: q.read_bytes() for q in list_checkpoints(ck)}
        if not saved or set(before) != {f"step_{s:06d}.bin" for s in saved}:
            out.fail(f"checkpoints on disk {sorted(before)} do not match the ckpt events {saved}")
        _check_failed_save(p, rc, ck, before, out, "save on a full tmpfs", "No space left on device")
        out.steps_lost += max(0, p.last_step() - max(saved, default=0))
        out.note("checkpoints that fit before the disk was full", len(saved))
        compare_files(ref_dir, ck, out, what="before the full disk: ")
        roomy = workdir / "roomy"
        shutil.copytree(ck, roomy)
    finally:
        umount(mnt)
    rc, p = run_standalone(model, shard, roomy, 1, resume="latest")
    ready = p.of("ready")
    if rc != 0 or not ready or int(ready[0]["step"]) != max(saved, default=0):
        out.fail(f"resume after freeing space: exit {rc}, ready {ready[:1]}; {p.stderr_lines()[-3:]}")
    compare_files(ref_dir, roomy, out, names=[f"step_{model.steps:06d}.bin"], what="after freeing space: ")
    return out.close()


def engine_write_error_rlimit(
    workdir: Path,
    n_trials: int = 3,
    name: str = "engine-write-error-rlimit",
    fault_class: str = "write error during a checkpoint (engine, EFBIG)",
) -> Outcome:
    """RLIMIT_FSIZE below one checkpoint: the next save fails with EFBIG partway (seeded limits,
    including 0). Exit 5, one line, the previous checkpoints intact, no partial file; a relaunch
    without the limit resumes from the newest valid checkpoint and ends byte-identical."""
    out = Outcome(fault_class, name)
    rng = rng_for(name)
    model = TINY.but(steps=8)
    shard, ref_dir, rc, _ = reference_run(workdir, model, 2)
    size = (ref_dir / "step_000002.bin").stat().st_size
    limits = [0] + [rng.randrange(1, size) for _ in range(n_trials - 1)]
    for i, limit in enumerate(limits):
        ck = workdir / f"trial{i}"
        ck.mkdir()
        for s in (2, 4):
            shutil.copy(ref_dir / f"step_{s:06d}.bin", ck)
        before = {q.name: q.read_bytes() for q in list_checkpoints(ck)}
        out.begin_fault()
        rc, p = run_standalone(model, shard, ck, 2, resume="latest", preexec_fn=fsize_limit(limit))
        _check_failed_save(p, rc, ck, before, out, f"RLIMIT_FSIZE={limit}", "File too large")
        out.steps_lost += max(0, p.last_step(4) - 4)
        rc, p = run_standalone(model, shard, ck, 2, resume="latest")
        ready = p.of("ready")
        if rc != 0 or not ready or int(ready[0]["step"]) != 4:
            out.fail(f"RLIMIT_FSIZE={limit}: relaunch without the limit: exit {rc}, ready {ready[:1]}")
        compare_files(ref_dir, ck, out, names=["step_000006.bin", "step_000008.bin"], what=f"limit {limit}: ")
    out.note("RLIMIT_FSIZE values (bytes)", limits)
    out.note("checkpoint size (bytes)", size)
    return out.close()


# ---------------------------------------------------------------------------
# signals


def engine_sigterm_in_write(
    workdir: Path,
    n_trials: int = 4,
    name: str = "engine-sigterm-in-write",
    fault_class: str = "SIGTERM during a checkpoint write (engine)",
) -> Outcome:
    """SIGTERM at a random offset inside a 22 MB checkpoint write: the write completes, the engine
    exits 0 with `exit` reason signal and a valid checkpoint of its last step; the relaunches end
    byte-identical to the uninterrupted run."""
    out = Outcome(fault_class, name)
    rng = rng_for(name)
    model = LARGE.but(steps=2 * n_trials + 2)
    shard, ref_dir, rc, ref = reference_run(workdir, model, 0)
    ref_steps = {int(e["step"]): step_record(e) for e in ref.of("step")}
    write_ms = max([float(e["ms"]) for e in ref.of("ckpt")] + [20.0])
    ck = workdir / "ck"
    watch = CkptWatch(ck)
    for trial in range(n_trials):
        _, start = watch.newest_valid()
        p = start_standalone(model, shard, ck, 1)
        target = start + rng.randint(1, 2)
        p.wait_event("step", TIMEOUT, lambda e: int(e["step"]) >= target)
        time.sleep(rng.uniform(0.0, 0.9 * write_ms / 1000.0))
        in_write = bool(temps_in(ck))
        out.begin_fault()
        p.send_signal(signal.SIGTERM)
        try:
            rc = p.finish(TIMEOUT)
        except Hang as exc:
            out.fail(f"trial {trial}: {exc}")
        out.bump("SIGTERMs that landed inside a checkpoint write (temp file present)", int(in_write))
        exits = p.of("exit")
        last = p.last_step(start)
        if rc != 0 or not exits or exits[-1]["reason"] != "signal" or int(exits[-1]["step"]) != last:
            out.fail(
                f"trial {trial}: exit {rc}, exit events {[e.fields for e in exits]}, last step {last}; "
                f"{p.stderr_lines()[-3:]}"
            )
        ckpts = [int(e["step"]) for e in p.of("ckpt")]
        if not ckpts or ckpts[-1] != last:
            out.fail(f"trial {trial}: the last checkpoint event is for step {ckpts[-1:]} but step {last} was trained")
        watch.check(out, f"after SIGTERM {trial}")
        if watch.newest_valid()[1] != last:
            out.fail(f"trial {trial}: newest valid checkpoint is step {watch.newest_valid()[1]}, not {last}")
        if temps_in(ck):
            out.fail(f"trial {trial}: temp files left after a clean exit: {temps_in(ck)}")
        _check_steps(p, ref_steps, out, f"trial {trial}")
    write_ms = max([write_ms] + [float(e["ms"]) for e in p.of("ckpt")])
    out.note("checkpoint write time (ms, max seen)", round(write_ms, 1))
    rc, p = run_standalone(model, shard, ck, 1)
    if rc != 0:
        out.fail(f"final relaunch exited {rc}: {p.stderr_lines()[-3:]}")
    _check_steps(p, ref_steps, out, "final relaunch")
    compare_files(ref_dir, ck, out, names=[f"step_{model.steps:06d}.bin"], what="final: ")
    return out.close()


def engine_sigusr1_storm(
    workdir: Path, n_signals: int = 200, name: str = "engine-sigusr1-storm", fault_class: str = "SIGUSR1 storm (engine)"
) -> Outcome:
    """200 SIGUSR1 at random short intervals while training: training goes on, every checkpoint
    verifies, every step's loss equals an unsignalled run's, the final checkpoint is byte-identical,
    and a run resumed from a randomly chosen SIGUSR1 checkpoint ends byte-identical too."""
    out = Outcome(fault_class, name, one_storm=True)
    rng = rng_for(name)
    model = TINY.but(steps=2000)  # long enough that the storm ends well before training does
    begun = time.monotonic()
    shard, ref_dir, rc, ref = reference_run(workdir, model, 0)
    # paced by this machine's speed: the sleeps add up to at most half the unsignalled run's time (a fast
    # machine trains the 2000 steps in under a second), and each signalled checkpoint only slows the run
    longest_sleep = min(0.002, (time.monotonic() - begun) / n_signals)
    ref_steps = {int(e["step"]): step_record(e) for e in ref.of("step")}
    ck = workdir / "ck"
    p = start_standalone(model, shard, ck, 0, resume=None)
    p.wait_event("step", TIMEOUT)
    sent = 0
    while sent < n_signals and p.alive():
        if not p.send_signal(signal.SIGUSR1):
            break
        sent += 1
        out.begin_fault()
        time.sleep(rng.uniform(0.0, longest_sleep))
    try:
        rc = p.finish(TIMEOUT)
    except Hang as exc:
        out.fail(str(exc))
    if sent < n_signals:
        out.fail(f"only {sent} signals were delivered before the run ended (the run is too short for the storm)")
    if rc != 0 or not p.of("exit") or p.of("exit")[-1]["reason"] != "done":
        out.fail(f"exit {rc}, last events {[e.kind for e in p.events[-3:]]}; {p.stderr_lines()[-3:]}")
    steps = [int(e["step"]) for e in p.of("step")]
    if steps != list(range(1, model.steps + 1)):
        out.fail(f"training did not go on step by step: {len(steps)} step events")
    _check_steps(p, ref_steps, out, "signalled run")
    ckpts = [e for e in p.of("ckpt") if e["reason"] == "sigusr1"]
    out.note("SIGUSR1 sent", sent)
    out.note("checkpoints written for them", len(ckpts))
    watch = CkptWatch(ck)
    watch.check(out, "after the storm")
    compare_files(ref_dir, ck, out, names=[f"step_{model.steps:06d}.bin"], what="final: ")
    if ckpts:
        pick = rng.choice(ckpts)
        d = workdir / "resumed"
        d.mkdir()
        shutil.copy(ck / f"step_{int(pick['step']):06d}.bin", d)
        rc, p2 = run_standalone(model, shard, d, 0)
        _check_steps(p2, ref_steps, out, f"resumed from SIGUSR1 checkpoint {pick['step']}")
        compare_files(ref_dir, d, out, names=[f"step_{model.steps:06d}.bin"], what="resumed: ")
        out.note("SIGUSR1 checkpoint resumed and compared", int(pick["step"]))
    return out.close()


def engine_sigstop(
    workdir: Path, n_stops: int = 3, name: str = "engine-sigstop", fault_class: str = "hung engine (SIGSTOP)"
) -> Outcome:
    """SIGSTOP a standalone engine for a while, then SIGCONT: training resumes where it was and the
    result is byte-identical (the proxy-level scenario is the one that detects and kills a hang)."""
    out = Outcome(fault_class, name, one_storm=True)
    rng = rng_for(name)
    model = TINY.but(steps=60)
    shard, ref_dir, rc, ref = reference_run(workdir, model, 5)
    ref_steps = {int(e["step"]): step_record(e) for e in ref.of("step")}
    ck = workdir / "ck"
    p = start_standalone(model, shard, ck, 5, resume=None)
    targets = sorted(rng.sample(range(2, model.steps - 5), n_stops))
    for t in targets:
        p.wait_event("step", TIMEOUT, lambda e: int(e["step"]) >= t)
        out.begin_fault()
        p.send_signal(signal.SIGSTOP)
        time.sleep(rng.uniform(0.1, 0.4))
        p.send_signal(signal.SIGCONT)
    rc = p.finish(TIMEOUT)
    if rc != 0:
        out.fail(f"exit {rc} after SIGSTOP/SIGCONT: {p.stderr_lines()[-3:]}")
    _check_steps(p, ref_steps, out, "stopped and continued")
    compare_files(ref_dir, ck, out, what="final: ")
    return out.close()


# ---------------------------------------------------------------------------
# frames sent straight to the engine


FUZZ_MODEL = Shape(vocab=64, ctx=8, dim=16, layers=1, heads=2, batch=2, steps=10, warmup=4, threads=1)


def proxy_mode_argv(model: Shape, ckpt_dir: Path) -> list[str]:
    return [str(ENGINE.path), *engine_args(ckpt_dir, ckpt_every=0, settings=model.flags())]


def feed_engine(workdir: Path, data: bytes, timeout: float = 20.0) -> tuple[int | None, list[str]]:
    """Send `data` to a fresh engine in proxy mode, then EOF. Returns (exit code, broken rules).

    Rules: it ends within `timeout` (no hang), by exit and not by a signal (no crash), with 0 or 4;
    every stdout line is an event; on 4: exactly one stderr line ('microgpt: error: ...') and one
    `error` event; on 0: no error line; every checkpoint file it left verifies and was announced.
    """
    ck = workdir / "ck"
    shutil.rmtree(ck, ignore_errors=True)
    proc = subprocess.Popen(
        proxy_mode_argv(FUZZ_MODEL, ck),
        cwd=str(workdir),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        stdout, stderr = proc.communicate(data, timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return None, [f"hang: no exit within {timeout:.0f}s"]
    rc = proc.returncode
    problems = []
    lines = [ln for ln in stderr.decode("utf-8", "replace").splitlines() if ln.strip()]
    events = []
    for ln in stdout.decode("utf-8", "replace").splitlines():
        if not ln.strip():
            continue
        try:
            events.append(frames.parse_event(ln))
        except ValueError:
            problems.append(f"stdout line is not an event: {ln[:120]!r}")
    if rc < 0:
        problems.append(f"killed by signal {-rc} (a crash)")
    elif rc not in (0, 4):
        problems.append(f"exit {rc}, expected 0 or 4; stderr {lines[-3:]}")
    if any("Traceback" in ln or "core dumped" in ln for ln in lines):
        problems.append(f"stderr shows a crash: {lines[-3:]}")
    errors = [e for e in events if e.kind == "error"]
    if rc == 4:
        if len(lines) != 1 or not lines[0].startswith("microgpt: error:"):
            problems.append(f"exit 4 without exactly one 'microgpt: error:' line: {lines}")
        if len(errors) != 1 or events[-1].kind != "error":
            problems.append(
                f"exit 4 with {len(errors)} error events (the last event: {events[-1].kind if events else None})"
            )
    elif rc == 0:
        if errors or any("error" in ln for ln in lines):
            problems.append(f"exit 0 but errors reported: {lines}")
    announced = {Path(e["path"]).name for e in events if e.kind == "ckpt"}
    for f in list_checkpoints(ck):
        if f.name not in announced:
            problems.append(f"{f.name} written without a ckpt event")
        reason = verify_checkpoint(f)
        if reason:
            problems.append(f"{f.name} does not verify: {reason}")
    return rc, problems

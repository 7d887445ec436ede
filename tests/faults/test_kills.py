"""kill -9 of the engine, of the proxy, of both, at seeded random moments, including inside
checkpoint writes (which run in the background while the engine trains on): no valid checkpoint is
ever lost, every resume starts from the newest valid one, and the finished run is bit-identical to
an uninterrupted one. The proxy-level storms train on the rank count under test (MICROGPT_TEST_RANKS:
on more than 1, the MPI CPU engine under mpirun, "the engine" killed being the launcher), each compared with
an uninterrupted run on 1 rank; the engine storm also runs on 2 ranks whatever it says."""

from __future__ import annotations

import shutil

import pytest

from harness.fsync_shim import build_fsync_shim
from harness.ranks import ranks_under_test, require_ranks

from . import engine_scenarios, proxy_scenarios, scenarios
from .scenarios import LARGE, TINY


def test_engine_sigkill_at_random_moments(engine_bin, tmp_path, record):
    """40 SIGKILLs of a standalone engine (--ckpt-every 2): at startup, after a step, after a ckpt
    event, and inside checkpoint writes; every checkpoint of the finished run equals the uninterrupted
    run's byte for byte."""
    out = record(
        engine_scenarios.engine_kill_storm(
            # 1200 steps: room for 40 kills however fast the engine runs between a kill's target
            # step and the kill itself (each kill lets the run progress a few steps)
            tmp_path,
            TINY.but(steps=1200),
            ckpt_every=2,
            n_kills=40,
            modes={"startup": 1.0, "step": 5.0, "ckpt": 1.5, "write": 2.5},
            name="engine-kill-random",
            fault_class="kill -9 of the engine (standalone, random moments)",
        )
    )
    out.check()
    assert out.injected == 40, f"only {out.injected} of 40 kills landed before the run ended: {out.notes}"


def test_engine_sigkill_inside_checkpoint_writes(engine_bin, tmp_path, record):
    """12 SIGKILLs of an engine with a 22 MB checkpoint written every step, each at a random offset
    within the measured write time. Most land inside the write (a temp file is left behind): the
    temp file is never taken and is removed by the next start; the final checkpoint is byte-identical."""
    out = record(
        engine_scenarios.engine_kill_storm(
            tmp_path,
            LARGE,
            ckpt_every=1,
            n_kills=12,
            modes={"write": 1.0},
            ref_every=0,
            name="engine-kill-in-write",
            fault_class="kill -9 of the engine inside checkpoint writes (22 MB)",
        )
    )
    out.check()
    hits = out.notes.get("kills that landed inside a checkpoint write (temp file left)", 0)
    assert hits >= 3, f"only {hits} of {out.injected} kills landed inside a write: the scenario missed its target"
    shutil.rmtree(tmp_path / "ck")  # ~300 MB of checkpoints; kept only when the test fails


RANKS = ranks_under_test()
PROXY_STORMS = [("proxy", 4, RANKS), ("engine", 8, RANKS), ("both", 4, RANKS)]
# on 2 ranks in every run of the suite: SIGKILLs of mpirun at random moments, around checkpoints too
PROXY_STORMS += [] if RANKS == 2 else [("engine", 4, 2)]


@pytest.mark.parametrize("kind,n_kills,ranks", PROXY_STORMS)
def test_proxy_level_kills(request, engine_bin, tmp_path, record, kind, n_kills, ranks):
    """SIGKILL the proxy's process group / the engine / both during a TINY-sized proxy run and relaunch
    the same command: identical per-step losses, mixtures, evals, samples and final weights. On 2 ranks the
    experiment is rank_env's (two micro-batches per step), its reference a 1-rank run."""
    require_ranks(ranks, scenarios.ENGINE.kind)
    env = request.getfixturevalue("proxy_env" if ranks == 1 else "rank_env")
    name = f"proxy-kill-{kind}" + ("" if ranks == 1 else f"-{ranks}-ranks")
    fault_class = proxy_scenarios.PROXY_KILL_KINDS[kind] + ("" if ranks == 1 else f" ({ranks} ranks)")
    out = record(
        proxy_scenarios.proxy_kill_storm(env, tmp_path, kind, n_kills, name=name, fault_class=fault_class, ranks=ranks)
    )
    out.check()
    assert out.injected == n_kills, f"only {out.injected} of {n_kills} kills landed before the run ended: {out.notes}"


WRITE_DELAY_MS = 40  # per fsync: a checkpoint's background write takes at least 80 ms


@pytest.mark.parametrize("kind,n_kills", [("proxy", 4), ("engine", 6), ("both", 4)])
def test_proxy_level_kills_inside_background_writes(proxy_env, tmp_path, record, kind, n_kills):
    """Checkpoint writes slowed to at least 80 ms (every fsync of the engine sleeps 40 ms) while the
    engine trains on, and every kill aimed inside one: with a temp file half written, or a file renamed
    but not yet announced by its ckpt event (the engine may have logged later steps). Relaunches resume
    from the newest valid checkpoint the log covers, no valid checkpoint is lost, and the finished run
    equals the uninterrupted one."""
    engine = proxy_scenarios.slow_write_engine(tmp_path, build_fsync_shim(tmp_path), WRITE_DELAY_MS)
    out = record(
        proxy_scenarios.proxy_kill_storm(
            proxy_env,
            tmp_path,
            kind,
            n_kills,
            engine=str(engine),
            write_s=2.5 * WRITE_DELAY_MS / 1000.0,
            name=f"proxy-kill-{kind}-in-write",
            fault_class=proxy_scenarios.PROXY_KILL_KINDS[kind] + " inside background checkpoint writes",
        )
    )
    out.check()
    hits = out.notes.get("kills that left a checkpoint temp file (inside a write)", 0) + out.notes.get(
        "kills that left a checkpoint the proxy had not seen announced", 0
    )
    assert hits >= n_kills // 2, f"only {hits} of {out.injected} kills landed inside a write: {out.notes}"

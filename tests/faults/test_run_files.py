"""Run-directory and command-line files the proxy must not trust: devices, FIFOs, huge files,
symlinks out of the run; a phase history deleted, restored from an old copy or edited after a pivot;
names beyond their bounds; an edited frozen experiment; bogus checkpoint files; NaN in the log."""

from __future__ import annotations

from . import run_dir_scenarios as rds


def test_unsafe_run_directory_files(proxy_env, stopped_run, tmp_path, record):
    record(rds.unsafe_run_files(proxy_env, stopped_run, tmp_path)).check()


def test_unsafe_command_line_files(proxy_env, stopped_run, tmp_path, record):
    record(rds.unsafe_command_line_files(proxy_env, stopped_run, tmp_path)).check()


def test_phase_history_contradictions_are_refused(proxy_env, stopped_run, tmp_path, record):
    record(rds.phase_history(proxy_env, stopped_run, tmp_path)).check()


def test_names_beyond_their_bounds(proxy_env, stopped_run, tmp_path, record):
    record(rds.names_out_of_bounds(proxy_env, stopped_run, tmp_path)).check()


def test_edited_frozen_experiment_is_refused(proxy_env, stopped_run, tmp_path, record):
    record(rds.frozen_experiment_edited(proxy_env, stopped_run, tmp_path)).check()


def test_bogus_checkpoint_files_are_ignored(proxy_env, tmp_path, record):
    record(rds.bogus_checkpoints(proxy_env, tmp_path)).check()


def test_status_json_is_strict_with_nan_in_the_log(proxy_env, stopped_run, tmp_path, record):
    record(rds.status_json_non_finite(proxy_env, stopped_run, tmp_path)).check()


def test_the_bounds_fit_every_reader():
    """The schema's bounds keep every file within what its readers take (docs/EXPERIMENTS.md, "Bounds"):
    the longest `.loss.json` line, the largest sample audit, `.state.json` and a phases.json entry over the
    most arms with the longest names, every float as long as JSON makes it, every character escaped."""
    from proxy.atomic import json_bytes
    from proxy.config import experiment as schema
    from proxy.formats.loss_log import StepEntry, encode_line
    from proxy.formats.samples import MAX_TEXT, Sample, SampleAudit
    from proxy.formats.state import ArmStatus, RunState
    from proxy.rundir.layout import LOSS_LINE_LIMIT, PHASES, READ_LIMITS, SAMPLES, STATE
    from proxy.rundir.phases import Phase

    arms = [f"{i:02d}".ljust(schema.MAX_NAME, "a") for i in range(schema.MAX_ARMS)]
    longest = -1.2345678901234567e-300
    line = encode_line(
        StepEntry(
            step=2**62,
            loss=longest,
            lr=longest,
            grad_norm=longest,
            tokens=2**62,
            time=longest,
            ms=longest,
            arms=dict.fromkeys(arms, longest),
            mixture=dict.fromkeys(arms, longest),
            phase=2**31,
            segment=2**31,
        ).to_dict()
    )
    assert len(line) < LOSS_LINE_LIMIT / 4, len(line)
    escaped = "\x01"  # json.dumps writes it as \u0001: six bytes for one character
    sample = Sample(
        prompt=escaped * schema.MAX_PROMPT_CHARS,
        completion=escaped * MAX_TEXT,
        tokens=[65535] * schema.MAX_SAMPLE_TOKENS,
    )
    audit = SampleAudit(step=2**62, time=longest, samples=[sample] * (schema.MAX_PROMPTS * schema.MAX_SAMPLE_COUNT))
    assert len(json_bytes([audit.to_dict()])) < READ_LIMITS[SAMPLES]  # the newest audit always fits
    state = RunState(
        arms={a: ArmStatus(ema=longest, reward=longest, weight=longest, cap=longest, floor=longest) for a in arms},
        bandit={"arms": {a: {k: longest for k in "abcdef"} for a in arms}},
    )
    assert len(json_bytes(state.to_dict())) < READ_LIMITS[STATE] / 8
    phase = Phase(
        phase=2**31,
        start_step=2**62,
        policy="exp3",
        caps=dict.fromkeys(arms, longest),
        floors=dict.fromkeys(arms, longest),
        time=longest,
        checkpoint="checkpoints/step_000000000000.bin",
    )
    assert READ_LIMITS[PHASES] // len(json_bytes(phase.to_dict())) >= 200  # pivots that fit, at the worst

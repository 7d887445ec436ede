"""`proxy verify` names every damaged checkpoint and why; foreign checkpoints are refused by every command."""

from __future__ import annotations

import json
import subprocess

from proxy.formats import frames
from proxy.formats.engine_cli import engine_args, setting_flags
from proxy.formats.frames import parse_event

from .conftest import one_line_error, run_cmd, tree_hashes

TINY_SHAPE = dict(vocab=512, ctx=64, dim=64, layers=2, heads=4)  # experiments/TINY-TRAIN.json's model


def engine_checkpoint(engine, directory, meta, **shape) -> bytes:
    """A fresh step-0 checkpoint written by the engine itself (a CHECKPOINT frame, then STOP)."""
    argv = [str(engine.path), *engine_args(directory, meta=meta, settings=setting_flags(threads=1, **shape))]
    done = subprocess.run(argv, input=frames.checkpoint_frame() + frames.stop_frame(), capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr
    path = next(parse_event(ln)["path"] for ln in done.stdout.splitlines() if b'"ckpt"' in ln)
    with open(path, "rb") as f:
        return f.read()


def test_verify_names_each_damaged_checkpoint(run_copy, engine, data_cache, tmp_path):
    ckpts = run_copy / "checkpoints"
    clean = run_cmd(["verify", "--run-dir", str(run_copy)], data_cache)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "4 checkpoint file(s): 4 valid" in clean.stdout
    assert "next launch resumes from checkpoints/step_000060.bin (step 60)" in clean.stdout

    raw = (ckpts / "step_000020.bin").read_bytes()
    (ckpts / "step_000020.bin").write_bytes(raw[:5000] + bytes([raw[5000] ^ 0x10]) + raw[5001:])
    raw = (ckpts / "step_000060.bin").read_bytes()
    (ckpts / "step_000060.bin").write_bytes(raw[:-100])
    # a checkpoint of another model, valid in itself, under a name the log covers
    (ckpts / "step_000050.bin").write_bytes(
        engine_checkpoint(engine, tmp_path / "other", None, **dict(TINY_SHAPE, dim=32))
    )
    result = run_cmd(["verify", "--run-dir", str(run_copy)], data_cache)
    assert result.returncode == 1, result.stdout + result.stderr
    out = result.stdout
    assert "5 checkpoint file(s): 2 valid, 3 corrupt" in out
    lines = {ln.split()[1]: ln for ln in out.splitlines() if ln.startswith("  ") and "checkpoints/" in ln}
    assert (
        "corrupt" in lines["checkpoints/step_000020.bin"]
        and "checksum mismatch" in lines["checkpoints/step_000020.bin"]
    )
    assert "corrupt" in lines["checkpoints/step_000060.bin"] and "truncated" in lines["checkpoints/step_000060.bin"]
    assert "corrupt" in lines["checkpoints/step_000050.bin"] and "foreign" in lines["checkpoints/step_000050.bin"]
    assert "dim 32" in lines["checkpoints/step_000050.bin"]
    assert lines["checkpoints/step_000040.bin"].split()[0] == "valid"
    assert lines["checkpoints/best.bin"].split()[0] == "valid"
    assert "next launch resumes from checkpoints/step_000040.bin (step 40)" in out
    # a step-0 checkpoint under step 50's name: the resume rule passes it over before any engine sees it
    assert "passed over: step_000060.bin: " in out
    assert "passed over: step_000050.bin: its header holds step 0, its name step 50" in out

    report = json.loads(run_cmd(["verify", "--run-dir", str(run_copy), "--json"], data_cache).stdout)
    assert report["corrupt"] == 3 and report["resume"]["step"] == 40
    assert {r["name"]: r["verdict"] for r in report["checkpoints"]} == {
        "checkpoints/step_000060.bin": "corrupt",
        "checkpoints/step_000050.bin": "corrupt",
        "checkpoints/step_000040.bin": "valid",
        "checkpoints/step_000020.bin": "corrupt",
        "checkpoints/best.bin": "valid",
    }


def test_foreign_checkpoints_are_refused(trained_run, run_copy, engine, data_cache, tmp_path):
    before = tree_hashes(trained_run)
    other_shape = tmp_path / "other_shape.bin"
    other_shape.write_bytes(engine_checkpoint(engine, tmp_path / "a", None, **dict(TINY_SHAPE, layers=3)))
    other_run = tmp_path / "other_run.bin"
    other_run.write_bytes(
        engine_checkpoint(engine, tmp_path / "b", {"experiment": "SOMEONE-ELSE", "phase": 0}, **TINY_SHAPE)
    )
    for path, why in ((other_shape, "layers 3"), (other_run, "written by experiment 'SOMEONE-ELSE'")):
        for command in (["sample", "--prompt", "def "], ["eval"], ["export", "--out", str(tmp_path / "out")]):
            line = one_line_error(
                run_cmd(
                    [*command, "--run-dir", str(trained_run), "--checkpoint", str(path), "--engine", engine.flag]
                    if command[0] != "export"
                    else [*command, "--run-dir", str(trained_run), "--checkpoint", str(path)],
                    data_cache,
                ),
                2,
            )
            assert "foreign checkpoint" in line and why in line, line
    assert not (tmp_path / "out").exists()
    assert tree_hashes(trained_run) == before

    # verify: another shape is corrupt for it (the engine refuses it); a checkpoint another experiment wrote
    # makes `proxy run` refuse to start (it would write over it or delete it), and verify says so
    (run_copy / "checkpoints" / "step_000060.bin").write_bytes(other_run.read_bytes())
    (run_copy / "checkpoints" / "step_000050.bin").write_bytes(other_shape.read_bytes())
    result = run_cmd(["verify", "--run-dir", str(run_copy)], data_cache)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "written by experiment 'SOMEONE-ELSE'" in result.stdout and "layers 3" in result.stdout
    assert (
        "next launch: the next launch would stop: " in result.stdout
        and "step_000060.bin: foreign checkpoint: written by experiment 'SOMEONE-ELSE'" in result.stdout
    )

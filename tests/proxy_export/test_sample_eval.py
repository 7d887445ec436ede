"""`proxy sample` and `proxy eval` on a finished run: deterministic text, the logged eval reproduced, the run
never written to, one line for every bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import torch

from engine.torch_reference import Reference
from proxy.commands.evaluate import file_parts
from proxy.commands.model_source import resolve_source, run_data
from proxy.formats.checkpoint import checkpoint_path, read_checkpoint
from proxy.formats.loss_log import LossLogIndex
from proxy.rundir.frozen import load_frozen_experiment
from proxy.rundir.layout import RunDir

from .conftest import EVAL_STEPS, REPO, one_line_error, proxy_env, run_cmd, tree_hashes

PROMPT = "def main("


def sample(run, engine, cache, *extra):
    return run_cmd(["sample", "--run-dir", str(run), "--engine", engine.flag, "--prompt", PROMPT, *extra], cache)


def test_sample_is_deterministic_per_seed_and_reads_only(trained_run, engine, data_cache):
    before = tree_hashes(trained_run)
    args = ("--max-new", "40", "--temperature", "0.9", "--count", "2")
    first = sample(trained_run, engine, data_cache, "--seed", "11", *args)
    again = sample(trained_run, engine, data_cache, "--seed", "11", *args)
    other = sample(trained_run, engine, data_cache, "--seed", "12", *args)
    for result in (first, again, other):
        assert result.returncode == 0, result.stdout + result.stderr
    assert first.stdout == again.stdout
    assert first.stdout != other.stdout
    texts = first.stdout.split("--- sample ")[1:]
    assert len(texts) == 2 and texts[0].startswith("1 of 2 (step 60, seed 11)")
    assert all(t.split("\n", 1)[1].startswith(PROMPT) for t in texts)
    # the checkpoint named by path (best.bin, inside the run) gives the same text as its step's file
    by_path = run_cmd(
        [
            "sample",
            "--checkpoint",
            str(trained_run / "checkpoints" / "best.bin"),
            "--engine",
            engine.flag,
            "--prompt",
            PROMPT,
            "--seed",
            "11",
            *args,
        ],
        data_cache,
    )
    assert by_path.returncode == 0, by_path.stderr
    assert by_path.stdout == first.stdout
    # greedy from an earlier checkpoint
    greedy = sample(trained_run, engine, data_cache, "--step", "20", "--temperature", "0", "--max-new", "16")
    assert greedy.returncode == 0, greedy.stderr
    # one sample has its header too: it says which step spoke
    head, text = greedy.stdout.split("\n", 1)
    assert head == "--- sample 1 of 1 (step 20, seed 0)" and text.startswith(PROMPT), greedy.stdout
    assert tree_hashes(trained_run) == before


def test_eval_equals_the_logged_eval_at_every_step(trained_run, engine, data_cache):
    before = tree_hashes(trained_run)
    index = LossLogIndex.load(trained_run / ".loss.json")
    for step in EVAL_STEPS:
        result = run_cmd(
            ["eval", "--run-dir", str(trained_run), "--step", str(step), "--engine", engine.flag, "--json"], data_cache
        )
        assert result.returncode == 0, result.stdout + result.stderr
        report, logged = json.loads(result.stdout), index.eval(step)
        assert report["step"] == step
        assert report["loss"] == logged.loss and report["arms"] == logged.arms, (report, logged)
    text = run_cmd(["eval", "--run-dir", str(trained_run), "--engine", engine.flag], data_cache)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].startswith("step 60 (") and f"{index.eval(60).loss:.6f}" in lines[0]
    assert [ln.split()[0] for ln in lines[1:]] == list(index.eval(60).arms)
    assert tree_hashes(trained_run) == before


def test_eval_of_text_files_matches_a_pytorch_forward(trained_run, engine, data_cache, tmp_path):
    """--data: the engine's loss on each file's rows equals the float64 PyTorch reference's on the same rows."""
    short, long = tmp_path / "short.py", tmp_path / "long.txt"
    short.write_text((REPO / "proxy" / "errors.py").read_text())
    long.write_text((REPO / "docs" / "ARCHITECTURE.md").read_text())
    result = run_cmd(
        [
            "eval",
            "--run-dir",
            str(trained_run),
            "--step",
            "40",
            "--engine",
            engine.flag,
            "--json",
            "--data",
            str(short),
            str(long),
        ],
        data_cache,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert list(report["files"]) == [str(short), str(long)]

    experiment = load_frozen_experiment(RunDir(trained_run))
    data = run_data(resolve_source(str(trained_run), 40, None), None, "the tokenizer")  # the run's own
    ckpt = read_checkpoint(checkpoint_path(trained_run / "checkpoints", 40))
    reference = Reference(ckpt.trailer.shape, ckpt.weights)
    parts = file_parts([(str(f), f.read_text()) for f in (short, long)], data, experiment.model.ctx)
    overlapped = 0
    for name, rows, _groups, _starts in parts:
        tokens = data.tokenizer.encode((short if name == str(short) else long).read_text())
        assert rows.shape[1] == experiment.model.ctx + 1 and rows[-1, -1] == data.tokenizer.eot_id
        covered = rows.shape[0] * experiment.model.ctx + 1
        assert covered >= len(tokens) + 1 > covered - experiment.model.ctx  # the fewest rows that cover it
        with torch.no_grad():
            expected = float(reference.loss(rows))
        # the tokens reported are the distinct ones predicted: every token of the file and its <|endoftext|>
        # but the first, however much the last row overlaps the one before it
        assert report["tokens"][name] == len(tokens)
        overlapped += rows.shape[0] * experiment.model.ctx > len(tokens)
        assert abs(report["files"][name] - expected) < 1e-4, (name, report["files"][name], expected)
    assert overlapped, "neither file's rows overlap: the distinct count was not put to the test"


def test_bad_inputs_get_one_line_and_a_nonzero_exit(trained_run, engine, data_cache, tmp_path):
    run = str(trained_run)
    before = tree_hashes(trained_run)
    assert "encodes to no tokens" in one_line_error(
        run_cmd(["sample", "--run-dir", run, "--engine", engine.flag, "--prompt", ""], data_cache), 2
    )
    # a prompt that is not text: bytes that are not UTF-8 on the command line
    result = subprocess.run(
        [sys.executable, "-m", "proxy", "sample", "--run-dir", run, "--engine", engine.flag, "--prompt", b"def \xff"],
        cwd=REPO,
        env=proxy_env(data_cache),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "not valid Unicode text" in one_line_error(result, 2)
    assert "no checkpoint at step 30" in one_line_error(
        run_cmd(["eval", "--run-dir", run, "--step", "30", "--engine", engine.flag], data_cache), 2
    )
    assert "--step: not a step number" in one_line_error(
        run_cmd(["eval", "--run-dir", run, "--step", "newest", "--engine", engine.flag], data_cache), 2
    )
    assert "no such checkpoint file" in one_line_error(
        run_cmd(["sample", "--checkpoint", str(tmp_path / "nope.bin"), "--prompt", PROMPT], data_cache), 2
    )
    assert "must be in [1, 4096]" in one_line_error(
        run_cmd(["sample", "--run-dir", run, "--prompt", PROMPT, "--count", "0"], data_cache), 2
    )
    missing = tmp_path / "missing.txt"
    assert "cannot read" in one_line_error(
        run_cmd(["eval", "--run-dir", run, "--engine", engine.flag, "--data", str(missing)], data_cache), 2
    )
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("x = 1\n")
    assert "fewer than the 65 (ctx + 1)" in one_line_error(
        run_cmd(["eval", "--run-dir", run, "--engine", engine.flag, "--data", str(tiny)], data_cache), 2
    )

    # a corrupt checkpoint (one flipped byte) and a truncated one, named by path
    good = (trained_run / "checkpoints" / "step_000040.bin").read_bytes()
    flipped, truncated = tmp_path / "flipped.bin", tmp_path / "truncated.bin"
    flipped.write_bytes(good[:1000] + bytes([good[1000] ^ 1]) + good[1001:])
    truncated.write_bytes(good[: len(good) // 2])
    for path, why in ((flipped, "checksum mismatch"), (truncated, "truncated")):
        line = one_line_error(
            run_cmd(
                ["sample", "--run-dir", run, "--checkpoint", str(path), "--engine", engine.flag, "--prompt", PROMPT],
                data_cache,
            ),
            2,
        )
        assert line.startswith("proxy: corrupt checkpoint:") and why in line and str(path) in line, line
    assert tree_hashes(trained_run) == before

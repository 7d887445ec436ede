"""`proxy export`: transformers loads the directory and computes the engine's logits; the tokenizer round-trips."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file
from tokenizers import Tokenizer as HFTokenizer

from proxy.commands.checkpoint_engine import CheckpointEngine
from proxy.commands.model_source import resolve_source
from proxy.data.prepare import prepare_data
from proxy.data.tokenizer import Tokenizer
from proxy.formats import frames
from proxy.formats.checkpoint import checkpoint_path, read_checkpoint
from proxy.formats.parameters import unflatten
from proxy.rundir.frozen import load_frozen_experiment
from proxy.rundir.layout import RunDir
from proxy.supervision.engine_process import EngineChoice

from .conftest import REPO, one_line_error, run_cmd, tree_hashes

STEP = 60
TEXTS = [
    "def f(x):\n    return x * 2\n",
    "The quick brown fox.",
    "  leading spaces\tand\ttabs\n\n",
    "unicode: é ü 漢字 🙂",
    "two <|endoftext|> documents",
    "",
]


def run_tokenizer(run, cache) -> Tokenizer:
    """The tokenizer the run was trained with: the one frozen in it, and the one in the prepared-data cache."""
    frozen = (run / "data" / "tokenizer.json").read_bytes()
    cached = prepare_data(load_frozen_experiment(RunDir(run)), run, cache, progress=False).tokenizer_json
    assert frozen == cached
    return Tokenizer.from_json(frozen, load_frozen_experiment(RunDir(run)).model.vocab, "run")


@pytest.fixture(scope="module")
def exported(trained_run, data_cache, tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "hf"
    result = run_cmd(["export", "--run-dir", str(trained_run), "--step", str(STEP), "--out", str(out)], data_cache)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"exported step {STEP} of {trained_run}" in result.stdout
    return out


def engine_logits(
    run, engine, prompt: list[int], count: int, max_new: int, temperature: float, seed: int, dump
) -> tuple[np.ndarray, list[list[int]]]:
    """The logits the engine's SAMPLE path picked each new token from (--dump-logits), and the tokens."""
    source = resolve_source(str(run), STEP, None)
    with CheckpointEngine(EngineChoice(engine.path, engine.kind), source, extra=["--dump-logits", str(dump)]) as eng:
        event = eng.ask(frames.sample_frame(1, prompt, count, max_new, temperature, 40, seed), "sample")
    logits = np.fromfile(dump, dtype="<f4")
    return logits.reshape(count, max_new, source.shape.vocab), event["tokens"]


def test_transformers_loads_the_export_and_matches_the_engines_logits(
    trained_run, exported, engine, data_cache, tmp_path
):
    transformers = pytest.importorskip(
        "transformers",
        reason="transformers is not installed (pip install '.[test]'); the export is still tested without it below",
    )
    model = transformers.GPT2LMHeadModel.from_pretrained(exported).eval()
    assert model.dtype == torch.float32
    shape = resolve_source(str(trained_run), STEP, None).shape
    assert (
        model.config.vocab_size,
        model.config.n_positions,
        model.config.n_embd,
        model.config.n_layer,
        model.config.n_head,
    ) == (shape.vocab, shape.ctx, shape.dim, shape.layers, shape.heads)
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()  # tied, not a copy

    # the tensors themselves: each of ours, transposed where GPT-2 uses Conv1D
    weights = unflatten(read_checkpoint(checkpoint_path(trained_run / "checkpoints", STEP)).weights, shape)
    state = model.state_dict()
    assert np.array_equal(state["transformer.h.1.attn.c_attn.weight"].numpy(), weights["h1.qkv.w"].T)
    assert np.array_equal(state["transformer.h.0.mlp.c_proj.weight"].numpy(), weights["h0.fcproj.w"].T)
    assert np.array_equal(state["lm_head.weight"].numpy(), weights["wte"])

    # logits on the same tokens: the engine's SAMPLE path (greedy, and sampled at temperature 0.8, three
    # completions) up to the full context, against transformers' forward pass on those sequences
    # A twin with erf GELU instead of tanh: on this small model it is off by only a few 1e-5, so the
    # export must also be clearly closer than the twin (the activation is checked, not just the weights).
    erf_twin = transformers.GPT2LMHeadModel.from_pretrained(exported, activation_function="gelu").eval()
    prompt = run_tokenizer(trained_run, data_cache).encode("def parse(text):\n    ")
    max_new = shape.ctx - len(prompt)
    worst, worst_twin = 0.0, 0.0
    for temperature, count, seed in ((0.0, 1, 0), (0.8, 3, 7)):
        logits, completions = engine_logits(
            trained_run, engine, prompt, count, max_new, temperature, seed, tmp_path / f"logits-{seed}.f32"
        )
        for k, new in enumerate(completions):
            sequence = torch.tensor([prompt + new[:-1]])
            with torch.no_grad():
                hf = model(sequence).logits[0, len(prompt) - 1 :].numpy()
                twin = erf_twin(sequence).logits[0, len(prompt) - 1 :].numpy()
            assert hf.shape == logits[k].shape
            worst = max(worst, float(np.abs(hf - logits[k]).max()))
            worst_twin = max(worst_twin, float(np.abs(twin - logits[k]).max()))
            if temperature == 0.0:
                assert new == [int(i) for i in hf.argmax(axis=-1)]
    print(f"max |engine - transformers| logit difference: {worst:.3g} (erf-GELU twin: {worst_twin:.3g})")
    assert worst < 1e-4, worst
    assert worst * 5 < worst_twin, (worst, worst_twin)


def test_the_exported_tokenizer_round_trips(trained_run, exported, data_cache):
    ours = run_tokenizer(trained_run, data_cache)
    loaded = HFTokenizer.from_file(str(exported / "tokenizer.json"))
    for text in TEXTS:
        ids = loaded.encode(text, add_special_tokens=False).ids
        assert ids == ours.encode(text)
        assert loaded.decode(ids, skip_special_tokens=False) == text
    config = json.loads((exported / "config.json").read_text())
    generation = json.loads((exported / "generation_config.json").read_text())
    assert config["eos_token_id"] == generation["eos_token_id"] == ours.eot_id == loaded.token_to_id("<|endoftext|>")
    assert config["activation_function"] == "gelu_new" and config["layer_norm_epsilon"] == 1e-5
    assert config["tie_word_embeddings"] is True and config["resid_pdrop"] == config["attn_pdrop"] == 0.0

    transformers = pytest.importorskip(
        "transformers", reason="transformers is not installed: AutoTokenizer not checked"
    )
    auto = transformers.AutoTokenizer.from_pretrained(exported)
    for text in TEXTS:
        ids = auto(text)["input_ids"]
        assert ids == ours.encode(text)
        assert auto.decode(ids) == text
    assert auto.eos_token == "<|endoftext|>"


def test_plain_safetensors_hold_our_tensors(trained_run, data_cache, tmp_path):
    path = checkpoint_path(trained_run / "checkpoints", 40)
    out = tmp_path / "plain"
    # a checkpoint named by path, outside any run (a copy): the weights alone need no run
    loose = tmp_path / "loose.bin"
    loose.write_bytes(path.read_bytes())
    result = run_cmd(["export", "--checkpoint", str(loose), "--format", "safetensors", "--out", str(out)], data_cache)
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["model.safetensors"]
    tensors = load_file(out / "model.safetensors")
    ckpt = read_checkpoint(path)
    expected = unflatten(ckpt.weights, ckpt.trailer.shape)
    assert list(tensors) == sorted(expected) and all(np.array_equal(tensors[n], expected[n]) for n in expected)
    # the HF format needs the run's tokenizer: one line, nothing written
    line = one_line_error(run_cmd(["export", "--checkpoint", str(loose), "--out", str(tmp_path / "hf")], data_cache), 2)
    assert "not in a run directory" in line and "--run-dir" in line
    assert not (tmp_path / "hf").exists()


def test_export_refusals_leave_everything_as_it_was(trained_run, exported, data_cache, tmp_path):
    before_run, before_out = tree_hashes(trained_run), tree_hashes(exported)
    line = one_line_error(run_cmd(["export", "--run-dir", str(trained_run), "--out", str(exported)], data_cache), 2)
    assert "exists and is not empty" in line
    a_file = tmp_path / "a_file"
    a_file.write_text("mine")
    for out in (a_file, a_file / "below"):  # a file at the target, or where a parent directory would go
        line = one_line_error(run_cmd(["export", "--run-dir", str(trained_run), "--out", str(out)], data_cache), 2)
        assert "not a directory" in line and str(out) in line, line
    assert a_file.read_text() == "mine"
    target = str(tmp_path / "new")
    line = one_line_error(
        run_cmd(["export", "--run-dir", str(trained_run), "--step", "30", "--out", target], data_cache), 2
    )
    assert "no checkpoint at step 30" in line
    line = one_line_error(
        run_cmd(["export", "--checkpoint", str(tmp_path / "nope.bin"), "--out", target], data_cache), 2
    )
    assert "no such checkpoint file" in line
    line = one_line_error(
        run_cmd(
            ["export", "--run-dir", str(trained_run), "--step", "30", "--out", str(tmp_path / "deep" / "new")],
            data_cache,
        ),
        2,
    )
    assert "no checkpoint at step 30" in line  # refused before anything is made: no parent either
    assert tree_hashes(trained_run) == before_run and tree_hashes(exported) == before_out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


def test_export_creates_missing_parents_and_fills_an_empty_directory(trained_run, data_cache, tmp_path):
    """As save_pretrained does: `--out a/b/c` makes a and b; an existing empty directory is filled."""
    deep = tmp_path / "a" / "b" / "model"
    result = run_cmd(
        ["export", "--run-dir", str(trained_run), "--format", "safetensors", "--out", str(deep)], data_cache
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(p.name for p in deep.iterdir()) == ["model.safetensors"]
    empty = tmp_path / "empty"
    empty.mkdir()
    result = run_cmd(
        ["export", "--run-dir", str(trained_run), "--format", "safetensors", "--out", str(empty)], data_cache
    )
    assert result.returncode == 0, result.stdout + result.stderr
    a, b = load_file(empty / "model.safetensors"), load_file(deep / "model.safetensors")
    assert list(a) == list(b) and all(np.array_equal(a[n], b[n]) for n in a)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "empty"]  # no temp directory left beside them


def test_safetensors_are_written_the_same_in_every_process(tmp_path):
    """The safetensors library writes its metadata in a hash map's order, which changes from process to
    process; ours are the same bytes every time, and the library reads them."""
    import subprocess
    import sys

    from proxy.formats.hf_gpt2 import encode_safetensors

    code = (
        "import sys, numpy as np; from proxy.formats.hf_gpt2 import encode_safetensors as e; "
        "t = {n: np.arange(k * 6, dtype=np.float32).reshape(2, 3 * k) for k, n in enumerate('cab', 1)}; "
        "sys.stdout.buffer.write(e(t, {'format': 'pt', 'microgpt': 'x', 'a': 'y'}))"
    )
    outs = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, check=True, cwd=REPO).stdout for _ in range(4)
    }
    assert len(outs) == 1
    path = tmp_path / "m.safetensors"
    path.write_bytes(outs.pop())
    loaded = load_file(path)
    assert sorted(loaded) == ["a", "b", "c"] and np.array_equal(
        loaded["b"], np.arange(18, dtype=np.float32).reshape(2, 9)
    )
    assert (8 + int.from_bytes(path.read_bytes()[:8], "little")) % 8 == 0
    with pytest.raises(ValueError, match="only float32"):
        encode_safetensors({"x": np.zeros(2, np.float16)}, {})

"""`proxy run --init-from DIR`: step 0 from a Hugging Face GPT-2 directory (the inverse of `proxy export`).

The directory is made here: a tokenizer.json trained with HF tokenizers (GPT-2's shape: byte-level BPE,
<|endoftext|> the last id) and a randomly initialised `transformers.GPT2LMHeadModel` (every tensor random,
LayerNorms too) saved with `save_pretrained`. Nothing is downloaded.
"""

from __future__ import annotations

import json
import shutil
import signal

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from harness.gate import KILL_SLACK
from proxy.commands.checkpoint_engine import CheckpointEngine
from proxy.commands.model_source import resolve_source
from proxy.formats import frames
from proxy.formats.checkpoint import checkpoint_path, read_checkpoint
from proxy.supervision.engine_process import EngineChoice

from .conftest import REPO, Proxy, assert_same_checkpoint, last_steps, max_logged_step, run_args, run_cmd, wait_for

transformers = pytest.importorskip("transformers", reason="transformers is a test extra (pip install '.[test]')")

SHAPE = dict(vocab=384, ctx=64, dim=64, layers=2, heads=4)
TRAIN = dict(
    batch=4,
    max_steps=40,
    lr=1e-3,
    min_lr=1e-4,
    warmup=4,
    seed=11,
    ckpt_every=5,
    eval_every=20,
    eval_rows=4,
    sample_every=20,
    keep_last=2,
    milestone_every=0,
    threads=1,
)


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpt2")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=SHAPE["vocab"] - 1, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator([p.read_text() for p in sorted((REPO / "proxy").rglob("*.py"))], trainer)
    tok.add_special_tokens(["<|endoftext|>"])  # the last id, as in GPT-2
    assert tok.get_vocab_size() == SHAPE["vocab"] and tok.token_to_id("<|endoftext|>") == SHAPE["vocab"] - 1
    tok.save(str(d / "tokenizer.json"))
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=SHAPE["vocab"],
        n_positions=SHAPE["ctx"],
        n_embd=SHAPE["dim"],
        n_layer=SHAPE["layers"],
        n_head=SHAPE["heads"],
        activation_function="gelu_new",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=SHAPE["vocab"] - 1,
        eos_token_id=SHAPE["vocab"] - 1,
    )
    model = transformers.GPT2LMHeadModel(config)
    with torch.no_grad():
        for p in model.parameters():  # LayerNorm weights and biases random too: every tensor is checked
            p.copy_(torch.randn_like(p) * 0.2)
    model.save_pretrained(d)
    return d


def experiment(directory, gpt2, name="FINETUNE", **changes):
    (directory / "corpus.txt").write_text("".join(p.read_text() for p in sorted((REPO / "docs").glob("*.md"))))
    exp = {
        "name": name,
        "model": {**SHAPE, **changes.pop("model", {})},
        "train": {**TRAIN, **changes},
        "tokenizer": str(gpt2 / "tokenizer.json"),
        "arms": [{"name": "docs", "sources": [{"file": "corpus.txt"}]}],
        "samples": {"prompts": ["The "], "max_new": 16, "temperature": 0.8, "top_k": 40, "count": 1},
    }
    path = directory / f"{name}.json"
    path.write_text(json.dumps(exp, indent=1))
    return path


@pytest.fixture(scope="module")
def imported(engine, data_cache, gpt2, tmp_path_factory):
    """A run made from the directory, finished uninterrupted (the reference of the kill test)."""
    root = tmp_path_factory.mktemp("imported")
    exp = experiment(root, gpt2)
    proxy = Proxy(run_args(exp, root / "run", "--init-from", gpt2), data_cache).start()
    assert proxy.wait() == 0, proxy.output()
    assert "step 0 imported from" in proxy.stdout()
    return root / "run"


def test_export_of_the_import_is_the_directory_bit_for_bit(imported, gpt2, data_cache, tmp_path):
    step0 = read_checkpoint(checkpoint_path(imported / "checkpoints", 0))
    assert not step0.m.any() and not step0.v.any() and step0.trailer.tokens_seen == 0
    assert json.loads((imported / "phases.json").read_text())[0]["checkpoint"] == "checkpoints/step_000000.bin"
    out = tmp_path / "export"
    result = run_cmd(["export", "--run-dir", str(imported), "--step", "0", "--out", str(out)], data_cache)
    assert result.returncode == 0, result.stderr
    theirs, ours = load_file(gpt2 / "model.safetensors"), load_file(out / "model.safetensors")
    assert sorted(theirs) == sorted(ours)
    for name in theirs:
        assert theirs[name].dtype == ours[name].dtype == np.float32
        assert np.array_equal(theirs[name].view(np.uint32), ours[name].view(np.uint32)), name
    assert (out / "tokenizer.json").read_bytes() == (gpt2 / "tokenizer.json").read_bytes()


def test_the_engine_computes_the_models_logits(imported, gpt2, engine, tmp_path):
    model = transformers.GPT2LMHeadModel.from_pretrained(gpt2).eval()
    prompt = Tokenizer.from_file(str(gpt2 / "tokenizer.json")).encode("def export(run, step):\n    ").ids
    source = resolve_source(str(imported), 0, None)
    dump = tmp_path / "logits.f32"
    max_new = SHAPE["ctx"] - len(prompt)
    with CheckpointEngine(EngineChoice(engine.path, engine.kind), source, extra=["--dump-logits", str(dump)]) as eng:
        event = eng.ask(frames.sample_frame(1, prompt, 2, max_new, 0.8, 40, 5), "sample")
    logits = np.fromfile(dump, dtype="<f4").reshape(2, max_new, SHAPE["vocab"])
    worst = 0.0
    for k, new in enumerate(event["tokens"]):
        with torch.no_grad():
            hf = model(torch.tensor([prompt + new[:-1]])).logits[0, len(prompt) - 1 :].numpy()
        worst = max(worst, float(np.abs(hf - logits[k]).max()))
    print(f"max |engine - transformers| logit difference at step 0: {worst:.3g}")
    assert worst < 1e-4, worst


def test_fine_tuning_resumes_bit_exactly_after_kill_9(imported, gpt2, gate, data_cache, tmp_path):
    exp = experiment(tmp_path, gpt2)
    run = tmp_path / "run"
    args = run_args(exp, run, "--init-from", gpt2, engine=gate.engine_flag)  # the same command, every launch
    proxy = None
    for target in (7, 23):
        gate.hold_after(target + KILL_SLACK)
        proxy = Proxy(args, data_cache).start()
        wait_for(lambda: max_logged_step(run) >= target, 240, f"step {target}", proxy, poll=0.005)
        proxy.kill_group(signal.SIGKILL)
        proxy.proc.wait(30)
    gate.open()
    proxy = Proxy(args, data_cache).start()
    assert proxy.wait() == 0, proxy.output()
    assert "step 0 was imported from" in proxy.stdout()  # the relaunch knew; nothing imported again
    a, b = last_steps(imported), last_steps(run)
    assert sorted(a) == sorted(b) == list(range(1, TRAIN["max_steps"] + 1))
    assert [s for s in a if any(a[s][f] != b[s][f] for f in ("loss", "grad_norm", "lr", "tokens", "mixture"))] == []
    name = f"step_{TRAIN['max_steps']:06d}.bin"
    assert_same_checkpoint(imported / "checkpoints" / name, run / "checkpoints" / name)
    assert (run / "checkpoints" / "step_000000.bin").exists()  # retention keeps the starting point


def test_the_model_block_comes_from_config_json(gpt2, engine, data_cache, tmp_path):
    """An experiment without a `model` block takes config.json's shape (ctx: its n_positions), one with part of
    it the rest; the run freezes the whole block and imports step 0 into it."""
    for name, model, want in (("NOMODEL", None, SHAPE), ("SHORTCTX", {"ctx": 32}, {**SHAPE, "ctx": 32})):
        exp = experiment(tmp_path, gpt2, name, max_steps=3, ckpt_every=0, eval_every=3, sample_every=0)
        obj = json.loads(exp.read_text())
        del obj["model"]
        if model is not None:
            obj["model"] = model
        exp.write_text(json.dumps(obj))
        run = tmp_path / f"run-{name}"
        proxy = Proxy(run_args(exp, run, "--init-from", gpt2), data_cache).start()
        assert proxy.wait() == 0, proxy.output()
        assert json.loads((run / "experiment.json").read_text())["model"] == want
        assert f"(vocab {want['vocab']}, ctx {want['ctx']}, dim {want['dim']}," in proxy.stdout()
        assert read_checkpoint(checkpoint_path(run / "checkpoints", 0)).trailer.shape.ctx == want["ctx"]
        assert max(last_steps(run)) == 3


def test_refusals_are_one_line(gpt2, engine, data_cache, tmp_path):
    cases = []
    cases.append(
        (
            experiment(tmp_path, gpt2, "WIDE", model={"dim": 32}),
            gpt2,
            "the experiment's model does not fit it: model.dim 32 (the model's is 64)",
        )
    )
    cases.append(
        (experiment(tmp_path, gpt2, "LONG", model={"ctx": 128}), gpt2, "model.ctx 128 (the model has 64 positions)")
    )
    other = tmp_path / "other.json"
    other.write_text(json.dumps(json.loads((gpt2 / "tokenizer.json").read_text()), indent=4))  # other bytes
    exp = experiment(tmp_path, gpt2, "OTHERTOK")
    obj = json.loads(exp.read_text())
    obj["tokenizer"] = str(other)
    exp.write_text(json.dumps(obj))
    cases.append((exp, gpt2, "the run's tokenizer is not its tokenizer.json"))
    erf = tmp_path / "erf"
    shutil.copytree(gpt2, erf)
    config = json.loads((erf / "config.json").read_text())
    config["activation_function"] = "gelu"
    (erf / "config.json").write_text(json.dumps(config))
    cases.append((experiment(tmp_path, gpt2, "ERF"), erf, "activation_function 'gelu'; this engine computes the tanh"))
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(gpt2 / "config.json", bare)
    cases.append((experiment(tmp_path, gpt2, "BARE"), bare, "no model.safetensors"))
    from safetensors.numpy import save_file

    for kind, value, tensor in (
        ("NaN", np.nan, "transformer.h.1.mlp.c_fc.weight"),
        ("+inf", np.inf, "transformer.ln_f.bias"),
        ("-inf", -np.inf, "transformer.wte.weight"),
    ):
        poisoned = tmp_path / f"poisoned-{kind}"
        shutil.copytree(gpt2, poisoned)
        tensors = load_file(poisoned / "model.safetensors")
        tensors[tensor].reshape(-1)[7] = value
        save_file(tensors, poisoned / "model.safetensors", metadata={"format": "pt"})
        cases.append(
            (
                experiment(tmp_path, gpt2, f"POISON{len(cases)}"),
                poisoned,
                f"model.safetensors: tensor {tensor} holds {kind} (at flat index 7); nothing imported",
            )
        )
    for i, (exp, directory, needle) in enumerate(cases):
        run = tmp_path / f"run{i}"
        result = run_cmd(run_args(exp, run, "--init-from", directory), data_cache)
        line = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else ""
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert line.startswith(f"proxy: --init-from {directory}: ") and needle in line, (needle, line)
        assert not checkpoint_path(run / "checkpoints", 0).exists()
        assert not any((run / "checkpoints").glob("*")) if (run / "checkpoints").exists() else True


def test_the_proxys_checkpoint_writer_is_the_engines(imported):
    """encode_checkpoint, which writes the imported step 0, gives an engine-written checkpoint's bytes back."""
    from proxy.formats.checkpoint import encode_checkpoint

    path = checkpoint_path(imported / "checkpoints", TRAIN["max_steps"])
    ckpt = read_checkpoint(path)
    assert encode_checkpoint(ckpt.step, ckpt.weights, ckpt.m, ckpt.v, ckpt.trailer) == path.read_bytes()

"""The end-of-text token of a given tokenizer (proxy/data/tokenizer.py): the experiment's `eot`, or the first of
COMMON_EOTS the tokenizer holds, or one line saying there is none; and the preparation separating documents with
it."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from proxy.config.experiment import parse_experiment
from proxy.data import prepare_data
from proxy.data.tokenizer import COMMON_EOTS, Tokenizer, TokenizerError
from proxy.formats.shard import read_shard

TEXT = ["the quick brown fox jumps over the lazy dog " * 20, "def f(x):\n    return x + 1\n" * 20]


def tokenizer_json(special: list[str]) -> bytes:
    """A byte-level BPE of 300 tokens whose special tokens are `special` (a Llama-, BERT- or chat-style one)."""
    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    hf.train_from_iterator(TEXT, trainer)
    return hf.to_str().encode()


@pytest.mark.parametrize("eot", COMMON_EOTS)
def test_each_common_end_of_text_token_is_found(eot):
    raw = tokenizer_json(["<pad>", eot])
    tok = Tokenizer.from_json(raw, 512, "t.json")
    assert tok.eot == eot and tok.eot_id == 1 and tok.hf.id_to_token(tok.eot_id) == eot


def test_the_first_common_one_wins_and_a_named_one_overrides():
    raw = tokenizer_json(["[SEP]", "</s>", "<|im_end|>"])
    assert Tokenizer.from_json(raw, 512, "t.json").eot == "</s>"  # COMMON_EOTS' order, not the file's
    named = Tokenizer.from_json(raw, 512, "t.json", "<|im_end|>")
    assert (named.eot, named.eot_id) == ("<|im_end|>", 2)
    assert Tokenizer.from_json(raw, 512, "t.json", eot_id=0).eot == "[SEP]"  # a run's recorded id


def test_no_end_of_text_token_is_one_line():
    raw = tokenizer_json(["<pad>", "<|im_end|>"])
    with pytest.raises(TokenizerError) as none:
        Tokenizer.from_json(raw, 512, "t.json")
    assert str(none.value) == (
        "t.json: has none of the end-of-text tokens <|endoftext|>, </s>, <eos>, [SEP], <|end_of_text|> (the "
        'separator written between documents): name its own in the experiment ("eot": "<|im_end|>")'
    )
    with pytest.raises(TokenizerError, match=r"^t.json: has no token '</s>' \(the experiment's eot\)$"):
        Tokenizer.from_json(raw, 512, "t.json", "</s>")
    with pytest.raises(ValueError, match="eot names the end-of-text token of a given tokenizer"):
        parse_experiment(experiment(None, "</s>"))


def experiment(tokenizer: str | None, eot: str | None) -> dict:
    exp = {
        "name": "eot",
        "model": {"vocab": 320, "ctx": 16, "dim": 16, "layers": 1, "heads": 2},
        "train": {"batch": 2, "max_steps": 10, "lr": 1e-3, "min_lr": 1e-4, "warmup": 1, "seed": 1, "eval_rows": 2},
        "arms": [{"name": "a", "sources": [{"file": "a.txt"}, {"file": "b.txt"}]}],
    }
    if tokenizer is not None:
        exp["tokenizer"] = tokenizer
    if eot is not None:
        exp["eot"] = eot
    return exp


@pytest.mark.parametrize("eot", [None, "<|im_end|>"])
def test_documents_are_separated_by_the_tokenizers_own_token(tmp_path, eot):
    """A Llama-style tokenizer (`</s>`, found) or a chat one (`<|im_end|>`, named): the prepared shards hold that
    token's id after each document, in the workers' encoding as in the main process's."""
    (tmp_path / "tok.json").write_bytes(tokenizer_json(["<unk>", "</s>", "<|im_end|>"]))
    (tmp_path / "a.txt").write_text(TEXT[0] * 40)
    (tmp_path / "b.txt").write_text(TEXT[1] * 40)
    exp = parse_experiment(experiment("tok.json", eot), tmp_path / "exp.json")
    data = prepare_data(exp, tmp_path, tmp_path / "cache", progress=False, workers=2)
    want = 2 if eot else 1
    assert data.tokenizer.eot_id == want
    train = data.train["a"][0].array()
    val = read_shard(data.val_shards["a"])[0]
    assert int((train == want).sum()) + int((val == want).sum()) == 2  # one after each document, nothing else
    other = 1 if eot else 2
    assert int((train == other).sum()) == 0
    again = prepare_data(exp, tmp_path, tmp_path / "cache", progress=False)
    assert again.cached and again.tokenizer.eot_id == want
    assert json.loads(json.dumps(exp.model_dump(exclude_none=True))).get("eot") == eot

"""The tokenizer (HF `tokenizers`): a byte-level BPE trained on the experiment's text, or one it names.

A trained one has id 0 = `<|endoftext|>`, written between documents in the
token shards; every byte sequence encodes (the 256 byte symbols are in the
vocabulary), so any text round-trips: `decode(encode(s)) == s`. It is
trained on a bounded, deterministic sample of the arms' text (prepare.py):
at most SAMPLE_BYTES, so its memory does not grow with the corpus.

A given one (the experiment's `tokenizer`, e.g. GPT-2's `tokenizer.json`) is
used as it is: it must hold at most `model.vocab` tokens and an end-of-text
token (the document separator): the one the experiment names (`eot`), or
else the first of COMMON_EOTS it holds (GPT-2's, Llama 2's and T5's, Gemma's,
BERT's, Llama 3's).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from typing import TypedDict

import numpy as np
from tokenizers import Tokenizer as _HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from ..atomic import atomic_write_text
from ..run_names import READ_LIMITS, TOKENIZER
from .text import PIECE_CHARS, pieces

EOT = "<|endoftext|>"
# the end-of-text tokens looked for, in this order, in a given tokenizer that the experiment names none of
COMMON_EOTS = (EOT, "</s>", "<eos>", "[SEP]", "<|end_of_text|>")
ENCODE_CHARS = 4 * PIECE_CHARS  # the most text given to one encode_batch call (its Encodings are large)
SAMPLE_BYTES = 64 << 20  # the most text a tokenizer is trained on (a deterministic sample of the pieces)
GIVEN_LIMIT = READ_LIMITS[TOKENIZER]  # the largest tokenizer.json read (GPT-2's is 1.4 MB)


# Everything that changes what training produces (part of the data cache key).
class TokenizerSettings(TypedDict):
    """How a tokenizer is trained; hashed into the data cache's key (prepare.py)."""

    kind: str
    special_tokens: list[str]
    add_prefix_space: bool
    use_regex: bool
    min_frequency: int
    sample_bytes: int
    version: int


TOKENIZER_SETTINGS: TokenizerSettings = {
    "kind": "byte_level_bpe",
    "special_tokens": [EOT],
    "add_prefix_space": False,
    "use_regex": True,
    "min_frequency": 2,
    "sample_bytes": SAMPLE_BYTES,
    "version": 3,  # 3: runs longer than text.WORD_CHARS are cut (the sample's pieces change)
}


class TokenizerError(ValueError):
    """A tokenizer that cannot be used; the message is one line."""


class Tokenizer:
    """A trained tokenizer. `vocab_size` is the model's vocabulary (the
    experiment's), at least the number of trained tokens; ids at or above the
    trained count never come out of `encode` and decode to nothing."""

    def __init__(self, hf: _HFTokenizer, vocab_size: int | None = None, eot: str = EOT):
        self.hf = hf
        self.trained_size = hf.get_vocab_size(with_added_tokens=True)
        self.vocab_size = vocab_size if vocab_size is not None else self.trained_size
        if self.vocab_size < self.trained_size:
            raise ValueError(f"vocab_size {self.vocab_size} is below the tokenizer's {self.trained_size} tokens")
        eot_id = hf.token_to_id(eot)
        if eot_id is None:
            raise ValueError(f"tokenizer has no {eot} token")
        self.eot, self.eot_id = eot, eot_id  # the separator written between documents

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        # encode_batch_fast skips the character offsets nothing here uses (same ids, less work)
        encode = getattr(self.hf, "encode_batch_fast", self.hf.encode_batch)
        return [e.ids for e in encode(list(texts), add_special_tokens=False)]

    def encode_pieces(self, texts: Iterable[str]) -> Iterator[np.ndarray]:
        """Each text's ids (uint16), in order, encoded in batches of at most about ENCODE_CHARS characters:
        the tokenizer's per-token objects live for one batch only."""
        batch: list[str] = []
        held = 0
        for text in texts:
            batch.append(text)
            held += len(text)
            if held >= ENCODE_CHARS:
                yield from (np.asarray(ids, dtype=np.uint16) for ids in self.encode_batch(batch))
                batch, held = [], 0
        if batch:
            yield from (np.asarray(ids, dtype=np.uint16) for ids in self.encode_batch(batch))

    def encode_document(self, text: str) -> np.ndarray:
        """A whole document's ids (uint16) as the preparation encodes it: in pieces (text.pieces), so memory
        and time stay bounded whatever one word of it holds."""
        parts = list(self.encode_pieces(pieces(text)))
        return np.concatenate(parts) if parts else np.zeros(0, np.uint16)

    def decode(self, ids: Iterable[int]) -> str:
        ids = [int(i) for i in ids if 0 <= int(i) < self.trained_size]
        return self.hf.decode(ids, skip_special_tokens=False)

    def to_str(self) -> str:
        return self.hf.to_str()

    def save(self, path: str | os.PathLike) -> None:
        """Write the HF tokenizer JSON atomically and durably."""
        atomic_write_text(path, self.to_str())

    @classmethod
    def load(cls, path: str | os.PathLike, vocab_size: int | None = None) -> Tokenizer:
        return cls(_HFTokenizer.from_file(str(path)), vocab_size)

    @classmethod
    def from_json(
        cls, raw: bytes, vocab_size: int, where: str, eot: str | None = None, eot_id: int | None = None
    ) -> Tokenizer:
        """A tokenizer.json's bytes as the model's tokenizer, its end-of-text token `eot`, or the token of id
        `eot_id` (a run's recorded one), or else the first of COMMON_EOTS it holds; TokenizerError (one line
        naming `where`) when it does not parse, has no such token, or holds more tokens than the model's
        vocabulary."""
        try:
            hf = _HFTokenizer.from_str(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise TokenizerError(f"{where}: not a tokenizer.json (not UTF-8: {exc.reason})") from None
        except Exception as exc:  # noqa: BLE001 - tokenizers raises its own Exception subclass
            raise TokenizerError(f"{where}: not a tokenizer.json ({str(exc).splitlines()[0][:200]})") from None
        size = hf.get_vocab_size(with_added_tokens=True)
        if size > vocab_size:
            raise TokenizerError(
                f"{where}: {size} tokens, more than model.vocab {vocab_size} (set model.vocab to at least {size})"
            )
        if eot_id is not None:
            eot = hf.id_to_token(eot_id)
            if eot is None:
                raise TokenizerError(f"{where}: has no token of id {eot_id} (the run's end-of-text token)")
        return cls(hf, vocab_size, end_of_text(hf, where, eot))

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, trained={self.trained_size})"


def end_of_text(hf: _HFTokenizer, where: str, eot: str | None) -> str:
    """The end-of-text token of a given tokenizer: `eot` when named, else the first of COMMON_EOTS it holds;
    TokenizerError (one line) when there is none."""
    if eot is not None:
        if hf.token_to_id(eot) is None:
            raise TokenizerError(f"{where}: has no token {eot!r} (the experiment's eot)")
        return eot
    found = next((t for t in COMMON_EOTS if hf.token_to_id(t) is not None), None)
    if found is None:
        raise TokenizerError(
            f"{where}: has none of the end-of-text tokens {', '.join(COMMON_EOTS)} (the separator written "
            'between documents): name its own in the experiment ("eot": "<|im_end|>")'
        )
    return found


def prompt_ids(tokenizer: Tokenizer, text: str, ctx: int) -> list[int]:
    """A sample prompt as the engine is given it: its tokens, the last `ctx` of them (the model's window).
    Empty when the text encodes to nothing; ValueError for text that is not Unicode (a command-line
    argument with bytes that are not UTF-8 arrives with lone surrogates)."""
    try:
        ids = tokenizer.encode(text)
    except TypeError:
        raise ValueError("is not valid Unicode text (not UTF-8?)") from None
    return list(ids)[-ctx:]


def _empty(vocab_size: int) -> tuple[_HFTokenizer, trainers.BpeTrainer]:
    s = TOKENIZER_SETTINGS
    hf = _HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=s["add_prefix_space"], use_regex=s["use_regex"])
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=s["min_frequency"],
        special_tokens=list(s["special_tokens"]),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    return hf, trainer


def train_tokenizer(documents: Sequence[str], vocab_size: int) -> Tokenizer:
    """Train a byte-level BPE of `vocab_size` tokens (id 0 = EOT) on `documents`.
    Deterministic: the same documents give the same tokenizer."""
    if vocab_size < 258:
        raise ValueError(f"vocab_size {vocab_size} is too small for a byte-level BPE (at least 258)")
    hf, trainer = _empty(vocab_size)
    hf.train_from_iterator(documents, trainer, length=len(documents))
    return Tokenizer(hf, vocab_size)

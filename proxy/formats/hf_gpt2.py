"""The exported model: Hugging Face `GPT2LMHeadModel` files and plain safetensors (docs/FORMATS.md, "Export").

Our model is GPT-2's architecture (docs/ARCHITECTURE.md): the same blocks,
tanh GELU, LayerNorm eps 1e-5, no dropout, the head tied to the token
embedding. Two things differ in how the tensors are laid out:

- transformers' GPT-2 uses `Conv1D` for its projections, whose weight is
  `[in, out]`; ours are `[out, in]` (as `nn.Linear`), so each is transposed;
- `attn.c_attn` packs q, k, v along its output as our `qkv.w` does (q is
  outputs 0..C-1, head h its slice h*C/H..(h+1)*C/H, then k, then v), so it
  needs only the transpose.

The head (`lm_head.weight`) is not written: it is the token embedding, which
`tie_word_embeddings` makes transformers reuse, as its own exports do.

The same mapping read backwards imports such a directory (`proxy run
--init-from`, the inverse of `--format hf`): `config_shape` checks that its
config.json is a model this engine computes (GPT-2, tanh GELU, LayerNorm
eps 1e-5, a 4C MLP, a tied head), `flat_weights` puts its tensors in our
order. Names may carry the `transformer.` prefix (save_pretrained) or not
(the Hub's gpt2); the attention-mask buffers some files hold are skipped.
This module only maps arrays and builds the JSON; it imports neither torch
nor transformers (the proxy does not depend on them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from .parameters import ModelShape, unflatten

LAYER_NORM_EPS = 1e-5  # MG_LN_EPS in microgpt/model.h
GELU_TANH = "gelu_new"  # transformers' name for 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
SAFETENSORS_FORMAT = {"format": "pt"}  # the metadata transformers requires of a safetensors file

# The files of an exported directory. `--format hf` writes them all; `--format safetensors` only the model.
MODEL_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"

# Our per-block tensor -> (transformers' name under `transformer.h.<l>.`, transposed?)
_BLOCK = {
    "ln1.w": ("ln_1.weight", False),
    "ln1.b": ("ln_1.bias", False),
    "qkv.w": ("attn.c_attn.weight", True),
    "qkv.b": ("attn.c_attn.bias", False),
    "proj.w": ("attn.c_proj.weight", True),
    "proj.b": ("attn.c_proj.bias", False),
    "ln2.w": ("ln_2.weight", False),
    "ln2.b": ("ln_2.bias", False),
    "fc.w": ("mlp.c_fc.weight", True),
    "fc.b": ("mlp.c_fc.bias", False),
    "fcproj.w": ("mlp.c_proj.weight", True),
    "fcproj.b": ("mlp.c_proj.bias", False),
}
_TOP = {
    "wte": "transformer.wte.weight",
    "wpe": "transformer.wpe.weight",
    "lnf.w": "transformer.ln_f.weight",
    "lnf.b": "transformer.ln_f.bias",
}


def hf_name(name: str) -> tuple[str, bool]:
    """transformers' name for one of our tensors (`h3.qkv.w` -> `transformer.h.3.attn.c_attn.weight`), and
    whether its layout is the transpose of ours."""
    if name in _TOP:
        return _TOP[name], False
    layer, _, part = name.partition(".")
    hf, transposed = _BLOCK[part]
    return f"transformer.h.{int(layer[1:])}.{hf}", transposed


def hf_tensors(weights: np.ndarray, shape: ModelShape) -> dict[str, np.ndarray]:
    """The flat weights as GPT2LMHeadModel's state dict (contiguous float32 arrays; no lm_head: it is tied)."""
    out = {}
    for name, tensor in unflatten(np.asarray(weights, dtype=np.float32), shape).items():
        hf, transposed = hf_name(name)
        out[hf] = np.ascontiguousarray(tensor.T if transposed else tensor)
    return out


def _our_name(hf: str) -> str | None:
    """Our name for one of transformers' tensor names (prefix `transformer.` optional); None for the buffers
    and the tied head, which carry no parameter of ours."""
    name = hf.removeprefix("transformer.")
    if name in _HF_TOP:
        return _HF_TOP[name]
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "h" and parts[1].isdigit() and parts[2] in _HF_BLOCK:
        return f"h{int(parts[1])}.{_HF_BLOCK[parts[2]]}"
    return None


_HF_TOP = {hf.removeprefix("transformer."): ours for ours, hf in _TOP.items()}
_HF_BLOCK = {hf: ours for ours, (hf, _t) in _BLOCK.items()}
SKIPPED = (["attn", "bias"], ["attn", "masked_bias"])  # causal-mask buffers of older GPT-2 files, not parameters


def flat_weights(tensors: dict[str, np.ndarray], shape: ModelShape) -> np.ndarray:
    """GPT2LMHeadModel's tensors (float32) as our flat weights: ValueError naming a tensor that is missing, of
    the wrong shape, unknown, or an lm_head that is not the token embedding. `ctx` may be below the file's
    positions: wpe's first `ctx` rows are taken."""
    mine: dict[str, np.ndarray] = {}
    head = None
    for hf, tensor in tensors.items():
        if hf in ("lm_head.weight",):
            head = tensor
            continue
        if hf.split(".")[-2:] in SKIPPED:
            continue
        ours = _our_name(hf)
        if ours is None:
            raise ValueError(f"tensor {hf!r} is not part of a GPT-2 model")
        mine[ours] = tensor
    flat = np.empty(shape.n_params, dtype=np.float32)
    views = unflatten(flat, shape)
    for name, view in views.items():
        if name not in mine:
            raise ValueError(f"no tensor {hf_name(name)[0]!r}")
        tensor = mine.pop(name)
        if hf_name(name)[1]:
            tensor = tensor.T
        if name == "wpe" and tensor.ndim == 2 and tensor.shape[0] >= view.shape[0]:
            tensor = tensor[: view.shape[0]]
        if tensor.shape != view.shape:
            raise ValueError(
                f"tensor {hf_name(name)[0]!r} has shape {list(tensor.shape)}, the model's is "
                f"{list(view.shape[::-1] if hf_name(name)[1] else view.shape)}"
            )
        view[...] = tensor
    if mine:
        raise ValueError(f"tensor {hf_name(next(iter(mine)))[0]!r} is beyond the model's {shape.layers} layers")
    if head is not None and not np.array_equal(head, views["wte"]):
        raise ValueError("lm_head.weight is not the token embedding (an untied head; this model ties them)")
    return flat


def config_shape(config: dict) -> ModelShape:
    """The model shape of a GPT-2 config.json (ctx: its n_positions); ValueError naming what this engine does
    not compute (another architecture, activation, epsilon, MLP width, an untied head)."""

    def need(key: str) -> int:
        value = config.get(key)
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"config.json: {key} is {value!r}")
        return value

    if config.get("model_type") != "gpt2":
        raise ValueError(f"config.json: model_type {config.get('model_type')!r}, not 'gpt2'")
    activation = config.get("activation_function", GELU_TANH)
    if activation not in (GELU_TANH, "gelu_pytorch_tanh"):
        raise ValueError(
            f"config.json: activation_function {activation!r}; this engine computes the tanh GELU ({GELU_TANH})"
        )
    eps = config.get("layer_norm_epsilon", LAYER_NORM_EPS)
    if eps != LAYER_NORM_EPS:
        raise ValueError(f"config.json: layer_norm_epsilon {eps!r}; this engine uses {LAYER_NORM_EPS}")
    dim = need("n_embd")
    if config.get("n_inner") not in (None, 4 * dim):
        raise ValueError(f"config.json: n_inner {config.get('n_inner')!r}; this engine's MLP is 4 x n_embd")
    if config.get("tie_word_embeddings", True) is not True:
        raise ValueError("config.json: tie_word_embeddings is false; this engine ties the head to the embedding")
    for key, value in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False)):
        if config.get(key, value) is not value:
            raise ValueError(f"config.json: {key} {config.get(key)!r}; this engine computes {value}")
    return ModelShape(
        vocab=need("vocab_size"), ctx=need("n_positions"), dim=dim, layers=need("n_layer"), heads=need("n_head")
    )


def own_tensors(weights: np.ndarray, shape: ModelShape) -> dict[str, np.ndarray]:
    """The flat weights under our own names and layouts (`--format safetensors`)."""
    return {
        name: np.ascontiguousarray(t) for name, t in unflatten(np.asarray(weights, dtype=np.float32), shape).items()
    }


def encode_safetensors(tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> bytes:
    """A safetensors file, deterministic to the byte: the safetensors library writes its metadata in the
    order of a hash map, which changes from process to process. Tensors in name order, float32 only; the
    JSON header padded with spaces so that the data start 8-byte aligned (as the library does)."""
    header: dict = {"__metadata__": dict(sorted(metadata.items()))}
    offset = 0
    for name in sorted(tensors):
        t = tensors[name]
        if t.dtype != np.float32:
            raise ValueError(f"tensor {name} is {t.dtype}; only float32 is written")
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)
    return b"".join(
        [len(text).to_bytes(8, "little"), text]
        + [np.ascontiguousarray(tensors[name], dtype="<f4").tobytes() for name in sorted(tensors)]
    )


def safetensors_metadata(step: int, shape: ModelShape, source: str) -> dict[str, str]:
    """The string metadata both exports carry: transformers' format tag, and where the weights came from."""
    about = {
        "step": step,
        "vocab": shape.vocab,
        "ctx": shape.ctx,
        "dim": shape.dim,
        "layers": shape.layers,
        "heads": shape.heads,
        "checkpoint": source,
    }
    return {**SAFETENSORS_FORMAT, "microgpt": json.dumps(about, sort_keys=True)}


@dataclass(frozen=True)
class HFConfig:
    """config.json: a GPT2Config that GPT2LMHeadModel loads as our model."""

    shape: ModelShape
    eot_id: int

    def to_dict(self) -> dict:
        s = self.shape
        return {
            "architectures": ["GPT2LMHeadModel"],
            "model_type": "gpt2",
            "vocab_size": s.vocab,
            "n_positions": s.ctx,
            "n_embd": s.dim,
            "n_layer": s.layers,
            "n_head": s.heads,
            "n_inner": None,  # 4 * n_embd
            "activation_function": GELU_TANH,
            "layer_norm_epsilon": LAYER_NORM_EPS,
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
            "scale_attn_weights": True,
            "scale_attn_by_inverse_layer_idx": False,
            "reorder_and_upcast_attn": False,
            "tie_word_embeddings": True,
            "bos_token_id": self.eot_id,
            "eos_token_id": self.eot_id,
            "initializer_range": 0.02,
            "use_cache": True,
            "torch_dtype": "float32",
        }


@dataclass(frozen=True)
class HFGenerationConfig:
    """generation_config.json: the run's sample-audit settings; generation stops at <|endoftext|>."""

    eot_id: int
    max_new: int
    temperature: float
    top_k: int

    def to_dict(self) -> dict:
        out: dict[str, int | float | bool] = {
            "bos_token_id": self.eot_id,
            "eos_token_id": self.eot_id,
            "pad_token_id": self.eot_id,
            "max_new_tokens": self.max_new,
            "do_sample": self.temperature > 0,
        }
        if self.temperature > 0:
            out["temperature"] = self.temperature
            out["top_k"] = self.top_k
        return out


@dataclass(frozen=True)
class HFTokenizerConfig:
    """tokenizer_config.json: tells AutoTokenizer to load tokenizer.json as a fast tokenizer."""

    eot: str
    ctx: int

    def to_dict(self) -> dict:
        return {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": self.eot,
            "eos_token": self.eot,
            "model_max_length": self.ctx,
            "add_prefix_space": False,
            "clean_up_tokenization_spaces": False,
        }

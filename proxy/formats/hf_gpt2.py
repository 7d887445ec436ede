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
    "ln1.w": ("ln_1.weight", False), "ln1.b": ("ln_1.bias", False),
    "qkv.w": ("attn.c_attn.weight", True), "qkv.b": ("attn.c_attn.bias", False),
    "proj.w": ("attn.c_proj.weight", True), "proj.b": ("attn.c_proj.bias", False),
    "ln2.w": ("ln_2.weight", False), "ln2.b": ("ln_2.bias", False),
    "fc.w": ("mlp.c_fc.weight", True), "fc.b": ("mlp.c_fc.bias", False),
    "fcproj.w": ("mlp.c_proj.weight", True), "fcproj.b": ("mlp.c_proj.bias", False),
}
_TOP = {"wte": "transformer.wte.weight", "wpe": "transformer.wpe.weight",
        "lnf.w": "transformer.ln_f.weight", "lnf.b": "transformer.ln_f.bias"}


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


def own_tensors(weights: np.ndarray, shape: ModelShape) -> dict[str, np.ndarray]:
    """The flat weights under our own names and layouts (`--format safetensors`)."""
    return {name: np.ascontiguousarray(t) for name, t in unflatten(np.asarray(weights, dtype=np.float32), shape).items()}


def safetensors_metadata(step: int, shape: ModelShape, source: str) -> dict[str, str]:
    """The string metadata both exports carry: transformers' format tag, and where the weights came from."""
    about = {"step": step, "vocab": shape.vocab, "ctx": shape.ctx, "dim": shape.dim, "layers": shape.layers,
             "heads": shape.heads, "checkpoint": source}
    return {**SAFETENSORS_FORMAT, "microgpt": json.dumps(about, sort_keys=True)}


@dataclass(frozen=True)
class HFConfig:
    """config.json: a GPT2Config that GPT2LMHeadModel loads as our model."""
    shape: ModelShape
    eot_id: int

    def to_dict(self) -> dict:
        s = self.shape
        return {
            "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
            "vocab_size": s.vocab, "n_positions": s.ctx, "n_embd": s.dim, "n_layer": s.layers, "n_head": s.heads,
            "n_inner": None,  # 4 * n_embd
            "activation_function": GELU_TANH, "layer_norm_epsilon": LAYER_NORM_EPS,
            "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
            "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
            "tie_word_embeddings": True, "bos_token_id": self.eot_id, "eos_token_id": self.eot_id,
            "initializer_range": 0.02, "use_cache": True, "torch_dtype": "float32",
        }


@dataclass(frozen=True)
class HFGenerationConfig:
    """generation_config.json: the run's sample-audit settings; generation stops at <|endoftext|>."""
    eot_id: int
    max_new: int
    temperature: float
    top_k: int

    def to_dict(self) -> dict:
        out = {"bos_token_id": self.eot_id, "eos_token_id": self.eot_id, "pad_token_id": self.eot_id,
               "max_new_tokens": self.max_new, "do_sample": self.temperature > 0}
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
        return {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": self.eot, "eos_token": self.eot,
                "model_max_length": self.ctx, "add_prefix_space": False, "clean_up_tokenization_spaces": False}


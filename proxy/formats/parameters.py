"""The model's parameters: one flat float32 array, tensors in a fixed order (docs/ARCHITECTURE.md).

The engine, its checkpoint file, the `--dump-grads` file and the PyTorch
reference all use this order, so the count and the layout are defined here
once. Weight matrices are stored `[out, in]`, row-major, as
`torch.nn.Linear` stores them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def _block(c: int) -> list[tuple[str, tuple[int, ...]]]:
    """One transformer block of width C, in order."""
    return [
        ("ln1.w", (c,)),
        ("ln1.b", (c,)),
        ("qkv.w", (3 * c, c)),
        ("qkv.b", (3 * c,)),
        ("proj.w", (c, c)),
        ("proj.b", (c,)),
        ("ln2.w", (c,)),
        ("ln2.b", (c,)),
        ("fc.w", (4 * c, c)),
        ("fc.b", (4 * c,)),
        ("fcproj.w", (c, 4 * c)),
        ("fcproj.b", (c,)),
    ]


def param_layout(vocab: int, ctx: int, dim: int, layers: int) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every parameter tensor in flat order: wte, wpe, the blocks `h<l>.*`, lnf."""
    out: list[tuple[str, tuple[int, ...]]] = [("wte", (vocab, dim)), ("wpe", (ctx, dim))]
    for layer in range(layers):
        out += [(f"h{layer}.{name}", shape) for name, shape in _block(dim)]
    return out + [("lnf.w", (dim,)), ("lnf.b", (dim,))]


def n_params(vocab: int, ctx: int, dim: int, layers: int) -> int:
    """The length of the flat array: V*C + T*C + L*(12*C*C + 13*C) + 2*C."""
    return sum(math.prod(shape) for _name, shape in param_layout(vocab, ctx, dim, layers))


@dataclass(frozen=True)
class ModelShape:
    """What fixes the parameter layout (heads only splits `dim`)."""

    vocab: int
    ctx: int
    dim: int
    layers: int
    heads: int

    @property
    def n_params(self) -> int:
        return n_params(self.vocab, self.ctx, self.dim, self.layers)

    def layout(self) -> list[tuple[str, tuple[int, ...]]]:
        return param_layout(self.vocab, self.ctx, self.dim, self.layers)


def unflatten(weights: np.ndarray, shape: ModelShape) -> dict[str, np.ndarray]:
    """The flat array as named tensors in flat order (`wte`, `h0.qkv.w`, ...): views, no copies."""
    if weights.shape != (shape.n_params,):
        raise ValueError(
            f"{weights.shape[0] if weights.ndim == 1 else weights.shape} weights for a model of "
            f"{shape.n_params} parameters"
        )
    out, offset = {}, 0
    for name, dims in shape.layout():
        size = math.prod(dims)
        out[name] = weights[offset : offset + size].reshape(dims)
        offset += size
    return out

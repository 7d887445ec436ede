"""A PyTorch twin of the engine's model and optimizer, for the reference tests.

The model is docs/ARCHITECTURE.md's GPT-2: learned token + position embeddings,
pre-LN blocks (causal self-attention with `heads` heads, GELU tanh MLP of width
4C), final LayerNorm, logits tied to wte, mean cross-entropy. Parameters come
from and go back to one flat float32 array in the engine's exact order
(proxy/formats/parameters.py), so weights,
gradients and Adam moments compare element by element with the engine's
checkpoint and `--dump-grads` file.

Written from the contract, deliberately plainly (explicit softmax attention, no
fused kernels), and in float64 by default so that the reference's own rounding
is far below the tolerances the tests allow the float32 engine.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from proxy.formats.parameters import ModelShape

LN_EPS = 1e-5


def decays(name: str) -> bool:
    """Decoupled weight decay applies to the 2-D tensors only."""
    return name.split(".", 1)[-1] in ("wte", "wpe", "qkv.w", "proj.w", "fc.w", "fcproj.w")


def param_slices(s: ModelShape) -> list[tuple[str, slice, tuple[int, ...]]]:
    out, off = [], 0
    for name, shape in s.layout():
        n = math.prod(shape)
        out.append((name, slice(off, off + n), shape))
        off += n
    return out


class Reference:
    """The model as a list of leaf tensors (one per parameter) built from a flat array."""

    def __init__(self, shape: ModelShape, flat: np.ndarray, dtype: torch.dtype = torch.float64):
        flat = np.asarray(flat)
        if flat.shape != (shape.n_params,):
            raise ValueError(f"flat array has {flat.shape}, model needs {shape.n_params}")
        self.shape = shape
        self.dtype = dtype
        self.names, self.params = [], []
        for name, sl, shp in param_slices(shape):
            t = torch.tensor(flat[sl].astype(np.float64), dtype=dtype).reshape(shp).requires_grad_(True)
            self.names.append(name)
            self.params.append(t)
        self.p = dict(zip(self.names, self.params, strict=False))

    # ---------------------------------------------------------------- model
    def logits(self, idx: torch.Tensor) -> torch.Tensor:
        s, p = self.shape, self.p
        B, T = idx.shape
        C, H = s.dim, s.heads
        hd = C // H
        x = p["wte"][idx] + p["wpe"][:T]
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        for layer in range(s.layers):
            q_ = f"h{layer}."
            h = F.layer_norm(x, (C,), p[q_ + "ln1.w"], p[q_ + "ln1.b"], LN_EPS)
            qkv = h @ p[q_ + "qkv.w"].T + p[q_ + "qkv.b"]
            q, k, v = qkv.split(C, dim=-1)
            q = q.view(B, T, H, hd).transpose(1, 2)
            k = k.view(B, T, H, hd).transpose(1, 2)
            v = v.view(B, T, H, hd).transpose(1, 2)
            att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            y = (att @ v).transpose(1, 2).reshape(B, T, C)
            x = x + y @ p[q_ + "proj.w"].T + p[q_ + "proj.b"]
            h = F.layer_norm(x, (C,), p[q_ + "ln2.w"], p[q_ + "ln2.b"], LN_EPS)
            h = F.gelu(h @ p[q_ + "fc.w"].T + p[q_ + "fc.b"], approximate="tanh")
            x = x + h @ p[q_ + "fcproj.w"].T + p[q_ + "fcproj.b"]
        x = F.layer_norm(x, (C,), p["lnf.w"], p["lnf.b"], LN_EPS)
        return x @ p["wte"].T

    def token_losses(self, rows: np.ndarray) -> torch.Tensor:
        """Per-token cross-entropy [rows, T] for uint16 rows [rows, T+1]."""
        rows = torch.from_numpy(np.asarray(rows, dtype=np.int64))
        logits = self.logits(rows[:, :-1])
        V = self.shape.vocab
        return F.cross_entropy(logits.reshape(-1, V), rows[:, 1:].reshape(-1), reduction="none").view(rows.shape[0], -1)

    def loss(self, rows: np.ndarray) -> torch.Tensor:
        return self.token_losses(rows).mean()

    def group_losses(self, rows: np.ndarray, groups: np.ndarray) -> dict[str, float]:
        with torch.no_grad():
            per_row = self.token_losses(rows).mean(dim=1)
        groups = np.asarray(groups)
        return {str(int(g)): float(per_row[torch.from_numpy(groups == g)].mean()) for g in np.unique(groups)}

    # ---------------------------------------------------------------- flat views
    def flat(self) -> np.ndarray:
        return torch.cat([t.detach().reshape(-1) for t in self.params]).numpy()

    def flat_grad(self) -> np.ndarray:
        return torch.cat([t.grad.reshape(-1) for t in self.params]).numpy()

    def zero_grad(self) -> None:
        for t in self.params:
            t.grad = None

    def loss_and_grad(self, rows: np.ndarray) -> tuple[float, np.ndarray]:
        self.zero_grad()
        loss = self.loss(rows)
        loss.backward()
        return loss.item(), self.flat_grad()

    @torch.no_grad()
    def greedy(self, prompt: list[int], max_new: int) -> list[int]:
        ids = list(prompt)
        for _ in range(max_new):
            ctx = torch.tensor([ids[-self.shape.ctx :]])
            ids.append(int(self.logits(ctx)[0, -1].argmax()))
        return ids[len(prompt) :]


def lr_at(s: int, lr: float, min_lr: float, warmup: int, steps: int) -> float:
    """docs/ENGINE.md's schedule for the update that produces step s (1-based)."""
    if s <= warmup:
        return lr * s / warmup
    if s > steps:
        return min_lr
    ratio = (s - warmup) / (steps - warmup)
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * ratio))


class Trainer:
    """torch.optim.AdamW (decay on 2-D tensors only), clip_grad_norm_, the engine's schedule."""

    def __init__(
        self,
        model: Reference,
        lr: float,
        min_lr: float,
        warmup: int,
        steps: int,
        beta1: float,
        beta2: float,
        eps: float,
        weight_decay: float,
        grad_clip: float,
    ):
        self.model = model
        self.sched = dict(lr=lr, min_lr=min_lr, warmup=warmup, steps=steps)
        self.grad_clip = grad_clip
        dec = [t for n, t in zip(model.names, model.params, strict=False) if decays(n)]
        nodec = [t for n, t in zip(model.names, model.params, strict=False) if not decays(n)]
        self.opt = torch.optim.AdamW(
            [{"params": dec, "weight_decay": weight_decay}, {"params": nodec, "weight_decay": 0.0}],
            lr=lr,
            betas=(beta1, beta2),
            eps=eps,
            foreach=False,
        )
        self.step_no = 0

    def step(self, rows: np.ndarray, groups: np.ndarray | None = None) -> dict:
        """One update on all rows (the mean over every row's tokens, as with grad accumulation)."""
        m = self.model
        self.step_no += 1
        lr = lr_at(self.step_no, **self.sched)
        m.zero_grad()
        tl = m.token_losses(rows)
        loss = tl.mean()
        loss.backward()
        grad_norm = float(torch.sqrt(sum((t.grad.double() ** 2).sum() for t in m.params)))
        if self.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(m.params, self.grad_clip)
        for g in self.opt.param_groups:
            g["lr"] = lr
        self.opt.step()
        out = {"step": self.step_no, "loss": loss.item(), "lr": lr, "grad_norm": grad_norm}
        if groups is not None:
            per_row = tl.detach().mean(dim=1)
            groups = np.asarray(groups)
            out["group_loss"] = {
                str(int(g)): float(per_row[torch.from_numpy(groups == g)].mean()) for g in np.unique(groups)
            }
        return out

    def moments(self) -> tuple[np.ndarray, np.ndarray]:
        """Adam's exp_avg and exp_avg_sq as flat arrays in parameter order."""
        ms, vs = [], []
        for t in self.model.params:
            st = self.opt.state[t]
            ms.append(st["exp_avg"].reshape(-1))
            vs.append(st["exp_avg_sq"].reshape(-1))
        return torch.cat(ms).numpy(), torch.cat(vs).numpy()

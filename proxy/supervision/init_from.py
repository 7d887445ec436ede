"""`proxy run --init-from DIR`: step 0 of a new run from a Hugging Face GPT-2 directory (docs/CLI.md).

DIR holds `config.json` and `model.safetensors` (what `save_pretrained` and
the Hub's gpt2 have; read with safetensors and numpy, no torch), and usually
`tokenizer.json`. The experiment's model must be DIR's: the same vocabulary,
width, layers and heads, and a context no longer than its positions (wpe's
first `ctx` rows are taken). The keys its `model` block leaves out (the whole
block too) are taken from config.json (`model_block`), ctx its n_positions. The run's tokenizer must be DIR's too (the
experiment names it with "tokenizer"): the embeddings are its ids.

The weights become `checkpoints/step_000000.bin` with zero AdamW moments and
the experiment's optimizer settings in its trailer (formats/checkpoint.py
writes it byte for byte as the engine would), and the usual run resumes from
it. Phase 0 names that checkpoint in phases.json, so retention keeps it (the
pretrained starting point) and a relaunch knows the run was imported. Until
a step is trained the import is made again at each launch that asks for it;
afterwards a relaunch with the same `--init-from` finds it done, and any
other is refused.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..atomic import atomic_write_bytes, make_dirs
from ..config.experiment import Experiment
from ..errors import EXIT_USAGE, ProxyError
from ..formats import bounded_json
from ..formats.checkpoint import Trailer, checkpoint_path, encode_checkpoint, read_trailer
from ..formats.engine_cli import meta_text
from ..formats.hf_gpt2 import CONFIG_FILE, MODEL_FILE, TOKENIZER_FILE, config_shape, flat_weights
from ..formats.parameters import ModelShape
from ..rundir.layout import RunDir, relative_checkpoint
from ..rundir.phases import read_phases, write_phases
from ..safe_fs import UnsafeFileError, file_sha256, read_regular
from .context import Console
from .run_data import RunData

CONFIG_LIMIT = 1 << 20
ENGINE_NAME = "import"  # the trailer's "engine": this step 0 was made by the proxy, not trained


def _fail(directory: Path, why: str) -> ProxyError:
    return ProxyError(f"--init-from {directory}: {why}", EXIT_USAGE)


def read_config(directory: Path) -> ModelShape:
    try:
        config = bounded_json.loads(read_regular(directory / CONFIG_FILE, CONFIG_LIMIT))
    except FileNotFoundError:
        raise _fail(
            directory, f"no {CONFIG_FILE} (a Hugging Face GPT-2 directory holds config.json and {MODEL_FILE})"
        ) from None
    except (OSError, UnsafeFileError, ValueError, RecursionError) as exc:
        raise _fail(directory, f"{CONFIG_FILE} unreadable ({exc})") from None
    if not isinstance(config, dict):
        raise _fail(directory, f"{CONFIG_FILE} is not a JSON object")
    try:
        return config_shape(config)
    except ValueError as exc:
        raise _fail(directory, str(exc)) from None


def model_block(directory: Path) -> dict[str, int]:
    """The experiment's `model` block as DIR's config.json gives it (ctx: its n_positions): the values of the
    keys an experiment leaves out (config/overrides.py, with_model_defaults)."""
    if not Path(directory).is_dir():
        raise _fail(directory, "no such directory")
    shape = read_config(Path(directory))
    return {"vocab": shape.vocab, "ctx": shape.ctx, "dim": shape.dim, "layers": shape.layers, "heads": shape.heads}


def read_tensors(directory: Path) -> dict[str, np.ndarray]:
    """model.safetensors as float32 arrays (float16 widened exactly); one line for anything else."""
    from safetensors import SafetensorError, safe_open  # noqa: PLC0415 - only the import reads them

    path = directory / MODEL_FILE
    if not path.is_file():
        other = [p.name for p in directory.glob("*") if p.name in ("pytorch_model.bin", "model.safetensors.index.json")]
        hint = f" ({other[0]} is not read: save it again with safe_serialization, one file)" if other else ""
        raise _fail(directory, f"no {MODEL_FILE}{hint}")
    out = {}
    try:
        with safe_open(str(path), framework="numpy") as f:
            for name in f.keys():
                dtype = f.get_slice(name).get_dtype()
                if dtype not in ("F32", "F16"):
                    raise _fail(directory, f"{MODEL_FILE}: tensor {name} is {dtype}; float32 or float16 are read")
                out[name] = f.get_tensor(name).astype(np.float32, copy=False)
    except (SafetensorError, OSError, ValueError) as exc:
        raise _fail(directory, f"{MODEL_FILE} unreadable ({str(exc)[:200]})") from None
    bad = non_finite(out)
    if bad is not None:  # else the import would write a diverged step 0 that the resume rule passes over
        raise _fail(directory, f"{MODEL_FILE}: {bad}; nothing imported")
    return out


def non_finite(tensors: dict[str, np.ndarray]) -> str | None:
    """'tensor NAME holds NaN (at index I)' (or inf) for the first tensor, in name order, that is not all
    finite; None when every value of every tensor is finite."""
    for name in sorted(tensors):
        flat = tensors[name].reshape(-1)
        finite = np.isfinite(flat)
        if not finite.all():
            index = int(np.argmin(finite))  # the first False
            kind = "NaN" if np.isnan(flat[index]) else ("+inf" if flat[index] > 0 else "-inf")
            return f"tensor {name} holds {kind} (at flat index {index})"
    return None


def _trailer(experiment: Experiment, shape: ModelShape, meta: dict) -> Trailer:
    t = experiment.train
    return Trailer(
        shape=shape,
        batch=t.batch,
        grad_accum=t.grad_accum,
        warmup=t.warmup,
        max_steps=t.max_steps,
        lr=t.lr,
        min_lr=t.min_lr,
        lr_schedule=t.lr_schedule,
        decay_fraction=t.decay_fraction,
        beta1=t.beta1,
        beta2=t.beta2,
        eps=t.eps,
        weight_decay=t.weight_decay,
        grad_clip=t.grad_clip,
        seed=t.seed,
        tokens_seen=0,
        meta=json.dumps({"engine": ENGINE_NAME, "meta": bounded_json.loads(meta_text(meta))}, separators=(",", ":")),
    )


def _imported_from(path: Path) -> dict | None:
    """What an existing step_000000.bin says it was imported from, or None."""
    trailer = read_trailer(path)
    try:
        meta = bounded_json.loads(trailer.meta) if trailer is not None else None
    except ValueError:
        return None
    inner = meta.get("meta") if isinstance(meta, dict) and meta.get("engine") == ENGINE_NAME else None
    return inner.get("init_from") if isinstance(inner, dict) else None


def import_model(
    run: RunDir, experiment: Experiment, data: RunData, directory: Path, trained: bool, console: Console
) -> None:
    directory = Path(directory)
    if not directory.is_dir():
        raise _fail(directory, "no such directory")
    model_path = directory / MODEL_FILE
    target = checkpoint_path(run.checkpoints, 0)
    source = {"path": str(directory.resolve())}
    if trained:
        done = _imported_from(target) if target.is_file() else None
        if done is not None and done.get("path") == source["path"]:
            console.say(f"step 0 was imported from {directory} already; the run goes on from its checkpoints")
            return
        raise _fail(directory, f"{run.root} has trained already; --init-from makes step 0 of a new run")
    shape = read_config(directory)
    m = experiment.model
    wanted = ModelShape(m.vocab, m.ctx, m.dim, m.layers, m.heads)
    differ = [
        f"{k} {getattr(wanted, k)} (the model's is {getattr(shape, k)})"
        for k in ("vocab", "dim", "layers", "heads")
        if getattr(wanted, k) != getattr(shape, k)
    ]
    if m.ctx > shape.ctx:
        differ.append(f"ctx {m.ctx} (the model has {shape.ctx} positions)")
    if differ:
        raise _fail(directory, "the experiment's model does not fit it: model." + "; model.".join(differ))
    given = directory / TOKENIZER_FILE
    if given.is_file():
        try:
            theirs = read_regular(given, len(data.tokenizer_json) + 1)
        except UnsafeFileError:
            theirs = b""
        except OSError as exc:
            raise _fail(directory, f"{TOKENIZER_FILE} unreadable ({exc.strerror})") from None
        if theirs != data.tokenizer_json:
            raise _fail(
                directory,
                f"the run's tokenizer is not its {TOKENIZER_FILE}: name that file in the "
                f'experiment ("tokenizer": "{given}")',
            )
    elif data.definition.tokenizer.given is None:
        raise _fail(
            directory,
            f"no {TOKENIZER_FILE}, and the run trains its own tokenizer, whose ids are not "
            "the model's: name the model's tokenizer in the experiment (\"tokenizer\")",
        )
    try:
        weights = flat_weights(read_tensors(directory), wanted)
    except ValueError as exc:
        raise _fail(directory, f"{MODEL_FILE}: {exc}") from None
    source["model_sha256"] = file_sha256(model_path)[1]
    zeros = np.zeros_like(weights)
    meta = {"experiment": experiment.name, "phase": 0, "init_from": source}
    raw = encode_checkpoint(0, weights, zeros, zeros, _trailer(experiment, wanted, meta))
    make_dirs(run.checkpoints)
    atomic_write_bytes(target, raw)
    phases = read_phases(run)
    if len(phases) == 1 and phases[0].checkpoint is None:  # the run starts from it (and retention keeps it)
        write_phases(run, [replace(phases[0], checkpoint=relative_checkpoint(0))])
    console.say(
        f"step 0 imported from {directory}: {wanted.n_params:,} parameters "
        f"(vocab {m.vocab}, ctx {m.ctx}, dim {m.dim}, layers {m.layers}, heads {m.heads}); AdamW moments zero"
    )

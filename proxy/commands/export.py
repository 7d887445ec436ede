"""`proxy export`: a checkpoint as a Hugging Face GPT-2 directory, or as plain safetensors (docs/CLI.md).

`--format hf` (the default) writes what `GPT2LMHeadModel.from_pretrained`
and `AutoTokenizer.from_pretrained` load: `model.safetensors` under
transformers' names and layouts, `config.json`, `generation_config.json`,
the run's tokenizer as `tokenizer.json`, and `tokenizer_config.json`
(formats/hf_gpt2.py). `--format safetensors` writes `model.safetensors`
alone, under our own tensor names and layouts (docs/ARCHITECTURE.md).

The directory is built next to `--out` under a temporary name, every file
fsynced, and renamed into place: it appears whole or not at all. `--out`
must be a new path or an empty directory; missing parent directories are
created (targets.py). The run is only read.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TextIO

from .. import temp_names
from ..atomic import fsync_dir, json_bytes, write_synced
from ..errors import EXIT_OK, add_note
from ..formats.hf_gpt2 import (
    CONFIG_FILE,
    GENERATION_CONFIG_FILE,
    MODEL_FILE,
    TOKENIZER_CONFIG_FILE,
    TOKENIZER_FILE,
    HFConfig,
    HFGenerationConfig,
    HFTokenizerConfig,
    hf_tensors,
    own_tensors,
    safetensors_metadata,
)
from ..formats.hf_gpt2 import encode_safetensors as safetensors_bytes
from .model_source import ModelSource, read_model_checkpoint, resolve_source, run_data, say_warnings
from .targets import check_new_dir, make_parents

FORMATS = ("hf", "safetensors")


def export_files(source: ModelSource, fmt: str, cache_dir: str | None) -> dict[str, bytes]:
    """The exported directory's files, by name."""
    weights = read_model_checkpoint(source.path).weights  # it verified a moment ago; it may have changed since
    metadata = safetensors_metadata(source.step, source.shape, source.path.name)
    if fmt == "safetensors":
        return {MODEL_FILE: safetensors_bytes(own_tensors(weights, source.shape), metadata)}
    _run, experiment = source.require_run("the tokenizer")
    data = run_data(source, cache_dir, "the tokenizer")
    eot, audits = data.tokenizer.eot_id, experiment.samples
    return {
        MODEL_FILE: safetensors_bytes(hf_tensors(weights, source.shape), metadata),
        CONFIG_FILE: json_bytes(HFConfig(source.shape, eot).to_dict()),
        GENERATION_CONFIG_FILE: json_bytes(
            HFGenerationConfig(eot, int(audits.max_new), float(audits.temperature), int(audits.top_k or 0)).to_dict()
        ),
        TOKENIZER_FILE: data.tokenizer_json,
        TOKENIZER_CONFIG_FILE: json_bytes(HFTokenizerConfig(data.tokenizer.eot, source.shape.ctx).to_dict()),
    }


def write_directory(out: Path, files: dict[str, bytes]) -> None:
    """`out` with `files`, whole or not at all: a temp directory beside it (temp_names.py: created
    exclusively, under a name no one can predict), fsynced, renamed into place (over an empty directory
    too). The temp directories of exports and forks killed there earlier are removed first."""
    make_parents(out, "--out")
    temp_names.remove_leftovers(out.parent, (temp_names.FORK, temp_names.EXPORT))
    tmp = None
    try:
        tmp = temp_names.make_dir(out.parent, out.name, temp_names.EXPORT)
        for name, data in files.items():
            write_synced(tmp / name, data)
        fsync_dir(tmp)
        check_new_dir(out, "--out")  # filled by someone else while we wrote?
        os.rename(tmp, out)
        fsync_dir(out.parent)
    except OSError as exc:  # cli.py says which file and why (exit 1)
        add_note(exc, f"cannot write {out}")
        raise
    finally:
        if tmp is not None:
            temp_names.remove_entry(tmp)


def main(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    target = Path(args.out)
    check_new_dir(target, "--out")
    source = resolve_source(args.run_dir, args.step, args.checkpoint)
    say_warnings(source)
    files = export_files(source, args.format, args.cache_dir)
    write_directory(target, files)
    where = f" of {source.run.root}" if source.run is not None else ""
    print(
        f"exported step {source.step}{where} ({source.path}) to {target}: "
        + ", ".join(f"{name} ({len(data):,} bytes)" for name, data in files.items()),
        file=out,
        flush=True,
    )
    if args.format == "hf":
        print(
            f"load with: GPT2LMHeadModel.from_pretrained({str(target)!r}), "
            f"AutoTokenizer.from_pretrained({str(target)!r})",
            file=out,
            flush=True,
        )
    return EXIT_OK

"""`proxy sample`: text from any checkpoint, through the engine's SAMPLE frame (docs/CLI.md, "proxy sample").

The same code path as the run's sample audits: the prompt is encoded with the
run's tokenizer (its last ctx tokens, as the audits do), the engine resumes
the checkpoint read-only (checkpoint_engine.py) and answers one SAMPLE frame
with one `sample` event holding every completion. Each completion is printed
as soon as that event arrives; the engine does not stream tokens one by one.
The same checkpoint, prompt, settings and seed print the same text.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import TextIO

from ..config.experiment import SampleConfig
from ..data.tokenizer import Tokenizer, prompt_ids
from ..errors import EXIT_OK, EXIT_USAGE, ProxyError
from ..formats import frames
from ..formats.parameters import ModelShape
from ..supervision.engine_process import choose_engine
from .checkpoint_engine import CheckpointEngine
from .model_source import resolve_source, run_data, say_warnings


@dataclass(frozen=True)
class SampleSettings:
    max_new: int
    temperature: float
    top_k: int
    seed: int
    count: int


def settings_from(args: argparse.Namespace, audits: SampleConfig) -> SampleSettings:
    """The command's options; what is not given is the run's sample-audit setting (count: 1, seed: 0)."""
    return SampleSettings(
        max_new=args.max_new if args.max_new is not None else int(audits.max_new),
        temperature=args.temperature if args.temperature is not None else float(audits.temperature),
        top_k=args.top_k if args.top_k is not None else int(audits.top_k or 0),
        seed=args.seed,
        count=args.count,
    )


def sample_request(request_id: int, prompt: list[int], settings: SampleSettings) -> bytes:
    """The SAMPLE frame for one prompt's completions. The one place `proxy sample` builds a frame: the
    multi-prompt SAMPLE frame replaces this call alone."""
    return frames.sample_frame(
        request_id, prompt, settings.count, settings.max_new, settings.temperature, settings.top_k, settings.seed
    )


def encode_prompt(tokenizer: Tokenizer, text: str, shape: ModelShape) -> list[int]:
    """The prompt's token ids (its Unicode checked by cli.py); ProxyError for a prompt that has none or that
    the model cannot take."""
    ids = prompt_ids(tokenizer, text, shape.ctx)
    if not ids:
        raise ProxyError(f"--prompt {text!r} encodes to no tokens", EXIT_USAGE)
    beyond = [i for i in ids if i >= shape.vocab]
    if beyond:
        raise ProxyError(
            f"--prompt encodes to token id {max(beyond)}, outside the model's vocabulary of {shape.vocab}", EXIT_USAGE
        )
    return ids


def main(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    source = resolve_source(args.run_dir, args.step, args.checkpoint)
    say_warnings(source)
    _run, experiment = source.require_run("the tokenizer")
    data = run_data(source, args.cache_dir, "the tokenizer")
    ids = encode_prompt(data.tokenizer, args.prompt, source.shape)
    settings = settings_from(args, experiment.samples)
    choice = choose_engine(args.engine)
    with CheckpointEngine(choice, source) as engine:
        event = engine.ask(sample_request(1, ids, settings), "sample")
        completions = event["tokens"]
        for i, tokens in enumerate(completions):  # each headed, one sample too: it says which step spoke
            print(f"--- sample {i + 1} of {len(completions)} (step {source.step}, seed {settings.seed})", file=out)
            print(args.prompt + data.tokenizer.decode(tokens), file=out, flush=True)
    return EXIT_OK

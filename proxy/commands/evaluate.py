"""`proxy eval`: a checkpoint's validation loss, per arm or per text file (docs/CLI.md, "proxy eval").

By default the rows are the ones the run's evals use (the batch sampler's
eval rows: `train.eval_tokens` worth of rows, or `train.eval_rows`, evenly
spaced over each arm's validation shard), sent as the run sends them (one EVAL frame holding every arm's rows,
group id = arm) to the same engine, and combined by the same rule
(formats/loss_log.py `eval_loss`), so on the same build the result equals the
eval entry the run logged at that step, bit for bit.

`--data FILE ...` evaluates text files instead (read when the arguments are
parsed, cli.py `_text_file`: a regular file of UTF-8 text, at most
EVAL_DATA_LIMIT bytes): each is encoded with the
run's tokenizer as the shards encode a document (in pieces; its tokens, then
<|endoftext|>) and cut into the fewest rows of ctx + 1 tokens that cover it,
spaced by the same rule.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import NamedTuple, TextIO

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..data.batches import eval_rows, evenly_spaced_starts
from ..errors import EXIT_OK, EXIT_USAGE, ProxyError
from ..formats import frames
from ..formats.loss_log import eval_loss
from ..supervision.engine_process import choose_engine
from .checkpoint_engine import CheckpointEngine
from .model_source import HeldData, ModelSource, resolve_source, run_data, say_warnings


class Part(NamedTuple):
    """One part evaluated: an arm (its validation rows) or a file (the rows that cover it)."""

    name: str
    tokens: np.ndarray  # [rows, ctx + 1]
    groups: np.ndarray  # [rows], the part's group id
    starts: np.ndarray  # [rows], ascending: where each row starts in its shard or file


def predicted_tokens(starts: np.ndarray, ctx: int) -> int:
    """How many distinct positions the rows predict: a row starting at s predicts s+1 .. s+ctx, and
    overlapping rows (the last row of a file, a short shard) predict some positions twice, counted once."""
    starts = np.asarray(starts, dtype=np.int64)
    gaps = np.minimum(np.diff(starts), ctx)
    return int(gaps.sum()) + ctx if starts.size else 0


def arm_parts(source: ModelSource, data: HeldData) -> list[Part]:
    """Each arm's validation rows, exactly as the run's evals take them (the run's frozen validation tokens)."""
    run, experiment = source.require_run("the validation data")
    longest = max(data.val[name].size for name in experiment.arm_names)
    rows, row_len = experiment.train.eval_row_count(source.shape.ctx, longest), source.shape.ctx + 1
    parts = []
    for arm, name in enumerate(experiment.arm_names):
        val = data.val[name]
        if val.size < row_len:
            raise ProxyError(
                f"the validation data of {run.root}: arm {name!r} holds {val.size} "
                f"tokens, fewer than one row of {row_len}",
                EXIT_USAGE,
            )
        parts.append(
            Part(
                name,
                eval_rows(val, row_len, rows),
                np.full(rows, arm, dtype=np.uint16),
                evenly_spaced_starts(val.size, row_len, rows),
            )
        )
    return parts


def file_parts(files: list[tuple[str, str]], data: HeldData, ctx: int) -> list[Part]:
    """Each file, (name, text), as one document (its tokens, then <|endoftext|>), in the fewest rows that
    cover it."""
    names = [name for name, _text in files]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ProxyError(f"--data names {', '.join(twice)} more than once", EXIT_USAGE)
    parts = []
    row_len = ctx + 1
    for group, (name, text) in enumerate(files):
        tokens = np.append(data.tokenizer.encode_document(text), np.uint16(data.tokenizer.eot_id))
        if tokens.size < row_len:
            raise ProxyError(
                f"--data {name}: {tokens.size} tokens, fewer than the {row_len} (ctx + 1) of one row", EXIT_USAGE
            )
        rows = math.ceil((tokens.size - 1) / ctx)
        starts = evenly_spaced_starts(tokens.size, row_len, rows)
        windows = np.ascontiguousarray(sliding_window_view(tokens, row_len)[starts])
        parts.append(Part(name, windows, np.full(rows, group, dtype=np.uint16), starts))
    return parts


def evaluate(engine: CheckpointEngine, parts: list[Part]) -> list[tuple[float, float]]:
    """(loss, tokens) of each part: every part's rows in one EVAL frame (each part its own group id), the
    way the run's evals send every arm's rows. Rows past the engine's frame limit (a long `--data` file of a
    short-context model) go in further frames, in order, and each part's loss is the token-weighted mean
    of its frames' (one frame, as every run's eval is, gives the engine's figure itself)."""
    tokens = np.concatenate([p.tokens for p in parts])
    groups = np.concatenate([p.groups for p in parts])
    events = [
        engine.ask(
            frames.eval_frame(1 + k, tokens[at : at + frames.MAX_FRAME_ROWS], groups[at : at + frames.MAX_FRAME_ROWS]),
            "eval",
        )
        for k, at in enumerate(range(0, len(tokens), frames.MAX_FRAME_ROWS))
    ]
    if len(events) == 1:
        return [frames.group_result(events[0], int(p.groups[0])) for p in parts]
    out = []
    for p in parts:
        group = int(p.groups[0])
        present = [frames.group_result(e, group) for e in events if str(group) in (e.get("group_loss") or {})]
        total = sum(n for _loss, n in present)
        out.append((sum(loss * n for loss, n in present) / total, total))
    return out


def eval_report(source: ModelSource, key: str, parts: list[Part], results: list[tuple[float, float]]) -> dict:
    """What `proxy eval --json` prints: the step, the loss (each part weighted by its rows' predictions, as
    the run's evals weigh arms), and each part's loss and the distinct tokens its rows predict."""
    ctx = source.shape.ctx
    return {
        "checkpoint": str(source.path),
        "step": source.step,
        "loss": eval_loss(results),
        key: {p.name: loss for p, (loss, _t) in zip(parts, results, strict=False)},
        "tokens": {p.name: predicted_tokens(p.starts, ctx) for p in parts},
    }


def format_report(report: dict, key: str) -> str:
    width = max(len(n) for n in report[key])
    lines = [f"step {report['step']} ({report['checkpoint']}): validation loss {report['loss']:.6f}"]
    lines += [
        f"  {name:<{width}}  {loss:.6f}  ({report['tokens'][name]:,} tokens)" for name, loss in report[key].items()
    ]
    return "\n".join(lines)


def main(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    source = resolve_source(args.run_dir, args.step, args.checkpoint)
    say_warnings(source)
    data = run_data(
        source, args.cache_dir, "the tokenizer" if args.data else "the validation data", need_val=not args.data
    )
    key = "files" if args.data else "arms"
    parts = file_parts(args.data, data, source.shape.ctx) if args.data else arm_parts(source, data)
    choice = choose_engine(args.engine)
    with CheckpointEngine(choice, source) as engine:
        results = evaluate(engine, parts)
    report = eval_report(source, key, parts, results)
    print(json.dumps(report, indent=1) if args.json else format_report(report, key), file=out, flush=True)
    return EXIT_OK

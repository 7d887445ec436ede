"""`proxy eval`: a checkpoint's validation loss, per arm or per text file (docs/CLI.md, "proxy eval").

By default the rows are the ones the run's evals use (the batch sampler's
eval rows: `train.eval_rows` evenly spaced rows of each arm's validation
shard), sent as the run sends them (one EVAL frame holding every arm's rows,
group id = arm) to the same engine, and combined by the same rule
(formats/loss_log.py `eval_loss`), so on the same build the result equals the
eval entry the run logged at that step, bit for bit.

`--data FILE ...` evaluates text files instead: each is encoded with the
run's tokenizer as the shards encode a document (its tokens, then
<|endoftext|>) and cut into the fewest rows of ctx + 1 tokens that cover it,
spaced by the same rule.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..data.batches import eval_rows, evenly_spaced_starts
from ..errors import EXIT_OK, EXIT_USAGE, ProxyError
from ..formats import frames
from ..formats.loss_log import eval_loss
from ..supervision.engine_process import EngineError, choose_engine
from .checkpoint_engine import CheckpointEngine
from .model_source import HeldData, ModelSource, resolve_source, run_data, say_warnings

# (name, tokens [rows, ctx + 1], group ids [rows]) of one part evaluated: an arm or a file
Part = tuple[str, np.ndarray, np.ndarray]


def arm_parts(source: ModelSource, data: HeldData) -> list[Part]:
    """Each arm's validation rows, exactly as the run's evals take them (the run's frozen validation tokens)."""
    _run, experiment = source.require_run("the validation data")
    rows, row_len = int(experiment.train.eval_rows), source.shape.ctx + 1
    parts = []
    for arm, name in enumerate(experiment.arm_names):
        if data.val[name].size < row_len:
            raise ProxyError(f"the validation data of {source.run.root}: arm {name!r} holds {data.val[name].size} "
                             f"tokens, fewer than one row of {row_len}", EXIT_USAGE)
        parts.append((name, eval_rows(data.val[name], row_len, rows), np.full(rows, arm, dtype=np.uint16)))
    return parts


def file_parts(paths: list[str], data: HeldData, ctx: int) -> list[Part]:
    """Each file as one document (its tokens, then <|endoftext|>), in the fewest rows that cover it."""
    twice = sorted({p for p in paths if paths.count(p) > 1})
    if twice:
        raise ProxyError(f"--data names {', '.join(twice)} more than once", EXIT_USAGE)
    parts = []
    row_len = ctx + 1
    for group, name in enumerate(paths):
        try:
            text = Path(name).read_text(encoding="utf-8")
        except OSError as exc:
            raise ProxyError(f"--data {name}: cannot read: {exc.strerror}", EXIT_USAGE) from None
        except UnicodeDecodeError as exc:
            raise ProxyError(f"--data {name}: not UTF-8 text ({exc.reason} at byte {exc.start})", EXIT_USAGE) from None
        tokens = np.array(data.tokenizer.encode(text) + [data.tokenizer.eot_id], dtype=np.uint16)
        if tokens.size < row_len:
            raise ProxyError(f"--data {name}: {tokens.size} tokens, fewer than the {row_len} (ctx + 1) of one row",
                             EXIT_USAGE)
        rows = math.ceil((tokens.size - 1) / ctx)
        starts = evenly_spaced_starts(tokens.size, row_len, rows)
        windows = np.ascontiguousarray(sliding_window_view(tokens, row_len)[starts])
        parts.append((name, windows, np.full(rows, group, dtype=np.uint16)))
    return parts


def evaluate(engine: CheckpointEngine, parts: list[Part]) -> list[tuple[float, float]]:
    """(loss, tokens) of each part: every part's rows in one EVAL frame (each part its own group id), the
    way the run's evals send every arm's rows."""
    tokens = np.concatenate([t for _name, t, _g in parts])
    groups = np.concatenate([g for _name, _t, g in parts])
    event = engine.ask(frames.eval_frame(1, tokens, groups), "eval")
    return [frames.group_result(event, int(g[0])) for _name, _t, g in parts]


def eval_report(source: ModelSource, key: str, parts: list[Part], results: list[tuple[float, float]]) -> dict:
    """What `proxy eval --json` prints: the step, the token-weighted loss, and each part's loss and tokens."""
    names = [name for name, _t, _g in parts]
    return {"checkpoint": str(source.path), "step": source.step, "loss": eval_loss(results),
            key: {n: loss for n, (loss, _t) in zip(names, results)},
            "tokens": {n: int(t) for n, (_l, t) in zip(names, results)}}


def format_report(report: dict, key: str) -> str:
    width = max(len(n) for n in report[key])
    lines = [f"step {report['step']} ({report['checkpoint']}): validation loss {report['loss']:.6f}"]
    lines += [f"  {name:<{width}}  {loss:.6f}  ({report['tokens'][name]:,} tokens)"
              for name, loss in report[key].items()]
    return "\n".join(lines)


def main(args, out=None) -> int:
    out = out or sys.stdout
    source = resolve_source(args.run_dir, args.step, args.checkpoint)
    say_warnings(source)
    data = run_data(source, args.cache_dir, "the tokenizer" if args.data else "the validation data",
                    need_val=not args.data)
    key = "files" if args.data else "arms"
    parts = file_parts(args.data, data, source.shape.ctx) if args.data else arm_parts(source, data)
    try:
        choice = choose_engine(args.engine)
    except EngineError as exc:
        raise ProxyError(str(exc), EXIT_USAGE) from None
    with CheckpointEngine(choice, source) as engine:
        results = evaluate(engine, parts)
    report = eval_report(source, key, parts, results)
    print(json.dumps(report, indent=1) if args.json else format_report(report, key), file=out, flush=True)
    return EXIT_OK

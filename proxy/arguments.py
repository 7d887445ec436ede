"""The arguments of every `proxy` subcommand (docs/CLI.md): `build_parser`, and the words and caps they use.

Apart from proxy/cli.py (the dispatch) so that a layer below the commands can read a command line the way
the proxy does (rundir/lock_holder.py: is a lock's holder a proxy of this run) without importing them.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import NoReturn, TypeVar

from .config.policies import POLICIES
from .safe_fs import UnsafeFileError, read_regular

T = TypeVar("T")


class UsageError(Exception):
    """A bad argument: its one line, for proxy/cli.py to print (exit 2)."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line (and exit 2), not usage plus a line."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


def _checked(convert: Callable[[str], T], what: str, ok: Callable[[T], bool], why: str) -> Callable[[str], T]:
    """An argparse type: `convert(text)` ("not <what>" if it fails), refused with "<why>" unless `ok(value)`."""

    def parse(text: str) -> T:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"{why}: {text!r}")
        return value

    return parse


_positive_float = _checked(float, "a number", lambda v: v > 0, "must be positive")
_non_negative_float = _checked(float, "a number", lambda v: 0 <= v < float("inf"), "must be a finite number >= 0")
_port = _checked(int, "a port number", lambda v: 0 < v < 65536, "port out of range")


def _int_in(low: int, high: int) -> Callable[[str], int]:
    return _checked(int, "an integer", lambda v: low <= v <= high, f"must be in [{low}, {high}]")


STEP_LATEST, STEP_BEST = "latest", "best"  # the --step words (proxy/commands/model_source.py)
# The largest `proxy eval --data` file read: a FIFO, a device or a larger file is refused with one line
# before anything is read. Tokenizing takes several times its size.
EVAL_DATA_LIMIT = 64 << 20


_step = _checked(int, "a step number", lambda v: v >= 0, "a step is >= 0")
_step_number = _checked(int, f"a step number, {STEP_LATEST} or {STEP_BEST}", lambda v: v >= 0, "a step is >= 0")


def _step_choice(text: str) -> str | int:
    """`--step`: a step number, `latest` or `best`."""
    return text if text in (STEP_LATEST, STEP_BEST) else _step_number(text)


def _unicode_text(text: str) -> str:
    """A text argument the tokenizer can take: one with bytes that are not UTF-8 arrives holding lone
    surrogates, which it cannot encode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError("not valid Unicode text (bytes that are not UTF-8?)") from None
    return text


def _text_file(name: str) -> tuple[str, str]:
    """`--data FILE`: (FILE, its text). A regular file of at most EVAL_DATA_LIMIT bytes of UTF-8: never a FIFO
    or a device, which would block or never end."""
    try:
        return name, read_regular(name, EVAL_DATA_LIMIT).decode("utf-8")
    except UnsafeFileError as exc:  # a FIFO, a device, a directory, larger than EVAL_DATA_LIMIT
        raise argparse.ArgumentTypeError(str(exc)) from None
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"{name}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise argparse.ArgumentTypeError(f"{name}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def _add_checkpoint_choice(parser: argparse.ArgumentParser) -> None:
    """Which checkpoint export, sample and eval use (proxy/commands/model_source.py)."""
    parser.add_argument(
        "--run-dir",
        metavar="DIR",
        help="the run (default: the most recently active run under runs/; with --checkpoint, the run holding it)",
    )
    parser.add_argument(
        "--step",
        type=_step_choice,
        metavar="N|latest|best",
        help="its checkpoint at step N, the one a relaunch would resume from (latest, the default), or best.bin",
    )
    parser.add_argument("--checkpoint", metavar="PATH", help="a checkpoint file instead of --step")
    parser.add_argument(
        "--cache-dir",
        metavar="DIR",
        help="prepared-data cache, for a run made before runs froze "
        "their data (default $MICROGPT_CACHE or ~/.cache/microgpt)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="proxy",
        description="microgpt's training proxy: supervises the engine, owns the data mixture and the run directory.",
    )
    parser.add_argument(
        "--version",
        action="store_true",
        help="print the package's version and each built engine's version and build, and exit",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    run = sub.add_parser("run", help="train an experiment (relaunch the same command to resume)")
    run.add_argument(
        "experiment",
        metavar="EXPERIMENT.json",
        nargs="?",
        help="the experiment file (default: the one frozen in --run-dir, e.g. a fork's)",
    )
    run.add_argument("--run-dir", metavar="DIR", help="run directory (default runs/<experiment name>)")
    run.add_argument(
        "--engine",
        metavar="cpu|cuda|PATH",
        help="engine binary (default: cuda when a GPU is visible and built, else cpu)",
    )
    run.add_argument(
        "--ranks",
        type=_int_in(1, 4096),
        default=None,
        metavar="N",
        help="data-parallel: train on N ranks of the engine's MPI build (cpu: N processes; cuda: one GPU each, "
        "gradients summed over NCCL), launched by `mpirun -np N`; N must divide train.grad_accum (default: the "
        "engine alone)",
    )
    run.add_argument(
        "--launcher",
        metavar='"CMD ..."',
        help='the command that starts the ranks instead of `mpirun -np N` (e.g. "srun --kill-on-bad-exit=1"); '
        "it must start --ranks ranks",
    )
    run.add_argument("--no-dashboard", action="store_true", help="do not start the dashboard")
    run.add_argument("--host", default="127.0.0.1", help="dashboard address (default 127.0.0.1)")
    run.add_argument(
        "--port", type=_port, default=8000, help="dashboard port; the next free one is used if taken (default 8000)"
    )
    run.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        dest="overrides",
        help="override one field of the experiment, e.g. --set train.lr=0.001 (repeatable; dotted "
        "KEY, VALUE as JSON or else a string; checked by the experiment's schema)",
    )
    run.add_argument(
        "--allow-experiment-change",
        action="store_true",
        help="continue a run whose experiment file differs from its frozen copy",
    )
    run.add_argument(
        "--allow-data-change",
        action="store_true",
        help="continue a run whose sources changed or vanished since its first step (recorded in "
        "RUN/data/data.json; its tokenizer and validation data stay the frozen ones)",
    )
    run.add_argument(
        "--init-from",
        metavar="DIR",
        help="a new run starts from this Hugging Face GPT-2 directory's "
        "weights (config.json, model.safetensors; the experiment names its tokenizer.json)",
    )
    run.add_argument(
        "--hang-timeout",
        type=_positive_float,
        metavar="S",
        help="seconds without an engine event before it counts as hung "
        "(default max(30, 20 x median step time), more around checkpoints)",
    )
    run.add_argument(
        "--restart-backoff",
        type=_positive_float,
        default=1.0,
        metavar="S",
        help="first delay before restarting a failed engine; doubles per failure (default 1)",
    )
    run.add_argument(
        "--max-failures",
        type=int,
        default=5,
        metavar="N",
        help="consecutive engine failures without progress before giving up (default 5)",
    )
    run.add_argument(
        "--cache-dir", metavar="DIR", help="prepared-data cache (default $MICROGPT_CACHE or ~/.cache/microgpt)"
    )
    run.add_argument(
        "--engine-paths",
        choices=("qualified", "verified"),
        default="qualified",
        help="the CUDA engine's fast paths (cuDNN or flash attention, fused kernels, CUDA graph): "
        "those that pass their check on this GPU (qualified, the default) or none (verified)",
    )

    status = sub.add_parser("status", help="step, loss, speed, ETA, mixture, last checkpoint, alive or not")
    status.add_argument("--run-dir", metavar="DIR", help="default: the most recently active run under runs/")
    status.add_argument("--json", action="store_true", help="print the report as JSON")

    ckpt = sub.add_parser("checkpoint", help="ask the running proxy for a checkpoint now (training continues)")
    ckpt.add_argument("--run-dir", metavar="DIR", help="default: the most recently active run under runs/")

    stop = sub.add_parser("stop", help="checkpoint and stop the running proxy")
    stop.add_argument("--run-dir", metavar="DIR", help="default: the most recently active run under runs/")
    stop.add_argument("--no-wait", action="store_true", help="return once the signal is sent")
    stop.add_argument(
        "--timeout",
        type=_positive_float,
        default=600.0,
        metavar="S",
        help="how long to wait for the proxy to exit (default 600)",
    )

    pivot = sub.add_parser("pivot", help="start a new phase with new caps and floors (a live or a stopped run)")
    pivot.add_argument(
        "--caps",
        metavar="NEW.json",
        required=True,
        help='caps file: {"caps": {arm: x}, "floors": {arm: y}, '
        '"policy": ' + "|".join(f'"{p}"' for p in POLICIES) + "} "
        '(docs/EXPERIMENTS.md, "Caps files")',
    )
    pivot.add_argument("--run-dir", metavar="DIR", help="default: the most recently active run under runs/")
    pivot.add_argument(
        "--at",
        type=_step,
        metavar="STEP",
        help="stopped run only: pivot at the newest valid checkpoint at or before STEP "
        "(default: the newest valid checkpoint the log covers)",
    )
    pivot.add_argument(
        "--timeout",
        type=_positive_float,
        default=600.0,
        metavar="S",
        help="live run: how long to wait for the proxy's answer (default 600)",
    )

    fork = sub.add_parser("fork", help="a new run directory continuing DIR's run from its checkpoint at STEP")
    fork.add_argument("--run-dir", metavar="DIR", required=True, help="the run to fork (never modified)")
    fork.add_argument(
        "--at",
        type=_step,
        metavar="STEP",
        required=True,
        help="fork at this step's checkpoint (or the nearest older valid one)",
    )
    fork.add_argument(
        "--to", metavar="NEW_DIR", required=True, help="the new run directory (must not exist, or be empty)"
    )
    fork.add_argument("--caps", metavar="NEW.json", help="start the fork with a new phase from this caps file")

    export = sub.add_parser("export", help="a checkpoint as a Hugging Face GPT-2 directory or plain safetensors")
    _add_checkpoint_choice(export)
    export.add_argument("--out", metavar="DIR", required=True, help="the directory to write (must not exist)")
    export.add_argument(
        "--format",
        choices=("hf", "safetensors"),
        default="hf",
        help="hf: GPT2LMHeadModel's files and the tokenizer (default); safetensors: the tensors "
        "alone, under our own names",
    )

    sample = sub.add_parser("sample", help="text from a checkpoint (the engine's SAMPLE path)")
    _add_checkpoint_choice(sample)
    sample.add_argument("--prompt", type=_unicode_text, metavar="TEXT", required=True, help="the text to continue")
    sample.add_argument(
        "--max-new",
        type=_int_in(1, 1 << 20),
        metavar="N",
        help="new tokens per sample (default: the run's samples.max_new)",
    )
    sample.add_argument(
        "--temperature",
        type=_non_negative_float,
        metavar="T",
        help="0 = greedy (default: the run's samples.temperature)",
    )
    sample.add_argument(
        "--top-k",
        type=_int_in(0, 1 << 16),
        metavar="K",
        help="sample among the K likeliest tokens, 0 = all (default: the run's samples.top_k)",
    )
    sample.add_argument(
        "--seed",
        type=_int_in(0, 2**64 - 1),
        default=0,
        metavar="S",
        help="the same seed prints the same text (default 0)",
    )
    sample.add_argument("--count", type=_int_in(1, 4096), default=1, metavar="N", help="samples (default 1)")
    sample.add_argument(
        "--engine",
        metavar="cpu|cuda|PATH",
        help="engine binary (default: cuda when a GPU is visible and built, else cpu)",
    )

    evaluate = sub.add_parser("eval", help="a checkpoint's validation loss per arm, or per text file")
    _add_checkpoint_choice(evaluate)
    evaluate.add_argument(
        "--data",
        type=_text_file,
        metavar="FILE",
        nargs="+",
        help="text files to evaluate "
        f"instead of the run's validation rows (UTF-8, at most {EVAL_DATA_LIMIT >> 20} MiB each)",
    )
    evaluate.add_argument("--json", action="store_true", help="print the result as JSON")
    evaluate.add_argument(
        "--engine",
        metavar="cpu|cuda|PATH",
        help="engine binary (default: cuda when a GPU is visible and built, else cpu)",
    )

    verify = sub.add_parser("verify", help="check every checkpoint of a run; exit 1 if any is corrupt")
    verify.add_argument("--run-dir", metavar="DIR", help="default: the most recently active run under runs/")
    verify.add_argument("--json", action="store_true", help="print the report as JSON")

    sub.add_parser("dashboard", help="serve the read-only dashboard (proxy dashboard --help)", add_help=False)
    return parser

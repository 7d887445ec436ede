"""Data and storage a run trusts too much: a frozen validation file holding an id beyond the
vocabulary, a full disk that only the engine's checkpoint writes meet, files that are not regular files
given where a checkpoint is expected, forged steps and clock jumps in `.loss.json` shown by `proxy status`.

Each runs the real `python -m proxy` against a copy of the stopped template run and asserts one line,
its exit code, no traceback, nothing changed; where the cause can be removed, a relaunch that finishes
bit-identical to the uninterrupted run.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from harness.engine import TIMEOUT
from proxy.formats.loss_log import StepEntry, encode_line, parse_line

from .proxy_checks import (
    checkpoints_kept,
    fill_disk,
    launch,
    one_line_exit,
    only_appended,
    proxy_cmd,
    run_cmd,
    run_state,
    start_training,
    temp_files,
    tmpfs,
)
from .proxy_harness import FAULT_EXPERIMENT, ProxyEnv, expected_resume, no_traceback, read_log, write_fault_experiment
from .proxy_scenarios import _snapshot, copy_run, relaunch_and_compare
from .run_dir_scenarios import _run_files
from .scenarios import ENGINE, Outcome

DATA_CLASS = "frozen validation ids beyond the vocabulary"
ENGINE_DISK_CLASS = "full disk that only the engine's checkpoints meet (tmpfs at checkpoints/, ENOSPC)"
NOT_REGULAR_CLASS = "a device or FIFO where a checkpoint is named (eval --checkpoint)"


def _with_sources(env: ProxyEnv, run: Path) -> Path:
    for corpus in env.experiment.parent.glob("*.txt"):  # the frozen copy's sources resolve against the run
        shutil.copy(corpus, run / corpus.name)
    return run


def _poison_val(run: Path, arm: str, position: int, token: int) -> str:
    """Set one id of RUN/data/<arm>.val.tok and update its size and SHA-256 in data.json (a consistent
    forgery: only the ids themselves can tell)."""
    val = run / "data" / f"{arm}.val.tok"
    raw = bytearray(val.read_bytes())
    header = len(raw) - 2 * json.loads((run / "data" / "data.json").read_text())["arms"][arm]["val"]["tokens"]
    raw[header + 2 * position : header + 2 * position + 2] = np.array([token], "<u2").tobytes()
    val.write_bytes(bytes(raw))
    definition = json.loads((run / "data" / "data.json").read_text())
    definition["arms"][arm]["val"]["sha256"] = hashlib.sha256(raw).hexdigest()
    (run / "data" / "data.json").write_text(json.dumps(definition, indent=1))
    return f"data/{arm}.val.tok"


def frozen_val_beyond_vocab(
    env: ProxyEnv, template: Path, workdir: Path, name: str = "proxy-frozen-val-vocab", fault_class: str = DATA_CLASS
) -> Outcome:
    """A frozen `<arm>.val.tok` holding id 65535 (vocab 300), its hash updated in data.json: `proxy run`
    (relaunch) and `proxy eval` refuse at once with one line naming the file and the id (exit 2), no
    engine started, nothing changed. (Before: five engine restarts and a crash loop, exit 3.)"""
    out = Outcome(fault_class, name)
    run = _with_sources(env, copy_run(template, workdir / "run"))
    original = {p.name: p.read_bytes() for p in (run / "data").iterdir()}
    where = _poison_val(run, "semis", 7, 65535)
    snapshot = _run_files(run)
    argv = [a for a in env.argv(run) if a != str(env.experiment)]
    for what, command in (
        ("run", argv),
        ("eval", proxy_cmd("eval", "--run-dir", run, "--cache-dir", env.cache, "--engine", ENGINE.flag)),
    ):
        out.begin_fault()
        rc, p = launch(lambda: run_cmd(command, timeout=TIMEOUT), out, f"[{what}]")
        line = one_line_exit(p, rc, 2, where, out, f"[{what}]")
        if "token id 65535 at position 7" not in line:
            out.fail(f"[{what}] the line does not name the id and where it is: {line}")
        out.note(f"{what}: message", line)
        if _run_files(run) != snapshot:
            out.fail(f"[{what}] the refused command changed the run directory (an engine started?)", data_lost=1)
    for name_, raw in original.items():
        (run / "data" / name_).write_bytes(raw)
    relaunch_and_compare(env, run, out, "frozen data restored")
    return out.close()


def engine_disk_full(
    env: ProxyEnv,
    template: Path,
    workdir: Path,
    name: str = "proxy-engine-disk-full",
    fault_class: str = ENGINE_DISK_CLASS,
) -> Outcome | str:
    """RUN/checkpoints is a small tmpfs of its own, filled while the run trains: the engine's next checkpoint
    fails with ENOSPC (exit 5) while the proxy's own files still take writes. The proxy stops at once with
    exit 5 (not five restarts and a crash loop, exit 3), one line naming ENOSPC and the checkpoint a
    relaunch resumes from (the resume rule's, not the step reached), `.state.json` stopped with ENOSPC,
    every line and checkpoint kept; after the filler is removed the relaunch finishes bit-identical."""
    out = Outcome(fault_class, name)
    run = copy_run(template, workdir / "run")
    stash = workdir / "checkpoints-before"
    shutil.move(run / "checkpoints", stash)
    mnt = run / "checkpoints"
    with tmpfs(mnt, 4 << 20) as why:
        if why is not None:
            return f"cannot mount a tmpfs here ({why})"
        for p in sorted(stash.iterdir()):
            shutil.copy2(p, mnt / p.name)
        ckpts, log = _snapshot(run), (run / ".loss.json").read_bytes()
        p = start_training(env, run, out, past=1)
        out.begin_fault()
        out.note("bytes written to fill checkpoints/", fill_disk(mnt))
        rc, _ = launch(lambda: (p.finish(TIMEOUT), p), out, "checkpoints/ full")
        line = one_line_exit(p, rc, 5, "(ENOSPC)", out, "checkpoints/ full")
        out.note("last line", line)
        if "cannot write the engine's checkpoint" not in line:
            out.fail(f"the line does not say the engine's checkpoint write failed: {line}")
        resume = expected_resume(run)
        if f"step_{resume:06d}.bin (step {resume}), the newest intact checkpoint" not in line:
            out.fail(f"the line does not name the checkpoint a relaunch resumes from (step {resume}): {line}")
        restarts = [ln for ln in p.stderr_lines() if "restarting from the newest valid checkpoint" in ln]
        if restarts:
            out.fail(f"the engine was restarted on a full disk: {restarts[0]}")
        only_appended(run, log, out, "checkpoints/ full")
        checkpoints_kept(run, ckpts, out, "checkpoints/ full")
        if temp_files(run):
            out.fail(f"temp files left behind: {temp_files(run)}")
        state = run_state(run)
        if state.get("status") != "stopped" or (state.get("write_failure") or {}).get("errno") != "ENOSPC":
            out.fail(f".state.json status {state.get('status')!r}, write_failure {state.get('write_failure')}")
        out.steps_lost += max(0, read_log(run / ".loss.json").max_step - resume)
        (mnt / "filler").unlink()
        relaunch_and_compare(env, run, out, "relaunch after freeing space")
    return out.close()


def checkpoint_not_regular(
    env: ProxyEnv,
    template: Path,
    workdir: Path,
    name: str = "proxy-eval-checkpoint-device",
    fault_class: str = NOT_REGULAR_CLASS,
) -> Outcome:
    """`proxy eval --checkpoint X` for X /dev/zero, a FIFO, a directory: exit 2, one line saying what X is
    (never "no such checkpoint file", which it is not), at once; a missing file is still "no such"."""
    out = Outcome(fault_class, name)
    run = _with_sources(env, copy_run(template, workdir / "run"))
    fifo = workdir / "fifo"
    os.mkfifo(fifo)
    folder = workdir / "folder"
    folder.mkdir()
    for what, target, needle in (
        ("/dev/zero", "/dev/zero", "a character device, not a regular file"),
        ("a FIFO", fifo, "a FIFO, not a regular file"),
        ("a directory", folder, "a directory, not a regular file"),
        ("a missing file", workdir / "nothing.bin", "no such checkpoint file"),
    ):
        out.begin_fault()
        rc, p = launch(
            lambda: run_cmd(
                proxy_cmd(
                    "eval", "--run-dir", run, "--cache-dir", env.cache, "--engine", ENGINE.flag, "--checkpoint", target
                )
            ),
            out,
            what,
        )
        out.note(what, one_line_exit(p, rc, 2, needle, out, f"[--checkpoint {what}]"))
    return out.close()


STATUS_CLASS = "forged steps and clock jumps in .loss.json (proxy status)"
FORGED_STEP = 999_999_999_999
YEAR_S = 365 * 86400.0


def _status_json(run: Path, out: Outcome, where: str) -> dict:
    rc, p = launch(lambda: run_cmd(proxy_cmd("status", "--run-dir", run, "--json")), out, where)
    no_traceback(p, out, where)
    if rc != 0:
        out.fail(f"{where}: exit {rc}: {p.stderr_lines()[-2:]}")
    return json.loads("\n".join(p.lines))


def status_forged_steps(
    env: ProxyEnv,
    template: Path,
    workdir: Path,
    name: str = "proxy-status-forged-steps",
    fault_class: str = STATUS_CLASS,
) -> Outcome:
    """`.loss.json` of a stopped run given five more steps whose times jump a year ahead, then back, and a
    forged step 999999999999: `proxy status` shows the last real step (at most 100%) with one warning
    naming the forged step, and the same tokens/s as the log without the jumps (each jump counted as the
    step's compute time), never an absurd rate; exit 0, no traceback."""
    out = Outcome(fault_class, name)
    steady = copy_run(template, workdir / "steady")
    jumped = copy_run(template, workdir / "jumped")
    last = max(
        (e for e in map(parse_line, (steady / ".loss.json").read_bytes().splitlines()) if isinstance(e, StepEntry)),
        key=lambda e: e.step,
    )
    for run, jump in ((steady, 0.0), (jumped, YEAR_S)):
        with open(run / ".loss.json", "ab") as f:
            for k in range(1, 6):
                shift = jump if k in (2, 3) else -jump if k == 4 else 0.0
                entry = replace(last, step=last.step + k, tokens=last.tokens + k * 64, time=last.time + k + shift)
                f.write(encode_line(entry.to_dict()))
    with open(jumped / ".loss.json", "ab") as f:
        f.write(encode_line(replace(last, step=FORGED_STEP, tokens=last.tokens + 6 * 64, time=last.time + 6).to_dict()))
    out.begin_fault()
    want, got = _status_json(steady, out, "steady"), _status_json(jumped, out, "jumped")
    if got["step"] != last.step + 5 or got["step"] > got["max_steps"] or got.get("steps_beyond_max") != [FORGED_STEP]:
        out.fail(
            f"status --json: step {got['step']} of {got['max_steps']}, steps_beyond_max "
            f"{got.get('steps_beyond_max')}; expected {last.step + 5} and [{FORGED_STEP}]"
        )
    rate, sane = got.get("tokens_per_s"), want.get("tokens_per_s")
    if rate is None or sane is None or not 0.2 * sane <= rate <= 5 * sane:
        out.fail(f"tokens/s {rate} with the clock jumps, {sane} without: a jump counted as time")
    out.note("tokens/s with and without the jumps", [rate, sane])
    rc, p = launch(lambda: run_cmd(proxy_cmd("status", "--run-dir", jumped)), out, "status")
    no_traceback(p, out, "status")
    step_line = next((ln for ln in p.lines if ln.startswith("step:")), "")
    warning = [ln for ln in p.lines if str(FORGED_STEP) in ln]
    percent = float(step_line.split("(")[1].split("%")[0]) if "%" in step_line else None
    if rc != 0 or percent is None or percent > 100 or len(warning) != 1 or "beyond max_steps" not in warning[0]:
        out.fail(f"status: exit {rc}, step line {step_line!r}, warnings {warning}")
    out.note("status", [step_line, warning[0]])
    return out.close()


WORD_CLASS = "a huge single-word document (eval --data)"
WORD_BYTES = 20 << 20  # the case is 32 MiB (82 s here, passing): 20 MiB keeps the suite shorter and
# still needs two EVAL frames at the fault model's ctx 16 (1.3M rows, over the engine's 1M per frame)
WORD_MEMORY = 3 << 30  # RLIMIT_AS of the evaluating proxy (and its engine): the bound
WORD_SECONDS = 180.0


def eval_huge_word(
    env: ProxyEnv, template: Path, workdir: Path, name: str = "proxy-eval-huge-word", fault_class: str = WORD_CLASS
) -> Outcome:
    """`proxy eval --data` of a 20 MiB file holding one word ('a' repeated) under RLIMIT_AS 3 GiB: it is
    encoded in pieces of at most text.WORD_CHARS characters a word, so it evaluates (exit 0) within the
    memory limit and 3 minutes, its rows in two EVAL frames, every token counted. (Before: one BPE word,
    aborted under 3 GB for 32 MiB; and more rows than one frame takes were an engine error.)"""
    out = Outcome(fault_class, name)
    run = _with_sources(env, copy_run(template, workdir / "run"))
    word = workdir / "word.txt"
    with open(word, "wb") as f:
        for _ in range(WORD_BYTES >> 20):
            f.write(b"a" * (1 << 20))

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (WORD_MEMORY, WORD_MEMORY))

    out.begin_fault()
    t0 = time.monotonic()
    rc, p = launch(
        lambda: run_cmd(
            proxy_cmd(
                "eval", "--run-dir", run, "--cache-dir", env.cache, "--engine", ENGINE.flag, "--data", word, "--json"
            ),
            timeout=WORD_SECONDS,
            preexec_fn=limit,
        ),
        out,
        "eval --data word.txt",
    )
    seconds = time.monotonic() - t0
    no_traceback(p, out, "eval --data word.txt")
    if rc != 0:
        out.fail(f"eval --data of a {WORD_BYTES >> 20} MiB word: exit {rc}: {p.stderr_lines()[-2:]}")
    report = json.loads("\n".join(p.lines))
    (loss,), (tokens,) = report["files"].values(), report["tokens"].values()
    if not (isinstance(loss, float) and loss > 0) or tokens < WORD_BYTES // 8:
        out.fail(f"eval --data of the word: loss {loss}, {tokens} tokens")
    out.note("seconds, loss, tokens", [round(seconds, 1), loss, tokens])
    return out.close()


TABLE_CLASS = "hostile table sources (hf_dataset, Parquet)"


def _save_to_disk(directory: Path, rows: list[str]) -> Path:
    """A `datasets` save_to_disk directory of one Arrow stream file (pyarrow only)."""
    import pyarrow as pa  # noqa: PLC0415 - the [parquet] extra, present in the test environment

    directory.mkdir(parents=True)
    table = pa.table({"text": rows})
    with (
        pa.OSFile(str(directory / "data-00000-of-00001.arrow"), "wb") as sink,
        pa.ipc.new_stream(sink, table.schema) as writer,
    ):
        for batch in table.to_batches(max_chunksize=50):
            writer.write_batch(batch)
    (directory / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}))
    return directory


def table_sources(env: ProxyEnv, workdir: Path) -> Outcome:
    """`proxy run` of a new run whose arm reads an hf_dataset whose Arrow file is a symlink to /dev/zero, a
    FIFO, or truncated: exit 2 at once, one line naming the arm and the file and what it is (never
    "missing", never a bare pyarrow message), nothing prepared; a Parquet file whose text column is stored
    dictionary-encoded prepares and trains (exit 0)."""
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415

    out = Outcome(TABLE_CLASS, "proxy-table-sources")
    exp_dir = workdir / "exp"
    base = json.loads(write_fault_experiment(exp_dir).read_text())
    rows = (exp_dir / "semis.txt").read_text().splitlines()
    arrow = _save_to_disk(exp_dir / "ds", rows) / "data-00000-of-00001.arrow"
    whole = arrow.read_bytes()

    def as_device():
        arrow.unlink()
        os.symlink("/dev/zero", arrow)

    def as_fifo():
        arrow.unlink()
        os.mkfifo(arrow)

    def truncated():
        arrow.unlink()
        arrow.write_bytes(whole[: len(whole) // 2])

    cases = [
        ("Arrow file a symlink to /dev/zero", as_device, "is a character device, not a regular file"),
        ("Arrow file a FIFO", as_fifo, "is a FIFO, not a regular file"),
        ("Arrow file truncated", truncated, "data-00000-of-00001.arrow: record batch"),
    ]
    for i, (what, damage, needle) in enumerate(cases):
        damage()
        exp = json.loads(json.dumps(base))
        exp["arms"][1]["sources"] = [{"hf_dataset": "ds"}]
        path = exp_dir / f"case-{i}.json"
        path.write_text(json.dumps(exp))
        out.begin_fault()
        argv = env.argv(workdir / f"run-{i}", experiment=path)
        argv[argv.index("--cache-dir") + 1] = str(workdir / f"cache-{i}")
        rc, p = launch(lambda: run_cmd(argv, timeout=TIMEOUT, preexec_fn=_memory_limit), out, f"[{what}]")
        line = one_line_exit(p, rc, 2, needle, out, f"[{what}]")
        if "arm 'semis'" not in line or "missing" in line:
            out.fail(f"[{what}] the line does not name the arm, or calls the file missing: {line}")
        out.note(what, line)
        if any((workdir / f"run-{i}" / "checkpoints").glob("step_*.bin")):
            out.fail(f"[{what}] a refused run trained")
    pq.write_table(pa.table({"text": pa.array(rows).dictionary_encode()}), exp_dir / "semis.parquet")
    exp = json.loads(json.dumps(base))
    exp["arms"][1]["sources"] = [{"parquet": "semis.parquet"}]
    (exp_dir / "dictionary.json").write_text(json.dumps(exp))
    out.begin_fault()
    argv = env.argv(workdir / "run-dictionary", experiment=exp_dir / "dictionary.json")
    argv[argv.index("--cache-dir") + 1] = str(workdir / "cache-dictionary")
    rc, p = launch(lambda: run_cmd(argv, timeout=TIMEOUT), out, "[dictionary-encoded Parquet]")
    no_traceback(p, out, "[dictionary-encoded Parquet]")
    if rc != 0:
        out.fail(f"[dictionary-encoded Parquet] exit {rc}: {p.stderr_lines()[-2:]}")
    return out.close()


def _memory_limit():
    resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))


IMPORT_CLASS = "non-finite weights given to --init-from"


def _gpt2_directory(directory: Path, tokenizer: Path, poison: tuple[str, float] | None) -> Path:
    """A Hugging Face GPT-2 directory of the fault experiment's model (made with the proxy's own export
    mapping, no torch): random weights, `poison` = (tensor, value) set at one place."""
    from proxy.formats.hf_gpt2 import SAFETENSORS_FORMAT, HFConfig, encode_safetensors, hf_tensors  # noqa: PLC0415
    from proxy.formats.parameters import ModelShape  # noqa: PLC0415

    m = FAULT_EXPERIMENT["model"]
    shape = ModelShape(m["vocab"], m["ctx"], m["dim"], m["layers"], m["heads"])
    directory.mkdir(parents=True)
    tensors = hf_tensors(np.random.default_rng(5).normal(0, 0.05, shape.n_params).astype(np.float32), shape)
    if poison is not None:
        tensors[poison[0]].reshape(-1)[3] = poison[1]
    (directory / "model.safetensors").write_bytes(encode_safetensors(tensors, SAFETENSORS_FORMAT))
    (directory / "config.json").write_text(json.dumps(HFConfig(shape, 0).to_dict()))
    shutil.copy(tokenizer, directory / "tokenizer.json")
    return directory


def init_from_non_finite(env: ProxyEnv, workdir: Path) -> Outcome:
    """`proxy run --init-from DIR` whose model.safetensors holds a NaN, a +inf or a -inf: exit 2 at once, one
    line naming the tensor and what it holds, no checkpoint written (before: a non-finite step 0 was
    written, passed over as diverged, and a random model trained to `finished`, exit 0). The same
    directory with finite weights imports and trains (exit 0)."""
    out = Outcome(IMPORT_CLASS, "proxy-init-from-non-finite")
    exp_dir = workdir / "exp"
    base = json.loads(write_fault_experiment(exp_dir).read_text())
    shutil.copy(env.ref / "data" / "tokenizer.json", exp_dir / "tokenizer.json")
    base["tokenizer"] = "tokenizer.json"
    (exp_dir / "init.json").write_text(json.dumps(base))
    cases = [
        ("NaN", ("transformer.h.0.attn.c_attn.weight", float("nan"))),
        ("+inf", ("transformer.wpe.weight", float("inf"))),
        ("-inf", ("transformer.ln_f.bias", float("-inf"))),
        ("finite", None),
    ]
    for i, (what, poison) in enumerate(cases):
        directory = _gpt2_directory(workdir / f"gpt2-{i}", exp_dir / "tokenizer.json", poison)
        run = workdir / f"run-{i}"
        argv = env.argv(run, "--init-from", directory, experiment=exp_dir / "init.json")
        out.begin_fault()
        rc, p = launch(lambda: run_cmd(argv, timeout=TIMEOUT), out, f"[{what}]")
        if poison is None:
            no_traceback(p, out, "[finite]")
            if rc != 0 or not any("step 0 imported from" in ln for ln in p.lines):
                out.fail(f"[finite weights] exit {rc}, not imported: {p.stderr_lines()[-2:]}")
            continue
        line = one_line_exit(
            p, rc, 2, f"tensor {poison[0]} holds {what} (at flat index 3); nothing imported", out, f"[{what}]"
        )
        out.note(what, line)
        if any((run / "checkpoints").glob("*")) if (run / "checkpoints").is_dir() else False:
            out.fail(f"[{what}] something was written to checkpoints/: {sorted((run / 'checkpoints').iterdir())}")
    return out.close()

"""JSON nested without bound in the files of a run.

Python's json module recurses once per `[`: a line of 200,000 `[` (under the
loss log's 1 MiB line cap) or a checkpoint's metadata nested 4,000 deep (under
the engine's 8 KiB metadata cap, with a valid CRC) used to end `run`, `status`,
`verify`, `fork`, `pivot`, `eval`, `export` and `sample` in a RecursionError
traceback. Every JSON the proxy reads now goes through
proxy/formats/bounded_json.py (depth 64 at most):

- the deep loss-log line is a damaged line: every command goes on (exit 0, no
  traceback), the relaunched run finishes as the reference with the line kept;
- the deep checkpoint metadata is metadata that cannot be read, as any that is
  not JSON: the weights are intact (the CRC holds), so the commands use the
  checkpoint and the relaunch resumes from it and finishes as the reference;
- deep `.state.json`, `phases.json`, experiment and caps files: a missing
  snapshot (rebuilt), or one line naming the file with exit 2, as for any file
  of theirs that is not JSON.

Real processes against real run directories, in a pid namespace of their own
(sandbox.py), as the other scenarios of hostile files.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

from harness.engine import Hang
from proxy.formats.checkpoint import encode_checkpoint, list_checkpoints, read_checkpoint

from .process_scenarios import _env
from .proxy_checks import one_line_exit, proxy_cmd, run_cmd
from .proxy_harness import (
    ProxyEnv,
    compare_with_reference,
    first_resume,
    no_traceback,
    read_log,
    write_fault_experiment,
)
from .proxy_scenarios import copy_run, relaunch_and_compare
from .sandbox import require_namespace
from .scenarios import ENGINE, Outcome, tail_lines

NESTING_CLASS = "JSON nested 4,000 to 200,000 deep in run files"

DEEP_LINE = b"[" * 200_000 + b"]" * 200_000 + b"\n"  # 400 KB: under the loss log's 1 MiB line cap
DEEP_META = '{"engine": "cpu", "meta": ' + "[" * 4000 + "]" * 4000 + "}"  # under the 8 KiB metadata cap
CAPS = {"caps": {"dots": 0.9, "semis": 0.9}, "floors": {"dots": 0.1, "semis": 0.1}}


def _planted(template: Path, dest: Path, env: ProxyEnv) -> Path:
    run = copy_run(template, dest)
    for corpus in env.experiment.parent.glob("*.txt"):  # as path_scenarios.huge_step_numbers does
        shutil.copy(corpus, run / corpus.name)
    return run


def _command(argv: list, code: int, out: Outcome, what: str) -> None:
    """`argv` exits `code` without a traceback."""
    out.begin_fault()
    try:
        rc, p = run_cmd(argv)
    except Hang as exc:
        out.fail(f"[{what}]: {exc}")
    no_traceback(p, out, f"[{what}]")
    if rc != code:
        out.fail(f"[{what}]: exit {rc}, expected {code}: {tail_lines(p.stderr + chr(10).join(p.lines))}")


def _follow_ups(env: ProxyEnv, run: Path, workdir: Path, out: Outcome, tag: str) -> None:
    """verify, status, eval, export, sample, fork on `run` and an offline pivot of a copy: exit 0 each."""
    cache = ("--cache-dir", env.cache)
    newest = list_checkpoints(run / "checkpoints")[0]
    for what, argv in [
        ("verify", proxy_cmd("verify", "--run-dir", run)),
        ("status", proxy_cmd("status", "--run-dir", run)),
        ("eval", proxy_cmd("eval", "--run-dir", run, *cache)),
        ("export", proxy_cmd("export", "--run-dir", run, "--out", workdir / f"export-{tag}", *cache)),
        (
            "sample",
            proxy_cmd(
                "sample", "--run-dir", run, "--prompt", "alpha ", "--max-new", 4, "--engine", ENGINE.flag, *cache
            ),
        ),
        ("fork", proxy_cmd("fork", "--run-dir", run, "--at", newest.name[5:11], "--to", workdir / f"fork-{tag}")),
    ]:
        _command(argv, 0, out, f"{tag}: {what}")
    pivoted = copy_run(run, workdir / f"pivot-{tag}")
    caps = workdir / "caps.json"
    caps.write_text(json.dumps(CAPS))
    _command(proxy_cmd("pivot", "--run-dir", pivoted, "--caps", caps), 0, out, f"{tag}: offline pivot")


def deep_json(env: dict, template: str, workdir: str) -> Outcome:
    """(1) a 200,000-deep line appended to a stopped run's `.loss.json`; (2) the newest checkpoint's metadata
    nested 4,000 deep, CRC valid; (3) `.state.json` nested deep; (4) phases.json, the experiment given to
    `proxy run`, a caps file given to `proxy pivot`, each nested deep. See the module's docstring for what
    each must do."""
    require_namespace()
    env, template, workdir = _env(env), Path(template), Path(workdir)
    out = Outcome(NESTING_CLASS, "deep-json")

    run = _planted(template, workdir / "deep-line", env)  # (1)
    with open(run / ".loss.json", "ab") as f:
        f.write(DEEP_LINE)
    _follow_ups(env, run, workdir, out, "deep .loss.json line")
    out.begin_fault()
    relaunch_and_compare(env, run, out, "[deep .loss.json line: run]")
    if DEEP_LINE not in (run / ".loss.json").read_bytes():
        out.fail("[deep .loss.json line: run]: the damaged line was removed from the log", data_lost=1)

    run = _planted(template, workdir / "deep-meta", env)  # (2)
    newest = list_checkpoints(run / "checkpoints")[0]
    original = newest.read_bytes()
    ck = read_checkpoint(newest)
    planted = encode_checkpoint(ck.step, ck.weights, ck.m, ck.v, dataclasses.replace(ck.trailer, meta=DEEP_META))
    newest.write_bytes(planted)
    _follow_ups(env, run, workdir, out, "deep checkpoint metadata")
    out.begin_fault()
    segments = max(int(e.get("segment", 0)) for e in read_log(run / ".loss.json").steps.values())
    try:
        rc, p = env.run(run, timeout=300)
    except Hang as exc:
        out.fail(f"[deep checkpoint metadata: run]: {exc}")
    no_traceback(p, out, "[deep checkpoint metadata: run]")
    if rc != 0 or first_resume(run, segments) != ck.step:
        out.fail(
            f"[deep checkpoint metadata: run]: exit {rc}, resumed from {first_resume(run, segments)}, "
            f"expected 0 and step {ck.step}: {tail_lines(p.stderr)}"
        )
    if newest.read_bytes() != planted:
        out.fail("[deep checkpoint metadata: run]: the checkpoint was changed", data_lost=1)
    newest.write_bytes(original)  # the one file that differs from the reference's by design
    compare_with_reference(env, run, out, where="[deep checkpoint metadata: run]")

    run = _planted(template, workdir / "deep-state", env)  # (3)
    (run / ".state.json").write_text("[" * 100_000 + "]" * 100_000)
    _command(proxy_cmd("status", "--run-dir", run), 0, out, "deep .state.json: status")
    out.begin_fault()
    relaunch_and_compare(env, run, out, "[deep .state.json: run]")

    run = _planted(template, workdir / "deep-phases", env)  # (4)
    before = (run / "phases.json").read_bytes()
    (run / "phases.json").write_text("[" * 100_000 + "]" * 100_000)
    out.begin_fault()
    rc, p = run_cmd(env.argv(run))
    out.note("deep phases.json: the line", one_line_exit(p, rc, 2, "phases.json", out, "[deep phases.json: run]"))
    (run / "phases.json").write_bytes(before)
    relaunch_and_compare(env, run, out, "[deep phases.json, restored: run]")

    deep_exp = write_fault_experiment(workdir / "deep-exp")
    deep_exp.write_text('{"name": ' + "[" * 50_000 + "]" * 50_000 + "}")
    out.begin_fault()
    rc, p = run_cmd(env.argv(workdir / "deep-exp-run", experiment=deep_exp))
    out.note("deep experiment: the line", one_line_exit(p, rc, 2, str(deep_exp), out, "[deep experiment: run]"))
    if (workdir / "deep-exp-run").exists():
        out.fail("[deep experiment: run]: a run directory was made")

    run = _planted(template, workdir / "deep-caps", env)
    caps = workdir / "deep-caps.json"
    caps.write_text('{"caps": ' + "[" * 50_000 + "]" * 50_000 + "}")
    before = (run / "phases.json").read_bytes()
    out.begin_fault()
    rc, p = run_cmd(proxy_cmd("pivot", "--run-dir", run, "--caps", caps))
    out.note("deep caps: the line", one_line_exit(p, rc, 2, str(caps), out, "[deep caps: pivot]"))
    if (run / "phases.json").read_bytes() != before:
        out.fail("[deep caps: pivot]: phases.json changed", data_lost=1)
    return out.close()

"""Bad inputs, fuzzed with hypothesis (seeded by FAULT_SEED): frames sent straight to the engine,
experiment files (the loader and `python -m proxy run BAD.json`), caps files (the loader and
`python -m proxy pivot --caps BAD.json`).

Always one clear error and a non-zero exit (or, for input that happens to be valid, a normal run),
never a traceback, a death by signal or a hang."""

from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import sys

import numpy as np
from hypothesis import HealthCheck, assume, given, seed, settings
from hypothesis import strategies as st

from proxy.config.caps import load_caps, load_pivot_caps
from proxy.config.config_file import ExperimentError
from proxy.config.experiment import load_experiment
from proxy.formats import frames
from proxy.rundir.layout import RunDir
from proxy.rundir.phases import read_phases

from . import engine_scenarios, proxy_harness, proxy_scenarios, scenarios
from .engine_scenarios import FUZZ_MODEL
from .scenarios import Outcome

SEED = scenarios.fault_seed()
FAST = dict(deadline=None, database=None, suppress_health_check=list(HealthCheck))

# ---------------------------------------------------------------------------
# frames

T1, ROWS, V = FUZZ_MODEL.ctx + 1, FUZZ_MODEL.batch, FUZZ_MODEL.vocab
U32, U64 = 2**32 - 1, 2**64 - 1


def _often(value, *others):
    """`value` most of the time, else one of `others` (edge cases)."""
    return st.sampled_from([value] * 5 + list(others))


def _tokens(draw, n: int, bad: bool) -> bytes:
    rng = np.random.default_rng(draw(st.integers(0, U32)))
    tokens = rng.integers(0, V, size=n, dtype="<u2")
    if bad and n:
        tokens[rng.integers(0, n)] = draw(st.integers(V, 65535))
    return tokens.tobytes()


@st.composite
def frame(draw) -> bytes:
    kind = draw(st.sampled_from(["train", "train", "eval", "sample", "sample", "checkpoint", "stop", "other"]))
    magic = draw(
        st.one_of(_often(frames.FRAME_MAGIC, b"MGF2", b"\0\0\0\0", b"mgf1"), st.binary(min_size=4, max_size=4))
    )
    flags = draw(_often(0, 1, 0x8000))
    reserved = draw(_often(0, 1, 2**31))
    payload = b""
    rows = row_len = ident = 0
    if kind in ("train", "eval"):
        typ = frames.TRAIN if kind == "train" else frames.EVAL
        rows = draw(
            _often(ROWS, 0, 1, 3, ROWS + 1, 2**20, 2**20 + 1, U32)
            if kind == "train"
            else st.sampled_from([1, 2, 3, 7, 0, 2**20, 2**20 + 1, U32])
        )
        row_len = draw(_often(T1, 0, T1 - 1, T1 + 1, U32))
        ident = draw(_often(1, 0, 2, U64) if kind == "train" else st.integers(0, U64))
        exact = rows * row_len * 2 + rows * 2
        if exact <= 1 << 16:
            payload = _tokens(draw, rows * row_len, draw(st.booleans())) + _tokens(draw, rows, False)
        else:
            payload = draw(st.binary(max_size=256))
        size = draw(st.sampled_from(["exact"] * 5 + ["plus", "minus", "random"]))
    elif kind == "sample":
        typ = frames.SAMPLE
        n_prompts = draw(_often(draw(st.integers(1, 3)), 0, 4097, U32))
        prompts = [
            (
                draw(_often(draw(st.integers(1, 12)), 0, 10**6)),
                draw(_often(draw(st.integers(1, 4)), 0, 4097, U32)),
                draw(st.integers(0, U64)),
            )
            for _ in range(min(n_prompts, 4))
        ]
        params = frames.SAMPLE_PARAMS.pack(
            n_prompts,
            draw(_often(draw(st.integers(1, 12)), 0, 2**20 + 1, U32)),
            draw(_often(0, 3, V, U32)),
            draw(st.sampled_from([0.0, 0.8, 1.0, 1.0, -1.0, math.nan, math.inf, 1e30])),
        )
        payload = (
            params
            + b"".join(frames.SAMPLE_PROMPT.pack(*p) for p in prompts)
            + b"".join(_tokens(draw, min(n, 64), draw(st.booleans())) for n, _, _ in prompts)
        )
        exact = frames.SAMPLE_PARAMS.size + frames.SAMPLE_PROMPT.size * n_prompts + 2 * sum(n for n, _, _ in prompts)
        size = draw(st.sampled_from(["exact"] * 5 + ["plus", "minus", "random"]))
        ident = draw(st.integers(0, U64))
    elif kind in ("checkpoint", "stop"):
        typ = frames.CHECKPOINT if kind == "checkpoint" else frames.STOP
        rows = draw(_often(0, 1))
        row_len = draw(_often(0, T1))
        payload = draw(_often(b"", b"\0" * 8))
        exact = len(payload)
        size = draw(st.sampled_from(["exact"] * 5 + ["plus", "random"]))
    else:
        typ = draw(st.sampled_from([0, 6, 7, 255, 65535]))
        rows, row_len, ident = draw(st.integers(0, U32)), draw(st.integers(0, U32)), draw(st.integers(0, U64))
        payload = draw(st.binary(max_size=64))
        exact = len(payload)
        size = "exact"
    payload_bytes = (
        {"exact": exact, "plus": exact + 1, "minus": max(0, exact - 1)}.get(size)
        if size != "random"
        else draw(st.integers(0, U32))
    )
    payload_bytes = min(payload_bytes, U32)
    data = frames.HEADER.pack(magic, typ, flags, ident, rows & U32, row_len & U32, payload_bytes, reserved) + payload
    if draw(st.integers(0, 7)) == 0:  # cut the frame somewhere
        data = data[: draw(st.integers(0, len(data) - 1))]
    return data


frame_streams = st.one_of(st.lists(frame(), min_size=1, max_size=3).map(b"".join), st.binary(min_size=1, max_size=300))


def _fuzz(out: Outcome, record, body):
    try:
        body()
    finally:
        record(out)
    out.check()


def test_fuzzed_frames_never_crash_or_hang_the_engine(engine_bin, tmp_path, record):
    out = Outcome("fuzzed frames sent to the engine", "fuzz-frames")

    @settings(max_examples=150, **FAST)
    @seed(SEED)
    @given(data=frame_streams)
    def check(data):
        out.begin_fault()
        rc, problems = engine_scenarios.feed_engine(tmp_path, data)
        out.bump(f"inputs that ended with exit {rc}")
        _settle(out, f"input {data[:96].hex()}{'...' if len(data) > 96 else ''} ({len(data)} bytes)", problems)

    _fuzz(out, record, check)


# ---------------------------------------------------------------------------
# experiment files and caps files


def _paths(doc, prefix=()):
    """Every key path in a JSON document (dict keys and list indices)."""
    out = [prefix] if prefix else []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, prefix + (i,))
    return out


def _get_parent(doc, path):
    for k in path[:-1]:
        doc = doc[k]
    return doc


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


@st.composite
def mutated(draw, valid: dict) -> dict | list:
    doc = copy.deepcopy(valid)
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(doc)
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = _get_parent(doc, path)
        op = draw(st.sampled_from(["delete", "replace", "replace", "add", "edge"]))
        if op == "delete":
            del parent[path[-1]]
        elif op == "replace":
            parent[path[-1]] = draw(json_values)
        elif op == "edge":
            parent[path[-1]] = draw(
                st.sampled_from([0, -1, 1, 2**31, 2**63, 1e308, -0.0, 0.5, "", "x" * 300, [], {}, None, True])
            )
        elif isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=10))] = draw(json_values)
        else:
            parent.append(draw(json_values))
    return doc


def _documents(valid: dict):
    text = json.dumps(valid)
    return st.one_of(
        mutated(valid).map(lambda d: json.dumps(d).encode()),
        mutated(valid).map(lambda d: json.dumps(d).encode()),
        json_values.map(lambda v: json.dumps(v).encode()),
        st.integers(0, len(text) - 1).map(lambda n: text[:n].encode()),  # truncated
        st.binary(max_size=200),
        st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")),
    )


def _settle(out: Outcome, what: str, problems: list[str]) -> None:
    """The fault's end: its problems fail this example (hypothesis then shrinks it)."""
    out.end_fault()
    if problems:
        out.fail(f"{what}: {problems}")


def _loads(load) -> bool:
    """Whether `load()` accepts the document (an ExperimentError: it does not)."""
    try:
        load()
        return True
    except ExperimentError:
        return False


def _refused_in_one_line(rc: int, stderr: str, path) -> list[str]:
    """A command given a bad file: exit 2 and one line naming it, never a traceback."""
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    problems = [] if rc == 2 else [f"exit {rc}, expected 2"]
    if len(lines) != 1 or "Traceback" in stderr:
        problems.append(f"stderr is not one line: {lines[-5:]}")
    elif str(path) not in lines[0]:
        problems.append(f"the line does not name the file: {lines[0][:200]}")
    return problems


def _exp_dir(tmp_path):
    path = proxy_harness.write_fault_experiment(tmp_path / "exp")
    return path, json.loads(path.read_text())


def _one_line(exc: Exception, path) -> list[str]:
    msg = str(exc)
    problems = []
    if "\n" in msg or not msg.strip():
        problems.append(f"message is not one line: {msg!r}")
    if not msg.startswith(str(path)):
        problems.append(f"message does not name the file: {msg[:200]!r}")
    return problems


def test_fuzzed_experiment_files_loader(tmp_path, record):
    """`load_experiment` returns an Experiment or raises ExperimentError with one line naming the file."""
    exp_path, valid = _exp_dir(tmp_path)
    bad = exp_path.with_name("bad.json")
    out = Outcome("fuzzed experiment files (loader)", "fuzz-experiment-loader")

    @settings(max_examples=300, **FAST)
    @seed(SEED)
    @given(doc=_documents(valid))
    def check(doc):
        out.begin_fault()
        bad.write_bytes(doc)
        try:
            load_experiment(bad)
            out.bump("documents that were valid")
            problems = []
        except ExperimentError as exc:
            problems = _one_line(exc, bad)
        except Exception as exc:  # noqa: BLE001 - anything else is the bug under test
            problems = [f"{type(exc).__name__}: {exc}"]
        _settle(out, f"{doc[:200]!r}", problems)

    _fuzz(out, record, check)


def test_fuzzed_experiment_files_cli(proxy_env, tmp_path, record):
    """`python -m proxy run BAD.json`: exit 2, one line on stderr, no traceback, no run directory."""
    exp_path, valid = _exp_dir(tmp_path)
    bad = exp_path.with_name("bad.json")
    out = Outcome("fuzzed experiment files (`proxy run BAD.json`)", "fuzz-experiment-cli")
    counter = iter(range(10**6))

    @settings(max_examples=8, **FAST)
    @seed(SEED)
    @given(doc=_documents(valid))
    def check(doc):
        bad.write_bytes(doc)
        assume(not _loads(lambda: load_experiment(bad)))  # a valid experiment would start training
        out.begin_fault()
        run_dir = tmp_path / f"run{next(counter)}"
        rc, p = proxy_env.run(run_dir, experiment=bad, timeout=60)
        problems = _refused_in_one_line(rc, p.stderr, bad)
        if run_dir.exists():
            problems.append("a run directory was created for a bad experiment")
        _settle(out, f"{doc[:200]!r}", problems)

    _fuzz(out, record, check)


def test_fuzzed_caps_files_loader(tmp_path, record):
    """`load_caps` returns full (caps, floors) maps that make a non-empty capped simplex, or raises
    ExperimentError with one line naming the file."""
    exp_path, _ = _exp_dir(tmp_path)
    experiment = load_experiment(exp_path)
    arms = experiment.arm_names
    valid = {"caps": {arms[0]: 0.7}, "floors": {arms[1]: 0.2}}
    caps_path = tmp_path / "caps.json"
    out = Outcome("fuzzed caps files (loader)", "fuzz-caps-loader")

    @settings(max_examples=300, **FAST)
    @seed(SEED)
    @given(doc=_documents(valid))
    def check(doc):
        out.begin_fault()
        caps_path.write_bytes(doc)
        problems = []
        try:
            caps, floors = load_caps(caps_path, experiment)
            out.bump("documents that were valid")
            if set(caps) != set(arms) or set(floors) != set(arms):
                problems.append(f"maps do not cover every arm: {caps} {floors}")
            elif (
                not all(0 <= floors[a] <= caps[a] <= 1 for a in arms)
                or sum(floors.values()) > 1 + 1e-9
                or sum(caps.values()) < 1 - 1e-9
            ):
                problems.append(f"accepted caps/floors with no mixture: {caps} {floors}")
        except ExperimentError as exc:
            problems = _one_line(exc, caps_path)
        except Exception as exc:  # noqa: BLE001
            problems = [f"{type(exc).__name__}: {exc}"]
        _settle(out, f"{doc[:200]!r}", problems)

    _fuzz(out, record, check)


def _tree(root) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_fuzzed_caps_files_pivot_cli(proxy_env, stopped_run, tmp_path, record):
    """`python -m proxy pivot --caps BAD.json` on a stopped run: exit 2, one line naming the file, no
    traceback, and not one byte of the run directory changed (docs/ARCHITECTURE.md: a bad caps file
    changes nothing and says why)."""
    run = proxy_scenarios.copy_run(stopped_run, tmp_path / "run")
    experiment = load_experiment(run / "experiment.json", check_sources=False)
    phase = read_phases(RunDir(run))[-1]
    arms = experiment.arm_names
    valid = {"caps": {arms[0]: 0.7}, "floors": {arms[1]: 0.2}, "policy": "exp3"}
    caps_path = tmp_path / "caps.json"
    before = _tree(run)
    out = Outcome("fuzzed caps files (`proxy pivot --caps BAD.json`)", "fuzz-caps-cli")
    env = dict(os.environ, PYTHONPATH=str(scenarios.REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))

    @settings(max_examples=8, **FAST)
    @seed(SEED)
    @given(doc=_documents(valid))
    def check(doc):
        caps_path.write_bytes(doc)
        assume(not _loads(lambda: load_pivot_caps(caps_path, experiment, phase)))  # a valid one would pivot the run
        out.begin_fault()
        r = subprocess.run(
            [sys.executable, "-m", "proxy", "pivot", "--caps", str(caps_path), "--run-dir", str(run)],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=scenarios.REPO,
            env=env,
        )
        problems = _refused_in_one_line(r.returncode, r.stderr, caps_path)
        if _tree(run) != before:
            problems.append("the run directory changed")
        _settle(out, f"{doc[:200]!r}", problems)

    _fuzz(out, record, check)

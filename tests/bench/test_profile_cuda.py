"""scripts/profile_cuda.sh and scripts/profile_summary.py without a GPU: the
ncu CSV summary on a hand-made fixture, and the script's plumbing with a
stand-in engine (and a stand-in ncu) that print what the real ones print."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import profile_summary as ps  # noqa: E402

FIXTURE = Path(__file__).parent / "fixtures" / "ncu_details.csv"
SCRIPT = REPO / "scripts" / "profile_cuda.sh"
PROFILE_LINE = (
    'microgpt: profile {"step":3,"step_ms":40.0000,"attention_forward_ms":2.0000,'
    '"attention_backward_ms":4.0000,"attention_calls":[12,12],"attention":"flash","precision":"bf16"}'
)


def test_ncu_details_summary():
    prof = ps.summarize_ncu("t", ps.parse_ncu_csv(FIXTURE.read_text()))
    assert prof.step_ms == pytest.approx(1.0)  # 1,000,000 ns of kernels
    assert prof.attention_ms == pytest.approx(0.1) and prof.attention_share == pytest.approx(0.1)
    gemm = next(k for k in prof.kernels if k.name.startswith("nvjet"))
    assert gemm.calls == 2 and gemm.ms == pytest.approx(0.8) and prof.kernels[0] is gemm
    assert prof.categories == pytest.approx(
        {"matmul (cuBLASLt)": 0.8, "attention": 0.1, "optimizer": 0.09, "layernorm": 0.01}
    )


def test_ncu_raw_page_and_units():
    raw = (
        '"ID","Kernel Name","gpu__time_duration.sum"\n"","","usecond"\n'
        '"0","attention_forward_kernel","1.5"\n"1","classifier_kernel","0.5"\n'
    )
    prof = ps.summarize_ncu("t", ps.parse_ncu_csv(raw))
    assert prof.step_ms == pytest.approx(0.002) and prof.attention_share == pytest.approx(0.75)


@pytest.mark.parametrize(
    "text, says",
    [
        ("==PROF== nothing profiled\n", "no CSV rows"),
        ('"ID","Name"\n"0","x"\n', "Kernel Name"),
        (
            '"Kernel Name","Metric Name","Metric Unit","Metric Value"\n"k","gpu__time_duration.sum","parsec","1"\n',
            "unknown time unit",
        ),
        (
            '"Kernel Name","Metric Name","Metric Unit","Metric Value"\n"k","dram__bytes.sum","byte","1"\n',
            "no gpu__time_duration.sum rows",
        ),
    ],
)
def test_ncu_csv_errors(text, says):
    with pytest.raises(ps.SummaryError, match=says):
        ps.parse_ncu_csv(text)


def test_events_summary():
    prof = ps.summarize_events("t", "microgpt: warning: x\n" + PROFILE_LINE + "\n")
    assert prof.tool == "events" and prof.step_ms == 40.0 and prof.attention_share == pytest.approx(0.15)
    with pytest.raises(ps.SummaryError, match="no 'microgpt: profile ' line"):
        ps.summarize_events("t", "nothing\n")


def fake(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def run_script(tmp_path: Path, *args: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run(
        ["bash", str(SCRIPT), "--out", str(tmp_path / "out"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def test_events_fallback_end_to_end(tmp_path):
    # A stand-in engine: reads every frame, checks the profiling variable, prints the profile line.
    engine = fake(
        tmp_path / "engine",
        f"""cat > /dev/null
[ "$MICROGPT_CUDA_PROFILE_STEP" = 2 ] || exit 9
echo '{PROFILE_LINE}' >&2
""",
    )
    res = run_script(
        tmp_path, "--tool", "events", "--step", "2", "--batch", "2", env_extra={"MICROGPT_CUDA_ENGINE": str(engine)}
    )
    assert res.returncode == 0, res.stderr
    assert "tool events" in res.stdout and "15.0% of the step" in res.stdout
    doc = json.loads((tmp_path / "out" / "andrea-12m_b2_flash.json").read_text())
    assert doc["tool"] == "events" and doc["attention_share"] == pytest.approx(0.15)


def test_ncu_end_to_end(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    # A stand-in ncu: writes the fixture to --log-file, runs the application (which drains stdin).
    fake(
        bindir / "ncu",
        f"""if [ "$1" = --version ]; then echo "Version 2099.1 (stand-in)"; exit 0; fi
log=""
while [ $# -gt 0 ]; do
  case $1 in
    --log-file) log=$2; shift 2 ;;
    --csv) shift ;;
    --page|--metrics|--print-units|--print-kernel-base|--profile-from-start|--clock-control|--cache-control) shift 2 ;;
    --*) shift ;;
    *) break ;;
  esac
done
cp {FIXTURE} "$log"
exec "$@"
""",
    )
    engine = fake(tmp_path / "engine", "cat > /dev/null\n")
    res = run_script(
        tmp_path,
        "--shape",
        "gpt2-124m",
        "--attention",
        "naive",
        env_extra={"MICROGPT_CUDA_ENGINE": str(engine), "PATH": f"{bindir}:{os.environ['PATH']}"},
    )
    assert res.returncode == 0, res.stderr
    assert "tool ncu (Version 2099.1 (stand-in))" in res.stdout and "10.0% of the step" in res.stdout
    doc = json.loads((tmp_path / "out" / "gpt2-124m_b8_naive.json").read_text())
    assert doc["tool"] == "ncu" and len(doc["kernels"]) == 5


@pytest.mark.parametrize(
    "args, says",
    [
        (["--shape", "gpt3"], "--shape"),
        (["--batch", "0"], "--batch"),
        (["--tool", "nsys"], "--tool"),
        (["--bogus"], "unknown argument"),
        (["--batch"], "needs a value"),
    ],
)
def test_bad_arguments(tmp_path, args, says):
    res = run_script(tmp_path, *args, env_extra={"MICROGPT_CUDA_ENGINE": "/bin/true"})
    assert res.returncode == 2 and says in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_missing_engine(tmp_path):
    res = run_script(tmp_path, "--tool", "events", env_extra={"MICROGPT_CUDA_ENGINE": str(tmp_path / "nope")})
    assert res.returncode == 2 and "not found" in res.stderr


def test_markdown_table(tmp_path):
    a = ps.summarize_ncu("gpt2 naive", ps.parse_ncu_csv(FIXTURE.read_text()))
    b = ps.summarize_events("gpt2 flash", PROFILE_LINE)
    for p, name in ((a, "a.json"), (b, "b.json")):
        ps.atomic_write_json(tmp_path / name, ps.asdict(p))
    table = ps.markdown_table([ps.load_profile(tmp_path / "a.json"), ps.load_profile(tmp_path / "b.json")])
    lines = table.splitlines()
    assert lines[0].startswith("| run | tool | step ms | attention | matmul (cuBLASLt) | attention |")
    assert lines[2].startswith("| gpt2 naive | ncu | 1.00 | 10.0% | 80.0% | 10.0% |")
    assert lines[3].startswith("| gpt2 flash | events | 40.00 | 15.0% |")

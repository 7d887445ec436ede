#!/usr/bin/env bash
# One script for a GPU machine (docs/CUDA.md, "Everything on a GPU in one script"): builds, checks, tests, profiles and
# benchmarks the CUDA engine. Every phase runs under its own time limit, and all of them within one
# budget, so a phase that fails or hangs never eats the session: it is logged and the next runs.
#
#   scripts/gpu_session.sh [--out DIR] [--budget SECONDS] PHASE...
#
# Phases, run in the order given:
#   prepare      HERE, before the first call (no GPU, no device time): copies into .gpu-carry/ (git-ignored)
#                what the GPU machine lacks: llm.c (from ../shared/peers/llm.c) and cudnn-frontend's
#                headers (from this machine's nvidia-cudnn-frontend wheel), and downloads into .whl/ the
#                proxy's packages the GPU image lacks (for test-e2e and goodput)
#   build        `make engines` for this GPU's architecture, with cuDNN (the image's nvidia-cudnn-cu13,
#                cudnn-frontend from .gpu-carry), and without it into build/nocudnn; llm.c's train_gpt2cu
#                with cuDNN in the background when .gpu-carry/llm.c exists (bench waits for it)
#   check        build/flash_attention_check: the flash kernels alone against float64, then --time
#   cpu          the CPU-side checks on this machine's 16 cores: tests/cuda_cpu, tests/cuda_build,
#                tests/qualification
#   sanitize     compute-sanitizer memcheck, racecheck, synccheck and initcheck on flash_attention_check
#                --quick and on the engine at a quick shape with every fast path (cuDNN attention, the
#                fused step in a CUDA graph, a checkpoint, a KV-cache sample)
#   test-fast    tests/gpu/test_fast_paths.py: the new paths first (cuDNN, fused, graph, KV cache,
#                snapshots, qualification on this GPU)
#   test         the rest of tests/gpu
#   test-e2e     `make test-gpu`'s other suites: the frame gate, end-to-end, pivot and kill-storm suites
#                against the CUDA engine (MICROGPT_TEST_ENGINE=cuda); the kill storms' results go to
#                faults-cuda.json (for docs/reliability-cuda.json). Needs the wheels in .whl (prepare)
#   profile      scripts/profile_cuda.sh of the new step (cuDNN attention, fused step in a CUDA graph):
#                per kernel with ncu at andrea-12m and gpt2-124m B=8, CUDA events at gpt2-124m B=32
#   bench        scripts/bench_cuda.py: the engine's qualified fast paths (cudnn+graph, and flash+graph)
#                against PyTorch reduce-overhead at andrea-12m B=8, and against PyTorch's default
#                compile and llm.c with cuDNN at gpt2-124m B=8 and B=32
#   goodput      scripts/bench_goodput.py: proxy run of ANDREA-12M (1000 steps) and ANDREA-120M (300
#                steps) at their default cadence on the CUDA engine (needs the wheels in .whl)
# The budget (default 570 s, under the device tool's 10-minute limit) counts from the start; a
# phase gets at most what is left of it, less 20 s for the summary, and is skipped under 30 s.
#
# Output in DIR (default $OUT where the device tool sets it, else ./gpu-out), at most 8 files:
# session.log (everything printed), summary.txt, results.tgz (check.jsonl, the sanitizer and llm.c
# logs, the profiles), bench-12m.json, bench-124m.json, faults-cuda.json, goodput-gpu.json.
# Exit status: 0 when every phase ran and passed, else 1.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
out=${OUT:-$repo/gpu-out}
budget=570
phases=()
while [[ $# -gt 0 ]]; do
    case $1 in
        --out) [[ $# -ge 2 ]] || { echo "gpu_session: --out needs a value" >&2; exit 2; }; out=$2; shift 2 ;;
        --budget) [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || { echo "gpu_session: --budget needs seconds" >&2; exit 2; }
                  budget=$2; shift 2 ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; exit 0 ;;
        prepare|build|check|cpu|sanitize|test-fast|test|test-e2e|profile|bench|goodput) phases+=("$1"); shift ;;
        *) echo "gpu_session: unknown phase or argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
[[ ${#phases[@]} -gt 0 ]] || { echo "gpu_session: name at least one phase (see --help)" >&2; exit 2; }

start=$(date +%s)
deadline=$((start + budget))
mkdir -p "$out"
state=$(mktemp -d "${TMPDIR:-/tmp}/gpu_session.XXXXXX")
exec > >(tee -a "$out/session.log") 2>&1

export REPO=$repo OUT_DIR=$out STATE=$state PY=python3
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export LLMC_DIR=$repo/.gpu-carry/llm.c FRONTEND_DIR=$repo/.gpu-carry/cudnn-frontend/include
cd "$repo" || exit 2

# ---------------------------------------------------------------------------
# phases (each runs as `bash -c phase_NAME` under timeout, so a hang is killed with its children)

phase_prepare() {
    local peers=${PEERS_DIR:-../shared/peers}
    [[ -d $peers/llm.c ]] || { echo "gpu_session: $peers/llm.c not found (the llm.c peer; PEERS_DIR=...)"; return 1; }
    mkdir -p .gpu-carry
    rm -rf .gpu-carry/llm.c .gpu-carry/cudnn-frontend
    cp -r "$peers/llm.c" .gpu-carry/llm.c
    local inc
    inc=$("$PY" -c "import importlib.metadata as m; print(m.distribution('nvidia-cudnn-frontend').locate_file('include'))") \
        || { echo "gpu_session: the nvidia-cudnn-frontend wheel is not installed here (scripts/install_test_deps.sh)"; return 1; }
    mkdir -p .gpu-carry/cudnn-frontend
    cp -r "$inc" .gpu-carry/cudnn-frontend/include
    mkdir -p .whl
    local pkg
    for pkg in pydantic==2.13.4 pydantic-core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2 \
               fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 watchdog==7.1.0; do
        "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
            --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "$pkg" || return 1
    done
    du -sh .gpu-carry .whl
}

# The image's cuDNN wheel (nvidia-cudnn-cu13, under python3's site-packages): its directory.
cudnn_wheel_dir() {
    "$PY" -c "import glob, os, nvidia; d = [os.path.dirname(os.path.dirname(h)) for p in nvidia.__path__ \
        for h in glob.glob(os.path.join(p, '*', 'include', 'cudnn.h'))]; print(d[0] if d else '')"
}

phase_build() {
    nvidia-smi || true
    nvcc --version | tail -n 2
    local cc arch=() fe=()
    cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d '. ')
    [[ $cc =~ ^[0-9]+$ ]] && arch=("CUDA_ARCH=-gencode=arch=compute_$cc,code=sm_$cc")
    [[ -f $FRONTEND_DIR/cudnn_frontend.h ]] && fe=("CUDNN_FRONTEND_INC=$FRONTEND_DIR")
    local cudnn
    cudnn=$(cudnn_wheel_dir)
    if [[ -f $LLMC_DIR/Makefile ]]; then
        echo "gpu_session: building llm.c with cuDNN in the background (log: llmc-build.log in results.tgz)"
        # llm.c links -lcudnn: the wheel ships libcudnn.so.9 only, so a directory with the plain name.
        mkdir -p "$STATE/cudnn-link"
        ln -sf "$cudnn/lib/libcudnn.so.9" "$STATE/cudnn-link/libcudnn.so"
        ( cd "$LLMC_DIR" && CPATH="$cudnn/include" LIBRARY_PATH="$STATE/cudnn-link" \
            make train_gpt2cu NO_MULTI_GPU=1 USE_CUDNN=1 CUDNN_FRONTEND_PATH="$FRONTEND_DIR" \
            > "$STATE/results/llmc-build.log" 2>&1
          echo $? > "$STATE/llmc.rc" ) &
    fi
    make cuda-info PYTHON="$PY" "${fe[@]}"
    make -j3 engines PYTHON="$PY" "${arch[@]}" "${fe[@]}" &
    local with=$!
    make cuda PYTHON="$PY" CUDNN=0 BUILD=build/nocudnn "${arch[@]}" > "$STATE/results/nocudnn-build.log" 2>&1 &
    local without=$!
    local rc=0
    wait $with || rc=1
    wait $without || { echo "gpu_session: the build without cuDNN failed (nocudnn-build.log)"; rc=1; }
    ldd build/microgpt_cuda | grep -E "cudnn|cublas|nvrtc"
    build/microgpt_cuda --help | grep -- "--attention"
    build/nocudnn/microgpt_cuda --help | grep -- "--attention"
    return $rc
}

phase_check() {
    build/flash_attention_check | tee "$STATE/results/check.jsonl" || return 1
    build/flash_attention_check --time | tee -a "$STATE/results/check.jsonl"
}

phase_cpu() {
    "$PY" -m pytest -q -rfE -p no:cacheprovider tests/cuda_cpu tests/cuda_build tests/qualification
}

# A quick run of the engine with every fast path: 4 steps (the 1st captures the graph), a checkpoint
# (the asynchronous snapshot), a SAMPLE through the KV cache.
engine_quick_args() {
    "$PY" - "$1" <<'PYEOF'
import sys
from proxy.formats.engine_cli import engine_args, setting_flags
print("\n".join(engine_args(sys.argv[1], ckpt_every=2, settings=setting_flags(
    vocab=512, ctx=128, dim=128, layers=2, heads=2, batch=4, steps=100, warmup=2),
    extra=["--attention", "cudnn", "--cuda-graph", "on"])))
PYEOF
}

engine_quick_frames() {
    "$PY" - <<'PYEOF'
import sys
import numpy as np
from proxy.formats import frames
rng = np.random.default_rng(1)
out = sys.stdout.buffer
for step in range(1, 5):
    out.write(frames.train_frame(step, rng.integers(0, 512, size=(4, 129), dtype=np.uint16), np.zeros(4, np.uint16)))
out.write(frames.sample_frame(1, [1, 2, 3], count=2, max_new=16, temperature=0.8, top_k=20))
out.write(frames.stop_frame())
PYEOF
}

phase_sanitize() {
    local tool rc=0 args
    mapfile -t args < <(engine_quick_args "$STATE/san-ckpt")
    engine_quick_frames > "$STATE/quick.frames"
    for tool in memcheck racecheck synccheck initcheck; do
        echo "-- compute-sanitizer --tool $tool: flash_attention_check --quick"
        compute-sanitizer --tool "$tool" --error-exitcode 3 build/flash_attention_check --quick \
            > "$STATE/results/san-$tool-flash.log" 2>&1 || rc=1
        tail -n 2 "$STATE/results/san-$tool-flash.log"
        echo "-- compute-sanitizer --tool $tool: the engine, every fast path, 4 steps, a checkpoint, a sample"
        rm -rf "$STATE/san-ckpt"
        compute-sanitizer --tool "$tool" --error-exitcode 3 build/microgpt_cuda "${args[@]}" \
            < "$STATE/quick.frames" > "$STATE/results/san-$tool-engine.log" 2>&1 || rc=1
        grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Error|Hazard|\"event\":\"(sample|error)\"" \
            "$STATE/results/san-$tool-engine.log" | head -n 8
        tail -n 1 "$STATE/results/san-$tool-engine.log"
    done
    return $rc
}

phase_test_fast() {
    "$PY" -m pytest -q -rfE -p no:cacheprovider tests/gpu/test_fast_paths.py
}

phase_test() {
    "$PY" -m pytest -q -rfE -p no:cacheprovider tests/gpu --deselect tests/gpu/test_fast_paths.py
}

install_wheels() {
    [[ -d .whl ]] || { echo "gpu_session: no .whl (run the prepare phase here first, carry .whl)"; return 1; }
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$STATE/site" \
        .whl/*.whl || return 1
}

phase_test_e2e() {
    install_wheels || return 1
    PYTHONPATH="$PYTHONPATH:$STATE/site" FAULT_RESULTS="$OUT_DIR/faults-cuda.json" MICROGPT_TEST_ENGINE=cuda \
        "$PY" -m pytest -q -rfE -p no:cacheprovider tests/harness tests/proxy_e2e tests/proxy_pivot \
        tests/faults/test_kills.py
}

phase_profile() {
    local cfg rc=0 dir=$STATE/results/profile
    mkdir -p "$dir"
    for cfg in "andrea-12m 8 auto" "gpt2-124m 8 auto" "gpt2-124m 32 events"; do
        set -- $cfg
        # Where ncu fails on this machine, the engine's own events still give the step.
        timeout -k 5 150 scripts/profile_cuda.sh --shape "$1" --batch "$2" --attention cudnn --step-path graph \
            --tool "$3" --out "$dir" \
        || { [[ $3 == auto ]] && echo "gpu_session: retrying $1 B=$2 with --tool events" \
             && timeout -k 5 90 scripts/profile_cuda.sh --shape "$1" --batch "$2" --attention cudnn \
                --step-path graph --tool events --out "$dir"; } || rc=1
    done
    "$PY" scripts/profile_summary.py table "$dir"/*.json
    return $rc
}

wait_llmc() {  # prints the train_gpt2cu path when llm.c was built, else nothing
    [[ -f $LLMC_DIR/Makefile ]] || return 0
    local i
    for ((i = 0; i < 240; i++)); do [[ -f $STATE/llmc.rc ]] && break; sleep 1; done
    if [[ $(cat "$STATE/llmc.rc" 2>/dev/null) == 0 && -x $LLMC_DIR/train_gpt2cu ]]; then
        echo "$LLMC_DIR/train_gpt2cu"
    else
        echo "gpu_session: llm.c is not built (see llmc-build.log); benchmarking without it" >&2
    fi
}

phase_bench() {
    local llmc rc=0
    "$PY" scripts/bench_cuda.py --shape andrea-12m --batch 8 --attention cudnn flash --step-paths graph \
        --torch-modes reduce-overhead --steps 20 --warmup 3 --ckpts 2 --json "$OUT_DIR/bench-12m.json" || rc=1
    llmc=$(wait_llmc)
    LD_LIBRARY_PATH="$(cudnn_wheel_dir)/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
        "$PY" scripts/bench_cuda.py --shape gpt2-124m --batch 8 32 --attention cudnn --step-paths graph \
        --torch-modes default --steps 15 --warmup 3 --ckpts 2 ${llmc:+--llmc "$llmc"} \
        --json "$OUT_DIR/bench-124m.json" || rc=1
    return $rc
}

phase_goodput() {
    install_wheels || return 1
    local gpu rc=0
    gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
    PYTHONPATH="$PYTHONPATH:$STATE/site" "$PY" scripts/bench_goodput.py run experiments/ANDREA-12M-TRAIN.json \
        --steps 1000 --engine cuda --label "ANDREA-12M, $gpu" --json "$OUT_DIR/goodput-gpu.json" || rc=1
    PYTHONPATH="$PYTHONPATH:$STATE/site" "$PY" scripts/bench_goodput.py run experiments/ANDREA-120M-TRAIN.json \
        --steps 300 --engine cuda --label "ANDREA-120M, $gpu" --json "$OUT_DIR/goodput-gpu.json" || rc=1
    return $rc
}

export -f phase_prepare cudnn_wheel_dir phase_build phase_check phase_cpu engine_quick_args engine_quick_frames \
    phase_sanitize phase_test_fast phase_test install_wheels phase_test_e2e phase_profile wait_llmc phase_bench \
    phase_goodput

# ---------------------------------------------------------------------------
# the runner

declare -A limit=([prepare]=300 [build]=300 [check]=150 [cpu]=300 [sanitize]=240 [test-fast]=300 [test]=420
                  [test-e2e]=480 [profile]=300 [bench]=480 [goodput]=420)
mkdir -p "$state/results"
results=()
failed=0
for phase in "${phases[@]}"; do
    left=$((deadline - $(date +%s) - 20))
    if ((left < 30)); then
        results+=("$(printf '%-12s %-22s %5s s' "$phase" "skipped (no budget)" 0)")
        failed=1
        continue
    fi
    lim=${limit[$phase]}
    ((lim > left)) && lim=$left
    echo
    echo "== $phase (limit ${lim} s, $(($(date +%s) - start)) s into the session) =="
    t0=$(date +%s)
    rc=0
    timeout -k 10 "$lim" bash -o pipefail -c "phase_${phase//-/_}" || rc=$?
    dt=$(($(date +%s) - t0))
    case $rc in
        0) status=ok ;;
        124|137) status="TIMED OUT" ;;
        *) status="FAILED (exit $rc)" ;;
    esac
    [[ $rc -eq 0 ]] || failed=1
    echo "== $phase: $status in $dt s =="
    results+=("$(printf '%-12s %-22s %5d s' "$phase" "$status" "$dt")")
done

{
    echo
    echo "== summary ($(($(date +%s) - start)) s of a ${budget} s budget; output in $out) =="
    printf '%s\n' "${results[@]}"
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null
    if [[ -f $state/results/check.jsonl ]]; then
        echo "-- flash kernels (check.jsonl): worst error per output over the cases"
        "$PY" - "$state/results/check.jsonl" <<'PYEOF' || true
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
cases = [r for r in rows if "nonfinite" in r]
if cases:
    keys = ("y", "lse", "dq", "dk", "dv", "y_row", "dq_row", "dk_row", "dv_row")
    print("  " + ", ".join(f"{k} {max(r[k] for r in cases):.2e}" for k in keys)
          + f"; unwritten {sum(r['nonfinite'] for r in cases)}; every case repeats bitwise: "
          + str(all(r["bitwise_repeat"] for r in cases)))
for r in rows:
    if "fwd_ms" in r:
        print(f"  {r['shape']}: forward {r['fwd_ms']:.3f} ms ({r['fwd_tflops']:.0f} TFLOP/s), "
              f"backward {r['bwd_ms']:.3f} ms ({r['bwd_tflops']:.0f} TFLOP/s)")
PYEOF
    fi
    for f in "$out"/bench-12m.json "$out"/bench-124m.json; do
        [[ -f $f ]] && "$PY" scripts/cuda_bench_report.py render "$f" | tail -n +5
    done
} | tee "$out/summary.txt"
if [[ -n $(ls -A "$state/results") ]]; then
    tar czf "$out/results.tgz" -C "$state" results
fi
rm -rf "$state"
exit $failed

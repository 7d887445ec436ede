#!/usr/bin/env bash
# One script for a GPU session (docs/CUDA.md, "Next GPU session"): builds, checks, tests, profiles
# and benchmarks the CUDA engine. Every phase runs under its own time limit, and all of them within
# one budget, so a phase that fails or hangs never eats the session: it is logged and the next runs.
#
#   scripts/gpu_session.sh [--out DIR] [--budget SECONDS] PHASE...
#
# Phases, run in the order given:
#   build        `make engines` for this GPU's architecture (nvidia-smi's compute capability);
#                llm.c's train_gpt2cu too, in the background, when .gpu-carry/llm.c exists (a copy of
#                the llm.c peer: it does not travel by itself); the bench phases wait for it
#   check        build/flash_attention_check: the flash kernels alone against float64, then --time
#   sanitize     compute-sanitizer memcheck, racecheck and synccheck on flash_attention_check --quick
#   sass         cuobjdump: HMMA (tensor core), LDSM (ldmatrix), LDGSTS (cp.async) and LDL/STL (local
#                memory) instructions in each flash kernel
#   test         python3 -m pytest -q tests/gpu
#   test-e2e     the frame gate, end-to-end, pivot and kill-storm suites against the CUDA engine
#                (MICROGPT_TEST_ENGINE=cuda: `make test-gpu` less tests/gpu); the kill storms' results
#                go to faults-cuda.json (for docs/reliability-cuda.json). Needs the proxy's Python
#                packages the image lacks, carried as wheels in .whl (docs/CUDA.md, "Next GPU session")
#   profile      scripts/profile_cuda.sh at andrea-12m and gpt2-124m B=8, naive and flash (ncu when
#                present), and gpt2-124m B=32 naive and flash (the engine's CUDA events)
#   bench-small  scripts/bench_cuda.py --batch 8, both shapes (llm.c beside GPT-2 where built)
#   bench-large  scripts/bench_cuda.py --shape gpt2-124m --batch 32 64
# The budget (default 570 s, under the device tool's 10-minute limit) counts from the start; a
# phase gets at most what is left of it, less 20 s for the summary, and is skipped under 30 s.
#
# Output in DIR (default $OUT where the device tool sets it, else ./gpu-out), at most 8 files:
# session.log (everything printed), summary.txt, check.jsonl, profiles.tgz, bench-small.json,
# bench-large.json, llmc-build.log, faults-cuda.json. Exit status: 0 when every phase ran and passed, else 1.
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
        build|check|sanitize|sass|test|test-e2e|profile|bench-small|bench-large) phases+=("$1"); shift ;;
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
export LLMC_DIR=$repo/.gpu-carry/llm.c
cd "$repo" || exit 2

# ---------------------------------------------------------------------------
# phases (each runs as `bash -c phase_NAME` under timeout, so a hang is killed with its children)

phase_build() {
    nvidia-smi || true
    nvcc --version | tail -n 2
    local cc arch=()
    cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d '. ')
    [[ $cc =~ ^[0-9]+$ ]] && arch=("CUDA_ARCH=-gencode=arch=compute_$cc,code=sm_$cc")
    if [[ -f $LLMC_DIR/Makefile ]]; then
        echo "gpu_session: building llm.c in the background (log: llmc-build.log)"
        ( cd "$LLMC_DIR" && make train_gpt2cu NO_MULTI_GPU=1 USE_CUDNN=0 > "$OUT_DIR/llmc-build.log" 2>&1
          echo $? > "$STATE/llmc.rc" ) &
    fi
    make cuda-info PYTHON="$PY"
    make -j3 engines PYTHON="$PY" "${arch[@]}"
}

phase_check() {
    build/flash_attention_check | tee "$OUT_DIR/check.jsonl" || return 1
    build/flash_attention_check --time | tee -a "$OUT_DIR/check.jsonl"
}

phase_sanitize() {
    local tool rc=0
    for tool in memcheck racecheck synccheck; do
        echo "-- compute-sanitizer --tool $tool"
        compute-sanitizer --tool "$tool" --error-exitcode 3 build/flash_attention_check --quick > "$STATE/san.out" 2>&1 \
            || rc=1
        grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Error|Hazard" "$STATE/san.out" | head -n 20
        tail -n 2 "$STATE/san.out"
    done
    return $rc
}

phase_sass() {
    cuobjdump --dump-sass build/microgpt_cuda > "$STATE/sass.txt" || return 1
    awk '/Function :/ { f = $3 }
         f ~ /flash_attention/ && /\/\*[0-9a-f]+\*\// {
             for (i = 1; i <= NF; i++) if ($i ~ /^(HMMA|LDSM|LDGSTS|LDL|STL)/) { split($i, op, "."); n[f, op[1]]++ }
             seen[f] = 1 }
         END { printf "%-70s %6s %6s %7s %5s %5s\n", "kernel", "HMMA", "LDSM", "LDGSTS", "LDL", "STL"
               for (k in seen) printf "%-70s %6d %6d %7d %5d %5d\n", substr(k, 1, 70), n[k, "HMMA"], n[k, "LDSM"],
                   n[k, "LDGSTS"], n[k, "LDL"], n[k, "STL"] }' "$STATE/sass.txt" | sort
}

phase_test() {
    "$PY" -m pytest -q -rfE -p no:cacheprovider tests/gpu
}

phase_test_e2e() {
    if [[ -d .whl ]]; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$STATE/site" \
            .whl/*.whl || return 1
        export PYTHONPATH="$PYTHONPATH:$STATE/site"
    fi
    FAULT_RESULTS="$OUT_DIR/faults-cuda.json" MICROGPT_TEST_ENGINE=cuda "$PY" -m pytest -q -rfE -p no:cacheprovider \
        tests/harness tests/proxy_e2e tests/proxy_pivot tests/faults/test_kills.py
}

phase_profile() {
    local cfg rc=0 dir=$STATE/profile
    mkdir -p "$dir"
    for cfg in "andrea-12m 8 naive auto" "andrea-12m 8 flash auto" "gpt2-124m 8 naive auto" \
               "gpt2-124m 8 flash auto" "gpt2-124m 32 naive events" "gpt2-124m 32 flash events"; do
        set -- $cfg
        # Where ncu fails on this machine, the engine's own events still give the attention share.
        timeout -k 5 150 scripts/profile_cuda.sh --shape "$1" --batch "$2" --attention "$3" --tool "$4" \
            --out "$dir" \
        || { [[ $4 == auto ]] && echo "gpu_session: retrying $1 B=$2 $3 with --tool events" \
             && timeout -k 5 90 scripts/profile_cuda.sh --shape "$1" --batch "$2" --attention "$3" --tool events \
                --out "$dir"; } || rc=1
    done
    "$PY" scripts/profile_summary.py table "$dir"/*.json
    tar czf "$OUT_DIR/profiles.tgz" -C "$STATE" profile
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

phase_bench_small() {
    local llmc
    llmc=$(wait_llmc)
    "$PY" scripts/bench_cuda.py --shape all --batch 8 --steps 20 --warmup 3 --ckpts 2 \
        ${llmc:+--llmc "$llmc"} --json "$OUT_DIR/bench-small.json"
}

phase_bench_large() {
    local llmc
    llmc=$(wait_llmc)
    "$PY" scripts/bench_cuda.py --shape gpt2-124m --batch 32 64 --steps 15 --warmup 3 --ckpts 0 \
        ${llmc:+--llmc "$llmc"} --json "$OUT_DIR/bench-large.json"
}

export -f phase_build phase_check phase_sanitize phase_sass phase_test phase_test_e2e phase_profile wait_llmc \
    phase_bench_small phase_bench_large

# ---------------------------------------------------------------------------
# the runner

declare -A limit=([build]=300 [check]=150 [sanitize]=180 [sass]=60 [test]=420 [test-e2e]=480 [profile]=420
                  [bench-small]=420 [bench-large]=480)
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
    if [[ -f $out/check.jsonl ]]; then
        echo "-- flash kernels (check.jsonl): worst error per output over the cases"
        "$PY" - "$out/check.jsonl" <<'PYEOF' || true
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
    for f in "$out"/bench-small.json "$out"/bench-large.json; do
        [[ -f $f ]] && "$PY" scripts/cuda_bench_report.py render "$f" | tail -n +5
    done
} | tee "$out/summary.txt"
rm -rf "$state"
exit $failed

#!/usr/bin/env bash
# Per-kernel time shares of one training step of build/microgpt_cuda.
#
#   scripts/profile_cuda.sh [--shape andrea-12m|gpt2-124m] [--batch B] [--attention naive|flash|cudnn]
#                           [--step-path verified|fused|graph] [--tool auto|ncu|events] [--step N] [--out DIR]
#
# The engine trains N steps of random tokens in proxy mode (defaults: andrea-12m, B=8, flash,
# the verified step kernels, step 3; --step-path fused or graph: --fused on, --cuda-graph on) with
# MICROGPT_CUDA_PROFILE_STEP=N, so step N alone runs between cudaProfilerStart and
# cudaProfilerStop, and then stops. The tool that measures it:
#   ncu     Nsight Compute (`--tool auto` picks it when `ncu` is on the PATH): every kernel of the
#           step, its time (gpu__time_duration, clocks and caches left alone), calls and share,
#           and shares by category (matmuls, attention, ...). Kernels run serialized under ncu,
#           so the shares are of the summed kernel time, not of the wall-clock step.
#   events  the fallback without ncu: the engine's own CUDA events, the step on the GPU
#           timeline and the time in the attention forward and backward calls; no per-kernel split.
# Nsight Systems is not used: it was not on the PATH of the GPU machines seen so far (docs/CUDA.md).
# ncu profiles the kernels inside a CUDA graph one by one as it does the others. The output names the
# tool. Files in DIR (default ./profile-out), TAG = SHAPE_bB_ATTENTION (+_STEPPATH when not verified):
#   TAG.json (scripts/profile_summary.py's Profile), TAG.stderr, TAG.events, TAG.ncu.csv (ncu).
# Exit 2 on bad arguments or a missing engine/tool, 1 when the profiled run fails.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
py=${PYTHON:-python3}
engine=${MICROGPT_CUDA_ENGINE:-$repo/build/microgpt_cuda}
shape=andrea-12m batch=8 attention=flash step_path=verified tool=auto step=3 out=profile-out

die() { echo "profile_cuda: $*" >&2; exit 2; }
need() { [[ $# -ge 2 && -n $2 ]] || die "$1 needs a value"; }

while [[ $# -gt 0 ]]; do
    case $1 in
        --shape) need "$@"; shape=$2; shift 2 ;;
        --batch) need "$@"; batch=$2; shift 2 ;;
        --attention) need "$@"; attention=$2; shift 2 ;;
        --step-path) need "$@"; step_path=$2; shift 2 ;;
        --tool) need "$@"; tool=$2; shift 2 ;;
        --step) need "$@"; step=$2; shift 2 ;;
        --out) need "$@"; out=$2; shift 2 ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done
case $shape in andrea-12m|gpt2-124m) ;; *) die "--shape: '$shape' is not andrea-12m or gpt2-124m" ;; esac
case $attention in naive|flash|cudnn) ;; *) die "--attention: '$attention' is not naive, flash or cudnn" ;; esac
case $step_path in verified|fused|graph) ;; *) die "--step-path: '$step_path' is not verified, fused or graph" ;; esac
[[ $batch =~ ^[1-9][0-9]*$ ]] || die "--batch: '$batch' is not a positive integer"
[[ $step =~ ^[1-9][0-9]*$ ]] || die "--step: '$step' is not a positive integer"
case $tool in
    auto) if command -v ncu >/dev/null 2>&1; then tool=ncu; else tool=events; fi ;;
    ncu) command -v ncu >/dev/null 2>&1 || die "--tool ncu: ncu is not on the PATH" ;;
    events) ;;
    *) die "--tool: '$tool' is not auto, ncu or events" ;;
esac
[[ -x $engine ]] || die "$engine not found: build it with \`make cuda\`"

export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$out"
tag="${shape}_b${batch}_${attention}"
[[ $step_path == verified ]] || tag="${tag}_${step_path}"
work=$(mktemp -d "${TMPDIR:-/tmp}/profile_cuda.XXXXXX")
trap 'rm -rf "$work"' EXIT
mapfile -t args < <("$py" "$here/profile_summary.py" engine-args "$shape" "$batch" "$attention" "$work/ckpt" "$step_path")
[[ ${#args[@]} -gt 0 ]] || die "could not build the engine's arguments"
"$py" "$here/profile_summary.py" frames "$shape" "$batch" "$step" > "$work/frames.bin"

echo "profile_cuda: $tag, step $step of $step, tool $tool ($([[ $tool == ncu ]] && ncu --version | tail -n 1 \
    || echo 'CUDA events in the engine: ncu not used'))"
run_failed() {
    echo "profile_cuda: the profiled run failed (exit $1); last lines of $out/$tag.stderr:" >&2
    tail -n 5 "$out/$tag.stderr" >&2
    exit 1
}
if [[ $tool == ncu ]]; then
    rc=0
    MICROGPT_CUDA_PROFILE_STEP=$step ncu --profile-from-start off --clock-control none --cache-control none \
        --metrics gpu__time_duration.sum --csv --page details --print-units base --print-kernel-base function \
        --log-file "$out/$tag.ncu.csv" "$engine" "${args[@]}" \
        < "$work/frames.bin" > "$out/$tag.events" 2> "$out/$tag.stderr" || rc=$?
    [[ $rc -eq 0 ]] || run_failed $rc
    # ncu writes its CSV to the log file; should a version print it to stdout instead, it is among
    # the engine's events (the parser keeps only CSV lines).
    cat "$out/$tag.ncu.csv" "$out/$tag.events" > "$work/all.csv"
    "$py" "$here/profile_summary.py" summarize --tool ncu --csv "$work/all.csv" --label "$tag" --out "$out/$tag.json"
else
    rc=0
    MICROGPT_CUDA_PROFILE_STEP=$step "$engine" "${args[@]}" \
        < "$work/frames.bin" > "$out/$tag.events" 2> "$out/$tag.stderr" || rc=$?
    [[ $rc -eq 0 ]] || run_failed $rc
    "$py" "$here/profile_summary.py" summarize --tool events --stderr "$out/$tag.stderr" --label "$tag" \
        --out "$out/$tag.json"
fi

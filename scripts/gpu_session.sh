#!/usr/bin/env bash
# One script for a GPU machine (docs/CUDA.md, "What a GPU lease runs"): builds, tests, profiles and
# benchmarks the CUDA engine. Every phase runs under its own time limit, and all of them within one
# budget, so a phase that fails or hangs never eats the session: it is logged and the next runs.
#
#   scripts/gpu_session.sh prepare                       HERE, before the lease (no GPU)
#   scripts/gpu_session.sh lease                         the first GPU call (carry .gpu-carry and .whl)
#   scripts/gpu_session.sh lease2                        a second call, if device time is left
#   scripts/gpu_session.sh --dry-run lease|lease2        HERE: everything of it that needs no GPU
#   scripts/gpu_session.sh [--out DIR] [--budget SECONDS] [--dry-run] PHASE|PLAN...
#
# Plans (a fixed list of phases, each with its time budget in seconds; a trailing + takes whatever
# is left of the session once the others are done):
#   lease    wheels 15, build 130, test-fast 140, bench-124m 170, bench-12m 45, profile-124m 20+
#   lease2   wheels 15, build 100, test-nccl 20, test 90, test-e2e 150, bench-b32 90, goodput 55
# Phases:
#   prepare      HERE (no GPU, no device time; not part of a plan): puts into .gpu-carry/ (git-ignored)
#                what the GPU machine lacks: llm.c (from ../shared/peers/llm.c), cudnn-frontend's headers
#                (this machine's nvidia-cudnn-frontend wheel), build/attention_cudnn.o compiled here with
#                a stamp of what it was compiled against (scripts/cudnn_carry.py), the commit; downloads
#                into .whl/ the wheels the image lacks (pydantic, fastapi, uvicorn, watchdog with their
#                dependencies, pytest-timeout, pytest-xdist) for Python 3.11-3.13 (the image has 3.12); prints the
#                carried size (64 MiB at most)
#   wheels       installs the wheels of .whl/ that fit this Python, one per project, into a target
#                directory that every later phase of the call has on PYTHONPATH (a temporary one:
#                name it first in any call whose phases import the proxy)
#   build        `make -j3 engines` for this GPU's architecture with cuDNN, using the carried cuDNN
#                object when its stamp matches this machine (else one line says why, and make compiles
#                it here); with bench-b32 in the plan, llm.c's train_gpt2cu with cuDNN in the background
#   test-fast    tests/gpu/test_fast_paths.py: every fast path against the verified one on this GPU
#   test-nccl    tests/gpu/test_nccl.py's one-GPU tests: `mpirun -np 1` of build/microgpt_cuda_mpi (NCCL)
#                against build/microgpt_cuda, bit for bit (skipped where the image has no mpirun)
#   test         the rest of tests/gpu
#   test-e2e     `make test-gpu`'s other suites (the Makefile's GPU_SUITES) against the CUDA engine
#                (MICROGPT_TEST_ENGINE=cuda), in 4 pytest-xdist workers: the engine, frame gate,
#                end-to-end, pivot and kill-storm suites; the kill storms' results go to faults-cuda.json
#   bench-124m   scripts/bench_cuda.py at gpt2-124m B=8: naive (the verified path, the same-card
#                anchor), cudnn+graph, cudnn+fused, flash+graph; PyTorch default and reduce-overhead
#   bench-12m    scripts/bench_cuda.py at andrea-12m B=8: cudnn+graph against PyTorch reduce-overhead
#   bench-b32    scripts/bench_cuda.py at gpt2-124m B=32: cudnn+graph, llm.c with cuDNN, PyTorch default
#                (a bench phase fails when one of its trainers could not run: bench_cuda.py records it
#                as skipped, with the reason)
#   profile-124m scripts/profile_cuda.sh of cudnn+graph at gpt2-124m B=8 (per kernel with ncu)
#   goodput      scripts/bench_goodput.py: proxy run of ANDREA-12M (300 steps) on the CUDA engine
#   check        build/flash_attention_check: the flash kernels alone against float64, then --time
#   cpu          tests/cuda_cpu, tests/cuda_build, tests/qualification on this machine's cores
#   sanitize     compute-sanitizer memcheck, racecheck, synccheck and initcheck on flash_attention_check
#                --quick and on the engine at a quick shape with every fast path
#   profile      scripts/profile_cuda.sh of cudnn+graph at andrea-12m and gpt2-124m B=8 (ncu) and at
#                gpt2-124m B=32 (CUDA events)
# The phases' budgets plus 20 s for the summary must fit the budget (default 540 s, at most 570 s:
# the device tool stops a command at 600 s), else the script refuses the plan in one line (exit 2).
# A phase gets at most what is left of the budget, less the 20 s, and is skipped under 10 s.
#
# --dry-run (no GPU needed): runs prepare, then each phase of the plan as far as it goes without a
# GPU, in an environment holding only the GPU image's Python packages plus the carried wheels
# (scripts/gpu_image.py): wheels installs them; build checks the carried object's stamp, places it and builds
# the engine with it for the Makefile's architectures (make reuses what is built), and checks that llm.c's Makefile gets past
# its cuDNN check (make -n); the test phases collect their tests (pytest --collect-only); the bench
# phases run scripts/bench_cuda.py with --no-engine --no-torch; profile and goodput check their
# scripts start. Exit 0 only when all of it passed.
#
# Output in DIR (default $OUT where the device tool sets it, else ./gpu-out): session.log (everything
# printed), summary.txt, results.tgz (logs, profiles), bench-124m.json, bench-12m.json, bench-b32.json
# and their merge cuda-<gpu>.json (scripts/cuda_bench_report.py), faults-cuda.json, goodput-gpu.json.
# Exit status: 0 when every phase ran and passed, 1 when one failed, 2 on a bad argument or plan.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
out=${OUT:-$repo/gpu-out}
budget=540
max_budget=570
reserve=20  # seconds kept for the summary
dry=
phases=()
budgets=()
declare -A limit=([prepare]=300 [wheels]=60 [build]=300 [check]=150 [cpu]=300 [sanitize]=240 [test-fast]=300
                  [test-nccl]=120 [test]=420 [test-e2e]=480 [bench-124m]=300 [bench-12m]=120 [bench-b32]=180 [profile-124m]=150
                  [profile]=300 [goodput]=300)
declare -A plan=([lease]="wheels:15 build:130 test-fast:140 bench-124m:170 bench-12m:45 profile-124m:20+"
                 [lease2]="wheels:15 build:100 test-nccl:20 test:90 test-e2e:150 bench-b32:90 goodput:55")
while [[ $# -gt 0 ]]; do
    case $1 in
        --out) [[ $# -ge 2 ]] || { echo "gpu_session: --out needs a value" >&2; exit 2; }; out=$2; shift 2 ;;
        --budget) [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || { echo "gpu_session: --budget needs seconds" >&2; exit 2; }
                  budget=$2; shift 2 ;;
        --dry-run) dry=1; shift ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; exit 0 ;;
        lease|lease2)
            for entry in ${plan[$1]}; do phases+=("${entry%%:*}"); budgets+=("${entry#*:}"); done; shift ;;
        *)
            [[ -n ${limit[$1]:-} ]] || { echo "gpu_session: unknown phase or argument '$1' (see --help)" >&2; exit 2; }
            phases+=("$1"); budgets+=("${limit[$1]}"); shift ;;
    esac
done
[[ ${#phases[@]} -gt 0 ]] || { echo "gpu_session: name a plan or at least one phase (see --help)" >&2; exit 2; }
((budget <= max_budget)) || { echo "gpu_session: --budget $budget is over $max_budget s (the device tool stops a command at 600 s)" >&2; exit 2; }
planned=$reserve
for b in "${budgets[@]}"; do planned=$((planned + ${b%+})); done
if ((planned > budget)); then
    echo "gpu_session: the plan needs $planned s (${phases[*]} and $reserve s for the summary), over the $budget s budget" >&2
    exit 2
fi
for phase in "${phases[@]}"; do
    if [[ -n $dry && $phase =~ ^(prepare|check|sanitize)$ ]]; then
        echo "gpu_session: --dry-run has nothing to do for the $phase phase (prepare runs first by itself; check and sanitize need the GPU throughout)" >&2
        exit 2
    fi
done

start=$(date +%s)
deadline=$((start + budget))
mkdir -p "$out"
state=$(mktemp -d "${TMPDIR:-/tmp}/gpu_session.XXXXXX")
exec > >(tee -a "$out/session.log") 2>&1

# SITE: where the wheels phase installs the carried wheels; every phase has it on PYTHONPATH.
export REPO=$repo OUT_DIR=$out STATE=$state PY=python3 SITE=$state/site DRY=$dry
export PYTHONUNBUFFERED=1 LLMC_DIR=$repo/.gpu-carry/llm.c FRONTEND_DIR=$repo/.gpu-carry/cudnn-frontend/include
[[ " ${phases[*]} " == *" bench-b32 "* ]] && export WITH_LLMC=1
cd "$repo" || exit 2
# ---------------------------------------------------------------------------
# phases (each runs as `bash -c phase_NAME` under timeout, so a hang is killed with its children; $DRY
# is set in a dry run, and each phase does there what needs no GPU)

# The wheels the image lacks: the proxy's packages (with their dependencies) and pytest's time limit.
# Pinned to the versions installed here, where the tests pass with them; downloaded for the image's
# Python and its neighbours (scripts/gpu_image.py: the wheels phase installs the ones that fit).
carried_requirements() {
    "$PY" -c "import importlib.metadata as m
print(' '.join(f'{d}=={m.version(d)}' for d in ('pydantic', 'fastapi', 'uvicorn', 'watchdog')))"
}
# pytest's plugins: its time limit (pyproject's timeout), and xdist (with execnet) for test-e2e.
carried_plugins() {
    "$PY" -c "import importlib.metadata as m
print(' '.join(f'{d}=={m.version(d)}' for d in ('pytest-timeout', 'pytest-xdist', 'execnet')))"
}
pip_download_for() {  # PYTHON_VERSION pip-download-arguments...
    local version=$1
    shift
    "$PY" -m pip download -q --only-binary=:all: --python-version "$version" --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "$@"
}

phase_prepare() {
    local peers=${PEERS_DIR:-../shared/peers} inc
    [[ -d $peers/llm.c ]] || { echo "gpu_session: $peers/llm.c not found (the llm.c peer; PEERS_DIR=...)"; return 1; }
    mkdir -p .gpu-carry
    rm -rf .gpu-carry/llm.c .gpu-carry/cudnn-frontend
    cp -r "$peers/llm.c" .gpu-carry/llm.c
    inc=$("$PY" -c "import importlib.metadata as m; print(m.distribution('nvidia-cudnn-frontend').locate_file('include'))") \
        || { echo "gpu_session: the nvidia-cudnn-frontend wheel is not installed here (scripts/install_test_deps.sh)"; return 1; }
    mkdir -p .gpu-carry/cudnn-frontend
    cp -r "$inc" .gpu-carry/cudnn-frontend/include
    # The cuDNN attention object: build/'s (compiled here when make finds it missing or out of date:
    # about a minute of CPU), carried with its stamp. The same bytes as build/'s, so that placing it
    # there in a dry run changes nothing.
    make build/attention_cudnn.o PYTHON="$PY" CUDNN_FRONTEND_INC="$FRONTEND_DIR" || return 1
    if cmp -s build/attention_cudnn.o .gpu-carry/attention_cudnn.o \
       && "$PY" scripts/cudnn_carry.py check .gpu-carry/attention_cudnn.o .gpu-carry/attention_cudnn.json \
            "$FRONTEND_DIR" > /dev/null; then
        echo "gpu_session: .gpu-carry/attention_cudnn.o is up to date"
    else
        cp build/attention_cudnn.o .gpu-carry/attention_cudnn.o.tmp \
            && mv .gpu-carry/attention_cudnn.o.tmp .gpu-carry/attention_cudnn.o || return 1
        "$PY" scripts/cudnn_carry.py write .gpu-carry/attention_cudnn.o .gpu-carry/attention_cudnn.json || return 1
    fi
    cat .gpu-carry/attention_cudnn.json; echo
    git describe --always --dirty --abbrev=12 > .gpu-carry/commit 2>/dev/null || rm -f .gpu-carry/commit
    # The wheels, downloaded again only when the request changes.
    local request pythons version
    pythons=$("$PY" scripts/gpu_image.py pythons) || return 1
    request="python $pythons: $(carried_requirements) + $(carried_plugins)" || return 1
    if [[ $(cat .whl/REQUEST 2>/dev/null) == "$request" ]]; then
        echo "gpu_session: .whl is up to date ($request)"
    else
        rm -rf .whl && mkdir -p .whl
        for version in $pythons; do
            # shellcheck disable=SC2046
            pip_download_for "$version" $(carried_requirements) || return 1
            # shellcheck disable=SC2046
            pip_download_for "$version" --no-deps $(carried_plugins) || return 1
        done
        echo "$request" > .whl/REQUEST
    fi
    ls .whl
    local bytes
    bytes=$(du -sb .gpu-carry .whl | awk '{ s += $1 } END { print s }')
    echo "gpu_session: carry .gpu-carry and .whl: $((bytes / 1048576)) MiB of the 64 MiB a call carries"
    ((bytes <= 64 * 1048576)) || { echo "gpu_session: the carried set is over 64 MiB"; return 1; }
}

phase_wheels() {
    local wheels
    wheels=$("$PY" scripts/gpu_image.py installable .whl) || return 1
    [[ -n $wheels ]] || { echo "gpu_session: no wheels in .whl (run the prepare phase here first, carry .whl)"; return 1; }
    # shellcheck disable=SC2086
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        $wheels || return 1
    "$PY" -c "import pydantic, fastapi, uvicorn, watchdog, pytest_timeout, xdist, execnet; print('gpu_session: wheels installed:', \
        'pydantic', pydantic.VERSION, 'fastapi', fastapi.__version__)"
}

# The image's cuDNN wheel (nvidia-cudnn-cu13, under python3's site-packages): its directory.
cudnn_wheel_dir() {
    "$PY" -c "import glob, os, nvidia; d = [os.path.dirname(os.path.dirname(h)) for p in nvidia.__path__ \
        for h in glob.glob(os.path.join(p, '*', 'include', 'cudnn.h'))]; print(d[0] if d else '')"
}

# The carried build/attention_cudnn.o into build/, when its stamp matches this machine; else one line
# saying why, and make compiles it here.
place_cudnn_object() {
    local obj=.gpu-carry/attention_cudnn.o why
    [[ -f $obj ]] || { echo "gpu_session: no carried cuDNN object ($obj): make compiles it here"; return 1; }
    why=$("$PY" scripts/cudnn_carry.py check "$obj" .gpu-carry/attention_cudnn.json "$FRONTEND_DIR" 2>&1) \
        || { echo "gpu_session: ${why#cudnn_carry: }: not using it (make compiles build/attention_cudnn.o here)"
             return 1; }
    mkdir -p build
    if ! cmp -s "$obj" build/attention_cudnn.o \
       || ! make -q build/attention_cudnn.o PYTHON="$PY" CUDNN_FRONTEND_INC="$FRONTEND_DIR" 2> /dev/null; then
        cp "$obj" build/attention_cudnn.o.tmp && mv build/attention_cudnn.o.tmp build/attention_cudnn.o
        touch build/attention_cudnn.o  # newer than its sources, whatever mtimes the copy gave them
    fi
    make -q build/attention_cudnn.o PYTHON="$PY" CUDNN_FRONTEND_INC="$FRONTEND_DIR" \
        || { echo "gpu_session: make would still compile build/attention_cudnn.o"; return 1; }
    echo "gpu_session: using the carried cuDNN object"
}

# llm.c's Makefile stops unless ./cudnn-frontend/include or ~/cudnn-frontend/include exists
# (CUDNN_FRONTEND_PATH does not get past that check): the carried headers, linked there.
llmc_make() {
    ln -sfn ../cudnn-frontend "$LLMC_DIR/cudnn-frontend"
    local cudnn
    cudnn=$(cudnn_wheel_dir)
    # llm.c links -lcudnn: the wheel ships libcudnn.so.9 only, so a directory with the plain name.
    mkdir -p "$STATE/cudnn-link"
    ln -sf "$cudnn/lib/libcudnn.so.9" "$STATE/cudnn-link/libcudnn.so"
    ( cd "$LLMC_DIR" && CPATH="$cudnn/include" LIBRARY_PATH="$STATE/cudnn-link" \
        make "$@" train_gpt2cu NO_MULTI_GPU=1 USE_CUDNN=1 )
}

phase_build() {
    # A dry run builds for the Makefile's own architectures (no GPU to ask), so the build/ it shares with
    # `make engines` holds what make would have built there.
    local cc="" arch rc=0
    if [[ -z $DRY ]]; then
        nvidia-smi || true
        cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d '. ')
    fi
    nvcc --version | tail -n 2
    [[ $cc =~ ^[0-9]+$ ]] && arch=("CUDA_ARCH=-gencode=arch=compute_$cc,code=sm_$cc") || arch=()
    if [[ -n ${WITH_LLMC:-} ]]; then
        [[ -f $LLMC_DIR/Makefile ]] || { echo "gpu_session: no .gpu-carry/llm.c (run prepare here, carry .gpu-carry)"; return 1; }
        if [[ -n $DRY ]]; then
            llmc_make -n > "$STATE/results/llmc-build.log" 2>&1 \
                && grep -q -- "-DENABLE_CUDNN" "$STATE/results/llmc-build.log" \
                && echo "gpu_session: llm.c's Makefile gets past its cuDNN check (make -n)" \
                || { echo "gpu_session: llm.c's Makefile stops:"; tail -n 3 "$STATE/results/llmc-build.log"; rc=1; }
            rm -f "$LLMC_DIR/cudnn-frontend"  # the carried tree stays free of links; the lease makes its own
        else
            echo "gpu_session: building llm.c with cuDNN in the background (llmc-build.log in results.tgz)"
            ( llmc_make > "$STATE/results/llmc-build.log" 2>&1; echo $? > "$STATE/llmc.rc" ) &
        fi
    fi
    place_cudnn_object
    make cuda-info PYTHON="$PY" CUDNN_FRONTEND_INC="$FRONTEND_DIR"
    make -j3 engines PYTHON="$PY" "${arch[@]}" CUDNN_FRONTEND_INC="$FRONTEND_DIR" MG_SOURCE="$(source_commit)" || rc=1
    readelf -d build/microgpt_cuda | grep NEEDED
    return $rc
}

phase_check() {
    build/flash_attention_check | tee "$STATE/results/check.jsonl" || return 1
    build/flash_attention_check --time | tee -a "$STATE/results/check.jsonl"
}

# pytest as every phase runs it: entry-point plugins off (those installed here but not on the image
# would load here only), pytest-timeout from the carried wheels; --collect-only in a dry run.
run_pytest() {
    local plugin=()
    "$PY" -c "import pytest_timeout" 2> /dev/null && plugin=(-p pytest_timeout)
    PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 "$PY" -m pytest "${plugin[@]}" -q -rfE -p no:cacheprovider \
        ${DRY:+--collect-only} "$@"
}

phase_cpu() {
    run_pytest tests/cuda_cpu tests/cuda_build tests/qualification
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
    run_pytest tests/gpu/test_fast_paths.py
}

# The NCCL build's one-GPU tests (the others in the file need two GPUs and skip on one), by node id.
nccl_one_gpu() {
    echo tests/gpu/test_nccl.py::test_one_rank_is_the_single_gpu_engine \
        tests/gpu/test_nccl.py::test_one_rank_turns_the_fused_step_off_in_one_line
}

phase_test_nccl() {
    # shellcheck disable=SC2046
    run_pytest $(nccl_one_gpu)
}

phase_test() {  # the rest of tests/gpu: test-fast and test-nccl run theirs
    local t deselect=()
    for t in $(nccl_one_gpu); do deselect+=("--deselect=$t"); done
    run_pytest tests/gpu --ignore=tests/gpu/test_fast_paths.py "${deselect[@]}"
}

phase_test_e2e() {  # the Makefile's GPU_SUITES but tests/gpu (the test and test-fast phases)
    local suites workers=(--numprocesses 4 --dist loadgroup)
    [[ -n $DRY ]] && workers=()
    suites=$(sed -n 's/^GPU_SUITES := //p' Makefile | tr ' ' '\n' | grep -vx "tests/gpu")
    [[ -n $suites ]] || { echo "gpu_session: no GPU_SUITES line in the Makefile"; return 1; }
    # Four workers on the machine's 16 cores, one GPU; the suites that must share one worker say so
    # (tests/conftest.py, as in `make test`). A dry run loads xdist but collects in one process.
    # shellcheck disable=SC2086
    FAULT_RESULTS="$OUT_DIR/faults-cuda.json" MICROGPT_TEST_ENGINE=cuda \
        run_pytest -p xdist "${workers[@]}" $suites
}

phase_profile() {
    local cfg rc=0 dir=$STATE/results/profile
    [[ -n $DRY ]] && { bash -n scripts/profile_cuda.sh && "$PY" scripts/profile_summary.py --help > /dev/null; return; }
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

phase_profile_124m() {
    local dir=$STATE/results/profile
    [[ -n $DRY ]] && { bash -n scripts/profile_cuda.sh && "$PY" scripts/profile_summary.py --help > /dev/null; return; }
    mkdir -p "$dir"
    scripts/profile_cuda.sh --shape gpt2-124m --batch 8 --attention cudnn --step-path graph --tool auto --out "$dir" \
        || return 1
    "$PY" scripts/profile_summary.py table "$dir"/*.json
}

wait_llmc() {  # prints the train_gpt2cu path when llm.c was built, else nothing
    local i
    for ((i = 0; i < 240; i++)); do [[ -f $STATE/llmc.rc ]] && break; sleep 1; done
    if [[ $(cat "$STATE/llmc.rc" 2>/dev/null) == 0 && -x $LLMC_DIR/train_gpt2cu ]]; then
        echo "$LLMC_DIR/train_gpt2cu"
    else
        echo "gpu_session: llm.c is not built (see llmc-build.log); benchmarking without it" >&2
    fi
}

# scripts/bench_cuda.py, results in $OUT_DIR/bench-NAME.json; a dry run measures nothing but runs the
# same command line with neither the engine nor PyTorch. A trainer that could not run (bench_cuda.py
# records it as skipped, with the reason) fails the phase.
# The commit the checkout was at when prepare ran here: the GPU machine's copy of the tree has another git
# state (its `git describe` named a commit days old), so the carried one comes first.
source_commit() {
    cat .gpu-carry/commit 2>/dev/null || git describe --always --dirty --abbrev=12 2>/dev/null
}

bench() {
    local name=$1 commit
    shift
    commit=$(source_commit)
    "$PY" scripts/bench_cuda.py "$@" ${commit:+--commit "$commit"} --json "$OUT_DIR/bench-$name.json" \
        ${DRY:+--no-engine --no-torch} || return 1
    "$PY" - "$OUT_DIR/bench-$name.json" <<'PYEOF'
import sys
from pathlib import Path
sys.path.insert(0, "scripts")
from cuda_bench_report import BenchReport
skipped = [f"{s.label} at {r.shape} B={r.batch}" for r in BenchReport.load(Path(sys.argv[1])).runs
           for s in r.sides if s.skipped]
if skipped:
    sys.exit(f"gpu_session: skipped (the table says why): {'; '.join(skipped)}")
PYEOF
}

phase_bench_124m() {
    bench 124m --shape gpt2-124m --batch 8 --variants naive cudnn+graph cudnn+fused flash+graph \
        --torch-modes default reduce-overhead --steps 15 --warmup 3 --ckpts 2
}

phase_bench_12m() {
    bench 12m --shape andrea-12m --batch 8 --variants cudnn+graph --torch-modes reduce-overhead --steps 20 \
        --warmup 3 --ckpts 2
}

phase_bench_b32() {
    local llmc=
    [[ -z $DRY ]] && llmc=$(wait_llmc)
    LD_LIBRARY_PATH="$(cudnn_wheel_dir)/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
        bench b32 --shape gpt2-124m --batch 32 --variants cudnn+graph --torch-modes default --steps 10 \
        --warmup 3 --ckpts 0 ${llmc:+--llmc "$llmc"}
}

phase_goodput() {
    if [[ -n $DRY ]]; then
        # The module that carries out `proxy run` (proxy/cli.py imports it only then), and the script.
        "$PY" -c "import importlib, proxy.cli; importlib.import_module(proxy.cli.COMMANDS['run'])" \
            && "$PY" scripts/bench_goodput.py run --help > /dev/null
        return
    fi
    local gpu
    gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
    "$PY" scripts/bench_goodput.py run experiments/ANDREA-12M-TRAIN.json --steps 300 --engine cuda \
        --label "ANDREA-12M, $gpu" --json "$OUT_DIR/goodput-gpu.json"
}

export -f carried_requirements carried_plugins pip_download_for phase_prepare phase_wheels cudnn_wheel_dir \
    place_cudnn_object llmc_make phase_build phase_check run_pytest phase_cpu engine_quick_args engine_quick_frames \
    phase_sanitize phase_test_fast nccl_one_gpu phase_test_nccl phase_test phase_test_e2e phase_profile phase_profile_124m wait_llmc source_commit bench \
    phase_bench_124m phase_bench_12m phase_bench_b32 phase_goodput

# ---------------------------------------------------------------------------
# the runner

mkdir -p "$state/results"
results=()
failed=0
run_phase() {  # NAME LIMIT
    local phase=$1 lim=$2 t0 dt rc=0 status
    echo
    echo "== $phase (limit ${lim} s, $(($(date +%s) - start)) s into the session) =="
    t0=$(date +%s)
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
}

echo "== plan$([[ -n $dry ]] && echo " (dry run)"): $(for i in "${!phases[@]}"; do printf '%s %s s, ' "${phases[$i]}" "${budgets[$i]}"; done)summary $reserve s: $planned s of a $budget s budget =="
if [[ -n $dry ]]; then
    # prepare runs here before a lease, outside its budget; then the image's environment.
    timeout -k 10 "${limit[prepare]}" bash -o pipefail -c phase_prepare \
        || { echo "gpu_session: prepare failed: nothing else is checked"; exit 1; }
    allow=$("$PY" scripts/gpu_image.py allow) || exit 1
    export GPU_IMAGE_ALLOW=$allow
    export PYTHONPATH="$repo/scripts/gpu_image_site:$repo:$SITE${PYTHONPATH:+:$PYTHONPATH}"
    echo "gpu_session: dry run in the GPU image's environment: $(tr ',' ' ' <<< "$allow") and the carried wheels"
    start=$(date +%s)
    deadline=$((start + budget))
else
    export PYTHONPATH="$repo:$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
for i in "${!phases[@]}"; do
    phase=${phases[$i]}
    left=$((deadline - $(date +%s) - reserve))
    if ((left < 10)); then
        results+=("$(printf '%-12s %-22s %5s s' "$phase" "skipped (no budget)" 0)")
        failed=1
        continue
    fi
    lim=${budgets[$i]%+}
    [[ ${budgets[$i]} == *+ ]] && lim=$left
    ((lim > left)) && lim=$left
    run_phase "$phase" "$lim"
done

{
    echo
    echo "== summary$([[ -n $dry ]] && echo " (dry run)") ($(($(date +%s) - start)) s of a ${budget} s budget; output in $out) =="
    printf '%s\n' "${results[@]}"
    gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1)
    [[ -n $gpu ]] && echo "$gpu"
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
    # Every bench file of this call merged into cuda-<gpu>.json (docs/bench/'s name for it), rendered.
    benches=("$out"/bench-*.json)
    if [[ -f ${benches[0]} ]]; then
        slug=$(grep -oE '\b[A-Z]{1,2}[0-9]{2,4}[A-Z]?\b' <<< "${gpu%%,*}" | head -n 1 | tr 'A-Z' 'a-z')
        "$PY" scripts/cuda_bench_report.py merge "${benches[@]}" -o "$out/cuda-${slug:-unknown}.json" \
            && "$PY" scripts/cuda_bench_report.py render "$out/cuda-${slug:-unknown}.json" | tail -n +5 \
            || touch "$state/summary-failed"
    fi
} | tee "$out/summary.txt"
[[ -f $state/summary-failed ]] && failed=1
if [[ -n $(ls -A "$state/results") ]]; then
    tar czf "$out/results.tgz" -C "$state" results
fi
rm -rf "$state"
exit $failed

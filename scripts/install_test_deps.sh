#!/usr/bin/env bash
# Installs what the test suite needs on a fresh machine: the package with its
# test extras (CPU torch 2.13.0 from the local index), and Debian's chromium for
# the dashboard's browser tests. Idempotent: fast when everything is present.
set -euo pipefail
PYTHON=${PYTHON:-python3}
"$PYTHON" -m pip install --quiet -e ".[test]"
# The CUDA engine links cuBLASLt. Where nvcc exists but its toolkit has no
# cuBLAS (a compiler-only install, as on CI), the nvidia-cublas wheel brings
# the headers and libcublasLt (about 445 MB to download, 600 MB installed,
# about a minute); microgpt/cuda.mk finds it through $PYTHON.
if command -v nvcc >/dev/null 2>&1; then
    cuda_home=$(nvcc -dryrun -c -x cu /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ _HERE_=\(.*\)\/bin$/\1/p' | head -n 1)
    if [ ! -f "$cuda_home/include/cublasLt.h" ] && ! "$PYTHON" -c "import glob, os, nvidia; assert any(glob.glob(os.path.join(p, '*', 'include', 'cublasLt.h')) for p in nvidia.__path__)" 2>/dev/null; then
        cuda_major=$(nvcc --version | sed -n 's/.*release \([0-9][0-9]*\)\..*/\1/p')
        wheel=nvidia-cublas
        [ "$cuda_major" = "12" ] && wheel=nvidia-cublas-cu12
        echo "install_test_deps: installing $wheel (cuBLASLt for the CUDA engine)"
        "$PYTHON" -m pip install --quiet "$wheel"
    fi
    # The machine-code gates (tests/cuda_cpu/test_sass_gates.py) read the engine with cuobjdump (which runs
    # nvdisasm for the SASS). A compiler-only toolkit has neither; their wheels are a few MB.
    if ! command -v cuobjdump >/dev/null 2>&1 && [ ! -x "$cuda_home/bin/cuobjdump" ] \
        && ! "$PYTHON" -c "import glob, os, nvidia; assert any(glob.glob(os.path.join(p, '*', 'bin', 'cuobjdump')) for p in nvidia.__path__)" 2>/dev/null; then
        cuda_major=$(nvcc --version | sed -n 's/.*release \([0-9][0-9]*\)\..*/\1/p')
        suffix=""
        [ "$cuda_major" = "12" ] && suffix="-cu12"
        echo "install_test_deps: installing nvidia-cuda-cuobjdump$suffix and nvidia-cuda-nvdisasm$suffix (machine-code gates)"
        "$PYTHON" -m pip install --quiet "nvidia-cuda-cuobjdump$suffix" "nvidia-cuda-nvdisasm$suffix"
    fi
    # cuDNN for --attention cudnn (microgpt/cuda.mk builds the engine with it
    # when found, and tests/cuda_build builds it both ways): the library wheel
    # (about 520 MB to download, 940 MB installed, 40 s here) and the
    # header-only cudnn-frontend (12 MB; --no-deps: only its headers are used,
    # not its Python package's CUTLASS dependencies).
    cuda_major=$(nvcc --version | sed -n 's/.*release \([0-9][0-9]*\)\..*/\1/p')
    if [ ! -f "$cuda_home/include/cudnn.h" ] && ! "$PYTHON" -c "import glob, os, nvidia; assert any(glob.glob(os.path.join(p, '*', 'include', 'cudnn.h')) for p in nvidia.__path__)" 2>/dev/null; then
        echo "install_test_deps: installing nvidia-cudnn-cu$cuda_major (cuDNN for the CUDA engine)"
        "$PYTHON" -m pip install --quiet "nvidia-cudnn-cu$cuda_major"
    fi
    # NCCL for the data-parallel CUDA engine (build/microgpt_cuda_mpi, microgpt/cuda.mk): the wheel's
    # include/nccl.h and lib/libnccl.so.2.
    if ! "$PYTHON" -c "import glob, os, nvidia; assert any(glob.glob(os.path.join(p, '*', 'lib', 'libnccl.so.2')) for p in nvidia.__path__)" 2>/dev/null; then
        echo "install_test_deps: installing nvidia-nccl-cu$cuda_major (NCCL for the data-parallel CUDA engine)"
        "$PYTHON" -m pip install --quiet "nvidia-nccl-cu$cuda_major"
    fi
    if ! "$PYTHON" -c "import importlib.metadata as m, os; assert os.path.isfile(m.distribution('nvidia-cudnn-frontend').locate_file('include/cudnn_frontend.h'))" 2>/dev/null; then
        echo "install_test_deps: installing nvidia-cudnn-frontend (its headers, for the CUDA engine)"
        "$PYTHON" -m pip install --quiet --no-deps nvidia-cudnn-frontend
    fi
fi
if ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
        echo "install_test_deps: installing Debian's chromium"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    else
        echo "install_test_deps: chromium missing and not root; browser tests will be skipped" >&2
    fi
fi
# Open MPI: mpirun for the data-parallel suite (tests/distributed), mpicc for build/microgpt_cpu_mpi.
if ! command -v mpirun >/dev/null 2>&1 || ! command -v mpicc >/dev/null 2>&1; then
    if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
        echo "install_test_deps: installing Debian's openmpi-bin and libopenmpi-dev"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openmpi-bin libopenmpi-dev >/dev/null
    else
        echo "install_test_deps: Open MPI missing and not root; the data-parallel tests will be skipped" >&2
    fi
fi

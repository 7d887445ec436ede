# microgpt build. `make` builds the engines and installs the Python package
# into the active environment (a virtual environment where the system's Python
# is externally managed, PEP 668: README.md), then says in one line what it
# built and what it skipped, and why; `make test` installs test dependencies
# and runs the whole suite.
PYTHON ?= python3
CC     ?= gcc
NVCC   ?= $(shell command -v nvcc 2>/dev/null)
MPICC  ?= $(shell command -v mpicc 2>/dev/null)

# CPU_ARCH: the engine is built on the machine that runs it. What -march=native
# picks besides the instruction set (the tuning: the vector width, which a*b+c
# to fuse) differs from one CPU to another; the results must not
# (docs/ENGINE.md, "Determinism"; tests/engine/test_cpu_tuning.py builds with
# other CPUs' tunings through CPU_ARCH).
# No -ffast-math: NaN checks and IEEE rounding must hold.
CPU_ARCH ?= -march=native
CFLAGS  ?= -O3 $(CPU_ARCH)
CFLAGS  += -std=gnu11 -fopenmp -Wall -Wextra -Wno-unused-parameter
LDLIBS  += -lm -lpthread
# The source an engine is built from, for its --version (microgpt/common.h).
MG_SOURCE := $(shell git describe --always --dirty 2>/dev/null || echo unknown)
CFLAGS  += -DMG_SOURCE='"$(MG_SOURCE)"'

BUILD := build

# The headers both engines include (docs/ENGINE.md, "Source layout"): editing
# any of them rebuilds both engines.
ENGINE_HEADERS := microgpt/common.h microgpt/config.h microgpt/model.h microgpt/checkpoint.h microgpt/checkpoint_writer.h \
                  microgpt/signals.h microgpt/protocol.h microgpt/shard.h microgpt/engine.h microgpt/sampler.h \
                  microgpt/train.h microgpt/fp8.h microgpt/comm.h microgpt/comm_mpi.h

.PHONY: all engines cpu cpu-mpi cuda cuda-cpu install lint test test-gpu clean

all: engines install
	@echo "make: $(ENGINES_LINE); installed the proxy into $(shell $(PYTHON) -c 'import sys; print(sys.prefix)')"

ENGINES_LINE = built $(BUILT_ENGINES)$(if $(MPI_SKIP),; skipped the MPI CPU engine ($(MPI_SKIP)))$(if $(CUDA_SKIP),; skipped the CUDA engine ($(CUDA_SKIP)),$(if $(CUDA_MPI_SKIP),; skipped the data-parallel CUDA engine ($(CUDA_MPI_SKIP))))
engines: cpu cuda
	@$(if $(filter engines,$(MAKECMDGOALS)),echo "make: $(ENGINES_LINE)",true)

cpu: $(BUILD)/microgpt_cpu cpu-mpi

$(BUILD)/microgpt_cpu: microgpt/microgpt_cpu.c $(ENGINE_HEADERS) | $(BUILD)
	$(CC) $(CFLAGS) -o $@ microgpt/microgpt_cpu.c $(LDLIBS)

# The same CPU engine with MPI collectives (microgpt/comm_mpi.h), for
# data-parallel runs under mpirun or srun (docs/OPERATIONS.md): built when
# mpicc is found, as the CUDA engine is when nvcc is.
ifneq ($(MPICC),)
cpu-mpi: $(BUILD)/microgpt_cpu_mpi

$(BUILD)/microgpt_cpu_mpi: microgpt/microgpt_cpu.c $(ENGINE_HEADERS) | $(BUILD)
	$(MPICC) $(CFLAGS) -DMG_MPI -o $@ microgpt/microgpt_cpu.c $(LDLIBS)
else
MPI_SKIP := no mpicc on PATH: apt install openmpi-bin libopenmpi-dev; proxy run --ranks needs it
cpu-mpi:
	@$(if $(filter cpu cpu-mpi,$(MAKECMDGOALS)),echo "make: skipped the MPI CPU engine ($(MPI_SKIP))",true)
endif

# CUDA_SKIP: why the CUDA engine is not built (empty when it is); `make` and `make engines` go on with the
# CPU engine and name the reason in their summary line, an explicit `make cuda` fails with it.
ifneq ($(NVCC),)
include microgpt/cuda.mk
else
CUDA_SKIP := no nvcc on PATH; the CPU engine is used
cuda:
	@$(if $(filter cuda,$(MAKECMDGOALS)),echo "make cuda: $(CUDA_SKIP)" >&2; exit 1,true)
endif
comma := ,
BUILT_ENGINES := $(BUILD)/microgpt_cpu$(if $(MPI_SKIP),,$(comma) $(BUILD)/microgpt_cpu_mpi)$(if $(CUDA_SKIP),, and $(BUILD)/microgpt_cuda$(if $(CUDA_MPI_SKIP),,$(comma) $(BUILD)/microgpt_cuda_mpi))

$(BUILD):
	mkdir -p $(BUILD)

# The CUDA kernels' own source compiled for the CPU, with their checks
# (tests/cuda_cpu, docs/CUDA.md "Testing the kernels without a GPU"): the
# hazard and asan builds in build/cuda_cpu/. No nvcc needed; the tests build
# them themselves, this is for running them by hand.
cuda-cpu:
	$(PYTHON) tests/cuda_cpu/build.py

# The system's Python on Debian and Ubuntu is externally managed (PEP 668): pip refuses to install into it,
# with a screenful. Said here in one line, with the command that makes a virtual environment.
NEEDS_VENV := import os, sys, sysconfig; sys.exit(sys.prefix == sys.base_prefix and not \
  os.environ.get('PIP_BREAK_SYSTEM_PACKAGES') and os.path.isfile(os.path.join(sysconfig.get_path('stdlib'), 'EXTERNALLY-MANAGED')))
install:
	@$(PYTHON) -c "$(NEEDS_VENV)" || { echo "make: $(PYTHON) is the system's Python, which pip does not install into (externally managed): make a virtual environment first, python3 -m venv .venv && . .venv/bin/activate (README.md)" >&2; exit 1; }
	$(PYTHON) -m pip install --quiet -e .

# The linter, the formatter's check and the type checker, configured in pyproject.toml ([tool.ruff],
# [tool.mypy]); any finding fails the target. They come with the test extra (pinned there).
LINT_PATHS := proxy dashboard scripts tests
lint:
	$(PYTHON) -m ruff check $(LINT_PATHS)
	$(PYTHON) -m ruff format --check $(LINT_PATHS)
	$(PYTHON) -m mypy

# Dependencies first: on a fresh machine they bring the cuBLAS the CUDA
# engine links against, so a CUDA compile error fails the test run. The tests
# run in TEST_WORKERS processes (pytest-xdist): most of a test's time is spent
# waiting on the engine and the proxy it started, so two workers keep a 2-core
# machine busy; the suites that must share one worker are in tests/conftest.py.
TEST_WORKERS ?= 2
test:
	PYTHON=$(PYTHON) scripts/install_test_deps.sh
	$(MAKE) lint
	$(MAKE) engines
	$(PYTHON) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup

# The GPU tests: tests/gpu (the CUDA engine against the CPU one, and what only it has), then the
# engine suite, the frame gate, end-to-end, pivot and kill-storm suites driving the CUDA engine
# (MICROGPT_TEST_ENGINE=cuda; each run compared with its own uninterrupted reference on the same
# GPU). With no GPU visible it says so in one line and fails: a skip must not read as a pass to
# someone who asked for the GPU tests. Run `make test` first on a fresh machine (it installs the
# test dependencies).
GPU_SUITES := tests/gpu tests/engine tests/harness tests/proxy_e2e tests/proxy_pivot tests/faults/test_kills.py

test-gpu:
	@$(PYTHON) -c "import sys; from proxy.supervision.engine_process import gpu_visible; sys.exit(not gpu_visible())" \
	  || { echo "make test-gpu: no NVIDIA GPU visible (no /dev/nvidia0, and nvidia-smi -L lists none): nothing was run"; exit 1; }
	$(MAKE) engines
	MICROGPT_TEST_ENGINE=cuda $(PYTHON) -m pytest -q $(GPU_SUITES)

clean:
	rm -rf $(BUILD)

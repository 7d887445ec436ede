# microgpt build. `make` builds the engines and installs the Python package
# into the active environment; `make test` installs test dependencies and runs
# the whole suite.
PYTHON ?= python3
CC     ?= gcc
NVCC   ?= $(shell command -v nvcc 2>/dev/null)

# -march=native: the engine is built on the machine that runs it. Bit-exact
# determinism is promised for the same build on the same machine.
# No -ffast-math: NaN checks and IEEE rounding must hold.
CFLAGS  ?= -O3 -march=native
CFLAGS  += -std=gnu11 -fopenmp -Wall -Wextra -Wno-unused-parameter
LDLIBS  += -lm -lpthread

BUILD := build

# The headers both engines include (docs/ENGINE.md, "Source layout"): editing
# any of them rebuilds both engines.
ENGINE_HEADERS := microgpt/common.h microgpt/config.h microgpt/model.h microgpt/checkpoint.h \
                  microgpt/protocol.h microgpt/engine.h microgpt/sampler.h microgpt/train.h

.PHONY: all engines cpu cuda install test clean

all: engines install

engines: cpu cuda

cpu: $(BUILD)/microgpt_cpu

$(BUILD)/microgpt_cpu: microgpt/microgpt_cpu.c $(ENGINE_HEADERS) | $(BUILD)
	$(CC) $(CFLAGS) -o $@ microgpt/microgpt_cpu.c $(LDLIBS)

ifneq ($(NVCC),)
include microgpt/cuda.mk
else
cuda:
	@echo "make: nvcc not found, skipping the CUDA engine (the CPU engine is used)"
endif

$(BUILD):
	mkdir -p $(BUILD)

install:
	$(PYTHON) -m pip install --quiet -e .

# Dependencies first: on a fresh machine they bring the cuBLAS the CUDA
# engine links against, so a CUDA compile error fails the test run.
test:
	PYTHON=$(PYTHON) scripts/install_test_deps.sh
	$(MAKE) engines
	$(PYTHON) -m pytest -q

clean:
	rm -rf $(BUILD)

# Build rules for the CUDA engine, included by the Makefile when nvcc exists.
#
# cuBLASLt comes from the CUDA toolkit when it has it ($(CUDA_HOME)/include/
# cublasLt.h), else from the nvidia-cublas wheel (pip install nvidia-cublas),
# found through $(PYTHON). Override with CUBLAS_INC=... CUBLAS_LIB=... .
# The binary gets an rpath to the library's directory, so it runs without
# LD_LIBRARY_PATH. If cuBLAS is missing, `make` says so loudly and goes on
# with the CPU engine; an explicit `make cuda` fails.

# The toolkit root, as nvcc itself reports it (nvcc may be a wrapper script).
CUDA_HOME ?= $(shell $(NVCC) -dryrun -c -x cu /dev/null -o /dev/null 2>&1 | sed -n 's/^\#\$$ _HERE_=\(.*\)\/bin$$/\1/p' | head -n 1)
CUDA_MAJOR := $(shell $(NVCC) --version 2>/dev/null | sed -n 's/.*release \([0-9][0-9]*\)\..*/\1/p')

# sm_80 (A100) and sm_90 (H100/H200) machine code, plus compute_90 PTX so
# newer GPUs can JIT it.
CUDA_ARCH ?= -gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_90,code=sm_90 \
             -gencode=arch=compute_90,code=compute_90
NVCCFLAGS ?= -O3 -std=c++17 $(CUDA_ARCH) -Xcompiler -Wall,-Wno-unused-function,-Wno-unused-parameter \
             -Wno-deprecated-gpu-targets

# The toolkit's cuBLAS, if it has one.
ifeq ($(CUBLAS_INC),)
ifneq ($(wildcard $(CUDA_HOME)/include/cublasLt.h),)
CUBLAS_INC := $(CUDA_HOME)/include
CUBLAS_LIB := $(firstword $(wildcard $(CUDA_HOME)/lib64/libcublasLt.so $(CUDA_HOME)/targets/*/lib/libcublasLt.so))
CUBLAS_LIB := $(if $(CUBLAS_LIB),$(patsubst %/,%,$(dir $(CUBLAS_LIB))),)
endif
endif

# Else the wheel: a directory under the `nvidia` namespace package holding
# include/cublasLt.h and lib/libcublasLt.so*, preferring the one whose
# library major version matches nvcc's (nvidia/cu13 for CUDA 13,
# nvidia/cublas for the -cu12 wheels). Prints that directory or nothing.
FIND_CUBLAS_WHEEL := import glob, os, sys, nvidia; j = os.path.join; \
  c = sorted((not glob.glob(j(b, 'lib', 'libcublasLt.so.' + sys.argv[1])), b) for r in nvidia.__path__ \
  for b in (os.path.dirname(os.path.dirname(h)) for h in glob.glob(j(r, '*', 'include', 'cublasLt.h'))) \
  if glob.glob(j(b, 'lib', 'libcublasLt.so*'))); print(c[0][1] if c else '')

ifeq ($(CUBLAS_INC),)
CUBLAS_WHEEL := $(shell $(PYTHON) -c "$(FIND_CUBLAS_WHEEL)" "$(CUDA_MAJOR)" 2>/dev/null)
ifneq ($(CUBLAS_WHEEL),)
CUBLAS_INC := $(CUBLAS_WHEEL)/include
CUBLAS_LIB := $(CUBLAS_WHEEL)/lib
endif
endif

# The library file to link: libcublasLt.so, else the versioned name the
# wheel ships (libcublasLt.so.13); the binary records its soname either way.
CUBLAS_SO := $(if $(CUBLAS_LIB),$(firstword $(wildcard $(CUBLAS_LIB)/libcublasLt.so) \
               $(wildcard $(CUBLAS_LIB)/libcublasLt.so.$(CUDA_MAJOR)) $(wildcard $(CUBLAS_LIB)/libcublasLt.so.*)),)

.PHONY: cuda cuda-info

ifneq ($(and $(CUBLAS_INC),$(CUBLAS_SO)),)

cuda: $(BUILD)/microgpt_cuda $(BUILD)/flash_attention_check

# The op headers, one per op (docs/ENGINE.md, "Source layout").
CUDA_OP_HEADERS := $(wildcard microgpt/cuda/*.cuh)

$(BUILD)/microgpt_cuda: microgpt/microgpt_cuda.cu $(CUDA_OP_HEADERS) $(ENGINE_HEADERS) | $(BUILD)
	@echo "make: building the CUDA engine with cuBLASLt from $(CUBLAS_LIB)"
	$(NVCC) $(NVCCFLAGS) -DMG_SOURCE='"$(MG_SOURCE)"' -I$(CUBLAS_INC) -o $@ microgpt/microgpt_cuda.cu -Xlinker $(CUBLAS_SO) \
		-Xlinker -rpath -Xlinker $(CUBLAS_LIB) -lpthread

# The flash attention kernels alone against a float64 reference (tests/gpu/).
$(BUILD)/flash_attention_check: tests/gpu/flash_attention_check.cu $(CUDA_OP_HEADERS) microgpt/common.h | $(BUILD)
	$(NVCC) $(NVCCFLAGS) -o $@ tests/gpu/flash_attention_check.cu

else

# An explicit `make cuda` fails; `make` / `make engines` warn and go on.
cuda:
	@echo "make: *** cuBLAS not found: the CUDA engine (build/microgpt_cuda) is NOT built. ***" >&2
	@echo "make:     nvcc is $(NVCC) (CUDA $(CUDA_MAJOR)), but neither $(CUDA_HOME)/include/cublasLt.h" >&2
	@echo "make:     nor the nvidia-cublas wheel (for $(PYTHON)) was found." >&2
	@echo "make:     Install it with:  $(PYTHON) -m pip install nvidia-cublas   (or set CUBLAS_INC and CUBLAS_LIB)" >&2
	@$(if $(filter cuda $(BUILD)/microgpt_cuda,$(MAKECMDGOALS)),exit 1,true)

endif

cuda-info:
	@echo "NVCC=$(NVCC) CUDA_HOME=$(CUDA_HOME) CUDA_MAJOR=$(CUDA_MAJOR)"
	@echo "CUBLAS_INC=$(CUBLAS_INC)"
	@echo "CUBLAS_LIB=$(CUBLAS_LIB)"
	@echo "CUBLAS_SO=$(CUBLAS_SO)"

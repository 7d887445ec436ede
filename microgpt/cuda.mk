# Build rules for the CUDA engine, included by the Makefile when nvcc exists.
#
# cuBLASLt comes from the CUDA toolkit when it has it ($(CUDA_HOME)/include/
# cublasLt.h), else from the nvidia-cublas wheel (pip install nvidia-cublas),
# found through $(PYTHON). Override with CUBLAS_INC=... CUBLAS_LIB=... .
# The binary gets an rpath to the library's directory, so it runs without
# LD_LIBRARY_PATH. If cuBLAS is missing, `make` says so in its summary line
# (CUDA_SKIP) and goes on with the CPU engine; an explicit `make cuda` fails.
#
# cuDNN (--attention cudnn, cuda/attention_cudnn.cpp) is found the same way:
# cudnn.h and libcudnn.so.9 from the toolkit, else from the nvidia-cudnn-cu13
# wheel; the header-only cudnn-frontend from the nvidia-cudnn-frontend wheel
# (CUDNN_INC=, CUDNN_LIB=, CUDNN_FRONTEND_INC= override). Found, the engine
# is built with it; not found, or with CUDNN=0, without it (one line says
# which). Nothing of either is vendored. The engine does not link libcudnn
# or libnvrtc: it loads them at run time (cuda/cudnn_loader.cpp), through an
# rpath to the directories found here, so it starts where they are missing.

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

# ---------------------------------------------------------------------------
# cuDNN and cudnn-frontend. CUDNN=0 builds without them.
CUDNN ?= 1

# A wheel's directory under the `nvidia` namespace package holding
# include/cudnn.h and lib/libcudnn.so.9; prints it or nothing.
FIND_CUDNN_WHEEL := import glob, os, nvidia; j = os.path.join; \
  c = [b for r in nvidia.__path__ for b in (os.path.dirname(os.path.dirname(h)) \
  for h in glob.glob(j(r, '*', 'include', 'cudnn.h'))) if glob.glob(j(b, 'lib', 'libcudnn.so.9'))]; \
  print(c[0] if c else '')
# The include directory the nvidia-cudnn-frontend wheel installs (cudnn_frontend.h); prints it or nothing.
FIND_CUDNN_FRONTEND := import importlib.metadata as m, os; \
  d = str(m.distribution('nvidia-cudnn-frontend').locate_file('include')); \
  print(d if os.path.isfile(os.path.join(d, 'cudnn_frontend.h')) else '')

ifneq ($(CUDNN),0)
ifeq ($(CUDNN_INC),)
ifneq ($(wildcard $(CUDA_HOME)/include/cudnn.h),)
CUDNN_INC := $(CUDA_HOME)/include
CUDNN_LIB := $(patsubst %/,%,$(dir $(firstword $(wildcard $(CUDA_HOME)/lib64/libcudnn.so.9 \
               $(CUDA_HOME)/targets/*/lib/libcudnn.so.9))))
else
CUDNN_WHEEL := $(shell $(PYTHON) -c "$(FIND_CUDNN_WHEEL)" 2>/dev/null)
CUDNN_INC := $(if $(CUDNN_WHEEL),$(CUDNN_WHEEL)/include,)
CUDNN_LIB := $(if $(CUDNN_WHEEL),$(CUDNN_WHEEL)/lib,)
endif
endif
ifeq ($(CUDNN_FRONTEND_INC),)
CUDNN_FRONTEND_INC := $(shell $(PYTHON) -c "$(FIND_CUDNN_FRONTEND)" 2>/dev/null)
endif
CUDNN_SO := $(if $(CUDNN_LIB),$(firstword $(wildcard $(CUDNN_LIB)/libcudnn.so.9 $(CUDNN_LIB)/libcudnn.so)),)
# The frontend's sm100 RMSNorm+SiLU engine calls NVRTC (the attention graphs
# never do): its header to compile against, and its library (the toolkit's,
# else the one beside the wheel's cuBLAS, a dependency of nvidia-cublas) for
# the rpath it is loaded through, should it ever be called.
NVRTC_INC := $(patsubst %/,%,$(dir $(firstword $(wildcard $(CUDA_HOME)/include/nvrtc.h $(CUBLAS_INC)/nvrtc.h))))
NVRTC_SO := $(firstword $(wildcard $(CUDA_HOME)/lib64/libnvrtc.so $(CUDA_HOME)/lib64/libnvrtc.so.$(CUDA_MAJOR) \
              $(CUBLAS_LIB)/libnvrtc.so.$(CUDA_MAJOR)))
USE_CUDNN := $(if $(and $(CUDNN_INC),$(CUDNN_SO),$(CUDNN_FRONTEND_INC),$(NVRTC_INC),$(NVRTC_SO)),1,)
endif

ifeq ($(USE_CUDNN),1)
CUDNN_OBJ := $(BUILD)/attention_cudnn.o
# The forwarders that object's cuDNN and NVRTC calls resolve to (cuda/cudnn_loader.h).
CUDNN_LOADER_OBJ := $(BUILD)/cudnn_loader.o
CUDNN_FLAGS := -DMICROGPT_CUDNN
# No -l for either library: only the rpaths dlopen searches.
CUDNN_LINK := $(CUDNN_OBJ) $(CUDNN_LOADER_OBJ) -ldl -Xlinker -rpath -Xlinker $(CUDNN_LIB) \
              -Xlinker -rpath -Xlinker $(patsubst %/,%,$(dir $(NVRTC_SO)))
CUDNN_NOTE := with cuDNN from $(CUDNN_LIB), loaded at run time (--attention cudnn)
else
CUDNN_NOTE := without cuDNN ($(if $(filter 0,$(CUDNN)),CUDNN=0,not found: pip install nvidia-cudnn-cu$(CUDA_MAJOR) nvidia-cudnn-frontend); --attention cudnn unavailable)
endif

# ---------------------------------------------------------------------------
# The data-parallel variant, build/microgpt_cuda_mpi (docs/CUDA.md, "The NCCL
# build"): the same engine with MPI collectives (comm_mpi.h, -DMG_MPI) and the
# gradients summed over NCCL (cuda/nccl.cuh, -DMG_NCCL). Built when mpicc
# (Open MPI: its --showme flags) and NCCL are found: NCCL_INC and NCCL_LIB,
# else the nvidia-nccl-cu$(CUDA_MAJOR) wheel (include/nccl.h, lib/libnccl.so.2:
# it has no plain libnccl.so, so the binary links that file and finds it
# through an rpath, as it does cuBLAS). Otherwise skipped (CUDA_MPI_SKIP).
FIND_NCCL_WHEEL := import glob, os, nvidia; j = os.path.join; \
  c = [b for r in nvidia.__path__ for b in (os.path.dirname(os.path.dirname(h)) \
  for h in glob.glob(j(r, '*', 'include', 'nccl.h'))) if os.path.isfile(j(b, 'lib', 'libnccl.so.2'))]; \
  print(c[0] if c else '')
ifeq ($(NCCL_INC),)
NCCL_WHEEL := $(shell $(PYTHON) -c "$(FIND_NCCL_WHEEL)" 2>/dev/null)
NCCL_INC := $(if $(NCCL_WHEEL),$(NCCL_WHEEL)/include,)
NCCL_LIB := $(if $(NCCL_WHEEL),$(NCCL_WHEEL)/lib,)
endif
NCCL_SO := $(if $(NCCL_LIB),$(wildcard $(NCCL_LIB)/libnccl.so.2),)

# mpicc's own flags, in nvcc's words: -I, -D, -L and -l as they are; -Wl,a,b
# to the host linker; anything else to the host compiler.
mg_comma := ,
MPI_COMPILE_RAW := $(if $(MPICC),$(shell $(MPICC) --showme:compile 2>/dev/null),)
MPI_LINK_RAW := $(if $(MPICC),$(shell $(MPICC) --showme:link 2>/dev/null),)
MPI_NVCC_COMPILE := $(foreach f,$(MPI_COMPILE_RAW),$(if $(filter -I% -D%,$(f)),$(f),-Xcompiler $(f)))
MPI_NVCC_LINK := $(foreach f,$(MPI_LINK_RAW),$(if $(filter -L% -l%,$(f)),$(f),$(if $(filter -Wl$(mg_comma)%,$(f)),\
                   -Xlinker $(patsubst -Wl$(mg_comma)%,%,$(f)),-Xcompiler $(f))))

CUDA_MPI_SKIP := $(if $(MPICC),$(if $(MPI_LINK_RAW),$(if $(NCCL_SO),,no NCCL: $(PYTHON) -m pip install \
  nvidia-nccl-cu$(CUDA_MAJOR) (or set NCCL_INC and NCCL_LIB)),$(MPICC) gives no --showme:link flags (Open MPI's \
  mpicc is needed)),no mpicc on PATH: apt install openmpi-bin libopenmpi-dev)

.PHONY: cuda cuda-info

ifneq ($(and $(CUBLAS_INC),$(CUBLAS_SO)),)

cuda: $(BUILD)/microgpt_cuda $(BUILD)/flash_attention_check $(if $(CUDA_MPI_SKIP),cuda-mpi-skipped,$(BUILD)/microgpt_cuda_mpi)

# The op headers, one per op (docs/ENGINE.md, "Source layout").
CUDA_OP_HEADERS := $(wildcard microgpt/cuda/*.cuh)

$(BUILD)/microgpt_cuda: microgpt/microgpt_cuda.cu $(CUDA_OP_HEADERS) $(ENGINE_HEADERS) $(CUDNN_OBJ) $(CUDNN_LOADER_OBJ) | $(BUILD)
	@echo "make: building the CUDA engine with cuBLASLt from $(CUBLAS_LIB), $(CUDNN_NOTE)"
	$(NVCC) $(NVCCFLAGS) $(CUDNN_FLAGS) -DMG_SOURCE='"$(MG_SOURCE)"' -I$(CUBLAS_INC) -o $@ microgpt/microgpt_cuda.cu $(CUDNN_LINK) \
		-Xlinker $(CUBLAS_SO) -Xlinker -rpath -Xlinker $(CUBLAS_LIB) -lpthread

# The data-parallel variant: the same source, compiled once more (the cuDNN
# objects are shared).
$(BUILD)/microgpt_cuda_mpi: microgpt/microgpt_cuda.cu $(CUDA_OP_HEADERS) $(ENGINE_HEADERS) $(CUDNN_OBJ) $(CUDNN_LOADER_OBJ) | $(BUILD)
	@echo "make: building the data-parallel CUDA engine with MPI and NCCL from $(NCCL_LIB)"
	$(NVCC) $(NVCCFLAGS) $(CUDNN_FLAGS) -DMG_MPI -DMG_NCCL -DMG_SOURCE='"$(MG_SOURCE)"' -I$(CUBLAS_INC) -I$(NCCL_INC) \
		$(MPI_NVCC_COMPILE) -o $@ microgpt/microgpt_cuda.cu $(CUDNN_LINK) -Xlinker $(CUBLAS_SO) -Xlinker -rpath \
		-Xlinker $(CUBLAS_LIB) -Xlinker $(NCCL_SO) -Xlinker -rpath -Xlinker $(NCCL_LIB) $(MPI_NVCC_LINK) -lpthread

# `make engines` names the reason in its summary line; an explicit `make cuda` says it here.
.PHONY: cuda-mpi-skipped
cuda-mpi-skipped:
	@$(if $(filter cuda,$(MAKECMDGOALS)),echo "make: skipped the data-parallel CUDA engine ($(CUDA_MPI_SKIP))",true)

# cuDNN's attention graphs: host code only, in a translation unit of its own
# (cudnn-frontend is a large header-only library; about a minute to compile).
$(BUILD)/attention_cudnn.o: microgpt/cuda/attention_cudnn.cpp microgpt/cuda/attention_cudnn.h \
		microgpt/cuda/cudnn_loader.h | $(BUILD)
	$(NVCC) -O2 -std=c++17 -Xcompiler -Wall,-Wno-unused-function -I$(CUDNN_INC) -I$(CUDNN_FRONTEND_INC) \
		-I$(NVRTC_INC) -c -o $@ microgpt/cuda/attention_cudnn.cpp

# The cuDNN and NVRTC functions that object calls, forwarded to the libraries
# loaded at run time (seconds to compile).
$(BUILD)/cudnn_loader.o: microgpt/cuda/cudnn_loader.cpp microgpt/cuda/cudnn_loader.h | $(BUILD)
	$(NVCC) -O2 -std=c++17 -Xcompiler -Wall -I$(CUDNN_INC) -I$(NVRTC_INC) -c -o $@ microgpt/cuda/cudnn_loader.cpp

# The flash attention kernels alone against a float64 reference (tests/gpu/).
$(BUILD)/flash_attention_check: tests/gpu/flash_attention_check.cu $(CUDA_OP_HEADERS) microgpt/common.h | $(BUILD)
	$(NVCC) $(NVCCFLAGS) -o $@ tests/gpu/flash_attention_check.cu

else

# An explicit `make cuda` fails with the reason; `make` / `make engines` name it in their summary and go on.
CUDA_SKIP := nvcc $(NVCC) has no cuBLAS: neither $(CUDA_HOME)/include/cublasLt.h nor the nvidia-cublas wheel \
  for $(PYTHON); $(PYTHON) -m pip install nvidia-cublas, or set CUBLAS_INC and CUBLAS_LIB, to build it
cuda:
	@$(if $(filter cuda $(BUILD)/microgpt_cuda,$(MAKECMDGOALS)),echo "make cuda: $(CUDA_SKIP)" >&2; exit 1,true)

endif

cuda-info:
	@echo "NVCC=$(NVCC) CUDA_HOME=$(CUDA_HOME) CUDA_MAJOR=$(CUDA_MAJOR)"
	@echo "CUBLAS_INC=$(CUBLAS_INC)"
	@echo "CUBLAS_LIB=$(CUBLAS_LIB)"
	@echo "CUBLAS_SO=$(CUBLAS_SO)"
	@echo "CUDNN=$(CUDNN) USE_CUDNN=$(USE_CUDNN)"
	@echo "CUDNN_INC=$(CUDNN_INC)"
	@echo "CUDNN_SO=$(CUDNN_SO)"
	@echo "CUDNN_FRONTEND_INC=$(CUDNN_FRONTEND_INC)"
	@echo "NVRTC_INC=$(NVRTC_INC) NVRTC_SO=$(NVRTC_SO)"
	@echo "NCCL_INC=$(NCCL_INC)"
	@echo "NCCL_SO=$(NCCL_SO)"

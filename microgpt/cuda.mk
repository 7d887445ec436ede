# Build rules for the CUDA engine, included by the Makefile when nvcc exists.
cuda: $(BUILD)/microgpt_cuda

$(BUILD)/microgpt_cuda: microgpt/microgpt_cuda.cu microgpt/microgpt.h | $(BUILD)
	$(NVCC) -O3 -std=c++17 -o $@ microgpt/microgpt_cuda.cu

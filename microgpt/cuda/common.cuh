// cuda/common.cuh: what every op of the CUDA engine shares: checked CUDA
// calls, LAUNCH, the activation types and their conversions, and warp and
// block sums.
//
// The CUDA engine is microgpt_cuda.cu (the model, its buffers, the step)
// plus one header per op here, in the manner of llm.c's llmc/: each holds an
// op's kernels, forward beside backward, and the host functions that launch
// them. An op has the name and the argument order of its CPU twin in
// microgpt_cpu.c; the CUDA one ends with what the device needs (a stream, a
// scratch buffer, the cuBLASLt context) where the CPU one ends with its
// thread count.
#ifndef MICROGPT_CUDA_COMMON_CUH
#define MICROGPT_CUDA_COMMON_CUH

#include "../common.h"

// nvcc compiles these headers for the GPU. The host compiler compiles the
// same source for the CPU execution layer of the tests
// (tests/cuda_cpu/cuda_on_cpu.h, included first), which gives the CUDA
// primitives a CPU meaning (docs/CUDA.md, "Testing the kernels without a GPU").
#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#elif !defined(CUDA_ON_CPU)
#error "microgpt/cuda/: compile with nvcc, or include tests/cuda_cpu/cuda_on_cpu.h first"
#endif
#include <stddef.h>
#include <stdint.h>
#include <string.h>

// ----------------------------------------------------------------------------
// Error checking: any failed CUDA call is fatal, reported through mg_fail
// (one line on stderr, one `error` event) with the file and line.

static void cuda_check(cudaError_t err, const char *file, int line, const char *what) {
    if (err != cudaSuccess)
        mg_fail(MG_EXIT_IO, "CUDA error at %s:%d: %s (%s)", file, line, cudaGetErrorString(err), what);
}
#define CUDA_CHECK(call) cuda_check((call), __FILE__, __LINE__, #call)
// After every kernel launch: catches bad launch configurations at once
// (asynchronous faults surface at the next synchronizing call).
#define LAUNCH_CHECK() cuda_check(cudaGetLastError(), __FILE__, __LINE__, "kernel launch")

// LAUNCH(grid, block, shared_bytes, stream, kernel)(arguments...) is
// kernel<<<grid, block, shared_bytes, stream>>>(arguments...). Every kernel
// is launched through it, so that the same launchers also run on the CPU,
// where <<< >>> does not parse. The kernel comes last because a template's
// arguments carry commas.
#if defined(__CUDACC__)
#define LAUNCH(grid, block, smem, stream, ...) __VA_ARGS__<<<grid, block, smem, stream>>>
#else
#define LAUNCH(grid, block, smem, stream, ...) \
    ::cuda_on_cpu::make_launch(#__VA_ARGS__, (grid), (block), (smem), __VA_ARGS__)
#endif

// The block's dynamic shared memory (the launch's shared_bytes), 16-byte
// aligned.
#if defined(__CUDACC__)
__device__ __forceinline__ unsigned char *dynamic_smem() {
    extern __shared__ __align__(16) unsigned char dynamic_smem_bytes[];
    return dynamic_smem_bytes;
}
#else
__device__ __forceinline__ unsigned char *dynamic_smem() { return ::cuda_on_cpu::dynamic_shared(); }
#endif

// ----------------------------------------------------------------------------
// Element types. Tx is the activation type: float or __nv_bfloat16. All
// arithmetic is fp32; conversions happen at loads and stores.

typedef __nv_bfloat16 bf16;

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(bf16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16 from_f<bf16>(float x) { return __float2bfloat16_rn(x); }

static unsigned ceil_div(size_t a, size_t b) { return (unsigned)((a + b - 1) / b); }

// ----------------------------------------------------------------------------
// Reductions. Butterfly sum over a warp: every lane ends with the same bits
// (each step adds the same two values, commutatively), so the result is
// deterministic.

template <typename T> __device__ __forceinline__ T warp_sum(T v) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

// Sum over a block (blockDim.x a multiple of 32, at most 1024): warp
// butterflies, then every thread adds the warp sums in warp order.
template <typename T> __device__ T block_sum(T v, T *shared /* [32] */) {
    v = warp_sum(v);
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    __syncthreads();  // shared may still be read by a previous call
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    T total = 0;
    for (int w = 0; w < nwarps; w++) total += shared[w];
    return total;
}

#endif  // MICROGPT_CUDA_COMMON_CUH

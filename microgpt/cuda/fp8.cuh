// cuda/fp8.cuh: the FP8 recipe's per-tensor kernels (docs/ENGINE.md, "FP8"):
// the amax of a tensor, the scale exponent from it, and the cast to FP8 codes
// at that scale, with fp8.h's conversion (the CPU engine's). The CPU engine's
// twin is fp8_round_trip in microgpt_cpu.c (amax, scale, cast and decode in
// one); tests/cuda_cpu checks these against fp8.h. Not called by the
// engine: the FP8 GEMMs that would consume the codes are not wired.
#ifndef MICROGPT_CUDA_FP8_CUH
#define MICROGPT_CUDA_FP8_CUH

#include "common.cuh"
#include "../fp8.h"

#define FP8_AMAX_BLOCKS 256
#define FP8_AMAX_THREADS 256

// The largest of the finite |x| (inf and NaN are skipped, as in fp8.h's rule);
// 0 for none. A maximum: the same bits in any order.
__device__ __forceinline__ float fp8_finite_abs(float x) {
    float a = fabsf(x);
    return a <= 3.4028235e38f ? a : 0.0f;
}

__device__ float fp8_block_max(float v, float *shared /* [32] */) {
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    float m = 0.0f;
    for (int w = 0; w < nwarps; w++) m = fmaxf(m, shared[w]);
    return m;
}

// Block b: the amax of one fixed contiguous chunk of x.
__global__ void fp8_amax_partial_kernel(float *partial, const float *x, size_t n) {
    __shared__ float sh[32];
    size_t per = (n + gridDim.x - 1) / gridDim.x, begin = (size_t)blockIdx.x * per;
    size_t end = begin + per < n ? begin + per : n;
    float m = 0.0f;
    for (size_t i = begin + threadIdx.x; i < end; i += blockDim.x) m = fmaxf(m, fp8_finite_abs(x[i]));
    m = fp8_block_max(m, sh);
    if (threadIdx.x == 0) partial[blockIdx.x] = m;
}

// One block: the amax of the partials, and the scale exponent (mg_fp8_scale_exp).
__global__ void fp8_scale_kernel(float *amax, int *scale_exp, const float *partial, int nparts, MgFp8Format fmt) {
    __shared__ float sh[32];
    float m = 0.0f;
    for (int i = threadIdx.x; i < nparts; i += blockDim.x) m = fmaxf(m, partial[i]);
    m = fp8_block_max(m, sh);
    if (threadIdx.x == 0) {
        *amax = m;
        *scale_exp = mg_fp8_scale_exp(m, fmt);
    }
}

// out[i] = the FP8 code of x[i] * 2^scale_exp (read on the device: no host wait).
__global__ void fp8_cast_kernel(uint8_t *out, const float *x, const int *scale_exp, size_t n, MgFp8Format fmt) {
    float scale = mg_fp8_scale(*scale_exp);
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = mg_fp8_encode(x[i] * scale, fmt);
}

// ----------------------------------------------------------------------------
// Host side.

// *amax and *scale_exp (device) of x[n]; partial: FP8_AMAX_BLOCKS floats of scratch.
static void fp8_amax_scale(float *amax, int *scale_exp, const float *x, size_t n, MgFp8Format fmt, float *partial,
                           cudaStream_t stream) {
    LAUNCH(FP8_AMAX_BLOCKS, FP8_AMAX_THREADS, 0, stream, fp8_amax_partial_kernel)(partial, x, n);
    LAUNCH_CHECK();
    LAUNCH(1, 256, 0, stream, fp8_scale_kernel)(amax, scale_exp, partial, FP8_AMAX_BLOCKS, fmt);
    LAUNCH_CHECK();
}

// out[n] = codes of x at the scale fp8_amax_scale left in *scale_exp.
static void fp8_cast(uint8_t *out, const float *x, const int *scale_exp, size_t n, MgFp8Format fmt,
                     cudaStream_t stream) {
    LAUNCH(1024, 256, 0, stream, fp8_cast_kernel)(out, x, scale_exp, n, fmt);
    LAUNCH_CHECK();
}

#endif  // MICROGPT_CUDA_FP8_CUH

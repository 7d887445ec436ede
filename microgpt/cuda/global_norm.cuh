// cuda/global_norm.cuh: the L2 norm of all gradients (for clipping), in a
// fixed order: same inputs, same bits. No backward: the norm is not
// differentiated.
#ifndef MICROGPT_CUDA_GLOBAL_NORM_CUH
#define MICROGPT_CUDA_GLOBAL_NORM_CUH

#include "common.cuh"

#define NORM_BLOCKS 1024
#define NORM_THREADS 256

// Block b sums the squares of one fixed contiguous chunk (in double).
__global__ void sumsq_partial_kernel(double *partial, const float *g, size_t n) {
    __shared__ double sh[32];
    size_t per = (n + gridDim.x - 1) / gridDim.x, begin = (size_t)blockIdx.x * per;
    size_t end = begin + per < n ? begin + per : n;
    double acc = 0.0;
    for (size_t i = begin + threadIdx.x; i < end; i += blockDim.x) acc += (double)g[i] * (double)g[i];
    double total = block_sum(acc, sh);
    if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

// One block adds the partials in a fixed tree.
__global__ void sumsq_final_kernel(double *out, const double *partial, int nparts) {
    __shared__ double sh[32];
    double acc = 0.0;
    for (int i = threadIdx.x; i < nparts; i += blockDim.x) acc += partial[i];
    double total = block_sum(acc, sh);
    if (threadIdx.x == 0) out[0] = sqrt(total);
}

// ----------------------------------------------------------------------------
// Host side.

// *out (device) = sqrt(sum of g[i]^2); partial: NORM_BLOCKS doubles of scratch.
static void global_norm(double *out, const float *g, size_t n, double *partial, cudaStream_t stream) {
    LAUNCH(NORM_BLOCKS, NORM_THREADS, 0, stream, sumsq_partial_kernel)(partial, g, n);
    LAUNCH_CHECK();
    LAUNCH(1, 1024, 0, stream, sumsq_final_kernel)(out, partial, NORM_BLOCKS);
    LAUNCH_CHECK();
}

#endif  // MICROGPT_CUDA_GLOBAL_NORM_CUH

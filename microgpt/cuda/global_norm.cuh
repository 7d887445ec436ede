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

// The fused step's last kernel of the norm (--fused): the same sum and square
// root as sumsq_final_kernel (the same bits), and then, on the device, what
// the driver computes from the norm on the host (train.h, mg_clip_factor): the
// clip factor, grad_clip / (norm + 1e-6) above the threshold, else 1, and
// whether the update must be skipped (a norm that is not finite), for the
// AdamW kernel to read. No host wait between the backward and the update.
__global__ void sumsq_final_clip_kernel(double *out, float *mult, int *skip, const double *partial, int nparts,
                                        float grad_clip) {
    __shared__ double sh[32];
    double acc = 0.0;
    for (int i = threadIdx.x; i < nparts; i += blockDim.x) acc += partial[i];
    double total = block_sum(acc, sh);
    if (threadIdx.x == 0) {
        double norm = sqrt(total);
        out[0] = norm;
        *mult = grad_clip > 0 && norm > grad_clip ? (float)(grad_clip / (norm + 1e-6)) : 1.0f;
        *skip = !(norm <= 1.0e308);  // NaN or infinite
    }
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

// As global_norm, then *mult (device) = the clip factor and *skip (device) =
// 1 when the norm is not finite.
static void global_norm_clip(double *out, float *mult, int *skip, const float *g, size_t n, float grad_clip,
                             double *partial, cudaStream_t stream) {
    LAUNCH(NORM_BLOCKS, NORM_THREADS, 0, stream, sumsq_partial_kernel)(partial, g, n);
    LAUNCH_CHECK();
    LAUNCH(1, 1024, 0, stream, sumsq_final_clip_kernel)(out, mult, skip, partial, NORM_BLOCKS, grad_clip);
    LAUNCH_CHECK();
}

#endif  // MICROGPT_CUDA_GLOBAL_NORM_CUH

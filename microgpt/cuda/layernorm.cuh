// cuda/layernorm.cuh: LayerNorm (eps MG_LN_EPS) over the channels of each
// row, forward and backward. One warp per row; mean and 1/std saved (fp32)
// for the backward; two-pass variance, as the CPU engine computes it. The
// residual add that precedes each LayerNorm is fused into the previous
// matmul instead (cuBLASLt's beta = 1 with C = the residual), which saves a
// whole pass.
#ifndef MICROGPT_CUDA_LAYERNORM_CUH
#define MICROGPT_CUDA_LAYERNORM_CUH

#include "../model.h"
#include "colsum.cuh"
#include "common.cuh"

#define LN_THREADS 256

template <typename Tx>
__global__ void layernorm_forward_kernel(Tx *out, float *mean, float *rstd, const Tx *x, const float *w, const float *b,
                                         int R, int C) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= R) return;  // whole warps leave together
    const Tx *xr = x + (size_t)row * C;
    float sum = 0.0f;
    for (int c = lane; c < C; c += 32) sum += to_f(xr[c]);
    float mu = warp_sum(sum) / C;
    float var = 0.0f;
    for (int c = lane; c < C; c += 32) { float d = to_f(xr[c]) - mu; var += d * d; }
    var = warp_sum(var);
    float rs = 1.0f / sqrtf(var / C + MG_LN_EPS);
    Tx *orow = out + (size_t)row * C;
    for (int c = lane; c < C; c += 32) orow[c] = from_f<Tx>((to_f(xr[c]) - mu) * rs * w[c] + b[c]);
    if (lane == 0) { mean[row] = mu; rstd[row] = rs; }
}

// dx (= or +=) the LayerNorm input gradient, one warp per row. The weight and
// bias gradients are column sums over rows: colsum.cuh, not atomics.
template <typename Tx>
__global__ void layernorm_backward_kernel(Tx *dx, const Tx *dout, const Tx *x, const float *w, const float *mean,
                                          const float *rstd, int R, int C, int accumulate) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= R) return;
    const Tx *xr = x + (size_t)row * C, *gr = dout + (size_t)row * C;
    float mu = mean[row], rs = rstd[row], dmean = 0.0f, dnorm_mean = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float norm = (to_f(xr[c]) - mu) * rs, dnorm = to_f(gr[c]) * w[c];
        dmean += dnorm;
        dnorm_mean += dnorm * norm;
    }
    dmean = warp_sum(dmean) / C;
    dnorm_mean = warp_sum(dnorm_mean) / C;
    Tx *dr = dx + (size_t)row * C;
    for (int c = lane; c < C; c += 32) {
        float norm = (to_f(xr[c]) - mu) * rs, dnorm = to_f(gr[c]) * w[c];
        float prev = accumulate ? to_f(dr[c]) : 0.0f;
        dr[c] = from_f<Tx>(prev + rs * (dnorm - dmean - norm * dnorm_mean));
    }
}

// ----------------------------------------------------------------------------
// Host side.

template <typename Tx>
static void layernorm_forward(Tx *out, float *mean, float *rstd, const Tx *x, const float *w, const float *b, int R,
                              int C, cudaStream_t stream) {
    LAUNCH(ceil_div(R, LN_THREADS / 32), LN_THREADS, 0, stream, layernorm_forward_kernel<Tx>)(out, mean, rstd, x, w, b,
                                                                                             R, C);
    LAUNCH_CHECK();
}

// dx (+)= LN backward; dw += sum(dout * norm); db += sum(dout). partial:
// colsum_scratch_floats(R, C) floats.
template <typename Tx>
static void layernorm_backward(Tx *dx, float *dw, float *db, const Tx *dout, const Tx *x, const float *w,
                               const float *mean, const float *rstd, int R, int C, int accumulate, float *partial,
                               cudaStream_t stream) {
    LAUNCH(ceil_div(R, LN_THREADS / 32), LN_THREADS, 0, stream, layernorm_backward_kernel<Tx>)(dx, dout, x, w, mean,
                                                                                              rstd, R, C, accumulate);
    LAUNCH_CHECK();
    colsum<Tx, 1>(dw, db, dout, x, mean, rstd, R, C, partial, stream);
}

#endif  // MICROGPT_CUDA_LAYERNORM_CUH

// cuda/colsum.cuh: column sums over rows, deterministically: the bias
// gradients (sum of dout) and the LayerNorm weight and bias gradients (sum of
// dout * norm, sum of dout). No forward twin: these are the backward of a
// broadcast over rows.
//
// Pass 1: block (x: 32 columns, y: one chunk of CS_ROWS rows) sums its rows
// in a fixed order into partial[chunk]; pass 2: one thread per column adds
// the chunks in order into the fp32 gradient. (cuBLASLt's BGRADB epilogue
// would overwrite the bias gradient rather than add to it, which breaks
// gradient accumulation over micro-batches; this costs one extra read of
// dout.)
#ifndef MICROGPT_CUDA_COLSUM_CUH
#define MICROGPT_CUDA_COLSUM_CUH

#include "common.cuh"
#include "vec.cuh"

#define CS_ROWS 256

// Floats of scratch the column sums of R rows of W columns need.
static size_t colsum_scratch_floats(size_t R, size_t W) { return (size_t)ceil_div(R, CS_ROWS) * W * 2; }

template <typename Tx, int LN>
__global__ void colsum_partial_kernel(float *partial, const Tx *g, const Tx *x, const float *mean, const float *rstd,
                                      int R, int W) {
    __shared__ float s1[8][33], s2[8][33];
    int tx = threadIdx.x, ty = threadIdx.y, c = blockIdx.x * 32 + tx, chunk = blockIdx.y;
    int r0 = chunk * CS_ROWS, r1 = min(R, r0 + CS_ROWS);
    float a = 0.0f, bsum = 0.0f;
    if (c < W)
        for (int r = r0 + ty; r < r1; r += 8) {
            float gv = to_f(g[(size_t)r * W + c]);
            if (LN) {
                float norm = (to_f(x[(size_t)r * W + c]) - mean[r]) * rstd[r];
                a += gv * norm;
                bsum += gv;
            } else {
                a += gv;
            }
        }
    s1[ty][tx] = a;
    s2[ty][tx] = bsum;
    __syncthreads();
    if (ty == 0 && c < W) {
        float t1 = 0.0f, t2 = 0.0f;
        for (int k = 0; k < 8; k++) { t1 += s1[k][tx]; t2 += s2[k][tx]; }
        partial[((size_t)chunk * W + c) * 2] = t1;
        partial[((size_t)chunk * W + c) * 2 + 1] = t2;
    }
}

__global__ void colsum_finalize_kernel(float *d1, float *d2, const float *partial, int chunks, int W) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= W) return;
    float t1 = 0.0f, t2 = 0.0f;
    for (int k = 0; k < chunks; k++) {
        t1 += partial[((size_t)k * W + c) * 2];
        t2 += partial[((size_t)k * W + c) * 2 + 1];
    }
    d1[c] += t1;
    if (d2) d2[c] += t2;
}

// The same column sum of g alone (a bias gradient) with 16-byte loads, for
// the fused step (--fused): a thread owns N = VecWidth<Tx>::N adjacent
// columns instead of one, so a warp reads 512 contiguous bytes of a row where
// colsum_partial_kernel's reads 64 (bf16). Each column is summed over the
// same rows in the same order as there (rows ty, ty + 8, ... of the chunk,
// then the 8 row phases in order), so the result is the same bits; the
// partials have colsum_partial_kernel's layout (first of each pair).
template <typename Tx>
__global__ void colsum_vec_partial_kernel(float *partial, const Tx *g, int R, int W) {
    const int N = VecWidth<Tx>::N;
    __shared__ float s[8][32 * N];
    int tx = threadIdx.x, ty = threadIdx.y, c0 = (blockIdx.x * 32 + tx) * N, chunk = blockIdx.y;
    int r0 = chunk * CS_ROWS, r1 = min(R, r0 + CS_ROWS);
    float acc[N];
#pragma unroll
    for (int j = 0; j < N; j++) acc[j] = 0.0f;
    if (c0 < W)
        for (int r = r0 + ty; r < r1; r += 8) {
            float v[N];
            load16(v, g + (size_t)r * W + c0);
#pragma unroll
            for (int j = 0; j < N; j++) acc[j] += v[j];
        }
#pragma unroll
    for (int j = 0; j < N; j++) s[ty][tx * N + j] = acc[j];
    __syncthreads();
    if (ty == 0 && c0 < W)
#pragma unroll
        for (int j = 0; j < N; j++) {
            float t = 0.0f;
            for (int k = 0; k < 8; k++) t += s[k][tx * N + j];
            partial[((size_t)chunk * W + c0 + j) * 2] = t;
        }
}

// d1[W] += sum over rows of g (LN: of g * norm), d2[W] (LN only) += sum of g.
// partial: colsum_scratch_floats(R, W) floats.
template <typename Tx, int LN>
static void colsum(float *d1, float *d2, const Tx *g, const Tx *x, const float *mean, const float *rstd, int R, int W,
                   float *partial, cudaStream_t stream) {
    dim3 grid(ceil_div(W, 32), ceil_div(R, CS_ROWS));
    LAUNCH(grid, dim3(32, 8), 0, stream, colsum_partial_kernel<Tx, LN>)(partial, g, x, mean, rstd, R, W);
    LAUNCH_CHECK();
    LAUNCH(ceil_div(W, 256), 256, 0, stream, colsum_finalize_kernel)(d1, d2, partial, (int)grid.y, W);
    LAUNCH_CHECK();
}

// d1[W] += sum over rows of g[R, W], with colsum_vec_partial_kernel: W a
// multiple of VecWidth<Tx>::N and g 16-byte aligned (colsum_vec_applies).
// partial: colsum_scratch_floats(R, W) floats.
template <typename Tx> static int colsum_vec_applies(const Tx *g, int W) {
    return W % VecWidth<Tx>::N == 0 && aligned16(g);
}

template <typename Tx>
static void colsum_vec(float *d1, const Tx *g, int R, int W, float *partial, cudaStream_t stream) {
    dim3 grid(ceil_div(W, 32 * VecWidth<Tx>::N), ceil_div(R, CS_ROWS));
    LAUNCH(grid, dim3(32, 8), 0, stream, colsum_vec_partial_kernel<Tx>)(partial, g, R, W);
    LAUNCH_CHECK();
    LAUNCH(ceil_div(W, 256), 256, 0, stream, colsum_finalize_kernel)(d1, nullptr, partial, (int)grid.y, W);
    LAUNCH_CHECK();
}

#endif  // MICROGPT_CUDA_COLSUM_CUH

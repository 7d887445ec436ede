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
#include "vec.cuh"

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

// The fused backward (--fused): one pass over the rows does what the kernel
// above and two column-sum kernels (colsum.cuh) do, reading dout and x once
// instead of twice, with 16-byte loads. A block owns LNB_ROWS consecutive
// rows (a warp LNB_ROWS / 8 of them, in order); a lane owns the 16-byte
// chunks lane, lane + 32, ... of a row (NCH of them, the row's columns in
// registers) and accumulates, over its warp's rows, the column sums of
// dout * norm (dw), dout (db) and, with want_next, of the dx it writes (the
// bias gradient of the matmul whose output gradient dx is: the residual
// gradient feeds the next matmul backward, so its bias gradient is folded in
// here instead of a pass of its own). The block adds its warps' sums in warp
// order into partial[block][3][C]; layernorm_backward_finalize_kernel adds
// the blocks in block order. Fixed orders throughout: same bits every run.
#define LNB_THREADS 256
#define LNB_ROWS 64

template <typename Tx, int NCH>
__global__ void __launch_bounds__(LNB_THREADS)
layernorm_backward_fused_kernel(Tx *dx, float *partial, const Tx *dout, const Tx *x, const float *w, const float *mean,
                                const float *rstd, int R, int C, int accumulate, int want_next) {
    const int N = VecWidth<Tx>::N, WARPS = LNB_THREADS / 32, PER_WARP = LNB_ROWS / WARPS;
    float *red = reinterpret_cast<float *>(dynamic_smem());  // [WARPS][C]
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    float wv[NCH][N], sdw[NCH][N], sdb[NCH][N], sdn[NCH][N];
#pragma unroll
    for (int k = 0; k < NCH; k++) {
        int c0 = (lane + 32 * k) * N;
#pragma unroll
        for (int j = 0; j < N; j++) {
            wv[k][j] = c0 < C ? w[c0 + j] : 0.0f;
            sdw[k][j] = sdb[k][j] = sdn[k][j] = 0.0f;
        }
    }
    int r0 = blockIdx.x * LNB_ROWS + warp * PER_WARP;
    for (int i = 0; i < PER_WARP; i++) {
        int r = r0 + i;
        if (r >= R) break;  // the whole warp leaves together
        const Tx *xr = x + (size_t)r * C, *gr = dout + (size_t)r * C;
        float mu = mean[r], rs = rstd[r];
        float norm[NCH][N], dnorm[NCH][N], dmean = 0.0f, dnorm_mean = 0.0f;
#pragma unroll
        for (int k = 0; k < NCH; k++) {
            int c0 = (lane + 32 * k) * N;
            float xv[N], gv[N];
            if (c0 < C) {
                load16(xv, xr + c0);
                load16(gv, gr + c0);
            } else {
#pragma unroll
                for (int j = 0; j < N; j++) xv[j] = gv[j] = 0.0f;
            }
#pragma unroll
            for (int j = 0; j < N; j++) {
                norm[k][j] = c0 < C ? (xv[j] - mu) * rs : 0.0f;
                dnorm[k][j] = gv[j] * wv[k][j];
                dmean += dnorm[k][j];
                dnorm_mean += dnorm[k][j] * norm[k][j];
                sdw[k][j] += gv[j] * norm[k][j];
                sdb[k][j] += gv[j];
            }
        }
        dmean = warp_sum(dmean) / C;
        dnorm_mean = warp_sum(dnorm_mean) / C;
        Tx *dr = dx + (size_t)r * C;
#pragma unroll
        for (int k = 0; k < NCH; k++) {
            int c0 = (lane + 32 * k) * N;
            if (c0 >= C) continue;
            float prev[N], out[N];
            if (accumulate) load16(prev, dr + c0);
#pragma unroll
            for (int j = 0; j < N; j++)
                out[j] = (accumulate ? prev[j] : 0.0f) + rs * (dnorm[k][j] - dmean - norm[k][j] * dnorm_mean);
            store16(dr + c0, out);
            if (want_next)
#pragma unroll
                for (int j = 0; j < N; j++) sdn[k][j] += to_f(from_f<Tx>(out[j]));  // what was stored
        }
    }
    // The warps' column sums, added in warp order: dw, db, then (want_next) the next bias.
    for (int q = 0; q < 3; q++) {
        if (q == 2 && !want_next) break;
        __syncthreads();  // red may still be read by the previous round
#pragma unroll
        for (int k = 0; k < NCH; k++) {
            int c0 = (lane + 32 * k) * N;
            if (c0 >= C) continue;
#pragma unroll
            for (int j = 0; j < N; j++) red[warp * C + c0 + j] = q == 0 ? sdw[k][j] : q == 1 ? sdb[k][j] : sdn[k][j];
        }
        __syncthreads();
        for (int c = threadIdx.x; c < C; c += LNB_THREADS) {
            float t = 0.0f;
            for (int v = 0; v < WARPS; v++) t += red[v * C + c];
            partial[((size_t)blockIdx.x * 3 + q) * C + c] = t;
        }
    }
}

// dw += the blocks' dw sums, db += their db sums, dnext (when not NULL) +=
// their next-bias sums: one thread per (sum, column), blocks in order.
__global__ void layernorm_backward_finalize_kernel(float *dw, float *db, float *dnext, const float *partial, int blocks,
                                                   int C) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x, q = idx / C, c = idx % C;
    if (q >= 3) return;
    float *out = q == 0 ? dw : q == 1 ? db : dnext;
    if (!out) return;
    float t = 0.0f;
    for (int b = 0; b < blocks; b++) t += partial[((size_t)b * 3 + q) * C + c];
    out[c] += t;
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

// The fused backward's chunks per lane: the row's 16-byte chunks over 32
// lanes; 0 where it does not apply (a row that is not whole 16-byte chunks,
// or wider than 4 chunks per lane: 1024 bf16 or 512 fp32 columns).
template <typename Tx> static int layernorm_backward_fused_chunks(int C) {
    const int N = VecWidth<Tx>::N;
    if (C % N) return 0;
    int nch = (int)ceil_div(C / N, 32);
    return nch <= 4 ? nch : 0;
}

// Floats of scratch layernorm_backward_fused needs for R rows of C.
static size_t layernorm_backward_fused_scratch_floats(size_t R, size_t C) {
    return (size_t)ceil_div(R, LNB_ROWS) * 3 * C;
}

// Its dynamic shared memory; more than the default 48 KB needs the kernel's
// attribute raised first (layernorm_backward_fused_setup).
static size_t layernorm_backward_fused_smem(int C) { return (size_t)(LNB_THREADS / 32) * C * sizeof(float); }

template <typename Tx> static cudaError_t layernorm_backward_fused_setup(int C) {
    int smem = (int)layernorm_backward_fused_smem(C);
    switch (layernorm_backward_fused_chunks<Tx>(C)) {
    case 1: return cudaFuncSetAttribute(layernorm_backward_fused_kernel<Tx, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    case 2: return cudaFuncSetAttribute(layernorm_backward_fused_kernel<Tx, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    case 3: return cudaFuncSetAttribute(layernorm_backward_fused_kernel<Tx, 3>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    case 4: return cudaFuncSetAttribute(layernorm_backward_fused_kernel<Tx, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    default: return cudaErrorInvalidValue;
    }
}

// As layernorm_backward, in one pass over the rows (plus a small pass over
// the per-block sums), and with dnext (when not NULL) += the column sums of
// the dx written: the bias gradient of the matmul that dx is the output
// gradient of. Needs layernorm_backward_fused_chunks<Tx>(C) > 0, 16-byte
// aligned rows, and partial: layernorm_backward_fused_scratch_floats(R, C).
template <typename Tx>
static void layernorm_backward_fused(Tx *dx, float *dw, float *db, float *dnext, const Tx *dout, const Tx *x,
                                     const float *w, const float *mean, const float *rstd, int R, int C, int accumulate,
                                     float *partial, cudaStream_t stream) {
    unsigned blocks = ceil_div(R, LNB_ROWS);
    size_t smem = layernorm_backward_fused_smem(C);
    int next = dnext != NULL;
    switch (layernorm_backward_fused_chunks<Tx>(C)) {
    case 1: LAUNCH(blocks, LNB_THREADS, smem, stream, layernorm_backward_fused_kernel<Tx, 1>)(dx, partial, dout, x, w, mean, rstd, R, C, accumulate, next); break;
    case 2: LAUNCH(blocks, LNB_THREADS, smem, stream, layernorm_backward_fused_kernel<Tx, 2>)(dx, partial, dout, x, w, mean, rstd, R, C, accumulate, next); break;
    case 3: LAUNCH(blocks, LNB_THREADS, smem, stream, layernorm_backward_fused_kernel<Tx, 3>)(dx, partial, dout, x, w, mean, rstd, R, C, accumulate, next); break;
    case 4: LAUNCH(blocks, LNB_THREADS, smem, stream, layernorm_backward_fused_kernel<Tx, 4>)(dx, partial, dout, x, w, mean, rstd, R, C, accumulate, next); break;
    default: mg_fail(MG_EXIT_IO, "internal: the fused LayerNorm backward does not apply at width %d", C);
    }
    LAUNCH_CHECK();
    LAUNCH(ceil_div(3 * (size_t)C, 256), 256, 0, stream, layernorm_backward_finalize_kernel)(dw, db, dnext, partial,
                                                                                            (int)blocks, C);
    LAUNCH_CHECK();
}

#endif  // MICROGPT_CUDA_LAYERNORM_CUH

// microgpt_cuda.cu: the GPU engine (CUDA + cuBLASLt).
//
// The model of docs/ARCHITECTURE.md on one NVIDIA GPU, in the manner of llm.c's
// train_gpt2.cu: one readable file, each forward kernel next to its backward
// twin, every CUDA and cuBLASLt call checked. This file only computes,
// exactly as microgpt_cpu.c does, and is tested against it (tests/gpu/): it
// fills in the engine table (engine.h); the driver (flags, frames, events,
// checkpoints, signals, the training loop) is shared, in train.h and the
// headers it includes.
//
// Precision (--precision):
//   fp32  every activation, matmul (CUBLAS_COMPUTE_32F: true fp32, never TF32)
//         and reduction in fp32. The reference mode the tests compare with the
//         CPU engine. Matmuls run unfused (bias, residual and GELU are our own
//         kernels, with the CPU engine's formulas).
//   bf16  (default on sm_80+) activations and matmul operands in bf16 with
//         fp32 accumulation; fp32 master weights, gradients, Adam moments,
//         LayerNorm statistics, softmax and loss arithmetic; checkpoints fp32.
//         Matmuls use cuBLASLt epilogues: BIAS (+ residual through beta=1),
//         GELU_AUX_BIAS forward (pre-activation saved as aux) and DGELU
//         backward. Any epilogue cuBLASLt refuses falls back, once and for
//         good, to the unfused kernels (MICROGPT_CUDA_FUSE=0 forces that).
//
// Determinism: the same checkpoint and frames give bit-identical results on
// the same GPU and build. No kernel uses atomics; every reduction has one
// fixed order (fixed block/thread-to-element maps, fixed trees, partial sums
// by fixed chunks then summed in chunk order). cuBLASLt algorithms are picked
// once per GEMM shape by the heuristic with a fixed workspace, and reused.
//
// Memory: everything is allocated in init (gpu_init); the step loop allocates
// nothing. init also runs one warm-up forward+backward so that every cuBLASLt
// plan exists and every fused/unfused decision is taken before `ready`.
#include "engine.h"
#include "model.h"
#include "train.h"

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>
#include <float.h>
#include <limits.h>
#include <type_traits>

#include "cuda_flash_attention.cuh"  // --attention flash: bf16 tensor-core kernels

// ----------------------------------------------------------------------------
// Error checking: any failed CUDA or cuBLASLt call is fatal, reported through
// mg_fail (one line on stderr, one `error` event) with the file and line.

static void cuda_check(cudaError_t err, const char *file, int line, const char *what) {
    if (err != cudaSuccess)
        mg_fail(MG_EXIT_IO, "CUDA error at %s:%d: %s (%s)", file, line, cudaGetErrorString(err), what);
}
#define CUDA_CHECK(call) cuda_check((call), __FILE__, __LINE__, #call)
// After every kernel launch: catches bad launch configurations at once
// (asynchronous faults surface at the next synchronizing call).
#define LAUNCH_CHECK() cuda_check(cudaGetLastError(), __FILE__, __LINE__, "kernel launch")

static void cublas_check(cublasStatus_t st, const char *file, int line, const char *what) {
    if (st != CUBLAS_STATUS_SUCCESS)
        mg_fail(MG_EXIT_IO, "cuBLASLt error at %s:%d: %s (%s)", file, line, cublasLtGetStatusString(st), what);
}
#define CUBLAS_CHECK(call) cublas_check((call), __FILE__, __LINE__, #call)

// ----------------------------------------------------------------------------
// Element types. Tx is the activation type: float or __nv_bfloat16. All
// arithmetic is fp32; conversions happen at loads and stores.

typedef __nv_bfloat16 bf16;

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(bf16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16 from_f<bf16>(float x) { return __float2bfloat16_rn(x); }

template <typename T> struct CudaType;
template <> struct CudaType<float> { static const cudaDataType_t value = CUDA_R_32F; };
template <> struct CudaType<bf16> { static const cudaDataType_t value = CUDA_R_16BF; };

static unsigned ceil_div(size_t a, size_t b) { return (unsigned)((a + b - 1) / b); }

// Butterfly sum over a warp: every lane ends with the same bits (each step
// adds the same two values, commutatively), so the result is deterministic.
template <typename T> __device__ __forceinline__ T warp_sum(T v) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
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

// ----------------------------------------------------------------------------
// Embedding: x0[b,t] = wte[token] + wpe[t], from the fp32 master weights.

template <typename Tx>
__global__ void embed_forward_kernel(Tx *x0, const int *inputs, const float *wte, const float *wpe, int BT, int T, int C) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)BT * C) return;
    int i = (int)(idx / C), c = (int)(idx % C);
    x0[idx] = from_f<Tx>(wte[(size_t)inputs[i] * C + c] + wpe[(size_t)(i % T) * C + c]);
}

// Backward of the token embedding. A token's row collects one contribution
// per position holding it; instead of atomics, the host sorts positions by
// token (counting sort, positions ascending) and one block owns each distinct
// token, adding its positions in order: the CPU engine's summation order.
template <typename Tx>
__global__ void wte_backward_kernel(float *dwte, const Tx *dx, const int *bucket_tok, const int *bucket_start,
                                    const int *positions, int C) {
    int u = blockIdx.x, tok = bucket_tok[u], begin = bucket_start[u], end = bucket_start[u + 1];
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float acc = dwte[(size_t)tok * C + c];
        for (int k = begin; k < end; k++) acc += to_f(dx[(size_t)positions[k] * C + c]);
        dwte[(size_t)tok * C + c] = acc;
    }
}

// Backward of the position embedding: one thread per (t, c), rows in order.
template <typename Tx>
__global__ void wpe_backward_kernel(float *dwpe, const Tx *dx, int B, int T, int C) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)T * C) return;
    int t = (int)(idx / C), c = (int)(idx % C);
    float acc = dwpe[idx];
    for (int b = 0; b < B; b++) acc += to_f(dx[((size_t)b * T + t) * C + c]);
    dwpe[idx] = acc;
}

// ----------------------------------------------------------------------------
// LayerNorm (eps MG_LN_EPS), one warp per row; mean and 1/std saved (fp32) for the
// backward. Two-pass variance, as the CPU engine computes it. The residual
// add that precedes each LayerNorm is fused into the previous matmul instead
// (cuBLASLt's beta=1 with C = the residual), which saves a whole pass.

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
// bias gradients are column sums over rows: colsum_* below, not atomics.
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
// Column sums over rows, deterministically: bias gradients (sum of dout) and
// LayerNorm weight/bias gradients (sum of dout * norm, sum of dout). Pass 1:
// block (x: 32 columns, y: one chunk of CS_ROWS rows) sums its rows in a
// fixed order into partial[chunk]; pass 2: one thread per column adds the
// chunks in order into the fp32 gradient. (cuBLASLt's BGRADB epilogue would
// overwrite the bias gradient rather than add to it, which breaks gradient
// accumulation over micro-batches; this costs one extra read of dout.)

#define CS_ROWS 256
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

// ----------------------------------------------------------------------------
// Unfused matmul helpers (fp32 mode, and the bf16 fallback): the output is
// first set to residual + bias, then the GEMM adds x W^T (beta = 1), the
// CPU engine's order. GELU (tanh approximation) forward and its derivative.

template <typename Tx>
__global__ void bias_residual_kernel(Tx *out, const Tx *residual, const float *bias, int R, int W) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)R * W) return;
    float v = bias ? bias[idx % W] : 0.0f;
    if (residual) v = to_f(residual[idx]) + v;
    out[idx] = from_f<Tx>(v);
}

template <typename Tx>
__global__ void gelu_forward_kernel(Tx *out, const Tx *in, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = to_f(in[i]);
    out[i] = from_f<Tx>(0.5f * x * (1.0f + tanhf(MG_GELU_SCALE * (x + MG_GELU_C * x * x * x))));
}

// d = d * gelu'(x), in place.
template <typename Tx>
__global__ void gelu_backward_kernel(Tx *d, const Tx *pre, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = to_f(pre[i]), u = MG_GELU_SCALE * (x + MG_GELU_C * x * x * x);
    float th = tanhf(u), sech2 = 1.0f - th * th;
    float grad = 0.5f * (1.0f + th) + 0.5f * x * sech2 * MG_GELU_SCALE * (1.0f + 3.0f * MG_GELU_C * x * x);
    d[i] = from_f<Tx>(to_f(d[i]) * grad);
}

// ----------------------------------------------------------------------------
// Causal self-attention, flash-style: the T x T probabilities are never
// stored. qkv rows are [q | k | v], each C wide, heads contiguous (hd = C/H).
//
// A group of G consecutive lanes owns one query row (forward, dQ) or one key
// row (dK/dV); lane `part` of the group holds dims d*G + part (interleaved,
// so the group reads consecutive shared-memory words: no bank conflicts).
// Dot products are summed over the group with an xor butterfly. K/V (or
// Q/dY) tiles are staged through shared memory as fp32. The forward keeps an
// online softmax per row and saves the log-sum-exp; the backward recomputes
// the probabilities from it (FlashAttention-2), with D_i = dY_i . Y_i.
// Deterministic without atomics: dQ and dK/dV are separate kernels, each row
// of each summing its terms sequentially in key (or query) order.
//
// These kernels use CUDA cores (fp32 FMA), not tensor cores: they are the
// simple, exact version, the only one in fp32 and for any head dim up to 128,
// and the default (--attention naive). `--attention flash` runs the bf16
// tensor-core kernels of cuda_flash_attention.cuh instead (see
// attention_forward below).

#define ATT_THREADS 128
template <int HD> struct AttShape {
    static const int G = HD >= 16 ? HD / 16 : 1;           // lanes per row
    static const int DPT = HD / G;                         // dims per lane
    static const int ROWS = ATT_THREADS / G;               // rows per block
    static const int KT = 4096 / HD < 64 ? 4096 / HD : 64; // keys (or queries) per shared tile: 32 KB for two tiles
};

template <int G> __device__ __forceinline__ float group_sum(float v) {
    for (int off = G / 2; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

// Stages rows [r0, r0+KT) of two hd-wide slices (column offsets o1, o2 of a
// row of width ld) into fp32 shared tiles, zero beyond T and beyond hd.
template <typename Tx, int HD, int KT>
__device__ __forceinline__ void stage_tiles(float (*s1)[HD], float (*s2)[HD], const Tx *base1, const Tx *base2, size_t ld,
                                            int r0, int T, int hd) {
    for (int idx = threadIdx.x; idx < KT * HD; idx += blockDim.x) {
        int rr = idx / HD, dim = idx % HD, r = r0 + rr;
        float a = 0.0f, b = 0.0f;
        if (r < T && dim < hd) {
            a = to_f(base1[(size_t)r * ld + dim]);
            b = to_f(base2[(size_t)r * ld + dim]);
        }
        s1[rr][dim] = a;
        s2[rr][dim] = b;
    }
}

template <typename Tx, int HD>
__global__ void __launch_bounds__(ATT_THREADS)
attention_forward_kernel(Tx *y, float *lse, const Tx *qkv, int T, int C, int H, int hd, float scale) {
    typedef AttShape<HD> S;
    __shared__ float ks[S::KT][HD], vs[S::KT][HD];
    int bh = blockIdx.y, b = bh / H, h = bh % H;
    int tile = gridDim.x - 1 - blockIdx.x;  // the latest (heaviest) query tiles start first
    int r = threadIdx.x / S::G, part = threadIdx.x % S::G, i = tile * S::ROWS + r;
    bool valid = i < T;
    size_t C3 = 3 * (size_t)C;
    const Tx *base = qkv + (size_t)b * T * C3 + h * hd;
    float q[S::DPT], o[S::DPT];
#pragma unroll
    for (int d = 0; d < S::DPT; d++) {
        int dim = d * S::G + part;
        q[d] = valid && dim < hd ? to_f(base[(size_t)i * C3 + dim]) : 0.0f;
        o[d] = 0.0f;
    }
    float mx = -INFINITY, l = 0.0f;
    int last = min(T - 1, tile * S::ROWS + S::ROWS - 1);  // the last key any row of this tile sees
    for (int k0 = 0; k0 <= last; k0 += S::KT) {
        __syncthreads();
        stage_tiles<Tx, HD, S::KT>(ks, vs, base + C, base + 2 * C, C3, k0, T, hd);
        __syncthreads();
        int kend = min(S::KT, last - k0 + 1);  // uniform over the block: every lane joins the shuffles
        for (int kk = 0; kk < kend; kk++) {
            float s = 0.0f;
#pragma unroll
            for (int d = 0; d < S::DPT; d++) s += q[d] * ks[kk][d * S::G + part];
            s = group_sum<S::G>(s);
            if (valid && k0 + kk <= i) {
                s *= scale;
                if (s > mx) {  // new running max: rescale what was accumulated
                    float corr = expf(mx - s);
                    l *= corr;
#pragma unroll
                    for (int d = 0; d < S::DPT; d++) o[d] *= corr;
                    mx = s;
                }
                float p = expf(s - mx);
                l += p;
#pragma unroll
                for (int d = 0; d < S::DPT; d++) o[d] += p * vs[kk][d * S::G + part];
            }
        }
    }
    if (!valid) return;
    float inv = 1.0f / l;
    Tx *yr = y + ((size_t)b * T + i) * C + h * hd;
#pragma unroll
    for (int d = 0; d < S::DPT; d++) {
        int dim = d * S::G + part;
        if (dim < hd) yr[dim] = from_f<Tx>(o[d] * inv);
    }
    if (part == 0) lse[(size_t)bh * T + i] = mx + logf(l);
}

// dQ, one group per query row, keys in order. Also computes and stores
// D_i = dY_i . Y_i, which the dK/dV kernel (launched after) reads.
template <typename Tx, int HD>
__global__ void __launch_bounds__(ATT_THREADS)
attention_backward_dq_kernel(Tx *dqkv, float *Dvec, const Tx *dy, const Tx *y, const Tx *qkv, const float *lse,
                             int T, int C, int H, int hd, float scale) {
    typedef AttShape<HD> S;
    __shared__ float ks[S::KT][HD], vs[S::KT][HD];
    int bh = blockIdx.y, b = bh / H, h = bh % H;
    int tile = gridDim.x - 1 - blockIdx.x;
    int r = threadIdx.x / S::G, part = threadIdx.x % S::G, i = tile * S::ROWS + r;
    bool valid = i < T;
    size_t C3 = 3 * (size_t)C;
    const Tx *base = qkv + (size_t)b * T * C3 + h * hd;
    size_t row = ((size_t)b * T + i) * C + h * hd;
    float q[S::DPT], g[S::DPT], dq[S::DPT], dsum = 0.0f;
#pragma unroll
    for (int d = 0; d < S::DPT; d++) {
        int dim = d * S::G + part;
        bool in = valid && dim < hd;
        q[d] = in ? to_f(base[(size_t)i * C3 + dim]) : 0.0f;
        g[d] = in ? to_f(dy[row + dim]) : 0.0f;
        dsum += in ? g[d] * to_f(y[row + dim]) : 0.0f;
        dq[d] = 0.0f;
    }
    float Di = group_sum<S::G>(dsum);
    float li = valid ? lse[(size_t)bh * T + i] : 0.0f;
    if (valid && part == 0) Dvec[(size_t)bh * T + i] = Di;
    int last = min(T - 1, tile * S::ROWS + S::ROWS - 1);
    for (int k0 = 0; k0 <= last; k0 += S::KT) {
        __syncthreads();
        stage_tiles<Tx, HD, S::KT>(ks, vs, base + C, base + 2 * C, C3, k0, T, hd);
        __syncthreads();
        int kend = min(S::KT, last - k0 + 1);
        for (int kk = 0; kk < kend; kk++) {
            float s = 0.0f, dp = 0.0f;
#pragma unroll
            for (int d = 0; d < S::DPT; d++) {
                s += q[d] * ks[kk][d * S::G + part];
                dp += g[d] * vs[kk][d * S::G + part];
            }
            s = group_sum<S::G>(s);
            dp = group_sum<S::G>(dp);
            if (valid && k0 + kk <= i) {
                float p = expf(s * scale - li);
                float ds = p * (dp - Di) * scale;
#pragma unroll
                for (int d = 0; d < S::DPT; d++) dq[d] += ds * ks[kk][d * S::G + part];
            }
        }
    }
    if (!valid) return;
    Tx *out = dqkv + ((size_t)b * T + i) * C3 + h * hd;
#pragma unroll
    for (int d = 0; d < S::DPT; d++) {
        int dim = d * S::G + part;
        if (dim < hd) out[dim] = from_f<Tx>(dq[d]);
    }
}

// dK and dV, one group per key row j, queries i >= j in order.
template <typename Tx, int HD>
__global__ void __launch_bounds__(ATT_THREADS)
attention_backward_dkv_kernel(Tx *dqkv, const Tx *dy, const Tx *qkv, const float *lse, const float *Dvec,
                              int T, int C, int H, int hd, float scale) {
    typedef AttShape<HD> S;
    __shared__ float qs[S::KT][HD], gs[S::KT][HD];
    __shared__ float ls[S::KT], dsh[S::KT];
    int bh = blockIdx.y, b = bh / H, h = bh % H;
    int tile = blockIdx.x;  // the earliest (heaviest) key tiles start first
    int r = threadIdx.x / S::G, part = threadIdx.x % S::G, j = tile * S::ROWS + r;
    bool valid = j < T;
    size_t C3 = 3 * (size_t)C;
    const Tx *base = qkv + (size_t)b * T * C3 + h * hd;
    const Tx *dyb = dy + (size_t)b * T * C + h * hd;
    float k[S::DPT], v[S::DPT], dk[S::DPT], dv[S::DPT];
#pragma unroll
    for (int d = 0; d < S::DPT; d++) {
        int dim = d * S::G + part;
        bool in = valid && dim < hd;
        k[d] = in ? to_f(base[(size_t)j * C3 + C + dim]) : 0.0f;
        v[d] = in ? to_f(base[(size_t)j * C3 + 2 * C + dim]) : 0.0f;
        dk[d] = 0.0f;
        dv[d] = 0.0f;
    }
    int first = tile * S::ROWS;  // the first query any key of this tile sees
    for (int q0 = first; q0 < T; q0 += S::KT) {
        __syncthreads();
        // Q rows have stride 3C and dY rows stride C: staged here, not by stage_tiles.
        for (int idx = threadIdx.x; idx < S::KT * HD; idx += blockDim.x) {
            int rr = idx / HD, dim = idx % HD, qi = q0 + rr;
            bool in = qi < T && dim < hd;
            qs[rr][dim] = in ? to_f(base[(size_t)qi * C3 + dim]) : 0.0f;
            gs[rr][dim] = in ? to_f(dyb[(size_t)qi * C + dim]) : 0.0f;
        }
        for (int rr = threadIdx.x; rr < S::KT; rr += blockDim.x) {
            int qi = q0 + rr;
            ls[rr] = qi < T ? lse[(size_t)bh * T + qi] : 0.0f;
            dsh[rr] = qi < T ? Dvec[(size_t)bh * T + qi] : 0.0f;
        }
        __syncthreads();
        int qend = min(S::KT, T - q0);
        for (int qq = 0; qq < qend; qq++) {
            float s = 0.0f, dp = 0.0f;
#pragma unroll
            for (int d = 0; d < S::DPT; d++) {
                s += qs[qq][d * S::G + part] * k[d];
                dp += gs[qq][d * S::G + part] * v[d];
            }
            s = group_sum<S::G>(s);
            dp = group_sum<S::G>(dp);
            if (valid && q0 + qq >= j) {
                float p = expf(s * scale - ls[qq]);
                float ds = p * (dp - dsh[qq]) * scale;
#pragma unroll
                for (int d = 0; d < S::DPT; d++) {
                    dv[d] += p * gs[qq][d * S::G + part];
                    dk[d] += ds * qs[qq][d * S::G + part];
                }
            }
        }
    }
    if (!valid) return;
    Tx *out = dqkv + ((size_t)b * T + j) * C3 + h * hd;
#pragma unroll
    for (int d = 0; d < S::DPT; d++) {
        int dim = d * S::G + part;
        if (dim < hd) {
            out[C + dim] = from_f<Tx>(dk[d]);
            out[2 * C + dim] = from_f<Tx>(dv[d]);
        }
    }
}

// ----------------------------------------------------------------------------
// Fused classifier: softmax cross-entropy per position without ever storing
// the probabilities. One block per row: an online max/sum pass over the
// logits, the loss, then (training) the logits are overwritten in place by
// their gradient (softmax - onehot) * grad_scale. A target < 0 marks a padded
// row: loss 0, gradient 0.

#define CE_THREADS 256
template <typename Tx>
__global__ void __launch_bounds__(CE_THREADS)
classifier_kernel(Tx *logits, float *losses, const int *targets, int V, float grad_scale, int write_grad) {
    __shared__ float sm[32], ss[32];
    int row = blockIdx.x, target = targets[row];
    Tx *x = logits + (size_t)row * V;
    float m = -INFINITY, s = 0.0f;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float v = to_f(x[j]);
        if (v > m) { s = s * expf(m - v) + 1.0f; m = v; }
        else s += expf(v - m);
    }
    // Combine (m, s) over the warp, then over warps in order (fixed tree).
    for (int off = 16; off > 0; off >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, off), s2 = __shfl_xor_sync(0xffffffffu, s, off);
        float mn = fmaxf(m, m2);
        s = (m == -INFINITY ? 0.0f : s * expf(m - mn)) + (m2 == -INFINITY ? 0.0f : s2 * expf(m2 - mn));
        m = mn;
    }
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    if (lane == 0) { sm[warp] = m; ss[warp] = s; }
    __syncthreads();
    float maxv = -INFINITY;
    for (int w = 0; w < nwarps; w++) maxv = fmaxf(maxv, sm[w]);
    float sum = 0.0f;
    for (int w = 0; w < nwarps; w++) sum += sm[w] == -INFINITY ? 0.0f : ss[w] * expf(sm[w] - maxv);
    if (threadIdx.x == 0) losses[row] = target < 0 ? 0.0f : logf(sum) - (to_f(x[target]) - maxv);
    if (!write_grad) return;
    __syncthreads();  // every thread has read x[target] before anyone overwrites it
    float inv = 1.0f / sum;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float g = 0.0f;
        if (target >= 0) g = (expf(to_f(x[j]) - maxv) * inv - (j == target ? 1.0f : 0.0f)) * grad_scale;
        x[j] = from_f<Tx>(g);
    }
}

// Logits of row r at position pos (sampling), converted to fp32.
template <typename Tx>
__global__ void gather_logits_kernel(float *out, const Tx *logits, int rows, int T, int pos, int V) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)rows * V) return;
    int r = (int)(idx / V), v = (int)(idx % V);
    out[idx] = to_f(logits[((size_t)r * T + pos) * V + v]);
}

// ----------------------------------------------------------------------------
// Optimizer: global gradient norm in a fixed order, then AdamW.

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

// Weight decay applies to the 2-D tensors only (mg_decay_ranges): the
// embeddings and, within each layer, the four matmul weights. O(1) per
// element from the layout; gpu_init checks it against mg_decay_ranges.
typedef struct {
    size_t layer0, layer_size, lnfw;
    size_t lo[4], hi[4];  // decayed [lo, hi) offsets within a layer
} DecayMap;

__host__ __device__ static inline int decays(const DecayMap &dm, size_t i) {
    if (i < dm.layer0) return 1;
    if (i >= dm.lnfw) return 0;
    size_t off = (i - dm.layer0) % dm.layer_size;
    for (int k = 0; k < 4; k++)
        if (off >= dm.lo[k] && off < dm.hi[k]) return 1;
    return 0;
}

// AdamW as torch.optim.AdamW (and microgpt_cpu.c) computes it: decoupled
// decay, then the bias-corrected step. Also refreshes the bf16 compute copy.
template <typename Tx>
__global__ void adamw_kernel(float *p, Tx *px, const float *grad, float *m, float *v, size_t n, DecayMap dm,
                             float grad_mult, float lr, float b1, float b2, float eps, float wd, float step_size,
                             float bc2_sqrt, int write_x) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float decay = decays(dm, i) ? 1.0f - lr * wd : 1.0f;
        float g = grad[i] * grad_mult;
        float mi = b1 * m[i] + (1.0f - b1) * g;
        float vi = b2 * v[i] + (1.0f - b2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float w = p[i] * decay - step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
        p[i] = w;
        if (write_x) px[i] = from_f<Tx>(w);
    }
}

template <typename Tx>
__global__ void convert_kernel(Tx *out, const float *in, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) out[i] = from_f<Tx>(in[i]);
}

// ----------------------------------------------------------------------------
// The engine's state.

#define MAX_PLANS 256
#define LT_WORKSPACE (32u << 20)  // cuBLASLt workspace: 32 MiB, NVIDIA's advice for Hopper

typedef struct {
    int m, n, k, ta, tb;
    long lda, ldb, ldd, aux_ld;
    int ab_type, d_type, epilogue;
    int align_a, align_b, align_c, align_d;
} GemmKey;

typedef struct {
    GemmKey key;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c, d;
    cublasLtMatmulAlgo_t algo;
    int ok;  // 0: cuBLASLt refused this form (only fused forms may be refused)
} GemmPlan;

// MICROGPT_CUDA_PROFILE_STEP=n (scripts/profile_cuda.sh): the n-th training
// step of the process runs between cudaProfilerStart and cudaProfilerStop
// (so `ncu --profile-from-start off` sees exactly one step) and is timed with
// CUDA events, the whole step and every attention forward and backward call;
// one `microgpt: profile {...}` JSON line on stderr follows it. Off: no cost.
typedef struct {
    int step;               // the step to profile (1-based), 0 = off
    int seen;               // training steps started so far
    int active;             // inside the profiled step
    int cap;                // attention calls of each kind per step: layers * grad_accum
    int n[2];               // calls recorded: [0] attention forward, [1] attention backward
    cudaEvent_t begin, end;
    cudaEvent_t *ev[2];     // per kind, [2 * cap] start/stop pairs
} Profile;

typedef struct {
    MgEngine *eng;
    MgConfig cfg;
    MgLayout lay;
    int B, T, C, L, H, V, hd, hd_bucket, BT;
    int bf16;             // activations and matmuls in bf16 (else fp32)
    int flash;            // attention on tensor cores (cuda_flash_attention.cuh)
    size_t xs;            // sizeof the activation type
    int fuse;             // try cuBLASLt epilogues (bf16 only)
    int warned_unfused;
    cudaDeviceProp prop;
    cudaStream_t stream;
    cudaEvent_t loss_ready;
    cublasLtHandle_t lt;
    void *lt_ws;
    GemmPlan plans[MAX_PLANS];
    int n_plans;
    DecayMap dm;

    // Parameters (flat, docs/ARCHITECTURE.md order), fp32 master, gradients, moments;
    // wx is the compute copy in the activation type (== params in fp32).
    float *params, *grads, *m, *v;
    void *wx;

    // Activations, saved for the backward. [L, BT, ...] where per layer.
    void *x0;                                   // [BT, C]
    void *ln1, *qkv, *atty, *res2, *ln2, *fch, *fchg, *res3;
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd;  // [L, BT]
    float *lse;                                 // [L, B*H*T] attention log-sum-exp
    void *lnf;                                  // [BT, C]
    float *lnf_mean, *lnf_rstd;                 // [BT]
    void *logits;                               // [BT, V]: logits, then their gradient
    float *losses;                              // [BT]
    int *inputs, *targets;                      // [BT]

    // Backward scratch.
    void *dres, *dln, *dqkv, *datty, *dfch;
    float *att_D;                               // [B*H*T]
    float *partial;                             // column-sum partials [chunks, 4C, 2]
    int *bucket_tok, *bucket_start, *positions; // embedding backward buckets
    float *logits_out;                          // [B, V] fp32, sampling
    double *norm_partial, *norm_out;
    Profile prof;

    // Pinned host staging.
    int *h_inputs, *h_targets, *h_bucket_tok, *h_bucket_start, *h_positions, *h_cursor;
    float *h_losses, *h_logits;
    double *h_norm;
    int n_buckets;

    size_t bytes;
} Gpu;

static void *dev_alloc(Gpu *e, size_t bytes) {
    void *p = NULL;
    bytes = (bytes + 255) & ~(size_t)255;
    cudaError_t err = cudaMalloc(&p, bytes ? bytes : 256);
    if (err != cudaSuccess)
        mg_fail(MG_EXIT_IO, "out of GPU memory allocating %zu bytes (%zu already held): %s; try a smaller --batch",
                bytes, e->bytes, cudaGetErrorString(err));
    CUDA_CHECK(cudaMemset(p, 0, bytes ? bytes : 256));
    e->bytes += bytes;
    return p;
}

static void *host_alloc(size_t bytes) {
    void *p = NULL;
    CUDA_CHECK(cudaMallocHost(&p, bytes ? bytes : 16));
    memset(p, 0, bytes ? bytes : 16);
    return p;
}

// Typed views of the type-erased activation buffers.
template <typename Tx> static Tx *X(const void *base, size_t offset) { return (Tx *)base + offset; }

// ----------------------------------------------------------------------------
// GEMM through cuBLASLt. Column-major, as cuBLASLt sees it:
//   D[m x n] = op(A)[m x k] op(B)[k x n] + beta C   (+ epilogue)
// Our tensors are row-major: a row-major [R, S] array is a column-major S x R
// matrix with leading dimension S. So, for a linear layer with x [BT, IC],
// W [OC, IC] and y [BT, OC]:
//   forward  y = x W^T      m=OC n=BT k=IC  A=W  (T, ld IC)  B=x    (N, ld IC)
//   dx       = dy W         m=IC n=BT k=OC  A=W  (N, ld IC)  B=dy   (N, ld OC)
//   dW      += dy^T x       m=IC n=OC k=BT  A=x  (N, ld IC)  B=dy   (T, ld OC)
// Plans (descriptors, layouts, the heuristic's algorithm) are made once per
// distinct key and reused, so every call of a shape runs the same algorithm:
// part of the determinism promise. The minimum-alignment preferences are the
// pointers' real alignments, since tensors inside the flat parameter array
// need not be 256-byte aligned (cuBLASLt's default assumption).

static int ptr_align(const void *p) {
    uintptr_t a = (uintptr_t)p;
    int al = 256;
    while (al > 1 && a % (uintptr_t)al) al >>= 1;
    return al;
}

static GemmPlan *gemm_plan(Gpu *e, const GemmKey *key, const void *bias, const void *aux) {
    for (int i = 0; i < e->n_plans; i++)
        if (memcmp(&e->plans[i].key, key, sizeof *key) == 0) return &e->plans[i];
    if (e->n_plans == MAX_PLANS) mg_fail(MG_EXIT_IO, "internal: more than %d distinct GEMM shapes", MAX_PLANS);
    GemmPlan *p = &e->plans[e->n_plans++];
    memset(p, 0, sizeof *p);
    p->key = *key;
    cudaDataType_t ab = (cudaDataType_t)key->ab_type, dt = (cudaDataType_t)key->d_type;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t opa = key->ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = key->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    cublasLtEpilogue_t epi = (cublasLtEpilogue_t)key->epilogue;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    if (bias) CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    if (aux) {
        int64_t ld = key->aux_ld;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld));
    }
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, ab, key->ta ? key->k : key->m, key->ta ? key->m : key->k, key->lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, ab, key->tb ? key->n : key->k, key->tb ? key->k : key->n, key->ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, dt, key->m, key->n, key->ldd));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->d, dt, key->m, key->n, key->ldd));
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = LT_WORKSPACE;
    uint32_t al[4] = {(uint32_t)key->align_a, (uint32_t)key->align_b, (uint32_t)key->align_c, (uint32_t)key->align_d};
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al[0], sizeof al[0]));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al[1], sizeof al[1]));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al[2], sizeof al[2]));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al[3], sizeof al[3]));
    cublasLtMatmulHeuristicResult_t heur;
    memset(&heur, 0, sizeof heur);
    int found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(e->lt, p->desc, p->a, p->b, p->c, p->d, pref, 1, &heur, &found);
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    if (st == CUBLAS_STATUS_SUCCESS && found > 0 && heur.state == CUBLAS_STATUS_SUCCESS) {
        p->algo = heur.algo;
        p->ok = 1;
    } else if (key->epilogue == CUBLASLT_EPILOGUE_DEFAULT) {
        mg_fail(MG_EXIT_IO, "cuBLASLt has no algorithm for a %dx%dx%d GEMM (trans %d%d, types %d/%d): %s", key->m, key->n,
                key->k, key->ta, key->tb, key->ab_type, key->d_type, cublasLtGetStatusString(st));
    }
    return p;
}

// Returns 1 when done; 0 when a fused epilogue is not available (the caller
// then runs the unfused kernels). Plain GEMMs never return 0.
static int gemm(Gpu *e, cublasLtEpilogue_t epilogue, int ta, int tb, int m, int n, int k, const void *A, long lda,
                const void *Bm, long ldb, float beta, const void *Cm, void *D, long ldd, cudaDataType_t ab,
                cudaDataType_t dt, const void *bias, const void *aux, long aux_ld) {
    if (!Cm) Cm = D;
    GemmKey key;
    memset(&key, 0, sizeof key);
    key.m = m; key.n = n; key.k = k; key.ta = ta; key.tb = tb;
    key.lda = lda; key.ldb = ldb; key.ldd = ldd; key.aux_ld = aux ? aux_ld : 0;
    key.ab_type = (int)ab; key.d_type = (int)dt; key.epilogue = (int)epilogue;
    key.align_a = ptr_align(A); key.align_b = ptr_align(Bm); key.align_c = ptr_align(Cm); key.align_d = ptr_align(D);
    GemmPlan *p = gemm_plan(e, &key, bias, aux);
    if (!p->ok) return 0;
    if (bias) CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    if (aux) CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
    float alpha = 1.0f;
    cublasStatus_t st = cublasLtMatmul(e->lt, p->desc, &alpha, A, p->a, Bm, p->b, &beta, Cm, p->c, D, p->d, &p->algo,
                                       e->lt_ws, LT_WORKSPACE, e->stream);
    if (st != CUBLAS_STATUS_SUCCESS && epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
        // Validation failures are reported before any work is queued.
        p->ok = 0;
        return 0;
    }
    CUBLAS_CHECK(st);
    return 1;
}

static void note_unfused(Gpu *e, const char *what) {
    if (e->warned_unfused) return;
    e->warned_unfused = 1;
    mg_warn("cuBLASLt refused the %s epilogue here; using the unfused kernels for it", what);
}

// ----------------------------------------------------------------------------
// Layers, each forward with its backward twin.

template <typename Tx> static cudaDataType_t xtype() { return CudaType<Tx>::value; }

template <typename Tx>
static void layernorm_forward(Gpu *e, Tx *out, float *mean, float *rstd, const Tx *x, const float *w, const float *b, int R) {
    int rows_per_block = LN_THREADS / 32;
    layernorm_forward_kernel<Tx><<<ceil_div(R, rows_per_block), LN_THREADS, 0, e->stream>>>(out, mean, rstd, x, w, b, R, e->C);
    LAUNCH_CHECK();
}

// dx (+)= LN backward; dw += sum(dout * norm); db += sum(dout).
template <typename Tx>
static void layernorm_backward(Gpu *e, Tx *dx, float *dw, float *db, const Tx *dout, const Tx *x, const float *w,
                               const float *mean, const float *rstd, int R, int accumulate) {
    int C = e->C;
    layernorm_backward_kernel<Tx><<<ceil_div(R, LN_THREADS / 32), LN_THREADS, 0, e->stream>>>(dx, dout, x, w, mean, rstd, R, C, accumulate);
    LAUNCH_CHECK();
    dim3 grid(ceil_div(C, 32), ceil_div(R, CS_ROWS));
    colsum_partial_kernel<Tx, 1><<<grid, dim3(32, 8), 0, e->stream>>>(e->partial, dout, x, mean, rstd, R, C);
    LAUNCH_CHECK();
    colsum_finalize_kernel<<<ceil_div(C, 256), 256, 0, e->stream>>>(dw, db, e->partial, (int)grid.y, C);
    LAUNCH_CHECK();
}

template <typename Tx>
static void bias_backward(Gpu *e, float *db, const Tx *dout, int R, int W) {
    dim3 grid(ceil_div(W, 32), ceil_div(R, CS_ROWS));
    colsum_partial_kernel<Tx, 0><<<grid, dim3(32, 8), 0, e->stream>>>(e->partial, dout, (const Tx *)NULL, NULL, NULL, R, W);
    LAUNCH_CHECK();
    colsum_finalize_kernel<<<ceil_div(W, 256), 256, 0, e->stream>>>(db, NULL, e->partial, (int)grid.y, W);
    LAUNCH_CHECK();
}

// out[BT, OC] = (residual or 0) + bias + inp[BT, IC] W[OC, IC]^T; with gelu_pre,
// out = GELU(that) and gelu_pre keeps the pre-activation for the backward.
// W and bias_x are in the activation type (wx), bias in fp32 (params).
template <typename Tx>
static void linear_forward(Gpu *e, Tx *out, const Tx *inp, const Tx *W, const Tx *bias_x, const float *bias,
                           const Tx *residual, int IC, int OC, Tx *gelu_pre) {
    int R = e->BT;
    cudaDataType_t t = xtype<Tx>();
    if (e->fuse && bias_x && ptr_align(bias_x) >= 16) {
        if (gelu_pre && !residual && OC % 8 == 0 && ptr_align(gelu_pre) >= 16) {
            if (gemm(e, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, 1, 0, OC, R, IC, W, IC, inp, IC, 0.0f, NULL, out, OC, t, t,
                     bias_x, gelu_pre, OC)) return;
            note_unfused(e, "GELU_AUX_BIAS");
        } else if (!gelu_pre) {
            if (gemm(e, CUBLASLT_EPILOGUE_BIAS, 1, 0, OC, R, IC, W, IC, inp, IC, residual ? 1.0f : 0.0f, residual, out, OC,
                     t, t, bias_x, NULL, 0)) return;
            note_unfused(e, "BIAS");
        }
    }
    // Unfused: target = residual + bias, then target += inp W^T, then GELU.
    Tx *target = gelu_pre ? gelu_pre : out;
    size_t n = (size_t)R * OC;
    int beta_one = residual || bias;
    if (beta_one) {
        bias_residual_kernel<Tx><<<ceil_div(n, 256), 256, 0, e->stream>>>(target, residual, bias, R, OC);
        LAUNCH_CHECK();
    }
    gemm(e, CUBLASLT_EPILOGUE_DEFAULT, 1, 0, OC, R, IC, W, IC, inp, IC, beta_one ? 1.0f : 0.0f, NULL, target, OC, t, t,
         NULL, NULL, 0);
    if (gelu_pre) {
        gelu_forward_kernel<Tx><<<ceil_div(n, 256), 256, 0, e->stream>>>(out, gelu_pre, n);
        LAUNCH_CHECK();
    }
}

// dinp = dout W (times gelu'(gelu_pre) when given: the backward of the GELU
// that produced inp); dW += dout^T inp (fp32); db += column sums of dout.
template <typename Tx>
static void linear_backward(Gpu *e, Tx *dinp, float *dW, float *db, const Tx *dout, const Tx *inp, const Tx *W, int IC,
                            int OC, const Tx *gelu_pre) {
    int R = e->BT;
    cudaDataType_t t = xtype<Tx>();
    int done = 0;
    if (gelu_pre && e->fuse && IC % 8 == 0 && ptr_align(gelu_pre) >= 16) {
        done = gemm(e, CUBLASLT_EPILOGUE_DGELU, 0, 0, IC, R, OC, W, IC, dout, OC, 0.0f, NULL, dinp, IC, t, t, NULL,
                    gelu_pre, IC);
        if (!done) note_unfused(e, "DGELU");
    }
    if (!done) {
        gemm(e, CUBLASLT_EPILOGUE_DEFAULT, 0, 0, IC, R, OC, W, IC, dout, OC, 0.0f, NULL, dinp, IC, t, t, NULL, NULL, 0);
        if (gelu_pre) {
            size_t n = (size_t)R * IC;
            gelu_backward_kernel<Tx><<<ceil_div(n, 256), 256, 0, e->stream>>>(dinp, gelu_pre, n);
            LAUNCH_CHECK();
        }
    }
    gemm(e, CUBLASLT_EPILOGUE_DEFAULT, 0, 1, IC, OC, R, inp, IC, dout, OC, 1.0f, NULL, dW, IC, t, CUDA_R_32F, NULL,
         NULL, 0);
    if (db) bias_backward<Tx>(e, db, dout, R, OC);
}

template <typename Tx, int HD>
static void attention_forward_hd(Gpu *e, Tx *y, float *lse, const Tx *qkv) {
    dim3 grid(ceil_div(e->T, AttShape<HD>::ROWS), e->B * e->H);
    attention_forward_kernel<Tx, HD><<<grid, ATT_THREADS, 0, e->stream>>>(y, lse, qkv, e->T, e->C, e->H, e->hd,
                                                                          1.0f / sqrtf((float)e->hd));
    LAUNCH_CHECK();
}

template <typename Tx, int HD>
static void attention_backward_hd(Gpu *e, Tx *dqkv, const Tx *dy, const Tx *y, const Tx *qkv, const float *lse) {
    dim3 grid(ceil_div(e->T, AttShape<HD>::ROWS), e->B * e->H);
    float scale = 1.0f / sqrtf((float)e->hd);
    attention_backward_dq_kernel<Tx, HD><<<grid, ATT_THREADS, 0, e->stream>>>(dqkv, e->att_D, dy, y, qkv, lse, e->T, e->C,
                                                                              e->H, e->hd, scale);
    LAUNCH_CHECK();
    attention_backward_dkv_kernel<Tx, HD><<<grid, ATT_THREADS, 0, e->stream>>>(dqkv, dy, qkv, lse, e->att_D, e->T, e->C,
                                                                               e->H, e->hd, scale);
    LAUNCH_CHECK();
}

// The head dim is a template parameter (register arrays need constant
// sizes): the smallest bucket that holds it, the rest zero-padded. With
// e->flash (bf16 only, head dims 32/64/128: gpu_init decides) the tensor-core
// kernels run instead; both write the same y, lse and dqkv.
static void profile_mark(Gpu *e, int kind, int stop);

template <typename Tx>
static void attention_forward(Gpu *e, Tx *y, float *lse, const Tx *qkv) {
    profile_mark(e, 0, 0);
    bool done = false;
    if constexpr (std::is_same<Tx, bf16>::value) {
        if (e->flash) {
            CUDA_CHECK(flash_attention_forward(e->stream, y, lse, qkv, e->B, e->T, e->C, e->H, e->hd));
            done = true;
        }
    }
    if (!done) switch (e->hd_bucket) {
    case 8: attention_forward_hd<Tx, 8>(e, y, lse, qkv); break;
    case 16: attention_forward_hd<Tx, 16>(e, y, lse, qkv); break;
    case 32: attention_forward_hd<Tx, 32>(e, y, lse, qkv); break;
    case 64: attention_forward_hd<Tx, 64>(e, y, lse, qkv); break;
    default: attention_forward_hd<Tx, 128>(e, y, lse, qkv); break;
    }
    profile_mark(e, 0, 1);
}

template <typename Tx>
static void attention_backward(Gpu *e, Tx *dqkv, const Tx *dy, const Tx *y, const Tx *qkv, const float *lse) {
    profile_mark(e, 1, 0);
    bool done = false;
    if constexpr (std::is_same<Tx, bf16>::value) {
        if (e->flash) {
            CUDA_CHECK(flash_attention_backward(e->stream, dqkv, e->att_D, dy, y, qkv, lse, e->B, e->T, e->C, e->H, e->hd));
            done = true;
        }
    }
    if (!done) switch (e->hd_bucket) {
    case 8: attention_backward_hd<Tx, 8>(e, dqkv, dy, y, qkv, lse); break;
    case 16: attention_backward_hd<Tx, 16>(e, dqkv, dy, y, qkv, lse); break;
    case 32: attention_backward_hd<Tx, 32>(e, dqkv, dy, y, qkv, lse); break;
    case 64: attention_backward_hd<Tx, 64>(e, dqkv, dy, y, qkv, lse); break;
    default: attention_backward_hd<Tx, 128>(e, dqkv, dy, y, qkv, lse); break;
    }
    profile_mark(e, 1, 1);
}

// ----------------------------------------------------------------------------
// The model: forward through the blocks, the head, the backward.

static size_t poff(const Gpu *e, int l, int tensor) { return mg_param(&e->lay, l, tensor); }

template <typename Tx>
static void blocks_forward(Gpu *e) {
    int C = e->C, BT = e->BT;
    size_t bt = (size_t)BT, bhT = (size_t)e->B * e->H * e->T;
    const float *P = e->params;
    const Tx *Wx = (const Tx *)e->wx;
    Tx *x0 = (Tx *)e->x0;
    embed_forward_kernel<Tx><<<ceil_div(bt * C, 256), 256, 0, e->stream>>>(x0, e->inputs, P + e->lay.wte, P + e->lay.wpe, BT, e->T, C);
    LAUNCH_CHECK();
    for (int l = 0; l < e->L; l++) {
        const Tx *x = l == 0 ? x0 : X<Tx>(e->res3, (size_t)(l - 1) * bt * C);
        Tx *ln1 = X<Tx>(e->ln1, l * bt * C), *qkv = X<Tx>(e->qkv, l * bt * 3 * C), *atty = X<Tx>(e->atty, l * bt * C);
        Tx *res2 = X<Tx>(e->res2, l * bt * C), *ln2 = X<Tx>(e->ln2, l * bt * C);
        Tx *fch = X<Tx>(e->fch, l * bt * 4 * C), *fchg = X<Tx>(e->fchg, l * bt * 4 * C), *res3 = X<Tx>(e->res3, l * bt * C);
        layernorm_forward<Tx>(e, ln1, e->ln1_mean + l * bt, e->ln1_rstd + l * bt, x, P + poff(e, l, MG_LN1W), P + poff(e, l, MG_LN1B), BT);
        linear_forward<Tx>(e, qkv, ln1, Wx + poff(e, l, MG_QKVW), Wx + poff(e, l, MG_QKVB), P + poff(e, l, MG_QKVB), NULL, C, 3 * C, NULL);
        attention_forward<Tx>(e, atty, e->lse + l * bhT, qkv);
        linear_forward<Tx>(e, res2, atty, Wx + poff(e, l, MG_PROJW), Wx + poff(e, l, MG_PROJB), P + poff(e, l, MG_PROJB), x, C, C, NULL);
        layernorm_forward<Tx>(e, ln2, e->ln2_mean + l * bt, e->ln2_rstd + l * bt, res2, P + poff(e, l, MG_LN2W), P + poff(e, l, MG_LN2B), BT);
        linear_forward<Tx>(e, fchg, ln2, Wx + poff(e, l, MG_FCW), Wx + poff(e, l, MG_FCB), P + poff(e, l, MG_FCB), NULL, C, 4 * C, fch);
        linear_forward<Tx>(e, res3, fchg, Wx + poff(e, l, MG_FCPROJW), Wx + poff(e, l, MG_FCPROJB), P + poff(e, l, MG_FCPROJB), res2, 4 * C, C, NULL);
    }
}

template <typename Tx> static const Tx *final_hidden(Gpu *e) { return X<Tx>(e->res3, (size_t)(e->L - 1) * e->BT * e->C); }

// Blocks, final LayerNorm, tied head: logits = lnf wte^T.
template <typename Tx>
static void model_forward(Gpu *e) {
    blocks_forward<Tx>(e);
    layernorm_forward<Tx>(e, (Tx *)e->lnf, e->lnf_mean, e->lnf_rstd, final_hidden<Tx>(e), e->params + e->lay.lnfw,
                          e->params + e->lay.lnfb, e->BT);
    gemm(e, CUBLASLT_EPILOGUE_DEFAULT, 1, 0, e->V, e->BT, e->C, (const Tx *)e->wx + e->lay.wte, e->C, e->lnf, e->C, 0.0f,
         NULL, e->logits, e->V, xtype<Tx>(), xtype<Tx>(), NULL, NULL, 0);
}

template <typename Tx>
static void classifier(Gpu *e, float grad_scale, int write_grad) {
    classifier_kernel<Tx><<<e->BT, CE_THREADS, 0, e->stream>>>((Tx *)e->logits, e->losses, e->targets, e->V, grad_scale, write_grad);
    LAUNCH_CHECK();
}

template <typename Tx>
static void model_backward(Gpu *e) {
    int C = e->C, BT = e->BT;
    size_t bt = (size_t)BT, bhT = (size_t)e->B * e->H * e->T;
    const float *P = e->params;
    float *G = e->grads;
    const Tx *Wx = (const Tx *)e->wx;
    Tx *dres = (Tx *)e->dres, *dln = (Tx *)e->dln, *dqkv = (Tx *)e->dqkv, *datty = (Tx *)e->datty, *dfch = (Tx *)e->dfch;
    // Head: dlnf = dlogits wte; dwte += dlogits^T lnf; then the final LayerNorm.
    linear_backward<Tx>(e, dln, G + e->lay.wte, NULL, (const Tx *)e->logits, (const Tx *)e->lnf, Wx + e->lay.wte, C, e->V, NULL);
    layernorm_backward<Tx>(e, dres, G + e->lay.lnfw, G + e->lay.lnfb, dln, final_hidden<Tx>(e), P + e->lay.lnfw,
                           e->lnf_mean, e->lnf_rstd, BT, 0);
    for (int l = e->L - 1; l >= 0; l--) {
        const Tx *x = l == 0 ? (const Tx *)e->x0 : X<Tx>(e->res3, (size_t)(l - 1) * bt * C);
        const Tx *ln1 = X<Tx>(e->ln1, l * bt * C), *qkv = X<Tx>(e->qkv, l * bt * 3 * C), *atty = X<Tx>(e->atty, l * bt * C);
        const Tx *res2 = X<Tx>(e->res2, l * bt * C), *ln2 = X<Tx>(e->ln2, l * bt * C);
        const Tx *fch = X<Tx>(e->fch, l * bt * 4 * C), *fchg = X<Tx>(e->fchg, l * bt * 4 * C);
        // MLP branch: dres is d(res3); the skip passes it to res2 unchanged.
        linear_backward<Tx>(e, dfch, G + poff(e, l, MG_FCPROJW), G + poff(e, l, MG_FCPROJB), dres, fchg,
                            Wx + poff(e, l, MG_FCPROJW), 4 * C, C, fch);
        linear_backward<Tx>(e, dln, G + poff(e, l, MG_FCW), G + poff(e, l, MG_FCB), dfch, ln2, Wx + poff(e, l, MG_FCW), C, 4 * C, NULL);
        layernorm_backward<Tx>(e, dres, G + poff(e, l, MG_LN2W), G + poff(e, l, MG_LN2B), dln, res2, P + poff(e, l, MG_LN2W),
                               e->ln2_mean + l * bt, e->ln2_rstd + l * bt, BT, 1);
        // Attention branch: dres is now d(res2).
        linear_backward<Tx>(e, datty, G + poff(e, l, MG_PROJW), G + poff(e, l, MG_PROJB), dres, atty, Wx + poff(e, l, MG_PROJW), C, C, NULL);
        attention_backward<Tx>(e, dqkv, datty, atty, qkv, e->lse + l * bhT);
        linear_backward<Tx>(e, dln, G + poff(e, l, MG_QKVW), G + poff(e, l, MG_QKVB), dqkv, ln1, Wx + poff(e, l, MG_QKVW), C, 3 * C, NULL);
        layernorm_backward<Tx>(e, dres, G + poff(e, l, MG_LN1W), G + poff(e, l, MG_LN1B), dln, x, P + poff(e, l, MG_LN1W),
                               e->ln1_mean + l * bt, e->ln1_rstd + l * bt, BT, 1);
    }
    // Embeddings: token rows by bucket (no atomics), positions by column.
    if (e->n_buckets > 0) {
        wte_backward_kernel<Tx><<<e->n_buckets, 128, 0, e->stream>>>(G + e->lay.wte, dres, e->bucket_tok, e->bucket_start, e->positions, C);
        LAUNCH_CHECK();
    }
    wpe_backward_kernel<Tx><<<ceil_div((size_t)e->T * C, 256), 256, 0, e->stream>>>(G + e->lay.wpe, dres, e->B, e->T, C);
    LAUNCH_CHECK();
}

// ----------------------------------------------------------------------------
// Host side of a micro-batch: tokens to pinned staging, embedding buckets,
// uploads. All device work is padded to the full [batch, ctx] shape, so the
// GEMM shapes (and their plans) never change; padded rows have target -1
// (no loss, no gradient) and input 0.

static void stage_rows(Gpu *e, const uint16_t *rows_tokens, int rows, int row_len, int len, int with_targets) {
    int T = e->T, BT = e->BT;
    for (int r = 0; r < e->B; r++)
        for (int t = 0; t < T; t++) {
            int i = r * T + t, ok = r < rows && t < len;
            e->h_inputs[i] = ok ? rows_tokens[(size_t)r * row_len + t] : 0;
            e->h_targets[i] = with_targets && ok ? rows_tokens[(size_t)r * row_len + t + 1] : -1;
        }
    CUDA_CHECK(cudaMemcpyAsync(e->inputs, e->h_inputs, BT * sizeof(int), cudaMemcpyHostToDevice, e->stream));
    CUDA_CHECK(cudaMemcpyAsync(e->targets, e->h_targets, BT * sizeof(int), cudaMemcpyHostToDevice, e->stream));
}

// Counting sort of positions by token (positions ascending within a token).
static void stage_buckets(Gpu *e) {
    int V = e->V, BT = e->BT, u = 0, acc = 0;
    memset(e->h_cursor, 0, V * sizeof(int));
    for (int i = 0; i < BT; i++) e->h_cursor[e->h_inputs[i]]++;
    for (int v = 0; v < V; v++) {
        int count = e->h_cursor[v];
        if (!count) continue;
        e->h_bucket_tok[u] = v;
        e->h_bucket_start[u++] = acc;
        e->h_cursor[v] = acc;
        acc += count;
    }
    e->h_bucket_start[u] = acc;
    e->n_buckets = u;
    for (int i = 0; i < BT; i++) e->h_positions[e->h_cursor[e->h_inputs[i]]++] = i;
    CUDA_CHECK(cudaMemcpyAsync(e->bucket_tok, e->h_bucket_tok, u * sizeof(int), cudaMemcpyHostToDevice, e->stream));
    CUDA_CHECK(cudaMemcpyAsync(e->bucket_start, e->h_bucket_start, (u + 1) * sizeof(int), cudaMemcpyHostToDevice, e->stream));
    CUDA_CHECK(cudaMemcpyAsync(e->positions, e->h_positions, BT * sizeof(int), cudaMemcpyHostToDevice, e->stream));
}

// Each row's mean token loss, summed in double in position order (as the CPU engine).
static void row_losses(Gpu *e, int rows, float *row_loss) {
    int T = e->T;
    for (int r = 0; r < rows; r++) {
        double sum = 0;
        for (int t = 0; t < T; t++) sum += e->h_losses[r * T + t];
        row_loss[r] = (float)(sum / T);
    }
}

template <typename Tx>
static void run_step(Gpu *e, float grad_scale, int backward) {
    model_forward<Tx>(e);
    classifier<Tx>(e, grad_scale, backward);
    CUDA_CHECK(cudaMemcpyAsync(e->h_losses, e->losses, e->BT * sizeof(float), cudaMemcpyDeviceToHost, e->stream));
    CUDA_CHECK(cudaEventRecord(e->loss_ready, e->stream));
    if (backward) model_backward<Tx>(e);
}

static void gpu_forward_backward(void *impl, const uint16_t *rows_tokens, int rows, float grad_scale, float *row_loss) {
    Gpu *e = (Gpu *)impl;
    if (rows > e->B) mg_fail(MG_EXIT_PROTOCOL, "internal: %d rows for a batch of %d", rows, e->B);
    stage_rows(e, rows_tokens, rows, e->T + 1, e->T, 1);
    stage_buckets(e);
    if (e->bf16) run_step<bf16>(e, grad_scale, 1);
    else run_step<float>(e, grad_scale, 1);
    // Wait for the losses only: the backward keeps running while the driver
    // sums them (grad_norm is the next call that waits for the GPU).
    CUDA_CHECK(cudaEventSynchronize(e->loss_ready));
    row_losses(e, rows, row_loss);
}

static void gpu_forward_loss(void *impl, const uint16_t *rows_tokens, int rows, float *row_loss) {
    Gpu *e = (Gpu *)impl;
    if (rows > e->B) mg_fail(MG_EXIT_PROTOCOL, "internal: %d rows for a batch of %d", rows, e->B);
    stage_rows(e, rows_tokens, rows, e->T + 1, e->T, 1);
    if (e->bf16) run_step<bf16>(e, 0.0f, 0);
    else run_step<float>(e, 0.0f, 0);
    CUDA_CHECK(cudaStreamSynchronize(e->stream));
    row_losses(e, rows, row_loss);
}

// Sampling: tokens at positions 0..len-1 of each row (the rest padding; the
// attention is causal, so padding never reaches position len-1).
static void gpu_last_logits(void *impl, const uint16_t *tokens, int rows, int len, float *out) {
    Gpu *e = (Gpu *)impl;
    if (rows > e->B || len < 1 || len > e->T) mg_fail(MG_EXIT_PROTOCOL, "internal: last_logits(%d rows, len %d)", rows, len);
    stage_rows(e, tokens, rows, len, len, 0);
    size_t n = (size_t)rows * e->V;
    if (e->bf16) {
        model_forward<bf16>(e);
        gather_logits_kernel<bf16><<<ceil_div(n, 256), 256, 0, e->stream>>>(e->logits_out, (const bf16 *)e->logits, rows, e->T, len - 1, e->V);
    } else {
        model_forward<float>(e);
        gather_logits_kernel<float><<<ceil_div(n, 256), 256, 0, e->stream>>>(e->logits_out, (const float *)e->logits, rows, e->T, len - 1, e->V);
    }
    LAUNCH_CHECK();
    CUDA_CHECK(cudaMemcpyAsync(e->h_logits, e->logits_out, n * sizeof(float), cudaMemcpyDeviceToHost, e->stream));
    CUDA_CHECK(cudaStreamSynchronize(e->stream));
    memcpy(out, e->h_logits, n * sizeof(float));
}

// ----------------------------------------------------------------------------
// State, gradients, optimizer.

static void refresh_compute_copy(Gpu *e) {
    if (!e->bf16) return;
    convert_kernel<bf16><<<1024, 256, 0, e->stream>>>((bf16 *)e->wx, e->params, e->lay.n);
    LAUNCH_CHECK();
}

static void gpu_set_state(void *impl, const float *w, const float *m, const float *v) {
    Gpu *e = (Gpu *)impl;
    size_t bytes = e->lay.n * sizeof(float);
    CUDA_CHECK(cudaMemcpyAsync(e->params, w, bytes, cudaMemcpyHostToDevice, e->stream));
    CUDA_CHECK(cudaMemcpyAsync(e->m, m, bytes, cudaMemcpyHostToDevice, e->stream));
    CUDA_CHECK(cudaMemcpyAsync(e->v, v, bytes, cudaMemcpyHostToDevice, e->stream));
    refresh_compute_copy(e);
    CUDA_CHECK(cudaStreamSynchronize(e->stream));
}

static void gpu_get_state(void *impl, float *w, float *m, float *v) {
    Gpu *e = (Gpu *)impl;
    size_t bytes = e->lay.n * sizeof(float);
    CUDA_CHECK(cudaMemcpyAsync(w, e->params, bytes, cudaMemcpyDeviceToHost, e->stream));
    CUDA_CHECK(cudaMemcpyAsync(m, e->m, bytes, cudaMemcpyDeviceToHost, e->stream));
    CUDA_CHECK(cudaMemcpyAsync(v, e->v, bytes, cudaMemcpyDeviceToHost, e->stream));
    CUDA_CHECK(cudaStreamSynchronize(e->stream));
}

// ----------------------------------------------------------------------------
// Profiling one step (MICROGPT_CUDA_PROFILE_STEP, see Profile).

static void profile_setup(Gpu *e) {
    const char *env = getenv("MICROGPT_CUDA_PROFILE_STEP");
    Profile *p = &e->prof;
    memset(p, 0, sizeof *p);
    if (!env || !*env) return;
    char *end = NULL;
    long step = strtol(env, &end, 10);
    if (*end || step < 1 || step > INT_MAX)
        mg_fail(MG_EXIT_USAGE, "MICROGPT_CUDA_PROFILE_STEP: '%s' is not a step number >= 1", env);
    p->step = (int)step;
    p->cap = e->L * e->cfg.grad_accum;
    CUDA_CHECK(cudaEventCreate(&p->begin));
    CUDA_CHECK(cudaEventCreate(&p->end));
    for (int k = 0; k < 2; k++) {
        p->ev[k] = (cudaEvent_t *)mg_calloc(2 * (size_t)p->cap, sizeof(cudaEvent_t));
        for (int i = 0; i < 2 * p->cap; i++) CUDA_CHECK(cudaEventCreate(&p->ev[k][i]));
    }
}

static void profile_mark(Gpu *e, int kind, int stop) {
    Profile *p = &e->prof;
    if (!p->active || p->n[kind] >= p->cap) return;
    CUDA_CHECK(cudaEventRecord(p->ev[kind][2 * p->n[kind] + stop], e->stream));
    if (stop) p->n[kind]++;
}

static void profile_begin_step(Gpu *e) {
    Profile *p = &e->prof;
    if (!p->step || ++p->seen != p->step) return;
    CUDA_CHECK(cudaStreamSynchronize(e->stream));
    CUDA_CHECK(cudaProfilerStart());
    CUDA_CHECK(cudaEventRecord(p->begin, e->stream));
    p->active = 1;
    p->n[0] = p->n[1] = 0;
}

static void profile_end_step(Gpu *e) {
    Profile *p = &e->prof;
    if (!p->active) return;
    p->active = 0;
    CUDA_CHECK(cudaEventRecord(p->end, e->stream));
    CUDA_CHECK(cudaEventSynchronize(p->end));
    CUDA_CHECK(cudaProfilerStop());
    float step_ms = 0, ms[2] = {0, 0};
    CUDA_CHECK(cudaEventElapsedTime(&step_ms, p->begin, p->end));
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < p->n[k]; i++) {
            float t = 0;
            CUDA_CHECK(cudaEventElapsedTime(&t, p->ev[k][2 * i], p->ev[k][2 * i + 1]));
            ms[k] += t;
        }
    fprintf(stderr, "microgpt: profile {\"step\":%d,\"step_ms\":%.4f,\"attention_forward_ms\":%.4f,"
            "\"attention_backward_ms\":%.4f,\"attention_calls\":[%d,%d],\"attention\":\"%s\",\"precision\":\"%s\"}\n",
            p->step, step_ms, ms[0], ms[1], p->n[0], p->n[1], e->flash ? "flash" : "naive", e->bf16 ? "bf16" : "fp32");
    fflush(stderr);
}

static void gpu_zero_grads(void *impl) {
    Gpu *e = (Gpu *)impl;
    profile_begin_step(e);
    CUDA_CHECK(cudaMemsetAsync(e->grads, 0, e->lay.n * sizeof(float), e->stream));
}

static void gpu_get_grads(void *impl, float *out) {
    Gpu *e = (Gpu *)impl;
    CUDA_CHECK(cudaMemcpyAsync(out, e->grads, e->lay.n * sizeof(float), cudaMemcpyDeviceToHost, e->stream));
    CUDA_CHECK(cudaStreamSynchronize(e->stream));
}

static double gpu_grad_norm(void *impl) {
    Gpu *e = (Gpu *)impl;
    sumsq_partial_kernel<<<NORM_BLOCKS, NORM_THREADS, 0, e->stream>>>(e->norm_partial, e->grads, e->lay.n);
    LAUNCH_CHECK();
    sumsq_final_kernel<<<1, 1024, 0, e->stream>>>(e->norm_out, e->norm_partial, NORM_BLOCKS);
    LAUNCH_CHECK();
    CUDA_CHECK(cudaMemcpyAsync(e->h_norm, e->norm_out, sizeof(double), cudaMemcpyDeviceToHost, e->stream));
    CUDA_CHECK(cudaStreamSynchronize(e->stream));
    return *e->h_norm;
}

static void gpu_update(void *impl, int step, float lr, float grad_mult) {
    Gpu *e = (Gpu *)impl;
    const MgConfig *c = &e->cfg;
    double bc1 = 1.0 - pow(c->beta1, step), bc2 = 1.0 - pow(c->beta2, step);
    float step_size = (float)(lr / bc1), bc2_sqrt = (float)sqrt(bc2);
    unsigned blocks = ceil_div(e->lay.n, 256);
    if (blocks > 65535u * 4) blocks = 65535u * 4;
    if (e->bf16)
        adamw_kernel<bf16><<<blocks, 256, 0, e->stream>>>(e->params, (bf16 *)e->wx, e->grads, e->m, e->v, e->lay.n, e->dm,
            grad_mult, lr, c->beta1, c->beta2, c->eps, c->weight_decay, step_size, bc2_sqrt, 1);
    else
        adamw_kernel<float><<<blocks, 256, 0, e->stream>>>(e->params, (float *)e->wx, e->grads, e->m, e->v, e->lay.n, e->dm,
            grad_mult, lr, c->beta1, c->beta2, c->eps, c->weight_decay, step_size, bc2_sqrt, 0);
    LAUNCH_CHECK();
    profile_end_step(e);
}

// ----------------------------------------------------------------------------
// Device selection, allocation, warm-up.

static const char *gpu_configure(void *impl, MgConfig *cfg) {
    Gpu *e = (Gpu *)impl;
    static char msg[512];
    e->eng->threads = 1;
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
        snprintf(msg, sizeof msg, "no CUDA device: %s%s%s (use build/microgpt_cpu on machines without an NVIDIA GPU)",
                 err != cudaSuccess ? cudaGetErrorName(err) : "none visible", err != cudaSuccess ? ": " : "",
                 err == cudaErrorInsufficientDriver ? "no NVIDIA driver, or one too old for this CUDA runtime"
                 : err != cudaSuccess ? cudaGetErrorString(err) : "");
        return msg;
    }
    CUDA_CHECK(cudaSetDevice(0));
    CUDA_CHECK(cudaGetDeviceProperties(&e->prop, 0));
    int has_bf16 = e->prop.major >= 8;
    if (!cfg->precision) cfg->precision = has_bf16 ? "bf16" : "fp32";
    e->bf16 = strcmp(cfg->precision, "bf16") == 0;
    if (e->bf16 && !has_bf16) {
        snprintf(msg, sizeof msg, "--precision bf16 needs compute capability 8.0 or newer; %s is %d.%d (use --precision fp32)",
                 e->prop.name, e->prop.major, e->prop.minor);
        return msg;
    }
    e->eng->precision = e->bf16 ? "bf16" : "fp32";
    snprintf(e->eng->device, sizeof e->eng->device, "%s (sm_%d%d, %d SMs, %.1f GiB)", e->prop.name, e->prop.major,
             e->prop.minor, e->prop.multiProcessorCount, e->prop.totalGlobalMem / 1073741824.0);
    const char *fuse_env = getenv("MICROGPT_CUDA_FUSE");
    e->fuse = e->bf16 && !(fuse_env && strcmp(fuse_env, "0") == 0);
    return NULL;
}

// --attention flash takes the tensor-core kernels where they apply (bf16, head
// dim 32, 64 or 128, enough shared memory); anywhere else it falls back to
// the naive kernels with one warning, never an error. The choice is appended
// to the device string of the ready event, so every run says which it used.
static void choose_attention(Gpu *e, const char *requested) {
    e->flash = 0;
    if (requested && strcmp(requested, "flash") == 0) {
        size_t need = flash_attention_smem(e->hd);
        if (!e->bf16)
            mg_warn("--attention flash needs --precision bf16; using the naive attention kernels (fp32)");
        else if (!flash_attention_supported(e->hd))
            mg_warn("--attention flash supports head dims 32, 64 and 128, not %d (--dim %d / --heads %d); "
                    "using the naive attention kernels", e->hd, e->C, e->H);
        else if (need > e->prop.sharedMemPerBlockOptin)
            mg_warn("--attention flash needs %zu bytes of shared memory per block, %s allows %zu; "
                    "using the naive attention kernels", need, e->prop.name, e->prop.sharedMemPerBlockOptin);
        else
            e->flash = 1;
    }
    if (e->flash) CUDA_CHECK(flash_attention_setup(e->hd));
    size_t len = strlen(e->eng->device);
    snprintf(e->eng->device + len, sizeof e->eng->device - len, ", attention %s", e->flash ? "flash" : "naive");
}

static size_t gpu_init(void *impl, const MgConfig *cfg) {
    Gpu *e = (Gpu *)impl;
    e->cfg = *cfg;
    e->B = cfg->batch; e->T = cfg->ctx; e->C = cfg->dim; e->L = cfg->layers; e->H = cfg->heads; e->V = cfg->vocab;
    e->hd = e->C / e->H;
    e->BT = e->B * e->T;
    if ((size_t)e->B * e->T > (size_t)1 << 26) mg_fail(MG_EXIT_USAGE, "--batch * --ctx = %zu is too large for the CUDA engine", (size_t)e->B * e->T);
    if (e->hd > 128) mg_fail(MG_EXIT_USAGE, "the CUDA engine supports head dims up to 128 (--dim %d / --heads %d = %d)", e->C, e->H, e->hd);
    e->hd_bucket = e->hd <= 8 ? 8 : e->hd <= 16 ? 16 : e->hd <= 32 ? 32 : e->hd <= 64 ? 64 : 128;
    e->xs = e->bf16 ? sizeof(bf16) : sizeof(float);
    e->lay = mg_layout(e->V, e->T, e->C, e->L);
    choose_attention(e, cfg->attention);
    profile_setup(e);

    // The decay map must agree with mg_decay_ranges, the definition.
    DecayMap *dm = &e->dm;
    dm->layer0 = e->lay.layer0; dm->layer_size = e->lay.layer_size; dm->lnfw = e->lay.lnfw;
    int mats[4] = {MG_QKVW, MG_PROJW, MG_FCW, MG_FCPROJW};
    for (int k = 0; k < 4; k++) { dm->lo[k] = e->lay.in_layer[mats[k]]; dm->hi[k] = dm->lo[k] + e->lay.size[mats[k]]; }
    MgRange *ranges = (MgRange *)mg_malloc((4 + 12 * (size_t)e->L) * sizeof(MgRange));
    int nr = mg_decay_ranges(&e->lay, e->L, ranges);
    for (int r = 0; r < nr; r++)
        if (ranges[r].end > ranges[r].begin &&
            (decays(*dm, ranges[r].begin) != ranges[r].decay || decays(*dm, ranges[r].end - 1) != ranges[r].decay))
            mg_fail(MG_EXIT_USAGE, "internal: the CUDA weight-decay map disagrees with mg_decay_ranges at [%zu, %zu)",
                    ranges[r].begin, ranges[r].end);
    free(ranges);

    CUDA_CHECK(cudaStreamCreate(&e->stream));
    CUDA_CHECK(cudaEventCreateWithFlags(&e->loss_ready, cudaEventDisableTiming));
    CUBLAS_CHECK(cublasLtCreate(&e->lt));
    e->lt_ws = dev_alloc(e, LT_WORKSPACE);

    size_t n = e->lay.n, B = e->B, T = e->T, C = e->C, L = e->L, H = e->H, V = e->V, bt = (size_t)e->BT, xs = e->xs;
    e->params = (float *)dev_alloc(e, n * sizeof(float));
    e->grads = (float *)dev_alloc(e, n * sizeof(float));
    e->m = (float *)dev_alloc(e, n * sizeof(float));
    e->v = (float *)dev_alloc(e, n * sizeof(float));
    e->wx = e->bf16 ? dev_alloc(e, n * xs) : (void *)e->params;

    e->x0 = dev_alloc(e, bt * C * xs);
    e->ln1 = dev_alloc(e, L * bt * C * xs);
    e->qkv = dev_alloc(e, L * bt * 3 * C * xs);
    e->atty = dev_alloc(e, L * bt * C * xs);
    e->res2 = dev_alloc(e, L * bt * C * xs);
    e->ln2 = dev_alloc(e, L * bt * C * xs);
    e->fch = dev_alloc(e, L * bt * 4 * C * xs);
    e->fchg = dev_alloc(e, L * bt * 4 * C * xs);
    e->res3 = dev_alloc(e, L * bt * C * xs);
    e->ln1_mean = (float *)dev_alloc(e, L * bt * sizeof(float));
    e->ln1_rstd = (float *)dev_alloc(e, L * bt * sizeof(float));
    e->ln2_mean = (float *)dev_alloc(e, L * bt * sizeof(float));
    e->ln2_rstd = (float *)dev_alloc(e, L * bt * sizeof(float));
    e->lse = (float *)dev_alloc(e, L * B * H * T * sizeof(float));
    e->lnf = dev_alloc(e, bt * C * xs);
    e->lnf_mean = (float *)dev_alloc(e, bt * sizeof(float));
    e->lnf_rstd = (float *)dev_alloc(e, bt * sizeof(float));
    e->logits = dev_alloc(e, bt * V * xs);
    e->losses = (float *)dev_alloc(e, bt * sizeof(float));
    e->inputs = (int *)dev_alloc(e, bt * sizeof(int));
    e->targets = (int *)dev_alloc(e, bt * sizeof(int));

    e->dres = dev_alloc(e, bt * C * xs);
    e->dln = dev_alloc(e, bt * C * xs);
    e->dqkv = dev_alloc(e, bt * 3 * C * xs);
    e->datty = dev_alloc(e, bt * C * xs);
    e->dfch = dev_alloc(e, bt * 4 * C * xs);
    e->att_D = (float *)dev_alloc(e, B * H * T * sizeof(float));
    e->partial = (float *)dev_alloc(e, (size_t)ceil_div(bt, CS_ROWS) * 4 * C * 2 * sizeof(float));
    e->bucket_tok = (int *)dev_alloc(e, bt * sizeof(int));
    e->bucket_start = (int *)dev_alloc(e, (bt + 1) * sizeof(int));
    e->positions = (int *)dev_alloc(e, bt * sizeof(int));
    e->logits_out = (float *)dev_alloc(e, B * V * sizeof(float));
    e->norm_partial = (double *)dev_alloc(e, NORM_BLOCKS * sizeof(double));
    e->norm_out = (double *)dev_alloc(e, sizeof(double));

    e->h_inputs = (int *)host_alloc(bt * sizeof(int));
    e->h_targets = (int *)host_alloc(bt * sizeof(int));
    e->h_bucket_tok = (int *)host_alloc(bt * sizeof(int));
    e->h_bucket_start = (int *)host_alloc((bt + 1) * sizeof(int));
    e->h_positions = (int *)host_alloc(bt * sizeof(int));
    e->h_cursor = (int *)host_alloc(V * sizeof(int));
    e->h_losses = (float *)host_alloc(bt * sizeof(float));
    e->h_logits = (float *)host_alloc(B * V * sizeof(float));
    e->h_norm = (double *)host_alloc(sizeof(double));

    // Warm-up: one forward+backward on zero weights and tokens makes every
    // GEMM plan and loads every kernel now, not inside the first step. The
    // gradients it leaves are cleared by the driver's zero_grads.
    uint16_t *zeros = (uint16_t *)mg_calloc((size_t)e->B * (e->T + 1), sizeof(uint16_t));
    float *row_loss = (float *)mg_calloc((size_t)e->B, sizeof(float));
    gpu_forward_backward(e, zeros, e->B, 1.0f, row_loss);
    CUDA_CHECK(cudaStreamSynchronize(e->stream));
    CUDA_CHECK(cudaMemsetAsync(e->grads, 0, n * sizeof(float), e->stream));
    CUDA_CHECK(cudaStreamSynchronize(e->stream));
    free(zeros);
    free(row_loss);
    return e->bytes;
}

// main(): binds the gpu_* functions above into the engine table and runs the
// shared driver (train.h). No KV cache: sampling recomputes the window for
// every new token through gpu_last_logits (docs/CUDA.md).
MG_ENGINE_MAIN(Gpu, gpu, "cuda", NULL)

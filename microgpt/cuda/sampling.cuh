// cuda/sampling.cuh: the forward that sampling runs (SAMPLE frames), with a
// KV cache: the CUDA twin of the CPU engine's cpu_kv_forward.
//
// A call runs N new positions of up to B sequences (tokens packed one
// sequence after another, each at its own positions, each in its own slot of
// the cache) through the model and writes the logits of each sequence's last
// new position. The keys and values of every position are stored in the
// slot, so the next call runs only the next token. The recompute path
// (last_logits: the whole window again for every token) runs the very same
// code with every position new, into slots of a scratch region.
//
// Why not the training forward: its matmuls are cuBLASLt's, whose algorithm
// (and so whose rounding) depends on the number of rows, and its attention
// kernels are written for whole sequences. Every op here is row-local
// instead: a row's outputs are computed by the same threads in the same order
// whatever other rows share the launch (the matmul: one warp per output
// element, a fixed chunk order and an xor butterfly; the attention: one block
// per query row and head, keys in order). So a position's logits have the
// same bits whether it came with the whole prompt or alone after a cached
// prefix: the KV cache gives the recompute path's tokens, bit for bit, as
// engine.h's kv_forward contract asks. Decoding is bound by reading the
// weights, once per call for up to SAMPLE_ROWS rows, which this does.
//
// No backward: sampling does not train.
#ifndef MICROGPT_CUDA_SAMPLING_CUH
#define MICROGPT_CUDA_SAMPLING_CUH

#include "../model.h"
#include "common.cuh"
#include "layernorm.cuh"
#include "vec.cuh"

__device__ __forceinline__ float sample_warp_max(float v) {
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

// x[i] = wte[tokens[i]] + wpe[positions[i]], from the fp32 master weights.
template <typename Tx>
__global__ void embedding_at_kernel(Tx *x, const int *tokens, const int *positions, const float *wte, const float *wpe,
                                    int N, int C) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)N * C) return;
    int i = (int)(idx / C), c = (int)(idx % C);
    x[idx] = from_f<Tx>(wte[(size_t)tokens[i] * C + c] + wpe[(size_t)positions[i] * C + c]);
}

// out[r, o] = GELU?((residual[r, o] or 0) + bias[o] + sum_k x[r, k] W[o, k]),
// x [N, IC], W [OC, IC] (the compute copy), bias fp32. A warp owns one output
// column o (blockIdx.x * 8 + warp) for SAMPLE_ROWS rows (blockIdx.y): its
// lanes take the 16-byte chunks lane, lane + 32, ... of W's row o and of each
// x row, multiply-add them in order, and an xor butterfly sums the lanes.
// IC must be whole 16-byte chunks (sampling_applies).
#define SAMPLE_THREADS 256
#define SAMPLE_ROWS 4
template <typename Tx, typename To>
__global__ void __launch_bounds__(SAMPLE_THREADS)
sample_matmul_kernel(To *out, const Tx *x, const Tx *W, const float *bias, const Tx *residual, int N, int IC, int OC,
                     int gelu) {
    const int NV = VecWidth<Tx>::N;
    int lane = threadIdx.x % 32, o = blockIdx.x * (SAMPLE_THREADS / 32) + threadIdx.x / 32;
    int r0 = blockIdx.y * SAMPLE_ROWS;
    if (o >= OC) return;  // whole warps
    float acc[SAMPLE_ROWS];
#pragma unroll
    for (int r = 0; r < SAMPLE_ROWS; r++) acc[r] = 0.0f;
    const Tx *wrow = W + (size_t)o * IC;
    for (int c0 = lane * NV; c0 < IC; c0 += 32 * NV) {
        float w[NV];
        load16(w, wrow + c0);
#pragma unroll
        for (int r = 0; r < SAMPLE_ROWS; r++) {
            if (r0 + r >= N) break;
            float xv[NV];
            load16(xv, x + (size_t)(r0 + r) * IC + c0);
#pragma unroll
            for (int j = 0; j < NV; j++) acc[r] += w[j] * xv[j];
        }
    }
#pragma unroll
    for (int r = 0; r < SAMPLE_ROWS; r++) {
        if (r0 + r >= N) break;
        float v = warp_sum(acc[r]);
        if (lane) continue;
        size_t at = (size_t)(r0 + r) * OC + o;
        v = (bias ? bias[o] : 0.0f) + v;
        if (residual) v = to_f(residual[at]) + v;
        if (gelu) v = 0.5f * v * (1.0f + tanhf(MG_GELU_SCALE * (v + MG_GELU_C * v * v * v)));
        out[at] = from_f<To>(v);
    }
}

// The keys and values of the N new rows (qkv [N, 3C]) into the cache: row
// slots[i] * T + positions[i] of a [slots * T, 3C] region (K and V at their
// columns in qkv's layout; the query third is not stored).
template <typename Tx>
__global__ void kv_store_kernel(Tx *cache, const Tx *qkv, const int *slots, const int *positions, int N, int C, int T) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)N * 2 * C) return;
    int i = (int)(idx / (2 * C)), c = C + (int)(idx % (2 * C));
    cache[((size_t)slots[i] * T + positions[i]) * 3 * C + c] = qkv[(size_t)i * 3 * C + c];
}

// Causal attention of the N new rows against their slots: one block per
// (row, head). The row at position p attends to the cached positions 0..p of
// its slot (its own key included: kv_store_kernel ran first), in chunks of
// SAMPLE_KEYS keys: scores into shared memory, the running max and sum
// rescaled per chunk (online softmax), thread d accumulating output dim d
// over the chunk's keys in order. Fixed orders: the same bits for a position
// whatever else is in the launch.
#define SAMPLE_ATT_THREADS 128
#define SAMPLE_KEYS 1024
template <typename Tx>
__global__ void __launch_bounds__(SAMPLE_ATT_THREADS)
attention_sample_kernel(Tx *y, const Tx *qkv, const Tx *cache, const int *slots, const int *positions, int C, int H,
                        int T, float scale) {
    __shared__ float q[128], p[SAMPLE_KEYS], red[32];
    int i = blockIdx.x, h = blockIdx.y, hd = C / H, t = threadIdx.x;
    int pos = positions[i];
    const Tx *kbase = cache + (size_t)slots[i] * T * 3 * C + C + h * hd;  // key row j: kbase + j * 3C
    const Tx *vbase = kbase + C;
    if (t < hd) q[t] = to_f(qkv[(size_t)i * 3 * C + h * hd + t]);
    float m = -INFINITY, l = 0.0f, o = 0.0f;
    for (int k0 = 0; k0 <= pos; k0 += SAMPLE_KEYS) {
        int kn = min(SAMPLE_KEYS, pos + 1 - k0);
        __syncthreads();  // q is written; p is free again
        float cmax = -INFINITY;
        for (int j = t; j < kn; j += SAMPLE_ATT_THREADS) {
            const Tx *k = kbase + (size_t)(k0 + j) * 3 * C;
            float s = 0.0f;
            for (int d = 0; d < hd; d++) s += q[d] * to_f(k[d]);
            s *= scale;
            p[j] = s;
            cmax = fmaxf(cmax, s);
        }
        cmax = sample_warp_max(cmax);
        if (t % 32 == 0) red[t / 32] = cmax;
        __syncthreads();
        float mnew = m;
        for (int w = 0; w < SAMPLE_ATT_THREADS / 32; w++) mnew = fmaxf(mnew, red[w]);
        float corr = expf(m - mnew);  // 0 at the first chunk (m = -inf)
        for (int j = t; j < kn; j += SAMPLE_ATT_THREADS) p[j] = expf(p[j] - mnew);
        __syncthreads();
        float lsum = 0.0f, osum = 0.0f;
        for (int j = 0; j < kn; j++) {
            lsum += p[j];
            if (t < hd) osum += p[j] * to_f(vbase[(size_t)(k0 + j) * 3 * C + t]);
        }
        l = l * corr + lsum;
        o = o * corr + osum;
        m = mnew;
    }
    if (t < hd) y[(size_t)i * C + h * hd + t] = from_f<Tx>(o / l);
}

// out[r] = x[rows[r]]: the rows whose logits are wanted (each sequence's last new position).
template <typename Tx>
__global__ void gather_rows_kernel(Tx *out, const Tx *x, const int *rows, int R, int C) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)R * C) return;
    int r = (int)(idx / C), c = (int)(idx % C);
    out[idx] = x[(size_t)rows[r] * C + c];
}

// ----------------------------------------------------------------------------
// Host side.

// Sampling runs on the GPU where the rows are whole 16-byte chunks (C, 4C
// and so every matmul's inner width) and a head fits a block (hd <= 128).
template <typename Tx> static int sampling_applies(int C, int H) {
    return C % VecWidth<Tx>::N == 0 && C / H <= 128;
}

// Rows in launches of at most 65535 row groups (gridDim.y's limit).
template <typename Tx, typename To>
static void sample_matmul(To *out, const Tx *x, const Tx *W, const float *bias, const Tx *residual, int N, int IC,
                          int OC, int gelu, cudaStream_t stream) {
    const int most = 65535 * SAMPLE_ROWS;
    for (int r0 = 0; r0 < N; r0 += most) {
        int n = N - r0 < most ? N - r0 : most;
        dim3 grid(ceil_div(OC, SAMPLE_THREADS / 32), ceil_div(n, SAMPLE_ROWS));
        LAUNCH(grid, SAMPLE_THREADS, 0, stream, sample_matmul_kernel<Tx, To>)(
            out + (size_t)r0 * OC, x + (size_t)r0 * IC, W, bias, residual ? residual + (size_t)r0 * OC : residual, n,
            IC, OC, gelu);
        LAUNCH_CHECK();
    }
}

// What sampling_forward reads and where it works. The weights: the fp32
// master (params: embeddings, biases, LayerNorm) and the compute copy (wx:
// matmul weights), in the flat layout `lay` of L layers. The cache: L layers
// of `layer_stride` elements, each [slots * T, 3C]. Scratch (device, Tx
// unless said): x_a, x_b, x2, ln, att [N, C]; qkv [N, 3C]; h [N, 4C]; last,
// last_ln [R, C]; mean, rstd [N] floats. Inputs (device ints): tokens,
// positions, slots [N]; last_rows [R] (the packed row of each sequence's
// last new position).
template <typename Tx> struct SampleBuffers {
    const float *params;
    const Tx *wx;
    MgLayout lay;
    int L, C, H, T, V;
    Tx *cache;
    size_t layer_stride;
    Tx *x_a, *x_b, *x2, *ln, *att, *qkv, *h, *last, *last_ln;
    float *mean, *rstd;
    const int *tokens, *positions, *slots, *last_rows;
};

// The logits of R sequences' last new positions, out [R, V] (fp32), from N new rows.
template <typename Tx>
static void sampling_forward(const SampleBuffers<Tx> &s, int N, int R, float *out, cudaStream_t stream) {
    int C = s.C;
    const float *P = s.params;
    const Tx *Wx = s.wx;
    const MgLayout *lay = &s.lay;
    LAUNCH(ceil_div((size_t)N * C, 256), 256, 0, stream, embedding_at_kernel<Tx>)(s.x_a, s.tokens, s.positions,
                                                                                   P + lay->wte, P + lay->wpe, N, C);
    LAUNCH_CHECK();
    Tx *x = s.x_a, *next = s.x_b;
    float scale = 1.0f / sqrtf((float)(C / s.H));
    for (int l = 0; l < s.L; l++) {
        Tx *cache = s.cache + (size_t)l * s.layer_stride;
        layernorm_forward<Tx>(s.ln, s.mean, s.rstd, x, P + mg_param(lay, l, MG_LN1W), P + mg_param(lay, l, MG_LN1B), N,
                              C, stream);
        sample_matmul<Tx, Tx>(s.qkv, s.ln, Wx + mg_param(lay, l, MG_QKVW), P + mg_param(lay, l, MG_QKVB), NULL, N, C,
                              3 * C, 0, stream);
        LAUNCH(ceil_div((size_t)N * 2 * C, 256), 256, 0, stream, kv_store_kernel<Tx>)(cache, s.qkv, s.slots,
                                                                                      s.positions, N, C, s.T);
        LAUNCH_CHECK();
        LAUNCH(dim3(N, s.H), SAMPLE_ATT_THREADS, 0, stream, attention_sample_kernel<Tx>)(s.att, s.qkv, cache, s.slots,
                                                                                        s.positions, C, s.H, s.T,
                                                                                        scale);
        LAUNCH_CHECK();
        sample_matmul<Tx, Tx>(s.x2, s.att, Wx + mg_param(lay, l, MG_PROJW), P + mg_param(lay, l, MG_PROJB), x, N, C, C,
                              0, stream);
        layernorm_forward<Tx>(s.ln, s.mean, s.rstd, s.x2, P + mg_param(lay, l, MG_LN2W), P + mg_param(lay, l, MG_LN2B),
                              N, C, stream);
        sample_matmul<Tx, Tx>(s.h, s.ln, Wx + mg_param(lay, l, MG_FCW), P + mg_param(lay, l, MG_FCB), NULL, N, C,
                              4 * C, 1, stream);
        sample_matmul<Tx, Tx>(next, s.h, Wx + mg_param(lay, l, MG_FCPROJW), P + mg_param(lay, l, MG_FCPROJB), s.x2, N,
                              4 * C, C, 0, stream);
        Tx *t = x;
        x = next;
        next = t;
    }
    LAUNCH(ceil_div((size_t)R * C, 256), 256, 0, stream, gather_rows_kernel<Tx>)(s.last, x, s.last_rows, R, C);
    LAUNCH_CHECK();
    layernorm_forward<Tx>(s.last_ln, s.mean, s.rstd, s.last, P + lay->lnfw, P + lay->lnfb, R, C, stream);
    sample_matmul<Tx, float>(out, s.last_ln, Wx + lay->wte, NULL, NULL, R, C, s.V, 0, stream);
}

#endif  // MICROGPT_CUDA_SAMPLING_CUH

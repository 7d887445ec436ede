// cuda/attention.cuh: causal self-attention, forward and backward, and the
// choice between its two implementations (--attention): the naive kernels
// here and the tensor-core ones of attention_flash.cuh. Both keep one
// contract:
//   qkv  [B, T, 3C]  rows [q | k | v], each C wide, heads contiguous (hd = C/H)
//   y    [B, T, C]   the attention output
//   lse  [B*H, T]    natural-log log-sum-exp of each query row's scaled scores
//   D    [B*H, T]    D_i = dY_i . Y_i (backward scratch)
//   dqkv [B, T, 3C]  written (not accumulated) by the backward
// The T x T probabilities are never stored (the CPU engine stores them).
//
// The naive kernels, flash-style on CUDA cores (fp32 FMA). A group of G
// consecutive lanes owns one query row (forward, dQ) or one key row (dK/dV);
// lane `part` of the group holds dims d*G + part (interleaved, so the group
// reads consecutive shared-memory words: no bank conflicts). Dot products are
// summed over the group with an xor butterfly. K/V (or Q/dY) tiles are staged
// through shared memory as fp32. The forward keeps an online softmax per row
// and saves the log-sum-exp; the backward recomputes the probabilities from
// it (FlashAttention-2), with D_i = dY_i . Y_i. Deterministic without
// atomics: dQ and dK/dV are separate kernels, each row of each summing its
// terms sequentially in key (or query) order. They are the simple, exact
// version: the only one in fp32 and for any head dim up to 128, the default
// (--attention naive), and the reference the flash kernels are checked
// against.
#ifndef MICROGPT_CUDA_ATTENTION_CUH
#define MICROGPT_CUDA_ATTENTION_CUH

#include <type_traits>

#include "attention_flash.cuh"
#include "common.cuh"

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
// Host side.

// Which kernels run attention (--attention): ATTENTION_FLASH only in bf16 at
// head dims 32, 64 and 128; ATTENTION_CUDNN (attention_cudnn.h, a library
// call the engine makes itself) only in bf16, in a build with cuDNN, where
// cuDNN supports the shape. The engine's init decides, and falls back to
// naive elsewhere.
typedef enum { ATTENTION_NAIVE, ATTENTION_FLASH, ATTENTION_CUDNN } AttentionKind;
static const char *attention_name(AttentionKind k) {
    return k == ATTENTION_CUDNN ? "cudnn" : k == ATTENTION_FLASH ? "flash" : "naive";
}

// The head dim is a template parameter of the naive kernels (register arrays
// need constant sizes): the smallest bucket that holds it, the rest
// zero-padded. Head dims above 128 are refused by the engine's init.
static int attention_hd_bucket(int hd) { return hd <= 8 ? 8 : hd <= 16 ? 16 : hd <= 32 ? 32 : hd <= 64 ? 64 : 128; }

template <typename Tx, int HD>
static void attention_forward_naive(Tx *y, float *lse, const Tx *qkv, int B, int T, int C, int H, cudaStream_t stream) {
    int hd = C / H;
    dim3 grid(ceil_div(T, AttShape<HD>::ROWS), B * H);
    LAUNCH(grid, ATT_THREADS, 0, stream, attention_forward_kernel<Tx, HD>)(y, lse, qkv, T, C, H, hd,
                                                                           1.0f / sqrtf((float)hd));
    LAUNCH_CHECK();
}

template <typename Tx, int HD>
static void attention_backward_naive(Tx *dqkv, const Tx *dy, const Tx *y, const Tx *qkv, const float *lse, int B, int T,
                                     int C, int H, float *D, cudaStream_t stream) {
    int hd = C / H;
    dim3 grid(ceil_div(T, AttShape<HD>::ROWS), B * H);
    float scale = 1.0f / sqrtf((float)hd);
    LAUNCH(grid, ATT_THREADS, 0, stream, attention_backward_dq_kernel<Tx, HD>)(dqkv, D, dy, y, qkv, lse, T, C, H, hd,
                                                                               scale);
    LAUNCH_CHECK();
    LAUNCH(grid, ATT_THREADS, 0, stream, attention_backward_dkv_kernel<Tx, HD>)(dqkv, dy, qkv, lse, D, T, C, H, hd,
                                                                                scale);
    LAUNCH_CHECK();
}

// y and lse from qkv.
template <typename Tx>
static void attention_forward(Tx *y, float *lse, const Tx *qkv, int B, int T, int C, int H, AttentionKind kind,
                              cudaStream_t stream) {
    if constexpr (std::is_same<Tx, bf16>::value) {
        if (kind == ATTENTION_FLASH) {
            CUDA_CHECK(flash_attention_forward(stream, y, lse, qkv, B, T, C, H, C / H));
            return;
        }
    }
    switch (attention_hd_bucket(C / H)) {
    case 8: attention_forward_naive<Tx, 8>(y, lse, qkv, B, T, C, H, stream); break;
    case 16: attention_forward_naive<Tx, 16>(y, lse, qkv, B, T, C, H, stream); break;
    case 32: attention_forward_naive<Tx, 32>(y, lse, qkv, B, T, C, H, stream); break;
    case 64: attention_forward_naive<Tx, 64>(y, lse, qkv, B, T, C, H, stream); break;
    default: attention_forward_naive<Tx, 128>(y, lse, qkv, B, T, C, H, stream); break;
    }
}

// dqkv from dy and the forward's y, qkv and lse; D: [B*H, T] floats of scratch.
template <typename Tx>
static void attention_backward(Tx *dqkv, const Tx *dy, const Tx *y, const Tx *qkv, const float *lse, int B, int T,
                               int C, int H, float *D, AttentionKind kind, cudaStream_t stream) {
    if constexpr (std::is_same<Tx, bf16>::value) {
        if (kind == ATTENTION_FLASH) {
            CUDA_CHECK(flash_attention_backward(stream, dqkv, D, dy, y, qkv, lse, B, T, C, H, C / H));
            return;
        }
    }
    switch (attention_hd_bucket(C / H)) {
    case 8: attention_backward_naive<Tx, 8>(dqkv, dy, y, qkv, lse, B, T, C, H, D, stream); break;
    case 16: attention_backward_naive<Tx, 16>(dqkv, dy, y, qkv, lse, B, T, C, H, D, stream); break;
    case 32: attention_backward_naive<Tx, 32>(dqkv, dy, y, qkv, lse, B, T, C, H, D, stream); break;
    case 64: attention_backward_naive<Tx, 64>(dqkv, dy, y, qkv, lse, B, T, C, H, D, stream); break;
    default: attention_backward_naive<Tx, 128>(dqkv, dy, y, qkv, lse, B, T, C, H, D, stream); break;
    }
}

#endif  // MICROGPT_CUDA_ATTENTION_CUH

// cuda/embedding.cuh: the token and position embeddings, forward and backward.
#ifndef MICROGPT_CUDA_EMBEDDING_CUH
#define MICROGPT_CUDA_EMBEDDING_CUH

#include "common.cuh"
#include "vec.cuh"

// x0[b,t] = wte[token] + wpe[t], from the fp32 master weights.
template <typename Tx>
__global__ void embedding_forward_kernel(Tx *x0, const int *inputs, const float *wte, const float *wpe, int BT, int T,
                                         int C) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)BT * C) return;
    int i = (int)(idx / C), c = (int)(idx % C);
    x0[idx] = from_f<Tx>(wte[(size_t)inputs[i] * C + c] + wpe[(size_t)(i % T) * C + c]);
}

// Backward of the token embedding. A token's row collects one contribution
// per position holding it; instead of atomics, the host sorts positions by
// token (embedding_buckets: counting sort, positions ascending) and one block
// owns each distinct token, adding its positions in order: the CPU engine's
// summation order.
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

// The same for the fused step (--fused): a warp per bucket (warps striding
// over the buckets), a lane per 16-byte chunk of the row (lane, lane + 32,
// ...), so each position's row is read with 16-byte loads; the bucket count
// is read from device memory (*n_buckets), so the grid does not depend on
// the batch and the launch can sit in a CUDA graph. Each element adds the
// same positions in the same order as wte_backward_kernel: the same bits.
#define WTE_THREADS 256
template <typename Tx>
__global__ void __launch_bounds__(WTE_THREADS)
wte_backward_fused_kernel(float *dwte, const Tx *dx, const int *bucket_tok, const int *bucket_start,
                          const int *positions, const int *n_buckets, int C) {
    const int N = VecWidth<Tx>::N;
    int lane = threadIdx.x % 32, nu = *n_buckets;
    int warps = gridDim.x * (WTE_THREADS / 32);
    for (int u = blockIdx.x * (WTE_THREADS / 32) + threadIdx.x / 32; u < nu; u += warps) {
        int tok = bucket_tok[u], begin = bucket_start[u], end = bucket_start[u + 1];
        for (int c0 = lane * N; c0 < C; c0 += 32 * N) {
            float acc[N];
            float *out = dwte + (size_t)tok * C + c0;
#pragma unroll
            for (int j = 0; j < N; j += 4) load4f(acc + j, out + j);
            for (int k = begin; k < end; k++) {
                float v[N];
                load16(v, dx + (size_t)positions[k] * C + c0);
#pragma unroll
                for (int j = 0; j < N; j++) acc[j] += v[j];
            }
#pragma unroll
            for (int j = 0; j < N; j += 4) store4f(out + j, acc + j);
        }
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
// Host side.

// The positions of a micro-batch sorted by token, the buckets
// wte_backward_kernel reads (host arrays; the engine uploads them): bucket u
// is token bucket_tok[u] at positions[bucket_start[u] .. bucket_start[u+1]),
// positions ascending. cursor is [V] scratch. Returns the number of buckets.
static int embedding_buckets(const int *inputs, int BT, int V, int *cursor, int *bucket_tok, int *bucket_start,
                             int *positions) {
    int u = 0, acc = 0;
    memset(cursor, 0, V * sizeof(int));
    for (int i = 0; i < BT; i++) cursor[inputs[i]]++;
    for (int v = 0; v < V; v++) {
        int count = cursor[v];
        if (!count) continue;
        bucket_tok[u] = v;
        bucket_start[u++] = acc;
        cursor[v] = acc;
        acc += count;
    }
    bucket_start[u] = acc;
    for (int i = 0; i < BT; i++) positions[cursor[inputs[i]]++] = i;
    return u;
}

template <typename Tx>
static void embedding_forward(Tx *x0, const int *inputs, const float *wte, const float *wpe, int BT, int T, int C,
                              cudaStream_t stream) {
    LAUNCH(ceil_div((size_t)BT * C, 256), 256, 0, stream, embedding_forward_kernel<Tx>)(x0, inputs, wte, wpe, BT, T, C);
    LAUNCH_CHECK();
}

// dwte += the rows of dx by token (the device copies of embedding_buckets'
// n_buckets buckets), dwpe += the rows of dx by position.
template <typename Tx>
static void embedding_backward(float *dwte, float *dwpe, const Tx *dx, const int *bucket_tok, const int *bucket_start,
                               const int *positions, int n_buckets, int BT, int T, int C, cudaStream_t stream) {
    if (n_buckets > 0) {
        LAUNCH(n_buckets, 128, 0, stream, wte_backward_kernel<Tx>)(dwte, dx, bucket_tok, bucket_start, positions, C);
        LAUNCH_CHECK();
    }
    LAUNCH(ceil_div((size_t)T * C, 256), 256, 0, stream, wpe_backward_kernel<Tx>)(dwpe, dx, BT / T, T, C);
    LAUNCH_CHECK();
}

// The fused wte backward applies to rows of whole 16-byte chunks (and so
// 16-byte aligned rows of dx and of the fp32 dwte).
template <typename Tx> static int embedding_backward_fused_applies(int C) { return C % VecWidth<Tx>::N == 0; }

// As embedding_backward, for the fused step: the bucket count in device
// memory (n_buckets, an int), max_buckets (at most the micro-batch's
// positions, or the vocabulary if smaller) sizing the grid.
template <typename Tx>
static void embedding_backward_fused(float *dwte, float *dwpe, const Tx *dx, const int *bucket_tok,
                                     const int *bucket_start, const int *positions, const int *n_buckets,
                                     int max_buckets, int BT, int T, int C, cudaStream_t stream) {
    LAUNCH(ceil_div(max_buckets, WTE_THREADS / 32), WTE_THREADS, 0, stream, wte_backward_fused_kernel<Tx>)(
        dwte, dx, bucket_tok, bucket_start, positions, n_buckets, C);
    LAUNCH_CHECK();
    LAUNCH(ceil_div((size_t)T * C, 256), 256, 0, stream, wpe_backward_kernel<Tx>)(dwpe, dx, BT / T, T, C);
    LAUNCH_CHECK();
}

#endif  // MICROGPT_CUDA_EMBEDDING_CUH

// cuda/classifier.cuh: the softmax cross-entropy over the vocabulary, its
// forward and backward fused in one kernel, and the logits sampling reads.
#ifndef MICROGPT_CUDA_CLASSIFIER_CUH
#define MICROGPT_CUDA_CLASSIFIER_CUH

#include "common.cuh"
#include "vec.cuh"

// One block per row (position): an online max/sum pass over the logits, the
// loss, then (training) the logits are overwritten in place by their
// gradient (softmax - onehot) * grad_scale. Fused because the backward needs
// exactly what the forward has in hand (the row's max and sum), so the
// probabilities are never stored and the row is read twice and written once.
// A target < 0 marks a padded row: loss 0, gradient 0.
#define CE_THREADS 256
template <typename Tx>
__global__ void __launch_bounds__(CE_THREADS)
fused_classifier_kernel(Tx *logits, float *losses, const int *targets, int V, float grad_scale, int write_grad) {
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

// The same with the row held in shared memory (the fused step, --fused): the
// logits are read from global memory once, 16 bytes at a time, the online
// max and sum taken as they arrive; the loss and the gradient then come from
// shared memory, and the gradient is written once. (The kernel above reads
// the row twice.) The row must fit the block's shared memory
// (fused_classifier_smem_bytes) and be whole 16-byte chunks.
#define CE_SMEM_THREADS 512
template <typename Tx>
__global__ void __launch_bounds__(CE_SMEM_THREADS)
fused_classifier_smem_kernel(Tx *logits, float *losses, const int *targets, int V, float grad_scale, int write_grad) {
    const int N = VecWidth<Tx>::N;
    __shared__ float sm[32], ss[32];
    Tx *row = reinterpret_cast<Tx *>(dynamic_smem());  // [V]
    int r = blockIdx.x, target = targets[r];
    Tx *x = logits + (size_t)r * V;
    float m = -INFINITY, s = 0.0f;
    for (int c0 = threadIdx.x * N; c0 < V; c0 += CE_SMEM_THREADS * N) {
        uint4 raw = *reinterpret_cast<const uint4 *>(x + c0);
        *reinterpret_cast<uint4 *>(row + c0) = raw;
        Tx v[N];
        memcpy(v, &raw, sizeof raw);
#pragma unroll
        for (int j = 0; j < N; j++) {
            float f = to_f(v[j]);
            if (f > m) { s = s * expf(m - f) + 1.0f; m = f; }
            else s += expf(f - m);
        }
    }
    for (int off = 16; off > 0; off >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, off), s2 = __shfl_xor_sync(0xffffffffu, s, off);
        float mn = fmaxf(m, m2);
        s = (m == -INFINITY ? 0.0f : s * expf(m - mn)) + (m2 == -INFINITY ? 0.0f : s2 * expf(m2 - mn));
        m = mn;
    }
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0) { sm[warp] = m; ss[warp] = s; }
    __syncthreads();  // also: the whole row is in shared memory
    float maxv = -INFINITY;
    for (int w = 0; w < CE_SMEM_THREADS / 32; w++) maxv = fmaxf(maxv, sm[w]);
    float sum = 0.0f;
    for (int w = 0; w < CE_SMEM_THREADS / 32; w++) sum += sm[w] == -INFINITY ? 0.0f : ss[w] * expf(sm[w] - maxv);
    if (threadIdx.x == 0) losses[r] = target < 0 ? 0.0f : logf(sum) - (to_f(row[target]) - maxv);
    if (!write_grad) return;
    float inv = 1.0f / sum;
    for (int c0 = threadIdx.x * N; c0 < V; c0 += CE_SMEM_THREADS * N) {
        Tx v[N];
        memcpy(v, row + c0, sizeof v);
        float g[N];
#pragma unroll
        for (int j = 0; j < N; j++)
            g[j] = target < 0 ? 0.0f : (expf(to_f(v[j]) - maxv) * inv - (c0 + j == target ? 1.0f : 0.0f)) * grad_scale;
        store16(x + c0, g);
    }
}

// The logits of row r at position pos (sampling), converted to fp32. No
// backward: sampling does not train.
template <typename Tx>
__global__ void gather_logits_kernel(float *out, const Tx *logits, int rows, int T, int pos, int V) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)rows * V) return;
    int r = (int)(idx / V), v = (int)(idx % V);
    out[idx] = to_f(logits[((size_t)r * T + pos) * V + v]);
}

// ----------------------------------------------------------------------------
// Host side.

// losses[BT] from logits[BT, V] and targets; with write_grad the logits
// become their gradient, times grad_scale.
template <typename Tx>
static void fused_classifier(Tx *logits, float *losses, const int *targets, int BT, int V, float grad_scale,
                             int write_grad, cudaStream_t stream) {
    LAUNCH(BT, CE_THREADS, 0, stream, fused_classifier_kernel<Tx>)(logits, losses, targets, V, grad_scale, write_grad);
    LAUNCH_CHECK();
}

// The shared memory fused_classifier_smem_kernel needs for a row of V, and
// whether it applies: V whole 16-byte chunks, the row within what the GPU
// allows a block (smem_optin, cudaDeviceProp::sharedMemPerBlockOptin).
template <typename Tx> static size_t fused_classifier_smem_bytes(int V) { return (size_t)V * sizeof(Tx); }
template <typename Tx> static int fused_classifier_smem_applies(int V, size_t smem_optin) {
    return V % VecWidth<Tx>::N == 0 && fused_classifier_smem_bytes<Tx>(V) <= smem_optin;
}
template <typename Tx> static cudaError_t fused_classifier_smem_setup(int V) {
    return cudaFuncSetAttribute(fused_classifier_smem_kernel<Tx>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)fused_classifier_smem_bytes<Tx>(V));
}

// As fused_classifier, with the row in shared memory (after
// fused_classifier_smem_setup; logits 16-byte aligned).
template <typename Tx>
static void fused_classifier_smem(Tx *logits, float *losses, const int *targets, int BT, int V, float grad_scale,
                                  int write_grad, cudaStream_t stream) {
    LAUNCH(BT, CE_SMEM_THREADS, fused_classifier_smem_bytes<Tx>(V), stream, fused_classifier_smem_kernel<Tx>)(
        logits, losses, targets, V, grad_scale, write_grad);
    LAUNCH_CHECK();
}

// out[rows, V] = logits[r, pos] of rows r < rows of a [rows', T, V] tensor.
template <typename Tx>
static void gather_logits(float *out, const Tx *logits, int rows, int T, int pos, int V, cudaStream_t stream) {
    size_t n = (size_t)rows * V;
    LAUNCH(ceil_div(n, 256), 256, 0, stream, gather_logits_kernel<Tx>)(out, logits, rows, T, pos, V);
    LAUNCH_CHECK();
}

#endif  // MICROGPT_CUDA_CLASSIFIER_CUH

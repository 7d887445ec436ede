// cuda/gelu.cuh: GELU, tanh approximation (MG_GELU_SCALE, MG_GELU_C: the
// CPU engine's and PyTorch's formula), forward and backward, elementwise.
// For the unfused FC matmul; in bf16 cuBLASLt's GELU_AUX_BIAS and DGELU
// epilogues do both inside the GEMMs (matmul.cuh).
#ifndef MICROGPT_CUDA_GELU_CUH
#define MICROGPT_CUDA_GELU_CUH

#include "../model.h"
#include "common.cuh"

template <typename Tx>
__global__ void gelu_forward_kernel(Tx *out, const Tx *in, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = to_f(in[i]);
    out[i] = from_f<Tx>(0.5f * x * (1.0f + tanhf(MG_GELU_SCALE * (x + MG_GELU_C * x * x * x))));
}

// dx = dout * gelu'(x); dx may be dout (each element is read before it is
// written, by the same thread).
template <typename Tx>
__global__ void gelu_backward_kernel(Tx *dx, const Tx *x, const Tx *dout, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float xi = to_f(x[i]), u = MG_GELU_SCALE * (xi + MG_GELU_C * xi * xi * xi);
    float th = tanhf(u), sech2 = 1.0f - th * th;
    float grad = 0.5f * (1.0f + th) + 0.5f * xi * sech2 * MG_GELU_SCALE * (1.0f + 3.0f * MG_GELU_C * xi * xi);
    dx[i] = from_f<Tx>(to_f(dout[i]) * grad);
}

// ----------------------------------------------------------------------------
// Host side.

template <typename Tx>
static void gelu_forward(Tx *out, const Tx *x, size_t n, cudaStream_t stream) {
    LAUNCH(ceil_div(n, 256), 256, 0, stream, gelu_forward_kernel<Tx>)(out, x, n);
    LAUNCH_CHECK();
}

template <typename Tx>
static void gelu_backward(Tx *dx, const Tx *x, const Tx *dout, size_t n, cudaStream_t stream) {
    LAUNCH(ceil_div(n, 256), 256, 0, stream, gelu_backward_kernel<Tx>)(dx, x, dout, n);
    LAUNCH_CHECK();
}

#endif  // MICROGPT_CUDA_GELU_CUH

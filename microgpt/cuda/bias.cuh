// cuda/bias.cuh: a bias (and a residual) added over the rows of a matmul's
// output, and the bias gradient. For the unfused matmuls (fp32 mode, and bf16
// where cuBLASLt refuses an epilogue): the output is first set to residual +
// bias, then the GEMM adds x W^T onto it (beta = 1), the CPU engine's order.
// The residual's backward is the identity (the gradient passes through
// unchanged), so only the bias has a backward kernel: a column sum.
#ifndef MICROGPT_CUDA_BIAS_CUH
#define MICROGPT_CUDA_BIAS_CUH

#include "colsum.cuh"
#include "common.cuh"

// out[R, W] = (residual or 0) + (bias or 0), bias broadcast over rows.
template <typename Tx>
__global__ void bias_residual_kernel(Tx *out, const Tx *residual, const float *bias, int R, int W) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)R * W) return;
    float v = bias ? bias[idx % W] : 0.0f;
    if (residual) v = to_f(residual[idx]) + v;
    out[idx] = from_f<Tx>(v);
}

// ----------------------------------------------------------------------------
// Host side.

template <typename Tx>
static void bias_residual_forward(Tx *out, const Tx *residual, const float *bias, int R, int W, cudaStream_t stream) {
    LAUNCH(ceil_div((size_t)R * W, 256), 256, 0, stream, bias_residual_kernel<Tx>)(out, residual, bias, R, W);
    LAUNCH_CHECK();
}

// db[W] += column sums of dout[R, W]. partial: colsum_scratch_floats(R, W) floats.
template <typename Tx>
static void bias_backward(float *db, const Tx *dout, int R, int W, float *partial, cudaStream_t stream) {
    colsum<Tx, 0>(db, NULL, dout, (const Tx *)NULL, NULL, NULL, R, W, partial, stream);
}

// The same with 16-byte loads (the fused step, --fused), the same bits; where
// colsum_vec_applies does not hold, the kernels above.
template <typename Tx>
static void bias_backward_fused(float *db, const Tx *dout, int R, int W, float *partial, cudaStream_t stream) {
    if (colsum_vec_applies(dout, W)) colsum_vec<Tx>(db, dout, R, W, partial, stream);
    else bias_backward<Tx>(db, dout, R, W, partial, stream);
}

#endif  // MICROGPT_CUDA_BIAS_CUH

// cuda/convert.cuh: fp32 to the activation type, elementwise: the bf16
// compute copy of the weights, refreshed after a state upload (AdamW keeps
// it current after each update itself). No backward.
#ifndef MICROGPT_CUDA_CONVERT_CUH
#define MICROGPT_CUDA_CONVERT_CUH

#include "common.cuh"

template <typename Tx>
__global__ void convert_kernel(Tx *out, const float *in, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) out[i] = from_f<Tx>(in[i]);
}

template <typename Tx>
static void convert(Tx *out, const float *in, size_t n, cudaStream_t stream) {
    LAUNCH(1024, 256, 0, stream, convert_kernel<Tx>)(out, in, n);
    LAUNCH_CHECK();
}

#endif  // MICROGPT_CUDA_CONVERT_CUH

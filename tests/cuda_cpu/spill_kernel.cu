// spill_kernel.cu: a kernel made to spill, for test_sass_gates.py (the gates
// must fail on it): 64 accumulators, all live across a loop, in at most 32
// registers (1024 threads, 2 blocks per SM).
__global__ void __launch_bounds__(1024, 2) spill_kernel(float *out, const float *in, int n) {
    float acc[64];
#pragma unroll
    for (int k = 0; k < 64; k++) acc[k] = in[k * blockDim.x + threadIdx.x];
    for (int i = 0; i < n; i++) {
        float x = in[i];
#pragma unroll
        for (int k = 0; k < 64; k++) acc[k] = fmaf(acc[k], x, acc[(k + 7) % 64] * acc[(k + 29) % 64]);
    }
#pragma unroll
    for (int k = 0; k < 64; k++) out[k * blockDim.x + threadIdx.x] = acc[k];
}

// cuda/vec.cuh: 16-byte loads and stores of activations, for the fused step
// kernels (--fused). One 16-byte access moves VecWidth<Tx>::N values (8 bf16
// or 4 fp32) where a scalar access moves one: fewer instructions in flight
// for the same bytes, which is what a bandwidth-bound kernel needs. The
// address must be 16-byte aligned: row starts are when the row width is a
// multiple of N (the host launchers check it and keep the scalar kernels
// otherwise). The bytes go through memcpy, never through a pointer of another
// type: nvcc turns the copy into register moves, and C++'s aliasing rules
// hold for the host compiler too.
#ifndef MICROGPT_CUDA_VEC_CUH
#define MICROGPT_CUDA_VEC_CUH

#include "common.cuh"

template <typename Tx> struct VecWidth {
    static const int N = 16 / (int)sizeof(Tx);  // values per 16 bytes
};

// out[0..N) = p[0..N) as fp32.
template <typename Tx> __device__ __forceinline__ void load16(float *out, const Tx *p) {
    uint4 raw = *reinterpret_cast<const uint4 *>(p);
    Tx v[VecWidth<Tx>::N];
    memcpy(v, &raw, sizeof raw);
#pragma unroll
    for (int k = 0; k < VecWidth<Tx>::N; k++) out[k] = to_f(v[k]);
}

// p[0..N) = in[0..N), rounded to Tx (round to nearest even for bf16).
template <typename Tx> __device__ __forceinline__ void store16(Tx *p, const float *in) {
    Tx v[VecWidth<Tx>::N];
#pragma unroll
    for (int k = 0; k < VecWidth<Tx>::N; k++) v[k] = from_f<Tx>(in[k]);
    uint4 raw;
    memcpy(&raw, v, sizeof raw);
    *reinterpret_cast<uint4 *>(p) = raw;
}

// Four fp32 values, 16 bytes.
__device__ __forceinline__ void load4f(float *out, const float *p) {
    uint4 raw = *reinterpret_cast<const uint4 *>(p);
    memcpy(out, &raw, sizeof raw);
}
__device__ __forceinline__ void store4f(float *p, const float *in) {
    uint4 raw;
    memcpy(&raw, in, sizeof raw);
    *reinterpret_cast<uint4 *>(p) = raw;
}

// p is 16-byte aligned.
static inline int aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

#endif  // MICROGPT_CUDA_VEC_CUH

// cuda/ptx.cuh: the PTX instructions the tensor-core kernels
// (attention_flash.cuh) rest on, each behind a small named device function:
// cp.async with its commit and wait groups, ldmatrix, and mma.sync
// m16n8k16 bf16. Under nvcc each is its inline PTX, with a "memory" clobber
// so that the compiler never moves ordinary shared-memory accesses across
// it; cp.async and bf16 mma need sm_80, and a build for an older target
// still compiles (the engine never selects these kernels there: bf16 itself
// needs sm_80) and traps if reached. Under the host compiler each is the CPU
// execution layer's model of the instruction (tests/cuda_cpu/cuda_on_cpu.cpp),
// written from the same PTX ISA semantics.
#ifndef MICROGPT_CUDA_PTX_CUH
#define MICROGPT_CUDA_PTX_CUH

#include "common.cuh"

#if defined(__CUDACC__)

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define PTX_SM80(code) __trap()
#else
#define PTX_SM80(code) code
#endif

__device__ __forceinline__ uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

// 16 bytes global -> shared, asynchronously; zero-fills when !valid (nothing
// is read then, but the address must still be a legal one). The data is
// there for this thread only after the cp_async_wait that covers its group.
__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool valid) {
    PTX_SM80(asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                          "r"(valid ? 16 : 0)
                          : "memory"));
}
// Closes this thread's group of cp.async copies issued since the last commit.
__device__ __forceinline__ void cp_async_commit() { PTX_SM80(asm volatile("cp.async.commit_group;\n" ::: "memory")); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N> __device__ __forceinline__ void cp_async_wait() {
    PTX_SM80(asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"));
}

// Four 8x8 bf16 matrices from shared memory, warp-collective; lanes 8m..8m+7
// give the row addresses of matrix m, and register m of lane l receives (row
// l/4, cols 2(l%4), 2(l%4)+1) of matrix m; with .trans, (rows 2(l%4),
// 2(l%4)+1, col l/4) instead.
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const __nv_bfloat16 *row) {
    PTX_SM80(asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                          : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                          : "r"(smem_addr(row))
                          : "memory"));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const __nv_bfloat16 *row) {
    PTX_SM80(asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                          : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                          : "r"(smem_addr(row))
                          : "memory"));
}

// c += a b: one 16x8x16 product, bf16 in, fp32 accumulate, warp-collective,
// in the fragment layouts of the PTX ISA ("Matrix Fragments for
// mma.m16n8k16"; attention_flash.cuh's opening comment gives them).
__device__ __forceinline__ void mma_bf16_16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    PTX_SM80(asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
                          "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                          : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1)));
}

#else  // the host compiler: the CPU execution layer's models

__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool valid) {
    ::cuda_on_cpu::cp_async16(dst, src, valid);
}
__device__ __forceinline__ void cp_async_commit() { ::cuda_on_cpu::cp_async_commit(); }
template <int N> __device__ __forceinline__ void cp_async_wait() { ::cuda_on_cpu::cp_async_wait(N); }
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const __nv_bfloat16 *row) {
    ::cuda_on_cpu::ldmatrix_x4(r, row, false);
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const __nv_bfloat16 *row) {
    ::cuda_on_cpu::ldmatrix_x4(r, row, true);
}
__device__ __forceinline__ void mma_bf16_16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    ::cuda_on_cpu::mma_bf16_16816(c, a, b0, b1);
}

#endif  // __CUDACC__

#endif  // MICROGPT_CUDA_PTX_CUH

// cuda_on_cpu.h: the CPU execution layer for the CUDA engine's kernels.
//
// The kernels of microgpt/cuda/ compile unchanged with the host compiler
// when this header comes first: it gives the handful of CUDA primitives they
// use a CPU meaning, and cuda_on_cpu.cpp runs them.
//
//   threads      every CUDA thread of a block is a fiber (its own stack); the
//                block's fibers run on one OS thread, switching only where a
//                CUDA thread would wait for others, so a run is deterministic
//                and its schedule is ours to choose (set_schedule): forward
//                or reversed thread and block order.
//   blocks       run one after another, so `static` storage is exactly block
//                storage: __shared__ is `static`, and dynamic shared memory
//                (the launch's shared_bytes) is one buffer.
//   barriers     __syncthreads waits until every thread of the block that has
//                not exited is at it. Warp-collective operations (shuffles,
//                ldmatrix, mma) wait until the 32 lanes of the warp are all
//                at one, then exchange their operands: a lane reads another
//                lane's value only there, so a wrong lane mapping gives wrong
//                numbers, as on the GPU.
//   cp.async     a copy lands at the cp_async_wait that covers its group; from
//                its issue until then the destination holds NaN bytes (0xFF),
//                so a read that misses its wait reads garbage.
//   shared-memory hazards
//                with the `hazard` build (tests/cuda_cpu/build.py), every load
//                and store of kernel code is seen by cuda_on_cpu.cpp (GCC's
//                -fsanitize=thread instrumentation, with our own hooks in place
//                of the ThreadSanitizer runtime). A shadow of shared memory
//                records which thread wrote and read each byte in which barrier
//                epoch; read-after-write, write-after-read and write-after-write
//                between different threads of one epoch, and reads of bytes not
//                written in this block, are reported with the kernel, the source
//                line and the threads. The same for global memory across the
//                blocks of a launch. Independent of the schedule: the epoch,
//                not the order threads ran in, decides.
//   numbers      __nv_bfloat16 and the conversions round to nearest even, as
//                the GPU does; mma.sync multiplies bf16 exactly and rounds the
//                sum once to fp32 (the hardware's internal order is not
//                specified, so results agree with the GPU to rounding, not to
//                the bit).
//
// Not modelled: timing, occupancy, the memory model's reorderings (a race the
// GPU's weak ordering allows but no barrier epoch shows), bank conflicts.
#ifndef CUDA_ON_CPU_H
#define CUDA_ON_CPU_H

#ifdef __CUDACC__
#error "cuda_on_cpu.h is for the host compiler; nvcc compiles the kernels for the GPU"
#endif

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <tuple>
#include <utility>

#define CUDA_ON_CPU 1

// ----------------------------------------------------------------------------
// Qualifiers.

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
// Blocks run one at a time, so block-static storage is function-static storage.
#define __shared__ static

// ----------------------------------------------------------------------------
// Types.

struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct float2 {
    float x, y;
};
struct __attribute__((aligned(16))) uint4 {
    unsigned x, y, z, w;
};

// bf16 as the GPU stores it: the high 16 bits of an fp32.
struct __nv_bfloat16 {
    unsigned short bits;
};
struct __attribute__((aligned(4))) __nv_bfloat162 {
    __nv_bfloat16 x, y;
};

inline float __bfloat162float(__nv_bfloat16 h) {
    uint32_t u = (uint32_t)h.bits << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// Round to nearest, ties to even; NaN stays a (quiet) NaN.
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    __nv_bfloat16 h;
    if ((u & 0x7fffffffu) > 0x7f800000u) h.bits = (unsigned short)((u >> 16) | 0x40);
    else h.bits = (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    return h;
}

inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi) {
    __nv_bfloat162 v;
    v.x = __float2bfloat16_rn(lo);
    v.y = __float2bfloat16_rn(hi);
    return v;
}

inline float2 __bfloat1622float2(__nv_bfloat162 v) {
    float2 f;
    f.x = __bfloat162float(v.x);
    f.y = __bfloat162float(v.y);
    return f;
}

typedef enum { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorInvalidConfiguration = 9 } cudaError_t;
typedef struct cuda_on_cpu_stream *cudaStream_t;
typedef enum { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 } cudaFuncAttribute;

// CUDA's min and max take their arguments by value (std::min's references
// would odr-use a `static const` member a kernel passes).
template <typename T> inline T min(T a, T b) { return b < a ? b : a; }
template <typename T> inline T max(T a, T b) { return a < b ? b : a; }

// ----------------------------------------------------------------------------
// The runtime (cuda_on_cpu.cpp). Everything kernel code reads of the
// runtime's state goes through these functions, which live in a translation
// unit that is not instrumented, so the hazard shadow sees only the kernels'
// own memory accesses.

namespace cuda_on_cpu {

uint3 thread_idx();
uint3 block_idx();
dim3 block_dim();
dim3 grid_dim();
void syncthreads();
uint64_t shfl_xor(unsigned mask, uint64_t bits, int lane_mask, int width);
unsigned char *dynamic_shared();
[[noreturn]] void trap(const char *what);

// Warp-collective tensor-core operations and cp.async (PTX semantics, see
// microgpt/cuda/ptx.cuh).
void ldmatrix_x4(uint32_t r[4], const void *row, bool trans);
void mma_bf16_16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1);
void cp_async16(void *dst, const void *src, bool valid);
void cp_async_commit();
void cp_async_wait(int n);

// Launching: a kernel's blocks one after another, each block's threads as
// fibers. `name` is the kernel expression as written at the launch (its
// template arguments included).
typedef void (*ThreadBody)(void *ctx);
cudaError_t launch(const char *name, const void *kernel, dim3 grid, dim3 block, size_t shared_bytes, ThreadBody body,
                   void *ctx);
cudaError_t func_set_attribute(const void *kernel, cudaFuncAttribute attr, int value);
cudaError_t last_error();
const char *error_string(cudaError_t err);

template <typename... P> struct Launch {
    const char *name;
    void (*kernel)(P...);
    dim3 grid, block;
    size_t shared_bytes;

    template <typename... A> void operator()(A &&...args) const {
        // The arguments converted to the kernel's parameter types, as a
        // <<< >>> launch converts them; every thread gets its own copy.
        std::tuple<P...> params(static_cast<P>(std::forward<A>(args))...);
        struct Ctx {
            void (*kernel)(P...);
            std::tuple<P...> *params;
        } ctx = {kernel, &params};
        launch(name, (const void *)kernel, grid, block, shared_bytes,
               [](void *c) {
                   Ctx *x = (Ctx *)c;
                   std::tuple<P...> mine = *x->params;
                   std::apply(x->kernel, mine);
               },
               &ctx);
    }
};

template <typename... P>
Launch<P...> make_launch(const char *name, dim3 grid, dim3 block, size_t shared_bytes, void (*kernel)(P...)) {
    return Launch<P...>{name, kernel, grid, block, shared_bytes};
}

}  // namespace cuda_on_cpu

// ----------------------------------------------------------------------------
// The CUDA names kernels use.

#define threadIdx (::cuda_on_cpu::thread_idx())
#define blockIdx (::cuda_on_cpu::block_idx())
#define blockDim (::cuda_on_cpu::block_dim())
#define gridDim (::cuda_on_cpu::grid_dim())

inline void __syncthreads() { ::cuda_on_cpu::syncthreads(); }
[[noreturn]] inline void __trap() { ::cuda_on_cpu::trap("__trap()"); }

template <typename T> inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    static_assert(sizeof(T) <= 8, "a shuffle moves at most 8 bytes");
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof v);
    bits = ::cuda_on_cpu::shfl_xor(mask, bits, lane_mask, width);
    T out;
    memcpy(&out, &bits, sizeof out);
    return out;
}

#define LAUNCH(grid, block, smem, stream, ...) \
    ::cuda_on_cpu::make_launch(#__VA_ARGS__, (grid), (block), (smem), __VA_ARGS__)

inline cudaError_t cudaGetLastError() { return ::cuda_on_cpu::last_error(); }
inline const char *cudaGetErrorString(cudaError_t err) { return ::cuda_on_cpu::error_string(err); }
template <typename... P> cudaError_t cudaFuncSetAttribute(void (*kernel)(P...), cudaFuncAttribute attr, int value) {
    return ::cuda_on_cpu::func_set_attribute((const void *)kernel, attr, value);
}

#endif  // CUDA_ON_CPU_H

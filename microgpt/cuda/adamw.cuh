// cuda/adamw.cuh: the AdamW update, elementwise, as torch.optim.AdamW (and
// microgpt_cpu.c) computes it: decoupled decay, then the bias-corrected step.
// No backward: the optimizer is the end of the step.
#ifndef MICROGPT_CUDA_ADAMW_CUH
#define MICROGPT_CUDA_ADAMW_CUH

#include "../model.h"
#include "common.cuh"
#include "vec.cuh"

// Weight decay applies to the 2-D tensors only (mg_decay_ranges, the
// definition): the embeddings and, within each layer, the four matmul
// weights. O(1) per element from the layout, where the CPU engine walks the
// ranges; decay_map builds it and checks it against mg_decay_ranges.
typedef struct {
    size_t layer0, layer_size, lnfw;
    size_t lo[4], hi[4];  // decayed [lo, hi) offsets within a layer
} DecayMap;

__host__ __device__ static inline int decays(const DecayMap &dm, size_t i) {
    if (i < dm.layer0) return 1;
    if (i >= dm.lnfw) return 0;
    size_t off = (i - dm.layer0) % dm.layer_size;
    for (int k = 0; k < 4; k++)
        if (off >= dm.lo[k] && off < dm.hi[k]) return 1;
    return 0;
}

// Also writes the compute copy px (bf16 mode: write_x).
template <typename Tx>
__global__ void adamw_kernel(float *p, Tx *px, const float *grad, float *m, float *v, size_t n, DecayMap dm,
                             float grad_mult, float lr, float b1, float b2, float eps, float wd, float step_size,
                             float bc2_sqrt, int write_x) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float decay = decays(dm, i) ? 1.0f - lr * wd : 1.0f;
        float g = grad[i] * grad_mult;
        float mi = b1 * m[i] + (1.0f - b1) * g;
        float vi = b2 * v[i] + (1.0f - b2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float w = p[i] * decay - step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
        p[i] = w;
        if (write_x) px[i] = from_f<Tx>(w);
    }
}

// The fused step's AdamW (--fused): four parameters per thread with 16-byte
// loads and stores, the step's settings read from device memory (so the same
// launch, in a CUDA graph, serves every step: the host writes lr and the
// bias corrections, the norm kernel the clip factor and the skip flag), and
// no 64-bit modulo per element: blockIdx.y is a segment of the layout (0:
// the embeddings, all decayed; 1..L: layer y-1; L+1: the final LayerNorm,
// none decayed), so an element's offset within its layer is a subtraction.
// Needs every segment and decay boundary at a multiple of 4 (a width C that
// is a multiple of 4: adamw_fused_applies). The arithmetic is adamw_kernel's,
// expression for expression.
typedef struct {
    float lr, step_size, bc2_sqrt;  // written by the host before the step
    float mult;                     // the clip factor (sumsq_final_clip_kernel)
    int skip;                       // 1: a non-finite norm, no update (sumsq_final_clip_kernel)
} AdamWStep;

template <typename Tx>
__global__ void adamw_fused_kernel(float *p, Tx *px, const float *grad, float *m, float *v, size_t n, DecayMap dm,
                                   int L, const AdamWStep *st, float b1, float b2, float eps, float wd, int write_x) {
    if (st->skip) return;
    int seg = blockIdx.y;
    size_t begin, end;
    if (seg == 0) { begin = 0; end = dm.layer0; }
    else if (seg <= L) { begin = dm.layer0 + (size_t)(seg - 1) * dm.layer_size; end = begin + dm.layer_size; }
    else { begin = dm.lnfw; end = n; }
    float lr = st->lr, step_size = st->step_size, bc2_sqrt = st->bc2_sqrt, grad_mult = st->mult;
    size_t stride = (size_t)gridDim.x * blockDim.x * 4;
    for (size_t i = begin + ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 4; i < end; i += stride) {
        int dec;
        if (seg == 0) dec = 1;
        else if (seg > L) dec = 0;
        else {
            size_t off = i - begin;
            dec = 0;
            for (int k = 0; k < 4; k++) dec |= off >= dm.lo[k] && off < dm.hi[k];
        }
        float decay = dec ? 1.0f - lr * wd : 1.0f;
        float pv[4], gv[4], mv[4], vv[4];
        load4f(pv, p + i);
        load4f(gv, grad + i);
        load4f(mv, m + i);
        load4f(vv, v + i);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float g = gv[k] * grad_mult;
            float mi = b1 * mv[k] + (1.0f - b1) * g;
            float vi = b2 * vv[k] + (1.0f - b2) * g * g;
            mv[k] = mi;
            vv[k] = vi;
            pv[k] = pv[k] * decay - step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
        }
        store4f(p + i, pv);
        store4f(m + i, mv);
        store4f(v + i, vv);
        if (write_x)
#pragma unroll
            for (int k = 0; k < 4; k++) px[i + k] = from_f<Tx>(pv[k]);
    }
}

// ----------------------------------------------------------------------------
// Host side.

// The decay map of a layout of L layers, checked against mg_decay_ranges at
// every range boundary.
static DecayMap decay_map(const MgLayout *lay, int L) {
    DecayMap dm;
    memset(&dm, 0, sizeof dm);
    dm.layer0 = lay->layer0; dm.layer_size = lay->layer_size; dm.lnfw = lay->lnfw;
    int mats[4] = {MG_QKVW, MG_PROJW, MG_FCW, MG_FCPROJW};
    for (int k = 0; k < 4; k++) { dm.lo[k] = lay->in_layer[mats[k]]; dm.hi[k] = dm.lo[k] + lay->size[mats[k]]; }
    MgRange *ranges = (MgRange *)mg_malloc((4 + 12 * (size_t)L) * sizeof(MgRange));
    int nr = mg_decay_ranges(lay, L, ranges);
    for (int r = 0; r < nr; r++)
        if (ranges[r].end > ranges[r].begin &&
            (decays(dm, ranges[r].begin) != ranges[r].decay || decays(dm, ranges[r].end - 1) != ranges[r].decay))
            mg_fail(MG_EXIT_USAGE, "internal: the CUDA weight-decay map disagrees with mg_decay_ranges at [%zu, %zu)",
                    ranges[r].begin, ranges[r].end);
    free(ranges);
    return dm;
}

// One AdamW step (1-based `step`) over n parameters; grads are multiplied by
// grad_mult (the clip factor) first. params_x: the compute copy to refresh,
// or NULL (fp32: the master weights are the compute copy).
template <typename Tx>
static void adamw_update(float *params, Tx *params_x, const float *grads, float *m, float *v, size_t n, DecayMap dm,
                         float grad_mult, float lr, float beta1, float beta2, float eps, float weight_decay, int step,
                         cudaStream_t stream) {
    double bc1 = 1.0 - pow(beta1, step), bc2 = 1.0 - pow(beta2, step);
    float step_size = (float)(lr / bc1), bc2_sqrt = (float)sqrt(bc2);
    unsigned blocks = ceil_div(n, 256);
    if (blocks > 65535u * 4) blocks = 65535u * 4;
    LAUNCH(blocks, 256, 0, stream, adamw_kernel<Tx>)(params, params_x, grads, m, v, n, dm, grad_mult, lr, beta1, beta2,
                                                     eps, weight_decay, step_size, bc2_sqrt, params_x != NULL);
    LAUNCH_CHECK();
}

// The fused AdamW applies when every segment and decay boundary of the
// layout falls on a multiple of 4 (a width that is a multiple of 4).
static int adamw_fused_applies(const DecayMap &dm, size_t n) {
    if (dm.layer0 % 4 || dm.layer_size % 4 || dm.lnfw % 4 || n % 4) return 0;
    for (int k = 0; k < 4; k++)
        if (dm.lo[k] % 4 || dm.hi[k] % 4) return 0;
    return 1;
}

// The host's part of a step's settings (lr and the bias corrections of step
// `step`, 1-based), as adamw_update computes them.
static void adamw_step_settings(AdamWStep *st, float lr, float beta1, float beta2, int step) {
    double bc1 = 1.0 - pow(beta1, step), bc2 = 1.0 - pow(beta2, step);
    st->lr = lr;
    st->step_size = (float)(lr / bc1);
    st->bc2_sqrt = (float)sqrt(bc2);
}

// One AdamW step with the settings in st (device memory), over a layout of L
// layers and n parameters (adamw_fused_applies).
template <typename Tx>
static void adamw_update_fused(float *params, Tx *params_x, const float *grads, float *m, float *v, size_t n,
                               DecayMap dm, int L, const AdamWStep *st, float beta1, float beta2, float eps,
                               float weight_decay, cudaStream_t stream) {
    size_t longest = dm.layer0 > dm.layer_size ? dm.layer0 : dm.layer_size;
    unsigned bx = ceil_div(longest / 4, 256);
    if (bx > 1024) bx = 1024;
    dim3 grid(bx, L + 2);
    LAUNCH(grid, 256, 0, stream, adamw_fused_kernel<Tx>)(params, params_x, grads, m, v, n, dm, L, st, beta1, beta2,
                                                         eps, weight_decay, params_x != NULL);
    LAUNCH_CHECK();
}

#endif  // MICROGPT_CUDA_ADAMW_CUH

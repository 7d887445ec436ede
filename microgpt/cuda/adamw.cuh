// cuda/adamw.cuh: the AdamW update, elementwise, as torch.optim.AdamW (and
// microgpt_cpu.c) computes it: decoupled decay, then the bias-corrected step.
// No backward: the optimizer is the end of the step.
#ifndef MICROGPT_CUDA_ADAMW_CUH
#define MICROGPT_CUDA_ADAMW_CUH

#include "../model.h"
#include "common.cuh"

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

#endif  // MICROGPT_CUDA_ADAMW_CUH

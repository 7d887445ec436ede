// model.h: the model both engines compute (docs/ARCHITECTURE.md): the flat parameter
// layout, which tensors take weight decay, the counter-based RNG, GPT-2
// initialisation, the learning-rate schedule, and the numeric constants both
// engines must share (LayerNorm epsilon, the GELU tanh approximation).
#ifndef MICROGPT_MODEL_H
#define MICROGPT_MODEL_H

#include "config.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>

// ----------------------------------------------------------------------------
// Constants of the model's arithmetic, used by both engines: LayerNorm's
// epsilon and GELU's tanh approximation, 0.5 x (1 + tanh(MG_GELU_SCALE (x +
// MG_GELU_C x^3))), as PyTorch's F.gelu(approximate="tanh") that the
// reference model (tests/engine/torch_reference.py) uses.
// Macros, not variables, so CUDA device code can use them too.

#define MG_LN_EPS 1e-5f
#define MG_GELU_SCALE 0.7978845608028654f  // sqrt(2 / pi)
#define MG_GELU_C 0.044715f

// ----------------------------------------------------------------------------
// The model's parameter layout (docs/ARCHITECTURE.md): one flat fp32 array.

enum { MG_LN1W, MG_LN1B, MG_QKVW, MG_QKVB, MG_PROJW, MG_PROJB, MG_LN2W, MG_LN2B,
       MG_FCW, MG_FCB, MG_FCPROJW, MG_FCPROJB, MG_PER_LAYER };

typedef struct {
    size_t wte, wpe;                 // offsets of the embeddings
    size_t layer0;                   // offset of layer 0's first tensor
    size_t layer_size;               // parameters per layer
    size_t in_layer[MG_PER_LAYER];   // offset of each tensor within a layer
    size_t size[MG_PER_LAYER];       // element count of each tensor within a layer
    size_t lnfw, lnfb;
    size_t n;                        // total
} MgLayout;

static MgLayout mg_layout(int V, int T, int C, int L) {
    MgLayout lay;
    size_t c = (size_t)C;
    size_t sizes[MG_PER_LAYER] = {c, c, 3 * c * c, 3 * c, c * c, c, c, c, 4 * c * c, 4 * c, 4 * c * c, c};
    lay.wte = 0;
    lay.wpe = (size_t)V * c;
    lay.layer0 = lay.wpe + (size_t)T * c;
    lay.layer_size = 0;
    for (int i = 0; i < MG_PER_LAYER; i++) {
        lay.in_layer[i] = lay.layer_size;
        lay.size[i] = sizes[i];
        lay.layer_size += sizes[i];
    }
    lay.lnfw = lay.layer0 + (size_t)L * lay.layer_size;
    lay.lnfb = lay.lnfw + c;
    lay.n = lay.lnfb + c;
    return lay;
}

static size_t mg_param(const MgLayout *lay, int layer, int tensor) {
    return lay->layer0 + (size_t)layer * lay->layer_size + lay->in_layer[tensor];
}

// Weight decay applies to the 2-D tensors only: the embeddings and the four
// matmul weights of each layer. Writes one flag per parameter range.
typedef struct { size_t begin, end; int decay; } MgRange;

// Fills ranges (capacity 2 + 12L + 2) and returns how many.
static int mg_decay_ranges(const MgLayout *lay, int L, MgRange *ranges) {
    int k = 0;
    ranges[k++] = (MgRange){lay->wte, lay->wpe, 1};
    ranges[k++] = (MgRange){lay->wpe, lay->layer0, 1};
    for (int l = 0; l < L; l++)
        for (int t = 0; t < MG_PER_LAYER; t++) {
            size_t b = mg_param(lay, l, t);
            int decay = t == MG_QKVW || t == MG_PROJW || t == MG_FCW || t == MG_FCPROJW;
            ranges[k++] = (MgRange){b, b + lay->size[t], decay};
        }
    ranges[k++] = (MgRange){lay->lnfw, lay->lnfw + lay->size[MG_LN1W], 0};
    ranges[k++] = (MgRange){lay->lnfb, lay->n, 0};
    return k;
}

// ----------------------------------------------------------------------------
// Counter-based randomness: every random number is a pure function of
// (seed, stream, counter), so results do not depend on thread count or order.

static uint64_t mg_mix64(uint64_t x) {  // splitmix64 finaliser
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static uint64_t mg_hash3(uint64_t seed, uint64_t a, uint64_t b) {
    return mg_mix64(mg_mix64(mg_mix64(seed) ^ a) ^ b);
}

// Uniform in [0, 1) with 53 random bits.
static double mg_uniform(uint64_t bits) { return (bits >> 11) * (1.0 / 9007199254740992.0); }

enum { MG_STREAM_INIT = 1, MG_STREAM_BATCH = 2, MG_STREAM_SAMPLE = 3 };

// GPT-2 initialisation: N(0, 0.02) for matrices and embeddings, the two
// residual projections scaled by 1/sqrt(2L), LayerNorm weights 1, biases 0.
static void mg_init_params(float *w, const MgConfig *cfg) {
    MgLayout lay = mg_layout(cfg->vocab, cfg->ctx, cfg->dim, cfg->layers);
    double resid_std = 0.02 / sqrt(2.0 * cfg->layers);
    for (size_t i = 0; i < lay.n; i++) w[i] = 0.0f;
    for (int l = -1; l <= cfg->layers; l++) {
        // l = -1: embeddings; 0..L-1: layers; L: final LayerNorm.
        size_t begin[4], end[4]; double stdv[4]; int nr = 0;
        if (l == -1) {
            begin[nr] = lay.wte; end[nr] = lay.layer0; stdv[nr++] = 0.02;
        } else if (l == cfg->layers) {
            for (size_t i = lay.lnfw; i < lay.lnfb; i++) w[i] = 1.0f;
        } else {
            int mats[4] = {MG_QKVW, MG_PROJW, MG_FCW, MG_FCPROJW};
            for (int j = 0; j < 4; j++) {
                begin[nr] = mg_param(&lay, l, mats[j]);
                end[nr] = begin[nr] + lay.size[mats[j]];
                stdv[nr++] = (mats[j] == MG_PROJW || mats[j] == MG_FCPROJW) ? resid_std : 0.02;
            }
            size_t ln1 = mg_param(&lay, l, MG_LN1W), ln2 = mg_param(&lay, l, MG_LN2W);
            for (int c = 0; c < cfg->dim; c++) { w[ln1 + c] = 1.0f; w[ln2 + c] = 1.0f; }
        }
        for (int r = 0; r < nr; r++)
            for (size_t i = begin[r]; i < end[r]; i++) {
                uint64_t h = mg_hash3(cfg->seed, MG_STREAM_INIT, i);
                double u1 = mg_uniform(h), u2 = mg_uniform(mg_mix64(h));
                double z = sqrt(-2.0 * log(1.0 - u1)) * cos(6.283185307179586 * u2);
                w[i] = (float)(z * stdv[r]);
            }
    }
}

// ----------------------------------------------------------------------------
// Learning rate: a pure function of the step, so restoring the step restores
// the schedule. Step s is 1-based: the update that produces step s. Every
// schedule warms up linearly to --lr over --warmup steps; then
//   cosine:   half a cosine from lr down to min_lr at --steps;
//   wsd:      lr (stable) until the last decay_fraction of --steps, then a
//             straight line down to min_lr at --steps: raising --steps while
//             still stable changes no rate already used, nor the next one;
//   constant: lr;
//   linear:   a straight line from lr down to min_lr at --steps.
// Past --steps the decaying schedules stay at min_lr.

// wsd's first decaying step is the one after this (at least the warmup's end).
static int mg_wsd_decay_start(const MgConfig *cfg) {
    int decay = (int)lround((double)cfg->decay_fraction * cfg->steps);
    if (decay < 1) decay = 1;
    int start = cfg->steps - decay;
    return start > cfg->warmup ? start : cfg->warmup;
}

// The fraction of [from, to] that step s has covered, clamped to [0, 1].
static double mg_progress(int s, int from, int to) {
    if (to <= from) return 1.0;
    double p = (double)(s - from) / (to - from);
    return p < 0 ? 0 : p > 1 ? 1 : p;
}

static float mg_lr_at(const MgConfig *cfg, int s) {
    if (cfg->warmup > 0 && s <= cfg->warmup) return (float)((double)cfg->lr * s / cfg->warmup);
    // (lr - min_lr) is a float difference, as the cosine has always computed it: the same rates, bit for
    // bit; each decay is min_lr plus a share of it, so its last step is min_lr exactly
    float drop = cfg->lr - cfg->min_lr;
    switch (mg_schedule_code(cfg->lr_schedule)) {
    case MG_SCHEDULE_CONSTANT:
        return cfg->lr;
    case MG_SCHEDULE_LINEAR:
        return (float)(cfg->min_lr + drop * (1.0 - mg_progress(s, cfg->warmup, cfg->steps)));
    case MG_SCHEDULE_WSD: {
        int start = mg_wsd_decay_start(cfg);
        if (s <= start) return cfg->lr;
        return (float)(cfg->min_lr + drop * (1.0 - mg_progress(s, start, cfg->steps)));
    }
    default: {  // cosine (mg_validate refuses any other name)
        double cosine = 0.5 * (1.0 + cos(3.141592653589793 * mg_progress(s, cfg->warmup, cfg->steps)));
        return (float)(cfg->min_lr + drop * cosine);
    }
    }
}

#endif  // MICROGPT_MODEL_H

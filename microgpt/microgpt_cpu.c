// microgpt_cpu.c: the CPU reference engine (C11 + OpenMP).
//
// The model of docs/ARCHITECTURE.md, forward and backward, AdamW, all in fp32
// (with --precision fp8, the linear layers' GEMM operands rounded through FP8
// first: docs/ENGINE.md, "FP8"). It is the
// engine for machines without a GPU, the one CI runs, and the reference the
// CUDA engine is tested against. This file only computes, and ends with its
// engine table (engine.h); the driver (flags, frames, events, checkpoints,
// signals, the training loop) is shared, in train.h and the headers it
// includes.
//
// Determinism: every reduction has one fixed order that does not depend on
// the thread count. Work is split across threads only along dimensions that
// are not summed over (rows for row-wise ops, channels for sums over rows,
// output tiles for matmuls), so the same inputs give bit-identical outputs
// with 1 thread or 64. Nor does it depend on the vector width or the fused
// multiply-adds the compiler picks for the CPU (sum_of, below): the same
// source and compiler give the same bits on any x86-64 CPU with AVX2 and FMA.
#include "engine.h"
#include "fp8.h"
#include "model.h"
#include "train.h"

#include <float.h>
#include <omp.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define MG_AVX2 1
#endif

// ----------------------------------------------------------------------------
// Fast exp. libm's expf does not vectorise without -ffast-math, and the
// softmaxes and GELU call it hundreds of millions of times per step. This is
// Cody-Waite range reduction and a degree-6 polynomial: under 2 ulp relative
// error, pure arithmetic, so `omp simd` loops vectorise it.

static inline float fast_expf(float x) {
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    float n = floorf(x * 1.44269504088896341f + 0.5f);
    float r = x - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    union { int32_t i; float f; } scale;
    scale.i = ((int32_t)n + 127) << 23;
    return p * scale.f;
}

// tanh through exp: tanh(u) = 1 - 2 / (exp(2u) + 1), exact at the limits.
static inline float fast_tanhf(float u) { return 1.0f - 2.0f / (fast_expf(2.0f * u) + 1.0f); }

// ----------------------------------------------------------------------------
// Sums in the source's order. `#pragma omp simd reduction` lets the compiler
// keep as many partial sums as its vector width, and -march=native picks that
// width by CPU model: the same source gave other bits on an AMD and an Intel
// CPU. Here element i goes into lane i % SUM_LANES, each lane adds in element
// order, and the lanes meet in one fixed tree; a product summed is fused by
// the source (fmaf), not left to the compiler's tuning. With AVX2 the lanes
// are one register; without, the same operations one float at a time.
#define SUM_LANES 8

static inline float lanes_total(const float *lane) {
    return ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
}

// sum of x[0..n)
static inline float sum_of(const float *x, int n) {
    float lane[SUM_LANES] = {0};
    int i = 0;
#ifdef MG_AVX2
    __m256 acc = _mm256_setzero_ps();
    for (; i + SUM_LANES <= n; i += SUM_LANES) acc = _mm256_add_ps(acc, _mm256_loadu_ps(x + i));
    _mm256_storeu_ps(lane, acc);
#else
    for (; i + SUM_LANES <= n; i += SUM_LANES)
        for (int l = 0; l < SUM_LANES; l++) lane[l] += x[i + l];
#endif
    for (int l = 0; i < n; i++, l++) lane[l] += x[i];
    return lanes_total(lane);
}

// sum of a[i] * b[i] over [0, n), each product fused into its lane's sum (fmaf: the same rounding as the
// AVX2 lanes', whatever the compiler would fuse on its own)
static inline float dot_of(const float *a, const float *b, int n) {
    float lane[SUM_LANES] = {0};
    int i = 0;
#ifdef MG_AVX2
    __m256 acc = _mm256_setzero_ps();
    for (; i + SUM_LANES <= n; i += SUM_LANES)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    _mm256_storeu_ps(lane, acc);
#else
    for (; i + SUM_LANES <= n; i += SUM_LANES)
        for (int l = 0; l < SUM_LANES; l++) lane[l] = fmaf(a[i + l], b[i + l], lane[l]);
#endif
    for (int l = 0; i < n; i++, l++) lane[l] = fmaf(a[i], b[i], lane[l]);
    return lanes_total(lane);
}

// ----------------------------------------------------------------------------
// GEMM. Every matmul of the model is one call of
//   C[i, j] (+)= sum_k A(i, k) * B(k, j)
// with A and B addressed through strides, so the forward (x W^T), the input
// gradient (dy W) and the weight gradient (dy^T x) need no transposed copies.
// BLIS-style: pack a KC x NC panel of B and an MC x KC block of A into
// contiguous buffers, then a 6x16 register-blocked micro-kernel. The sum over
// k runs in KC blocks in a fixed order: the result never depends on how the
// M and N loops are split over threads.

#define MR 6
#define NR 16
#define KC 256
#define MC 96
#define NC 2048

typedef struct {
    float *bpack;        // KC * NC, shared
    float **apack;       // per thread, MC * KC
    int threads;
    // --precision fp8: matmul_forward and matmul_backward multiply these
    // copies of their operands, each rounded through FP8 (fp8_round_trip).
    int fp8;
    float *fp8_x;        // [BT, 4C] the input (E4M3)
    float *fp8_w;        // [4C, C] the weight (E4M3)
    float *fp8_d;        // [BT, 4C] the output's gradient (E5M2)
} GemmScratch;

static void pack_a(const float *A, long as_m, long as_k, int i0, int mc, int k0, int kc, int M, float *ap) {
    if (as_m == 1) {
        // A stored transposed (a weight gradient's dout^T): read MR contiguous
        // floats per k instead of striding down a column.
        for (int p = 0; p < mc; p += MR) {
            float *dst = ap + (size_t)p * kc;
            int rows = M - (i0 + p) < MR ? M - (i0 + p) : MR;
            for (int k = 0; k < kc; k++) {
                const float *src = A + (long)(k0 + k) * as_k + i0 + p;
                int i = 0;
                for (; i < rows; i++) dst[k * MR + i] = src[i];
                for (; i < MR; i++) dst[k * MR + i] = 0.0f;
            }
        }
        return;
    }
    for (int p = 0; p < mc; p += MR) {
        float *dst = ap + (size_t)p * kc;
        for (int i = 0; i < MR; i++) {
            int row = i0 + p + i;
            if (row >= M) {
                for (int k = 0; k < kc; k++) dst[k * MR + i] = 0.0f;
                continue;
            }
            const float *src = A + (long)row * as_m + (long)k0 * as_k;
            for (int k = 0; k < kc; k++) dst[k * MR + i] = src[(long)k * as_k];
        }
    }
}

static void pack_b_panel(const float *Bm, long bs_k, long bs_n, int j0, int k0, int kc, int N, float *dst) {
    int ncols = N - j0 < NR ? N - j0 : NR;
    if (bs_n == 1) {
        for (int k = 0; k < kc; k++) {
            const float *src = Bm + (long)(k0 + k) * bs_k + j0;
            float *out = dst + k * NR;
            int j = 0;
            for (; j < ncols; j++) out[j] = src[j];
            for (; j < NR; j++) out[j] = 0.0f;
        }
    } else {
        for (int j = 0; j < NR; j++) {
            if (j >= ncols) {
                for (int k = 0; k < kc; k++) dst[k * NR + j] = 0.0f;
                continue;
            }
            const float *src = Bm + (long)(j0 + j) * bs_n + (long)k0 * bs_k;
            for (int k = 0; k < kc; k++) dst[k * NR + j] = src[(long)k * bs_k];
        }
    }
}

// acc = sum over kc of a (MR-tall panel) x b (NR-wide panel); then
// C = acc (first) or C = C + acc (otherwise), for the mr x nr valid corner.
static void micro_kernel(int kc, const float *a, const float *b, float *c, long ldc, int mr, int nr, int first) {
#ifdef MG_AVX2
    __m256 acc[MR][2];
    for (int i = 0; i < MR; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    for (int k = 0; k < kc; k++) {
        __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
        for (int i = 0; i < MR; i++) {
            __m256 ai = _mm256_broadcast_ss(a + i);
            acc[i][0] = _mm256_fmadd_ps(ai, b0, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(ai, b1, acc[i][1]);
        }
        a += MR;
        b += NR;
    }
    if (mr == MR && nr == NR) {
        for (int i = 0; i < MR; i++) {
            float *ci = c + i * ldc;
            if (first) {
                _mm256_storeu_ps(ci, acc[i][0]);
                _mm256_storeu_ps(ci + 8, acc[i][1]);
            } else {
                _mm256_storeu_ps(ci, _mm256_add_ps(_mm256_loadu_ps(ci), acc[i][0]));
                _mm256_storeu_ps(ci + 8, _mm256_add_ps(_mm256_loadu_ps(ci + 8), acc[i][1]));
            }
        }
        return;
    }
    float tile[MR * NR] __attribute__((aligned(32)));
    for (int i = 0; i < MR; i++) {
        _mm256_store_ps(tile + i * NR, acc[i][0]);
        _mm256_store_ps(tile + i * NR + 8, acc[i][1]);
    }
#else
    float tile[MR * NR];
    for (int i = 0; i < MR * NR; i++) tile[i] = 0.0f;
    for (int k = 0; k < kc; k++)
        for (int i = 0; i < MR; i++)
            for (int j = 0; j < NR; j++) tile[i * NR + j] += a[k * MR + i] * b[k * NR + j];
#endif
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) {
            float *cij = c + i * ldc + j;
            *cij = first ? tile[i * NR + j] : *cij + tile[i * NR + j];
        }
}

// C[M, N] = (accumulate ? C : 0) + A B, with A(i,k) = A[i*as_m + k*as_k] and
// B(k,j) = B[k*bs_k + j*bs_n]. C is row-major with row stride ldc.
static void gemm(GemmScratch *gs, int M, int N, int K, const float *A, long as_m, long as_k,
                 const float *Bm, long bs_k, long bs_n, float *C, long ldc, int accumulate) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        if (!accumulate)
            for (int i = 0; i < M; i++) memset(C + (long)i * ldc, 0, (size_t)N * sizeof(float));
        return;
    }
    int m_blocks = (M + MC - 1) / MC;
    #pragma omp parallel num_threads(gs->threads)
    {
        float *ap = gs->apack[omp_get_thread_num()];
        for (int j0 = 0; j0 < N; j0 += NC) {
            int nc = N - j0 < NC ? N - j0 : NC;
            int n_panels = (nc + NR - 1) / NR;
            for (int k0 = 0; k0 < K; k0 += KC) {
                int kc = K - k0 < KC ? K - k0 : KC;
                int first = !accumulate && k0 == 0;
                #pragma omp for schedule(static)
                for (int q = 0; q < n_panels; q++)
                    pack_b_panel(Bm, bs_k, bs_n, j0 + q * NR, k0, kc, N, gs->bpack + (size_t)q * NR * kc);
                // Work units: (row block, column half) pairs, so small M still
                // spreads over threads. The split never changes the arithmetic.
                int col_parts = m_blocks >= gs->threads ? 1 : 2, half = (n_panels + 1) / 2;
                #pragma omp for schedule(static)
                for (int unit = 0; unit < m_blocks * col_parts; unit++) {
                    int ib = unit / col_parts, part = unit % col_parts;
                    int i0 = ib * MC, mc = M - i0 < MC ? M - i0 : MC;
                    int q_begin = col_parts == 1 || part == 0 ? 0 : half;
                    int q_end = col_parts == 2 && part == 0 ? half : n_panels;
                    pack_a(A, as_m, as_k, i0, (mc + MR - 1) / MR * MR, k0, kc, M, ap);
                    for (int q = q_begin; q < q_end; q++) {
                        int jj = j0 + q * NR, nr = N - jj < NR ? N - jj : NR;
                        const float *bp = gs->bpack + (size_t)q * NR * kc;
                        for (int p = 0; p < mc; p += MR) {
                            int mr = mc - p < MR ? mc - p : MR;
                            micro_kernel(kc, ap + (size_t)p * kc, bp, C + (long)(i0 + p) * ldc + jj, ldc, mr, nr, first);
                        }
                    }
                }
            }
        }
    }
}

// The same product on one thread with its own packing buffers, for the many
// small per-(batch, head) products of attention, which threads split among
// themselves. With causal set, C is only needed on and below the diagonal
// (j <= i): micro-tiles wholly above it are skipped and hold garbage.
typedef struct {
    float *bpack;  // KC * NC
    float *apack;  // MC * KC
} GemmThreadBuffers;

// What the attention ops use besides their tensors: GEMM buffers per thread
// and (backward) per-thread score gradients.
typedef struct {
    GemmThreadBuffers *gemm;  // [threads]
    float *dscores;           // [threads, T, T]
    int threads;
} AttentionScratch;

static void gemm_serial(const GemmThreadBuffers *buf, int M, int N, int K, const float *A, long as_m, long as_k,
                        const float *Bm, long bs_k, long bs_n, float *C, long ldc, int causal) {
    for (int j0 = 0; j0 < N; j0 += NC) {
        int nc = N - j0 < NC ? N - j0 : NC, n_panels = (nc + NR - 1) / NR;
        for (int k0 = 0; k0 < K; k0 += KC) {
            int kc = K - k0 < KC ? K - k0 : KC, first = k0 == 0;
            for (int q = 0; q < n_panels; q++)
                pack_b_panel(Bm, bs_k, bs_n, j0 + q * NR, k0, kc, N, buf->bpack + (size_t)q * NR * kc);
            for (int i0 = 0; i0 < M; i0 += MC) {
                int mc = M - i0 < MC ? M - i0 : MC;
                pack_a(A, as_m, as_k, i0, (mc + MR - 1) / MR * MR, k0, kc, M, buf->apack);
                for (int q = 0; q < n_panels; q++) {
                    int jj = j0 + q * NR, nr = N - jj < NR ? N - jj : NR;
                    for (int p = 0; p < mc; p += MR) {
                        int mr = mc - p < MR ? mc - p : MR;
                        if (causal && jj > i0 + p + mr - 1) continue;
                        micro_kernel(kc, buf->apack + (size_t)p * kc, buf->bpack + (size_t)q * NR * kc,
                                     C + (long)(i0 + p) * ldc + jj, ldc, mr, nr, first);
                    }
                }
            }
        }
    }
}

// ----------------------------------------------------------------------------
// The engine's state: parameters, gradients, Adam moments, activations.

typedef struct {
    // Saved by the forward pass for the backward pass. [L, ...] arrays hold
    // every layer; the rest are the last layer's or the head's.
    float *x0;                  // [BT, C] embeddings (input of layer 0)
    float *ln1, *ln1_mean, *ln1_rstd;   // [L, BT, C], [L, BT], [L, BT]
    float *qkv;                 // [L, BT, 3C]
    float *att;                 // [L, B, H, T, T] softmax probabilities
    float *atty;                // [L, BT, C] attention output before the projection
    float *res2;                // [L, BT, C] x + attn(LN(x))
    float *ln2, *ln2_mean, *ln2_rstd;
    float *fch;                 // [L, BT, 4C] before GELU
    float *fch_gelu;            // [L, BT, 4C]
    float *res3;                // [L, BT, C] block output
    float *lnf, *lnf_mean, *lnf_rstd;   // [BT, C], [BT], [BT]
    float *logits;              // [BT, V] logits, then probabilities, then their gradient
    float *losses;              // [BT]
    int *inputs, *targets;      // [BT]
} Acts;

typedef struct {
    float *dres;      // [BT, C] gradient flowing down the residual stream
    float *dln;       // [BT, C]
    float *dlnf;      // [BT, C]
    float *dqkv;      // [BT, 3C]
    float *datty;     // [BT, C]
    float *dfch;      // [BT, 4C]
    AttentionScratch att;
} Scratch;

typedef struct {
    MgConfig cfg;
    MgLayout lay;
    int B, T, C, L, H, V;
    float *params, *grads, *m, *v;
    MgRange *ranges;
    int n_ranges;
    Acts a;
    Scratch s;
    GemmScratch gs;
    // Sampling's KV cache: per batch slot, the keys and values of every
    // position so far, [L, B, T, 2C] (k then v of each position).
    float *kv;
    int *kv_start;      // [B + 1] packed row of each sequence's first new token
    int *kv_positions;  // [BT] absolute position of each packed row
    int threads;
    size_t bytes;
    MgEngine *eng;  // configure fills in its thread count and device name, init its caps
} Cpu;

static float *cpu_alloc(Cpu *e, size_t count) {
    size_t bytes = (count * sizeof(float) + 63) & ~(size_t)63;
    float *p = (float *)aligned_alloc(64, bytes ? bytes : 64);
    if (!p) mg_fail(MG_EXIT_IO, "out of memory allocating %zu bytes", bytes);
    memset(p, 0, bytes);
    e->bytes += bytes;
    return p;
}

static const char *cpu_configure(void *impl, MgConfig *cfg) {
    Cpu *e = (Cpu *)impl;
    // Names that are no precision at all are mg_validate's to refuse.
    if (cfg->precision && strcmp(cfg->precision, "bf16") == 0)
        return "the CPU engine computes in fp32 or fp8 (--precision bf16 is for the CUDA engine)";
    e->gs.fp8 = cfg->precision && strcmp(cfg->precision, "fp8") == 0;
    e->threads = cfg->threads > 0 ? cfg->threads : omp_get_max_threads();
    e->eng->threads = e->threads;
    e->eng->precision = e->gs.fp8 ? "fp8" : "fp32";
    if (!cfg->precision) cfg->precision = e->eng->precision;  // named in each checkpoint's metadata
    snprintf(e->eng->device, sizeof e->eng->device, "cpu (%d thread%s)", e->threads, e->threads == 1 ? "" : "s");
    return NULL;
}

static size_t cpu_init(void *impl, const MgConfig *cfg) {
    Cpu *e = (Cpu *)impl;
    e->cfg = *cfg;
    e->B = cfg->batch; e->T = cfg->ctx; e->C = cfg->dim; e->L = cfg->layers; e->H = cfg->heads; e->V = cfg->vocab;
    e->lay = mg_layout(e->V, e->T, e->C, e->L);
    size_t n = e->lay.n, B = e->B, T = e->T, C = e->C, L = e->L, H = e->H, V = e->V, BT = B * T;
    e->params = cpu_alloc(e, n);
    e->grads = cpu_alloc(e, n);
    e->m = cpu_alloc(e, n);
    e->v = cpu_alloc(e, n);
    e->ranges = (MgRange *)mg_malloc((4 + 12 * L) * sizeof(MgRange));
    e->n_ranges = mg_decay_ranges(&e->lay, (int)L, e->ranges);
    Acts *a = &e->a;
    a->x0 = cpu_alloc(e, BT * C);
    a->ln1 = cpu_alloc(e, L * BT * C); a->ln1_mean = cpu_alloc(e, L * BT); a->ln1_rstd = cpu_alloc(e, L * BT);
    a->qkv = cpu_alloc(e, L * BT * 3 * C);
    a->att = cpu_alloc(e, L * B * H * T * T);
    a->atty = cpu_alloc(e, L * BT * C);
    a->res2 = cpu_alloc(e, L * BT * C);
    a->ln2 = cpu_alloc(e, L * BT * C); a->ln2_mean = cpu_alloc(e, L * BT); a->ln2_rstd = cpu_alloc(e, L * BT);
    a->fch = cpu_alloc(e, L * BT * 4 * C);
    a->fch_gelu = cpu_alloc(e, L * BT * 4 * C);
    a->res3 = cpu_alloc(e, L * BT * C);
    a->lnf = cpu_alloc(e, BT * C); a->lnf_mean = cpu_alloc(e, BT); a->lnf_rstd = cpu_alloc(e, BT);
    a->logits = cpu_alloc(e, BT * V);
    a->losses = cpu_alloc(e, BT);
    a->inputs = (int *)cpu_alloc(e, BT);
    a->targets = (int *)cpu_alloc(e, BT);
    Scratch *s = &e->s;
    s->dres = cpu_alloc(e, BT * C);
    s->dln = cpu_alloc(e, BT * C);
    s->dlnf = cpu_alloc(e, BT * C);
    s->dqkv = cpu_alloc(e, BT * 3 * C);
    s->datty = cpu_alloc(e, BT * C);
    s->dfch = cpu_alloc(e, BT * 4 * C);
    s->att.threads = e->threads;
    s->att.dscores = cpu_alloc(e, (size_t)e->threads * T * T);
    s->att.gemm = (GemmThreadBuffers *)mg_malloc((size_t)e->threads * sizeof(GemmThreadBuffers));
    for (int t = 0; t < e->threads; t++) {
        s->att.gemm[t].bpack = cpu_alloc(e, (size_t)KC * NC);
        s->att.gemm[t].apack = cpu_alloc(e, (size_t)MC * KC);
    }
    e->kv = cpu_alloc(e, L * B * T * 2 * C);
    e->kv_start = (int *)cpu_alloc(e, B + 1);
    e->kv_positions = (int *)cpu_alloc(e, BT);
    e->gs.threads = e->threads;
    e->gs.bpack = cpu_alloc(e, (size_t)KC * NC);
    e->gs.apack = (float **)mg_malloc((size_t)e->threads * sizeof(float *));
    for (int t = 0; t < e->threads; t++) e->gs.apack[t] = cpu_alloc(e, (size_t)MC * KC);
    if (e->gs.fp8) {
        e->gs.fp8_x = cpu_alloc(e, BT * 4 * C);
        e->gs.fp8_w = cpu_alloc(e, 4 * C * C);
        e->gs.fp8_d = cpu_alloc(e, BT * 4 * C);
    }
    // The KV cache above, at every shape; not in fp8, whose activation scales
    // are per tensor: the new rows alone would get other scales than the
    // whole window, so the cache could not give the recompute path's logits.
    e->eng->caps.kv_forward = !e->gs.fp8;
    return e->bytes;
}

static void cpu_set_state(void *impl, const float *w, const float *m, const float *v) {
    Cpu *e = (Cpu *)impl;
    size_t bytes = e->lay.n * sizeof(float);
    memcpy(e->params, w, bytes);
    memcpy(e->m, m, bytes);
    memcpy(e->v, v, bytes);
}

static void cpu_get_state(void *impl, float *w, float *m, float *v) {
    Cpu *e = (Cpu *)impl;
    size_t bytes = e->lay.n * sizeof(float);
    memcpy(w, e->params, bytes);
    memcpy(m, e->m, bytes);
    memcpy(v, e->v, bytes);
}

static void cpu_zero_grads(void *impl) {
    Cpu *e = (Cpu *)impl;
    memset(e->grads, 0, e->lay.n * sizeof(float));
}

static void cpu_get_grads(void *impl, float *out) {
    Cpu *e = (Cpu *)impl;
    memcpy(out, e->grads, e->lay.n * sizeof(float));
}

static void cpu_set_grads(void *impl, const float *in) {
    Cpu *e = (Cpu *)impl;
    memcpy(e->grads, in, e->lay.n * sizeof(float));
}

// ----------------------------------------------------------------------------
// Ops, each forward with its backward twin. Each has the name and argument
// order of its CUDA twin in microgpt/cuda/ (docs/ENGINE.md, "Source
// layout"); the CPU one ends with its thread count (or the scratch that
// holds it) where the CUDA one ends with a stream.

// Embedding: x0[i] = wte[inputs[i]] + wpe[t], t the position in the row
// (i % T, positions NULL), or positions[i] (the KV-cache forward's packed
// rows).
static void embedding_forward(float *x0, const int *inputs, const float *wte, const float *wpe, int BT, int T, int C,
                              const int *positions, int threads) {
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int i = 0; i < BT; i++) {
        int t = positions ? positions[i] : i % T;
        const float *te = wte + (size_t)inputs[i] * C, *pe = wpe + (size_t)t * C;
        float *out = x0 + (size_t)i * C;
        for (int c = 0; c < C; c++) out[c] = te[c] + pe[c];
    }
}

// dwte += dx by token, dwpe += dx by position. Tokens repeat, so rows of dwte
// receive many contributions: threads split the channels, and each walks all
// positions in order (no atomics, fixed order).
static void embedding_backward(float *dwte, float *dwpe, const float *dx, const int *inputs, int BT, int T, int C,
                               int threads) {
    #pragma omp parallel num_threads(threads)
    {
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
        int c0 = (int)((long)C * id / nt), c1 = (int)((long)C * (id + 1) / nt);
        for (int i = 0; i < BT; i++) {
            float *row = dwte + (size_t)inputs[i] * C;
            const float *g = dx + (size_t)i * C;
            for (int c = c0; c < c1; c++) row[c] += g[c];
        }
        for (int i = 0; i < BT; i++) {
            float *row = dwpe + (size_t)(i % T) * C;
            const float *g = dx + (size_t)i * C;
            for (int c = c0; c < c1; c++) row[c] += g[c];
        }
    }
}

// LayerNorm over the C channels of each of R rows (eps MG_LN_EPS); saves
// mean and 1/std for the backward.
static void layernorm_forward(float *out, float *mean, float *rstd, const float *x, const float *w, const float *b, int R,
                              int C, int threads) {
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int i = 0; i < R; i++) {
        const float *xi = x + (size_t)i * C;
        float mu = sum_of(xi, C) / C, lane[SUM_LANES] = {0};
        for (int c = 0; c < C; c++) { float d = xi[c] - mu; lane[c % SUM_LANES] = fmaf(d, d, lane[c % SUM_LANES]); }
        float rs = 1.0f / sqrtf(lanes_total(lane) / C + MG_LN_EPS);
        float *oi = out + (size_t)i * C;
        for (int c = 0; c < C; c++) oi[c] = (xi[c] - mu) * rs * w[c] + b[c];
        mean[i] = mu;
        rstd[i] = rs;
    }
}

// dx (= or, with accumulate, +=) the LN input gradient; dw += sum(dout *
// norm); db += sum(dout). Per-row input gradients split over rows; the weight
// and bias gradients are sums over rows, so those split over channels instead.
static void layernorm_backward(float *dx, float *dw, float *db, const float *dout, const float *x, const float *w,
                               const float *mean, const float *rstd, int R, int C, int accumulate, int threads) {
    #pragma omp parallel num_threads(threads)
    {
        #pragma omp for schedule(static)
        for (int i = 0; i < R; i++) {
            const float *xi = x + (size_t)i * C, *gi = dout + (size_t)i * C;
            float mu = mean[i], rs = rstd[i], dnorm_lane[SUM_LANES] = {0}, dnorm_norm_lane[SUM_LANES] = {0};
            for (int c = 0; c < C; c++) {
                float norm = (xi[c] - mu) * rs, dnorm = gi[c] * w[c];
                dnorm_lane[c % SUM_LANES] += dnorm;
                dnorm_norm_lane[c % SUM_LANES] = fmaf(dnorm, norm, dnorm_norm_lane[c % SUM_LANES]);
            }
            float dnorm_mean = lanes_total(dnorm_lane) / C, dnorm_norm_mean = lanes_total(dnorm_norm_lane) / C;
            float *dxi = dx + (size_t)i * C;
            for (int c = 0; c < C; c++) {
                float norm = (xi[c] - mu) * rs, dnorm = gi[c] * w[c];
                dxi[c] = (accumulate ? dxi[c] : 0.0f) + rs * (dnorm - dnorm_mean - norm * dnorm_norm_mean);
            }
        }
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
        int c0 = (int)((long)C * id / nt), c1 = (int)((long)C * (id + 1) / nt);
        for (int i = 0; i < R; i++) {
            const float *xi = x + (size_t)i * C, *gi = dout + (size_t)i * C;
            float mu = mean[i], rs = rstd[i];
            for (int c = c0; c < c1; c++) {
                dw[c] += gi[c] * (xi[c] - mu) * rs;
                db[c] += gi[c];
            }
        }
    }
}

// GELU runs 8 lanes at a time with AVX2 (GCC does not vectorise this body).
// Every element, the tail included (through a zero-padded lane buffer), takes
// the same vector path, so no element's rounding depends on where the thread
// ranges split the array: results stay identical for any thread count.
#ifdef MG_AVX2
// fast_expf on 8 lanes, the same steps. The clamp keeps NaN (minps/maxps
// return their second operand when either is NaN, so x goes second).
static inline __m256 exp8(__m256 x) {
    x = _mm256_max_ps(_mm256_set1_ps(-87.0f), _mm256_min_ps(_mm256_set1_ps(88.0f), x));
    __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.0f));
    __m256i scale = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(scale));
}

static inline __m256 tanh8(__m256 u) {
    __m256 one = _mm256_set1_ps(1.0f);
    __m256 e = exp8(_mm256_add_ps(u, u));
    return _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, one)));
}

// 0.5 x (1 + tanh(s (x + c x^3))), and its derivative.
static inline __m256 gelu8(__m256 x) {
    __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
    __m256 u = _mm256_mul_ps(_mm256_set1_ps(MG_GELU_SCALE), _mm256_fmadd_ps(_mm256_set1_ps(MG_GELU_C), x3, x));
    return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), x), _mm256_add_ps(_mm256_set1_ps(1.0f), tanh8(u)));
}

static inline __m256 gelu_grad8(__m256 x) {
    __m256 one = _mm256_set1_ps(1.0f), half = _mm256_set1_ps(0.5f), xx = _mm256_mul_ps(x, x);
    __m256 u = _mm256_mul_ps(_mm256_set1_ps(MG_GELU_SCALE), _mm256_fmadd_ps(_mm256_set1_ps(MG_GELU_C), _mm256_mul_ps(xx, x), x));
    __m256 th = tanh8(u), sech2 = _mm256_fnmadd_ps(th, th, one);
    __m256 inner = _mm256_mul_ps(_mm256_set1_ps(MG_GELU_SCALE), _mm256_fmadd_ps(_mm256_set1_ps(3.0f * MG_GELU_C), xx, one));
    return _mm256_fmadd_ps(_mm256_mul_ps(_mm256_mul_ps(half, x), sech2), inner, _mm256_mul_ps(half, _mm256_add_ps(one, th)));
}
#endif

// One thread's range [begin, end) of out = gelu(x) (backward: out = dout * gelu'(x)).
static void gelu_range(float *out, const float *x, const float *dout, size_t begin, size_t end) {
#ifdef MG_AVX2
    size_t i = begin;
    for (; i + 8 <= end; i += 8) {
        __m256 xi = _mm256_loadu_ps(x + i);
        __m256 y = dout ? _mm256_mul_ps(_mm256_loadu_ps(dout + i), gelu_grad8(xi)) : gelu8(xi);
        _mm256_storeu_ps(out + i, y);
    }
    if (i < end) {
        float xl[8] = {0}, dl[8] = {0}, yl[8];
        memcpy(xl, x + i, (end - i) * sizeof(float));
        if (dout) memcpy(dl, dout + i, (end - i) * sizeof(float));
        __m256 xi = _mm256_loadu_ps(xl);
        _mm256_storeu_ps(yl, dout ? _mm256_mul_ps(_mm256_loadu_ps(dl), gelu_grad8(xi)) : gelu8(xi));
        memcpy(out + i, yl, (end - i) * sizeof(float));
    }
#else
    for (size_t i = begin; i < end; i++) {
        float xi = x[i], u = MG_GELU_SCALE * (xi + MG_GELU_C * xi * xi * xi), th = fast_tanhf(u);
        if (!dout) { out[i] = 0.5f * xi * (1.0f + th); continue; }
        float grad = 0.5f * (1.0f + th) + 0.5f * xi * (1.0f - th * th) * MG_GELU_SCALE * (1.0f + 3.0f * MG_GELU_C * xi * xi);
        out[i] = dout[i] * grad;
    }
#endif
}

// Thread ranges start at multiples of 64 elements, so the lane groups are the
// same whatever the thread count.
static void gelu_parallel(float *out, const float *x, const float *dout, size_t n, int threads) {
    #pragma omp parallel num_threads(threads)
    {
        size_t blocks = (n + 63) / 64, nt = (size_t)omp_get_num_threads(), id = (size_t)omp_get_thread_num();
        size_t begin = blocks * id / nt * 64, end = blocks * (id + 1) / nt * 64;
        if (end > n) end = n;
        if (begin < end) gelu_range(out, x, dout, begin, end);
    }
}

// out = gelu(x), elementwise (tanh approximation, MG_GELU_SCALE, MG_GELU_C).
static void gelu_forward(float *out, const float *x, size_t n, int threads) { gelu_parallel(out, x, NULL, n, threads); }

// dx = dout * d gelu(x)/dx; dx may alias dout (read before written, same index).
static void gelu_backward(float *dx, const float *x, const float *dout, size_t n, int threads) {
    gelu_parallel(dx, x, dout, n, threads);
}

// --precision fp8: dst[n] = src[n] rounded through fmt at the tensor's own
// current scale (fp8.h: a power of two from the largest finite |src|). The
// amax is a maximum, exact in any order, so the result does not depend on
// the thread count.
static void fp8_round_trip(float *dst, const float *src, size_t n, MgFp8Format fmt, int threads) {
    float amax = 0.0f;
    #pragma omp parallel for reduction(max : amax) schedule(static) num_threads(threads)
    for (size_t i = 0; i < n; i++) {
        float a = fabsf(src[i]);
        if (a <= FLT_MAX && a > amax) amax = a;  // NaN and inf fail the first test
    }
    int k = mg_fp8_scale_exp(amax, fmt);
    float scale = mg_fp8_scale(k), inv_scale = mg_fp8_scale(-k);
    // mg_fp8_round_trip with the decode looked up: every code's value, once.
    static float decoded[2][256];
    static int have_table;
    if (!have_table) {
        for (int c = 0; c < 256; c++) {
            decoded[MG_FP8_E4M3][c] = mg_fp8_decode((uint8_t)c, MG_FP8_E4M3);
            decoded[MG_FP8_E5M2][c] = mg_fp8_decode((uint8_t)c, MG_FP8_E5M2);
        }
        have_table = 1;
    }
    const float *table = decoded[fmt];
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (size_t i = 0; i < n; i++) dst[i] = table[mg_fp8_encode(src[i] * scale, fmt)] * inv_scale;
}

// out[R, OC] = (residual or 0) + bias + x[R, IC] W[OC, IC]^T. Adding the
// residual here fuses the block's skip connection into the matmul's output.
// With gelu_pre, that goes to gelu_pre (kept for the backward) and out =
// GELU(gelu_pre).
static void matmul_forward(float *out, const float *x, const float *W, const float *bias, const float *residual, int R,
                           int IC, int OC, float *gelu_pre, GemmScratch *gs) {
    if (gs->fp8) {  // E4M3 input and weight; bias, residual and GELU in fp32
        fp8_round_trip(gs->fp8_x, x, (size_t)R * IC, MG_FP8_E4M3, gs->threads);
        fp8_round_trip(gs->fp8_w, W, (size_t)OC * IC, MG_FP8_E4M3, gs->threads);
        x = gs->fp8_x;
        W = gs->fp8_w;
    }
    float *target = gelu_pre ? gelu_pre : out;
    #pragma omp parallel for schedule(static) num_threads(gs->threads)
    for (int i = 0; i < R; i++) {
        float *oi = target + (size_t)i * OC;
        const float *ri = residual ? residual + (size_t)i * OC : NULL;
        for (int o = 0; o < OC; o++) oi[o] = (ri ? ri[o] : 0.0f) + bias[o];
    }
    gemm(gs, R, OC, IC, x, IC, 1, W, 1, IC, target, OC, 1);
    if (gelu_pre) gelu_forward(out, gelu_pre, (size_t)R * OC, gs->threads);
}

// dx = dout W (times gelu'(gelu_pre) when given: the backward of the GELU
// that produced x); dW += dout^T x; db += column sums of dout. In fp8 the
// two products take dout through E5M2 and W and x through E4M3 (each at its
// own scale, x's the same as in the forward); db sums the fp32 dout.
static void matmul_backward(float *dx, float *dW, float *db, const float *dout, const float *x, const float *W, int R,
                            int IC, int OC, const float *gelu_pre, GemmScratch *gs) {
    const float *dq = dout;
    if (gs->fp8) {
        fp8_round_trip(gs->fp8_d, dout, (size_t)R * OC, MG_FP8_E5M2, gs->threads);
        fp8_round_trip(gs->fp8_w, W, (size_t)OC * IC, MG_FP8_E4M3, gs->threads);
        fp8_round_trip(gs->fp8_x, x, (size_t)R * IC, MG_FP8_E4M3, gs->threads);
        dq = gs->fp8_d;
        W = gs->fp8_w;
        x = gs->fp8_x;
    }
    gemm(gs, R, IC, OC, dq, OC, 1, W, IC, 1, dx, IC, 0);
    gemm(gs, OC, IC, R, dq, 1, OC, x, IC, 1, dW, IC, 1);
    if (gelu_pre) gelu_backward(dx, gelu_pre, dx, (size_t)R * IC, gs->threads);
    if (!db) return;
    #pragma omp parallel num_threads(gs->threads)
    {
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
        int o0 = (int)((long)OC * id / nt), o1 = (int)((long)OC * (id + 1) / nt);
        for (int i = 0; i < R; i++) {
            const float *gi = dout + (size_t)i * OC;
            for (int o = o0; o < o1; o++) db[o] += gi[o];
        }
    }
}

// Causal self-attention. qkv rows are [q | k | v], each C wide, heads
// contiguous (hd = C/H). Each (batch, head) is one thread's work, done as
// small matmuls through gemm_serial: scores S = Q K^T (tiles above the
// diagonal skipped), a causal softmax in place (zeros above the diagonal, so
// the next product can run over the whole square), then Y = P V. The
// probabilities P are saved for the backward.
// attention_softmax_rows: rows of `keys` scores each; row i is the query at
// position pos0 + i, which sees keys 0..pos0+i (the rest of its row is zeroed).
static void attention_softmax_rows(float *p, int rows, int keys, int pos0, float scale) {
    for (int i = 0; i < rows; i++) {
        int t = pos0 + i;
        float *row = p + (size_t)i * keys;
        float maxv = -INFINITY;
        for (int t2 = 0; t2 <= t; t2++) { row[t2] *= scale; maxv = row[t2] > maxv ? row[t2] : maxv; }
        #pragma omp simd
        for (int t2 = 0; t2 <= t; t2++) row[t2] = fast_expf(row[t2] - maxv);
        float inv = 1.0f / sum_of(row, t + 1);
        for (int t2 = 0; t2 <= t; t2++) row[t2] *= inv;
        for (int t2 = t + 1; t2 < keys; t2++) row[t2] = 0.0f;
    }
}

static void attention_forward(float *y, float *att, const float *qkv, int B, int T, int C, int H,
                              const AttentionScratch *as) {
    int hd = C / H, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hd);
    #pragma omp parallel for collapse(2) schedule(static) num_threads(as->threads)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const GemmThreadBuffers *buf = &as->gemm[omp_get_thread_num()];
            const float *q = qkv + (size_t)b * T * C3 + h * hd, *k = q + C, *v = q + 2 * C;
            float *p = att + ((size_t)b * H + h) * T * T;
            gemm_serial(buf, T, T, hd, q, C3, 1, k, 1, C3, p, T, 1);
            attention_softmax_rows(p, T, T, 0, scale);
            gemm_serial(buf, T, hd, T, p, T, 1, v, C3, 1, y + (size_t)b * T * C + h * hd, C, 0);
        }
}

// The backward of the same products, per (batch, head):
// dP = dY V^T, dV = P^T dY, dS = P * (dP - rowsum(P * dP)) * scale,
// dQ = dS K, dK = dS^T Q. Each writes its own slice of dqkv, once.
static void attention_backward(float *dqkv, const float *dy, const float *qkv, const float *att, int B, int T, int C,
                               int H, const AttentionScratch *as) {
    int hd = C / H, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hd);
    #pragma omp parallel for collapse(2) schedule(static) num_threads(as->threads)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            int tid = omp_get_thread_num();
            const GemmThreadBuffers *buf = &as->gemm[tid];
            float *ds = as->dscores + (size_t)tid * T * T;
            const float *q = qkv + (size_t)b * T * C3 + h * hd, *k = q + C, *v = q + 2 * C;
            const float *p = att + ((size_t)b * H + h) * T * T;
            const float *g = dy + (size_t)b * T * C + h * hd;
            float *dq = dqkv + (size_t)b * T * C3 + h * hd, *dk = dq + C, *dv = dq + 2 * C;
            gemm_serial(buf, T, T, hd, g, C, 1, v, 1, C3, ds, T, 1);
            gemm_serial(buf, T, hd, T, p, 1, T, g, C, 1, dv, C3, 0);
            for (int t = 0; t < T; t++) {
                const float *prow = p + (size_t)t * T;
                float *drow = ds + (size_t)t * T, pd = dot_of(prow, drow, t + 1);
                for (int t2 = 0; t2 <= t; t2++) drow[t2] = prow[t2] * (drow[t2] - pd) * scale;
                for (int t2 = t + 1; t2 < T; t2++) drow[t2] = 0.0f;
            }
            gemm_serial(buf, T, hd, T, ds, T, 1, k, C3, 1, dq, C3, 0);
            gemm_serial(buf, T, hd, T, ds, 1, T, q, C3, 1, dk, C3, 0);
        }
}

// Softmax cross-entropy over the vocabulary for each of BT positions, its
// forward and backward in one pass over each row: losses[i], and the logits
// become the probabilities, then (write_grad) their gradient (softmax -
// onehot) * grad_scale in place.
static void fused_classifier(float *logits, float *losses, const int *targets, int BT, int V, float grad_scale,
                             int write_grad, int threads) {
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int i = 0; i < BT; i++) {
        float *row = logits + (size_t)i * V;
        float maxv = -INFINITY;
        #pragma omp simd reduction(max:maxv)
        for (int j = 0; j < V; j++) maxv = row[j] > maxv ? row[j] : maxv;
        float target_logit = row[targets[i]];
        #pragma omp simd
        for (int j = 0; j < V; j++) row[j] = fast_expf(row[j] - maxv);
        float sum = sum_of(row, V), inv = 1.0f / sum;
        for (int j = 0; j < V; j++) row[j] *= inv;
        losses[i] = logf(sum) - (target_logit - maxv);
        if (!write_grad) continue;
        for (int j = 0; j < V; j++) row[j] *= grad_scale;
        row[targets[i]] -= grad_scale;
    }
}

// ----------------------------------------------------------------------------
// The model: forward through the blocks, head, backward. Line for line the
// CUDA engine's blocks_forward, model_forward and model_backward.

static float *layer_param(Cpu *e, int l, int tensor) { return e->params + mg_param(&e->lay, l, tensor); }
static float *layer_grad(Cpu *e, int l, int tensor) { return e->grads + mg_param(&e->lay, l, tensor); }

// Runs the blocks on rows x T tokens already in a.inputs; the final hidden
// state (before the final LayerNorm) is res3 of the last layer.
static void blocks_forward(Cpu *e, int B, int T) {
    int C = e->C, H = e->H, BT = B * T, nt = e->threads;
    size_t bt = (size_t)BT;
    Acts *a = &e->a;
    GemmScratch *gs = &e->gs;
    embedding_forward(a->x0, a->inputs, e->params + e->lay.wte, e->params + e->lay.wpe, BT, T, C, NULL, nt);
    for (int l = 0; l < e->L; l++) {
        const float *x = l == 0 ? a->x0 : a->res3 + (size_t)(l - 1) * bt * C;
        float *ln1 = a->ln1 + (size_t)l * bt * C, *qkv = a->qkv + (size_t)l * bt * 3 * C;
        float *att = a->att + (size_t)l * e->B * e->H * e->T * e->T;
        float *atty = a->atty + (size_t)l * bt * C, *res2 = a->res2 + (size_t)l * bt * C;
        float *ln2 = a->ln2 + (size_t)l * bt * C, *fch = a->fch + (size_t)l * bt * 4 * C;
        float *fch_gelu = a->fch_gelu + (size_t)l * bt * 4 * C, *res3 = a->res3 + (size_t)l * bt * C;
        layernorm_forward(ln1, a->ln1_mean + (size_t)l * bt, a->ln1_rstd + (size_t)l * bt, x,
                          layer_param(e, l, MG_LN1W), layer_param(e, l, MG_LN1B), BT, C, nt);
        matmul_forward(qkv, ln1, layer_param(e, l, MG_QKVW), layer_param(e, l, MG_QKVB), NULL, BT, C, 3 * C, NULL, gs);
        attention_forward(atty, att, qkv, B, T, C, H, &e->s.att);
        matmul_forward(res2, atty, layer_param(e, l, MG_PROJW), layer_param(e, l, MG_PROJB), x, BT, C, C, NULL, gs);
        layernorm_forward(ln2, a->ln2_mean + (size_t)l * bt, a->ln2_rstd + (size_t)l * bt, res2,
                          layer_param(e, l, MG_LN2W), layer_param(e, l, MG_LN2B), BT, C, nt);
        matmul_forward(fch_gelu, ln2, layer_param(e, l, MG_FCW), layer_param(e, l, MG_FCB), NULL, BT, C, 4 * C, fch, gs);
        matmul_forward(res3, fch_gelu, layer_param(e, l, MG_FCPROJW), layer_param(e, l, MG_FCPROJB), res2, BT, 4 * C, C,
                       NULL, gs);
    }
}

static const float *final_hidden(Cpu *e, int BT) { return e->a.res3 + (size_t)(e->L - 1) * BT * e->C; }

// Blocks, final LayerNorm, tied head: logits = lnf wte^T, for rows rows of
// T+1 tokens (inputs and shifted targets).
static void model_forward(Cpu *e, const uint16_t *rows_tokens, int rows) {
    int T = e->T, C = e->C, BT = rows * T;
    for (int r = 0; r < rows; r++)
        for (int t = 0; t < T; t++) {
            e->a.inputs[r * T + t] = rows_tokens[(size_t)r * (T + 1) + t];
            e->a.targets[r * T + t] = rows_tokens[(size_t)r * (T + 1) + t + 1];
        }
    blocks_forward(e, rows, T);
    layernorm_forward(e->a.lnf, e->a.lnf_mean, e->a.lnf_rstd, final_hidden(e, BT), e->params + e->lay.lnfw,
                      e->params + e->lay.lnfb, BT, C, e->threads);
    gemm(&e->gs, BT, e->V, C, e->a.lnf, C, 1, e->params + e->lay.wte, 1, C, e->a.logits, e->V, 0);
}

static void row_losses(Cpu *e, int rows, float *row_loss) {
    int T = e->T;
    for (int r = 0; r < rows; r++) {
        double sum = 0;
        for (int t = 0; t < T; t++) sum += e->a.losses[r * T + t];
        row_loss[r] = (float)(sum / T);
    }
}

// From the logits' gradient (fused_classifier wrote it) to every parameter's.
static void model_backward(Cpu *e, int B) {
    int T = e->T, C = e->C, H = e->H, BT = B * T, nt = e->threads;
    size_t bt = (size_t)BT;
    Acts *a = &e->a;
    Scratch *s = &e->s;
    GemmScratch *gs = &e->gs;
    // Head: dlnf = dlogits wte; dwte += dlogits^T lnf; then the final LayerNorm.
    // Straight GEMMs, not matmul_backward: the tied head stays fp32 in fp8.
    gemm(gs, BT, C, e->V, a->logits, e->V, 1, e->params + e->lay.wte, C, 1, s->dlnf, C, 0);
    gemm(gs, e->V, C, BT, a->logits, 1, e->V, a->lnf, C, 1, e->grads + e->lay.wte, C, 1);
    layernorm_backward(s->dres, e->grads + e->lay.lnfw, e->grads + e->lay.lnfb, s->dlnf, final_hidden(e, BT),
                       e->params + e->lay.lnfw, a->lnf_mean, a->lnf_rstd, BT, C, 0, nt);
    for (int l = e->L - 1; l >= 0; l--) {
        const float *x = l == 0 ? a->x0 : a->res3 + (size_t)(l - 1) * bt * C;
        const float *ln1 = a->ln1 + (size_t)l * bt * C, *qkv = a->qkv + (size_t)l * bt * 3 * C;
        const float *att = a->att + (size_t)l * e->B * e->H * e->T * e->T;
        const float *atty = a->atty + (size_t)l * bt * C, *res2 = a->res2 + (size_t)l * bt * C;
        const float *ln2 = a->ln2 + (size_t)l * bt * C, *fch = a->fch + (size_t)l * bt * 4 * C;
        const float *fch_gelu = a->fch_gelu + (size_t)l * bt * 4 * C;
        // MLP branch: dres is d(res3); the skip passes it to res2 unchanged.
        matmul_backward(s->dfch, layer_grad(e, l, MG_FCPROJW), layer_grad(e, l, MG_FCPROJB), s->dres, fch_gelu,
                        layer_param(e, l, MG_FCPROJW), BT, 4 * C, C, fch, gs);
        matmul_backward(s->dln, layer_grad(e, l, MG_FCW), layer_grad(e, l, MG_FCB), s->dfch, ln2,
                        layer_param(e, l, MG_FCW), BT, C, 4 * C, NULL, gs);
        layernorm_backward(s->dres, layer_grad(e, l, MG_LN2W), layer_grad(e, l, MG_LN2B), s->dln, res2,
                           layer_param(e, l, MG_LN2W), a->ln2_mean + (size_t)l * bt, a->ln2_rstd + (size_t)l * bt, BT,
                           C, 1, nt);
        // Attention branch: dres is now d(res2).
        matmul_backward(s->datty, layer_grad(e, l, MG_PROJW), layer_grad(e, l, MG_PROJB), s->dres, atty,
                        layer_param(e, l, MG_PROJW), BT, C, C, NULL, gs);
        attention_backward(s->dqkv, s->datty, qkv, att, B, T, C, H, &s->att);
        matmul_backward(s->dln, layer_grad(e, l, MG_QKVW), layer_grad(e, l, MG_QKVB), s->dqkv, ln1,
                        layer_param(e, l, MG_QKVW), BT, C, 3 * C, NULL, gs);
        layernorm_backward(s->dres, layer_grad(e, l, MG_LN1W), layer_grad(e, l, MG_LN1B), s->dln, x,
                           layer_param(e, l, MG_LN1W), a->ln1_mean + (size_t)l * bt, a->ln1_rstd + (size_t)l * bt, BT,
                           C, 1, nt);
    }
    embedding_backward(e->grads + e->lay.wte, e->grads + e->lay.wpe, s->dres, a->inputs, BT, T, C, nt);
}

static void cpu_forward_backward(void *impl, const uint16_t *rows_tokens, int rows, float grad_scale, float *row_loss) {
    Cpu *e = (Cpu *)impl;
    model_forward(e, rows_tokens, rows);
    fused_classifier(e->a.logits, e->a.losses, e->a.targets, rows * e->T, e->V, grad_scale, 1, e->threads);
    row_losses(e, rows, row_loss);
    model_backward(e, rows);
}

static void cpu_forward_loss(void *impl, const uint16_t *rows_tokens, int rows, float *row_loss) {
    Cpu *e = (Cpu *)impl;
    model_forward(e, rows_tokens, rows);
    fused_classifier(e->a.logits, e->a.losses, e->a.targets, rows * e->T, e->V, 0.0f, 0, e->threads);
    row_losses(e, rows, row_loss);
}

// Sampling: logits at the last position only, so the head costs one row.
static void cpu_last_logits(void *impl, const uint16_t *tokens, int rows, int len, float *out) {
    Cpu *e = (Cpu *)impl;
    int C = e->C, BT = rows * len;
    for (int i = 0; i < BT; i++) e->a.inputs[i] = tokens[i];
    blocks_forward(e, rows, len);
    const float *hidden = final_hidden(e, BT);
    for (int r = 0; r < rows; r++) {
        size_t last = (size_t)r * len + len - 1;
        layernorm_forward(e->a.lnf + (size_t)r * C, e->a.lnf_mean + r, e->a.lnf_rstd + r, hidden + last * C,
                          e->params + e->lay.lnfw, e->params + e->lay.lnfb, 1, C, e->threads);
    }
    gemm(&e->gs, rows, e->V, C, e->a.lnf, C, 1, e->params + e->lay.wte, 1, C, out, e->V, 0);
}

// ----------------------------------------------------------------------------
// Sampling with the KV cache (engine.h, kv_forward). Only the new positions
// run, packed (N rows for all sequences together), through the ops of
// blocks_forward, with layer 0's activation buffers as scratch for every
// layer; each layer's new keys and values go into the cache. Attention of
// sequence i, head h: its new queries against its slot's keys 0..pos+n-1
// (gemm_serial, as attention_forward), the causal softmax at the queries'
// absolute positions, then P V. Every number is the same arithmetic in the
// same order as in blocks_forward over the whole sequence: a matmul's rows do
// not depend on one another, and the full forward's longer P V sums only add
// exact zeros (probabilities above the diagonal). So the logits equal
// cpu_last_logits' bit for bit (tests/engine/test_sampling.py checks it).

static void cpu_kv_forward(void *impl, int rows, const int *slot, const int *pos, const int *n_new,
                           const uint16_t *tokens, float *out) {
    Cpu *e = (Cpu *)impl;
    int C = e->C, C3 = 3 * C, H = e->H, hd = C / H, T = e->T;
    Acts *a = &e->a;
    int *start = e->kv_start;
    start[0] = 0;
    for (int i = 0; i < rows; i++) start[i + 1] = start[i] + n_new[i];
    int N = start[rows];
    for (int i = 0; i < rows; i++)
        for (int k = 0; k < n_new[i]; k++) {
            a->inputs[start[i] + k] = tokens[start[i] + k];
            e->kv_positions[start[i] + k] = pos[i] + k;
        }
    embedding_forward(a->x0, a->inputs, e->params + e->lay.wte, e->params + e->lay.wpe, N, T, C, e->kv_positions,
                      e->threads);
    float scale = 1.0f / sqrtf((float)hd);
    const float *x = a->x0;
    for (int l = 0; l < e->L; l++) {
        layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, x, layer_param(e, l, MG_LN1W), layer_param(e, l, MG_LN1B), N,
                          C, e->threads);
        matmul_forward(a->qkv, a->ln1, layer_param(e, l, MG_QKVW), layer_param(e, l, MG_QKVB), NULL, N, C, C3, NULL,
                       &e->gs);
        float *cache = e->kv + (size_t)l * e->B * T * 2 * C;
        for (int i = 0; i < rows; i++)
            for (int k = 0; k < n_new[i]; k++)
                memcpy(cache + ((size_t)slot[i] * T + pos[i] + k) * 2 * C, a->qkv + (size_t)(start[i] + k) * C3 + C,
                       2 * (size_t)C * sizeof(float));
        #pragma omp parallel for collapse(2) schedule(static) num_threads(e->threads)
        for (int i = 0; i < rows; i++)
            for (int h = 0; h < H; h++) {
                const GemmThreadBuffers *buf = &e->s.att.gemm[omp_get_thread_num()];
                int n = n_new[i], keys = pos[i] + n;
                const float *q = a->qkv + (size_t)start[i] * C3 + h * hd;
                const float *k = cache + (size_t)slot[i] * T * 2 * C + h * hd, *v = k + C;
                float *p = a->att + ((size_t)i * H + h) * T * T;
                gemm_serial(buf, n, keys, hd, q, C3, 1, k, 1, 2 * C, p, keys, 0);
                attention_softmax_rows(p, n, keys, pos[i], scale);
                gemm_serial(buf, n, hd, keys, p, keys, 1, v, 2 * C, 1, a->atty + (size_t)start[i] * C + h * hd, C, 0);
            }
        matmul_forward(a->res2, a->atty, layer_param(e, l, MG_PROJW), layer_param(e, l, MG_PROJB), x, N, C, C, NULL,
                       &e->gs);
        layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, layer_param(e, l, MG_LN2W),
                          layer_param(e, l, MG_LN2B), N, C, e->threads);
        matmul_forward(a->fch_gelu, a->ln2, layer_param(e, l, MG_FCW), layer_param(e, l, MG_FCB), NULL, N, C, 4 * C,
                       a->fch, &e->gs);
        matmul_forward(a->res3, a->fch_gelu, layer_param(e, l, MG_FCPROJW), layer_param(e, l, MG_FCPROJB), a->res2, N,
                       4 * C, C, NULL, &e->gs);
        x = a->res3;
    }
    for (int i = 0; i < rows; i++)
        layernorm_forward(a->lnf + (size_t)i * C, a->lnf_mean + i, a->lnf_rstd + i, x + (size_t)(start[i + 1] - 1) * C,
                          e->params + e->lay.lnfw, e->params + e->lay.lnfb, 1, C, e->threads);
    gemm(&e->gs, rows, e->V, C, a->lnf, C, 1, e->params + e->lay.wte, 1, C, out, e->V, 0);
}

// ----------------------------------------------------------------------------
// Optimizer.

// The L2 norm of g[n]: sums of squares in fixed 64K-element chunks, then the
// chunk sums in order: the same bits whatever the thread count.
#define NORM_CHUNK 65536
static double global_norm(const float *g, size_t n, int threads) {
    size_t chunks = (n + NORM_CHUNK - 1) / NORM_CHUNK;
    double *partial = (double *)mg_malloc(chunks * sizeof(double));
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (size_t ch = 0; ch < chunks; ch++) {
        size_t i0 = ch * NORM_CHUNK, i1 = i0 + NORM_CHUNK < n ? i0 + NORM_CHUNK : n;
        double acc = 0;
        for (size_t i = i0; i < i1; i++) acc += (double)g[i] * g[i];
        partial[ch] = acc;
    }
    double total = 0;
    for (size_t ch = 0; ch < chunks; ch++) total += partial[ch];
    free(partial);
    return sqrt(total);
}

// One AdamW step (1-based `step`) as torch.optim.AdamW computes it:
// decoupled decay first (on the ranges that take it), then the
// bias-corrected step; grads are multiplied by grad_mult (the clip factor)
// first.
static void adamw_update(float *params, const float *grads, float *m, float *v, const MgRange *ranges, int n_ranges,
                         float grad_mult, float lr, float beta1, float beta2, float eps, float weight_decay, int step,
                         int threads) {
    double bc1 = 1.0 - pow(beta1, step), bc2 = 1.0 - pow(beta2, step);
    float step_size = (float)(lr / bc1), bc2_sqrt = (float)sqrt(bc2);
    for (int r = 0; r < n_ranges; r++) {
        MgRange rg = ranges[r];
        float decay = rg.decay ? 1.0f - lr * weight_decay : 1.0f;
        #pragma omp parallel for schedule(static) num_threads(threads)
        for (size_t i = rg.begin; i < rg.end; i++) {
            float g = grads[i] * grad_mult;
            float mi = beta1 * m[i] + (1.0f - beta1) * g;
            float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
            m[i] = mi;
            v[i] = vi;
            params[i] = params[i] * decay - step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
        }
    }
}

static double cpu_grad_norm(void *impl) {
    Cpu *e = (Cpu *)impl;
    return global_norm(e->grads, e->lay.n, e->threads);
}

static void cpu_update(void *impl, int step, float lr, float grad_mult) {
    Cpu *e = (Cpu *)impl;
    const MgConfig *c = &e->cfg;
    adamw_update(e->params, e->grads, e->m, e->v, e->ranges, e->n_ranges, grad_mult, lr, c->beta1, c->beta2, c->eps,
                 c->weight_decay, step, e->threads);
}

// ----------------------------------------------------------------------------
// The engine table (engine.h) and main(), which runs the shared driver
// (train.h) with it. The CPU engine has no whole-step path and snapshots
// through get_state: those slots stay empty and their caps off.

static const MgEngineOps cpu_ops = {
    .configure = cpu_configure,
    .init = cpu_init,
    .set_state = cpu_set_state,
    .get_state = cpu_get_state,
    .zero_grads = cpu_zero_grads,
    .forward_backward = cpu_forward_backward,
    .forward_loss = cpu_forward_loss,
    .grad_norm = cpu_grad_norm,
    .update = cpu_update,
    .get_grads = cpu_get_grads,
    .set_grads = cpu_set_grads,
    .last_logits = cpu_last_logits,
    .kv_forward = cpu_kv_forward,
    .train_step = NULL,
    .snapshot = NULL,
    .snapshot_wait = NULL,
    .reduce_grads = NULL,
};

int main(int argc, char **argv) {
    static Cpu impl;
    static MgEngine eng = {.name = "cpu", .ops = &cpu_ops, .impl = &impl};
    impl.eng = &eng;
    return mg_main(argc, argv, &eng);
}

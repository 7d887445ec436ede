// microgpt_cuda.cu: the GPU engine (CUDA + cuBLASLt).
//
// The model of docs/ARCHITECTURE.md on one NVIDIA GPU, in the manner of llm.c's
// train_gpt2.cu: this file holds the model (its buffers, the forward and
// backward through the layers, the step, device selection and allocation);
// the ops are in cuda/, one header each with its kernels forward beside
// backward, named as their CPU twins in microgpt_cpu.c. Every CUDA and
// cuBLASLt call is checked. This file only computes, exactly as
// microgpt_cpu.c does, and is tested against it (tests/gpu/); it ends with its
// engine table (engine.h). The driver (flags, frames, events, checkpoints,
// signals, the training loop) is shared, in train.h and the headers it
// includes.
//
// Precision (--precision):
//   fp32  every activation, matmul (CUBLAS_COMPUTE_32F: true fp32, never TF32)
//         and reduction in fp32. The reference mode the tests compare with the
//         CPU engine. Matmuls run unfused (bias, residual and GELU are our own
//         kernels, with the CPU engine's formulas).
//   bf16  (default on sm_80+) activations and matmul operands in bf16 with
//         fp32 accumulation; fp32 master weights, gradients, Adam moments,
//         LayerNorm statistics, softmax and loss arithmetic; checkpoints fp32.
//         Matmuls use cuBLASLt epilogues: BIAS (+ residual through beta=1),
//         GELU_AUX_BIAS forward (pre-activation saved as aux) and DGELU
//         backward. Any epilogue cuBLASLt refuses falls back, once and for
//         good, to the unfused kernels (MICROGPT_CUDA_FUSE=0 forces that).
//
// Determinism: the same checkpoint and frames give bit-identical results on
// the same GPU and build. No kernel uses atomics; every reduction has one
// fixed order (fixed block/thread-to-element maps, fixed trees, partial sums
// by fixed chunks then summed in chunk order). cuBLASLt algorithms are picked
// once per GEMM shape by the heuristic with a fixed workspace, and reused.
//
// Memory: everything is allocated in init (gpu_init); the step loop allocates
// nothing. init also runs one warm-up forward+backward so that every cuBLASLt
// plan exists and every fused/unfused decision is taken before `ready`.
// What --help lists for --attention (config.h): cudnn only in a build with it.
#ifdef MICROGPT_CUDNN
#define MG_ATTENTION_PATHS "naive, flash, cudnn or auto"
#else
#define MG_ATTENTION_PATHS "naive, flash or auto (this build has no cuDNN)"
#endif

#include "engine.h"
#include "model.h"
#include "train.h"

#include <cuda_profiler_api.h>
#include <float.h>
#include <limits.h>

// The ops, one header each (forward beside backward), in the order the step
// runs them.
#include "cuda/common.cuh"
#include "cuda/embedding.cuh"
#include "cuda/layernorm.cuh"
#include "cuda/matmul.cuh"      // with bias.cuh, gelu.cuh, colsum.cuh
#include "cuda/attention.cuh"   // naive, and attention_flash.cuh (--attention flash)
#ifdef MICROGPT_CUDNN
#include "cuda/attention_cudnn.h"  // --attention cudnn (its own translation unit)
#include "cuda/cudnn_loader.h"     // cuDNN, loaded at run time (not linked)
#endif
#include "cuda/classifier.cuh"
#include "cuda/global_norm.cuh"
#include "cuda/adamw.cuh"
#include "cuda/convert.cuh"
#include "cuda/sampling.cuh"
#ifdef MG_NCCL
#include "cuda/nccl.cuh"        // data-parallel: the gradients summed across the ranks (build/microgpt_cuda_mpi)
#endif

// ----------------------------------------------------------------------------
// The engine's state.

// MICROGPT_CUDA_PROFILE_STEP=n (scripts/profile_cuda.sh): the n-th training
// step of the process runs between cudaProfilerStart and cudaProfilerStop
// (so `ncu --profile-from-start off` sees exactly one step) and is timed with
// CUDA events, the whole step and every attention forward and backward call;
// one `microgpt: profile {...}` JSON line on stderr follows it. Off: no cost.
typedef struct {
    int step;               // the step to profile (1-based), 0 = off
    int seen;               // training steps started so far
    int active;             // inside the profiled step
    int cap;                // attention calls of each kind per step: layers * grad_accum
    int n[2];               // calls recorded: [0] attention forward, [1] attention backward
    cudaEvent_t begin, end;
    cudaEvent_t *ev[2];     // per kind, [2 * cap] start/stop pairs
} Profile;

typedef struct {
    MgEngine *eng;
    MgConfig cfg;
    MgLayout lay;
    int B, T, C, L, H, V, hd, BT;
    int bf16;             // activations and matmuls in bf16 (else fp32)
    AttentionKind attention;  // naive, flash (attention_flash.cuh) or cudnn (attention_cudnn.h)
#ifdef MICROGPT_CUDNN
    CudnnAttention *cudnn;    // the SDPA graphs for this shape (attention cudnn only)
    void *cudnn_workspace;
#endif
    size_t xs;            // sizeof the activation type
    int fuse;             // try cuBLASLt's epilogues (bf16, unless MICROGPT_CUDA_FUSE=0); init hands it to mm
    // --fused: the fused step (bf16): the whole optimizer step enqueued with no
    // host wait (train_step), the kernels below where they apply at this shape.
    int fused;
    int ln_fused;         // layernorm_backward_fused, with the proj/fcproj bias gradients folded in
    int ce_smem;          // fused_classifier_smem
    int wte_fused;        // embedding_backward_fused
    // --cuda-graph: that step captured once (at the first step) and replayed.
    int use_graph;
    cudaGraphExec_t graph;
    int capturing;        // inside the capture: the profiler's per-call marks stay out
    int K;                // micro-batches per step (--grad-accum)
    int sample_rowlocal;  // sampling through sampling.cuh (KV cache and recompute alike), else model_forward
    int micro;            // the current micro-batch (select_micro)
    cudaDeviceProp prop;
    cudaStream_t stream;
    cudaEvent_t loss_ready;
    // The checkpoint snapshot: weights and moments copied into pinned host
    // buffers on a side stream, after the update that made them
    // (update_done); the next update waits for copy_done.
    cudaStream_t copy_stream;
    cudaEvent_t update_done, copy_done;
    float *h_snap_w, *h_snap_m, *h_snap_v;
    Matmul mm;            // cuBLASLt: handle, workspace, plans; fuse = try the epilogues (bf16 only)
    DecayMap dm;

    // Parameters (flat, docs/ARCHITECTURE.md order), fp32 master, gradients, moments;
    // wx is the compute copy in the activation type (== params in fp32).
    float *params, *grads, *m, *v;
    void *wx;

    // Activations, saved for the backward. [L, BT, ...] where per layer.
    void *x0;                                   // [BT, C]
    void *ln1, *qkv, *atty, *res2, *ln2, *fch, *fch_gelu, *res3;
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd;  // [L, BT]
    float *lse;                                 // [L, B*H*T] attention log-sum-exp
    void *lnf;                                  // [BT, C]
    float *lnf_mean, *lnf_rstd;                 // [BT]
    void *logits;                               // [BT, V]: logits, then their gradient
    float *losses;                              // [BT] of the current micro-batch (a slice of losses_all)
    int *inputs, *targets;                      // [BT] of the current micro-batch
    float *losses_all;                          // [K, BT]: the fused step's micro-batches
    int *inputs_all, *targets_all;              // [K, BT]

    // Backward scratch.
    void *dres, *dln, *dqkv, *datty, *dfch;
    float *att_D;                               // [B*H*T]
    float *partial;                             // column-sum partials (colsum.cuh), for up to 4C columns
    int *bucket_tok, *bucket_start, *positions; // embedding backward buckets of the current micro-batch
    int *bucket_tok_all, *bucket_start_all, *positions_all;  // [K, BT], [K, BT + 1], [K, BT]
    int *n_buckets_all;                         // [K]: their counts (the fused wte backward reads them)
    float *ln_partial;                          // layernorm_backward_fused's per-block sums
    AdamWStep *opt;                             // the fused step's settings (lr, bias corrections, clip factor)
    float *logits_out;                          // [B, V] fp32, sampling
    double *norm_partial, *norm_out;
    Profile prof;

    // Data-parallel (the NCCL build, build/microgpt_cuda_mpi; caps.reduce_grads):
    // this rank's micro-batches accumulate in place; during the backward of
    // the last of them each range of the gradients (the head's LayerNorm,
    // each layer, the embeddings: contiguous in the layout, model.h) is summed
    // across the ranks on NCCL's stream as soon as its last write is
    // enqueued; gpu_reduce_grads waits for those sums.
    int dp;               // on: the NCCL build (even on one rank: the sum of one is the identity)
    int micro_per_rank;   // --grad-accum / ranks
    int micro_done;       // micro-batches since zero_grads
    int reduce_now;       // inside the backward of the last of them
#ifdef MG_NCCL
    Nccl nccl;
#endif

    // Pinned host staging, [K, ...] like their device twins (the classic path uses slice 0).
    int *h_inputs, *h_targets, *h_bucket_tok, *h_bucket_start, *h_positions, *h_cursor, *h_n_buckets;
    float *h_losses, *h_logits;
    double *h_norm;
    AdamWStep *h_opt;
    int n_buckets;      // of slice 0 (the classic path)

    size_t bytes;
} Gpu;

static void *dev_alloc(Gpu *e, size_t bytes) {
    void *p = NULL;
    bytes = (bytes + 255) & ~(size_t)255;
    cudaError_t err = cudaMalloc(&p, bytes ? bytes : 256);
    if (err != cudaSuccess)
        mg_fail(MG_EXIT_IO, "out of GPU memory allocating %zu bytes (%zu already held): %s; try a smaller --batch",
                bytes, e->bytes, cudaGetErrorString(err));
    CUDA_CHECK(cudaMemset(p, 0, bytes ? bytes : 256));
    e->bytes += bytes;
    return p;
}

static void *host_alloc(size_t bytes) {
    void *p = NULL;
    CUDA_CHECK(cudaMallocHost(&p, bytes ? bytes : 16));
    memset(p, 0, bytes ? bytes : 16);
    return p;
}

// Typed views of the type-erased activation buffers.
template <typename Tx> static Tx *X(const void *base, size_t offset) { return (Tx *)base + offset; }

// Attention with the profiler's marks around it (the ops are in cuda/attention.cuh).
static void profile_mark(Gpu *e, int kind, int stop);

// cuDNN's attention (bf16 only; init chose it): a failed call ends the run.
static int cudnn_forward(Gpu *e, void *y, float *lse, const void *qkv) {
#ifdef MICROGPT_CUDNN
    char err[512];
    if (cudnn_attention_forward(e->cudnn, e->cudnn_workspace, y, lse, qkv, err, sizeof err))
        mg_fail(MG_EXIT_IO, "%s", err);
    return 1;
#else
    return 0;
#endif
}

static int cudnn_backward(Gpu *e, void *dqkv, const void *dy, const void *y, const void *qkv, const float *lse) {
#ifdef MICROGPT_CUDNN
    char err[512];
    if (cudnn_attention_backward(e->cudnn, e->cudnn_workspace, dqkv, dy, y, qkv, lse, err, sizeof err))
        mg_fail(MG_EXIT_IO, "%s", err);
    return 1;
#else
    return 0;
#endif
}

template <typename Tx>
static void attention_forward_marked(Gpu *e, Tx *y, float *lse, const Tx *qkv) {
    profile_mark(e, 0, 0);
    if (!(e->attention == ATTENTION_CUDNN && cudnn_forward(e, y, lse, qkv)))
        attention_forward<Tx>(y, lse, qkv, e->B, e->T, e->C, e->H, e->attention, e->stream);
    profile_mark(e, 0, 1);
}

template <typename Tx>
static void attention_backward_marked(Gpu *e, Tx *dqkv, const Tx *dy, const Tx *y, const Tx *qkv, const float *lse) {
    profile_mark(e, 1, 0);
    if (!(e->attention == ATTENTION_CUDNN && cudnn_backward(e, dqkv, dy, y, qkv, lse)))
        attention_backward<Tx>(dqkv, dy, y, qkv, lse, e->B, e->T, e->C, e->H, e->att_D, e->attention, e->stream);
    profile_mark(e, 1, 1);
}

// ----------------------------------------------------------------------------
// The model: forward through the blocks, the head, the backward. Line for
// line the CPU engine's blocks_forward, model_forward and model_backward.

static size_t poff(const Gpu *e, int l, int tensor) { return mg_param(&e->lay, l, tensor); }

template <typename Tx>
static void blocks_forward(Gpu *e) {
    int C = e->C, BT = e->BT;
    size_t bt = (size_t)BT, bhT = (size_t)e->B * e->H * e->T;
    const float *P = e->params;
    const Tx *Wx = (const Tx *)e->wx;
    Matmul *mm = &e->mm;
    cudaStream_t st = e->stream;
    Tx *x0 = (Tx *)e->x0;
    embedding_forward<Tx>(x0, e->inputs, P + e->lay.wte, P + e->lay.wpe, BT, e->T, C, st);
    for (int l = 0; l < e->L; l++) {
        const Tx *x = l == 0 ? x0 : X<Tx>(e->res3, (size_t)(l - 1) * bt * C);
        Tx *ln1 = X<Tx>(e->ln1, l * bt * C), *qkv = X<Tx>(e->qkv, l * bt * 3 * C), *atty = X<Tx>(e->atty, l * bt * C);
        Tx *res2 = X<Tx>(e->res2, l * bt * C), *ln2 = X<Tx>(e->ln2, l * bt * C);
        Tx *fch = X<Tx>(e->fch, l * bt * 4 * C), *fch_gelu = X<Tx>(e->fch_gelu, l * bt * 4 * C);
        Tx *res3 = X<Tx>(e->res3, l * bt * C);
        layernorm_forward<Tx>(ln1, e->ln1_mean + l * bt, e->ln1_rstd + l * bt, x, P + poff(e, l, MG_LN1W),
                              P + poff(e, l, MG_LN1B), BT, C, st);
        matmul_forward<Tx>(qkv, ln1, Wx + poff(e, l, MG_QKVW), Wx + poff(e, l, MG_QKVB), P + poff(e, l, MG_QKVB), NULL,
                           BT, C, 3 * C, NULL, mm);
        attention_forward_marked<Tx>(e, atty, e->lse + l * bhT, qkv);
        matmul_forward<Tx>(res2, atty, Wx + poff(e, l, MG_PROJW), Wx + poff(e, l, MG_PROJB), P + poff(e, l, MG_PROJB),
                           x, BT, C, C, NULL, mm);
        layernorm_forward<Tx>(ln2, e->ln2_mean + l * bt, e->ln2_rstd + l * bt, res2, P + poff(e, l, MG_LN2W),
                              P + poff(e, l, MG_LN2B), BT, C, st);
        matmul_forward<Tx>(fch_gelu, ln2, Wx + poff(e, l, MG_FCW), Wx + poff(e, l, MG_FCB), P + poff(e, l, MG_FCB), NULL,
                           BT, C, 4 * C, fch, mm);
        matmul_forward<Tx>(res3, fch_gelu, Wx + poff(e, l, MG_FCPROJW), Wx + poff(e, l, MG_FCPROJB),
                           P + poff(e, l, MG_FCPROJB), res2, BT, 4 * C, C, NULL, mm);
    }
}

template <typename Tx> static const Tx *final_hidden(Gpu *e) { return X<Tx>(e->res3, (size_t)(e->L - 1) * e->BT * e->C); }

// Blocks, final LayerNorm, tied head: logits = lnf wte^T.
template <typename Tx>
static void model_forward(Gpu *e) {
    blocks_forward<Tx>(e);
    layernorm_forward<Tx>((Tx *)e->lnf, e->lnf_mean, e->lnf_rstd, final_hidden<Tx>(e), e->params + e->lay.lnfw,
                          e->params + e->lay.lnfb, e->BT, e->C, e->stream);
    gemm_xwt(&e->mm, CudaType<Tx>::value, e->logits, e->lnf, (const Tx *)e->wx + e->lay.wte, NULL, e->BT, e->C, e->V,
             NO_EPILOGUE);
}

// The LayerNorm backward of the step: the fused kernel (which also adds the
// column sums of the dx it writes into dnext, the bias gradient of the matmul
// that dx feeds) or the verified one (dnext is then left to matmul_backward).
template <typename Tx>
static void layernorm_backward_step(Gpu *e, Tx *dx, float *dw, float *db, float *dnext, const Tx *dout, const Tx *x,
                                    const float *w, const float *mean, const float *rstd, int accumulate) {
    if (e->ln_fused)
        layernorm_backward_fused<Tx>(dx, dw, db, dnext, dout, x, w, mean, rstd, e->BT, e->C, accumulate, e->ln_partial,
                                     e->stream);
    else
        layernorm_backward<Tx>(dx, dw, db, dout, x, w, mean, rstd, e->BT, e->C, accumulate, e->partial, e->stream);
}

// Sums gradients [begin, end) across the ranks (data-parallel, the last
// micro-batch's backward only), after the writes enqueued so far.
static void reduce_range(Gpu *e, size_t begin, size_t end) {
#ifdef MG_NCCL
    if (e->reduce_now) nccl_reduce_range(&e->nccl, e->grads + begin, end - begin, e->stream);
#else
    (void)e; (void)begin; (void)end;
#endif
}

template <typename Tx>
static void model_backward(Gpu *e) {
    int C = e->C, BT = e->BT;
    size_t bt = (size_t)BT, bhT = (size_t)e->B * e->H * e->T;
    const float *P = e->params;
    float *G = e->grads;
    const Tx *Wx = (const Tx *)e->wx;
    Matmul *mm = &e->mm;
    cudaStream_t st = e->stream;
    Tx *dres = (Tx *)e->dres, *dln = (Tx *)e->dln, *dqkv = (Tx *)e->dqkv, *datty = (Tx *)e->datty, *dfch = (Tx *)e->dfch;
    // The bias gradients: in the fused step, those of the two projections
    // come out of the LayerNorm backward before them (folded: fold = 1), and
    // those of QKV and FC from the 16-byte column sums; otherwise each comes
    // from its matmul_backward.
    int fold = e->ln_fused;
    auto own_bias = [&](int l, int tensor) -> float * { return fold ? NULL : G + poff(e, l, tensor); };
    // Head: dlnf = dlogits wte; dwte += dlogits^T lnf; then the final LayerNorm.
    matmul_backward<Tx>(dln, G + e->lay.wte, NULL, (const Tx *)e->logits, (const Tx *)e->lnf, Wx + e->lay.wte, BT, C,
                        e->V, NULL, e->partial, mm);
    layernorm_backward_step<Tx>(e, dres, G + e->lay.lnfw, G + e->lay.lnfb, G + poff(e, e->L - 1, MG_FCPROJB), dln,
                                final_hidden<Tx>(e), P + e->lay.lnfw, e->lnf_mean, e->lnf_rstd, 0);
    reduce_range(e, e->lay.lnfw, e->lay.n);  // the final LayerNorm's: done
    for (int l = e->L - 1; l >= 0; l--) {
        const Tx *x = l == 0 ? (const Tx *)e->x0 : X<Tx>(e->res3, (size_t)(l - 1) * bt * C);
        const Tx *ln1 = X<Tx>(e->ln1, l * bt * C), *qkv = X<Tx>(e->qkv, l * bt * 3 * C), *atty = X<Tx>(e->atty, l * bt * C);
        const Tx *res2 = X<Tx>(e->res2, l * bt * C), *ln2 = X<Tx>(e->ln2, l * bt * C);
        const Tx *fch = X<Tx>(e->fch, l * bt * 4 * C), *fch_gelu = X<Tx>(e->fch_gelu, l * bt * 4 * C);
        // MLP branch: dres is d(res3); the skip passes it to res2 unchanged.
        matmul_backward<Tx>(dfch, G + poff(e, l, MG_FCPROJW), own_bias(l, MG_FCPROJB), dres, fch_gelu,
                            Wx + poff(e, l, MG_FCPROJW), BT, 4 * C, C, fch, e->partial, mm);
        matmul_backward<Tx>(dln, G + poff(e, l, MG_FCW), e->fused ? NULL : G + poff(e, l, MG_FCB), dfch, ln2,
                            Wx + poff(e, l, MG_FCW), BT, C, 4 * C, NULL, e->partial, mm);
        if (e->fused) bias_backward_fused<Tx>(G + poff(e, l, MG_FCB), dfch, BT, 4 * C, e->partial, st);
        layernorm_backward_step<Tx>(e, dres, G + poff(e, l, MG_LN2W), G + poff(e, l, MG_LN2B), G + poff(e, l, MG_PROJB),
                                    dln, res2, P + poff(e, l, MG_LN2W), e->ln2_mean + l * bt, e->ln2_rstd + l * bt, 1);
        // Attention branch: dres is now d(res2).
        matmul_backward<Tx>(datty, G + poff(e, l, MG_PROJW), own_bias(l, MG_PROJB), dres, atty,
                            Wx + poff(e, l, MG_PROJW), BT, C, C, NULL, e->partial, mm);
        attention_backward_marked<Tx>(e, dqkv, datty, atty, qkv, e->lse + l * bhT);
        matmul_backward<Tx>(dln, G + poff(e, l, MG_QKVW), e->fused ? NULL : G + poff(e, l, MG_QKVB), dqkv, ln1,
                            Wx + poff(e, l, MG_QKVW), BT, C, 3 * C, NULL, e->partial, mm);
        if (e->fused) bias_backward_fused<Tx>(G + poff(e, l, MG_QKVB), dqkv, BT, 3 * C, e->partial, st);
        layernorm_backward_step<Tx>(e, dres, G + poff(e, l, MG_LN1W), G + poff(e, l, MG_LN1B),
                                    l > 0 ? G + poff(e, l - 1, MG_FCPROJB) : NULL, dln, x, P + poff(e, l, MG_LN1W),
                                    e->ln1_mean + l * bt, e->ln1_rstd + l * bt, 1);
        reduce_range(e, poff(e, l, 0), poff(e, l, 0) + e->lay.layer_size);  // layer l's: done
    }
    // Embeddings: token rows by bucket (no atomics), positions by column.
    if (e->wte_fused)
        embedding_backward_fused<Tx>(G + e->lay.wte, G + e->lay.wpe, dres, e->bucket_tok, e->bucket_start, e->positions,
                                     e->n_buckets_all + e->micro, e->BT < e->V ? e->BT : e->V, BT, e->T, C, st);
    else
        embedding_backward<Tx>(G + e->lay.wte, G + e->lay.wpe, dres, e->bucket_tok, e->bucket_start, e->positions,
                               e->n_buckets, BT, e->T, C, st);
    reduce_range(e, e->lay.wte, e->lay.layer0);  // the embeddings' (wte, also written by the head, and wpe): done
}

// ----------------------------------------------------------------------------
// Host side of a micro-batch: tokens to pinned staging, embedding buckets,
// uploads. All device work is padded to the full [batch, ctx] shape, so the
// GEMM shapes (and their plans) never change; padded rows have target -1
// (no loss, no gradient) and input 0.

// Micro-batch k's slices of the per-micro-batch buffers become the current
// ones (the classic path always uses slice 0).
static void select_micro(Gpu *e, int k) {
    size_t bt = (size_t)e->BT;
    e->micro = k;
    e->inputs = e->inputs_all + k * bt;
    e->targets = e->targets_all + k * bt;
    e->losses = e->losses_all + k * bt;
    e->bucket_tok = e->bucket_tok_all + k * bt;
    e->bucket_start = e->bucket_start_all + k * (bt + 1);
    e->positions = e->positions_all + k * bt;
}

// Tokens into slice k of the pinned staging: inputs, and targets (or -1).
static void stage_rows_host(Gpu *e, int k, const uint16_t *rows_tokens, int rows, int row_len, int len, int with_targets) {
    int T = e->T;
    int *in = e->h_inputs + (size_t)k * e->BT, *tg = e->h_targets + (size_t)k * e->BT;
    for (int r = 0; r < e->B; r++)
        for (int t = 0; t < T; t++) {
            int i = r * T + t, ok = r < rows && t < len;
            in[i] = ok ? rows_tokens[(size_t)r * row_len + t] : 0;
            tg[i] = with_targets && ok ? rows_tokens[(size_t)r * row_len + t + 1] : -1;
        }
}

// The embedding backward's buckets of slice k (positions sorted by token), in the pinned staging.
static int stage_buckets_host(Gpu *e, int k) {
    size_t bt = (size_t)e->BT;
    int u = embedding_buckets(e->h_inputs + k * bt, e->BT, e->V, e->h_cursor, e->h_bucket_tok + k * bt,
                              e->h_bucket_start + k * (bt + 1), e->h_positions + k * bt);
    e->h_n_buckets[k] = u;
    return u;
}

// The classic path's micro-batch: slice 0, uploaded now.
static void stage_rows(Gpu *e, const uint16_t *rows_tokens, int rows, int row_len, int len, int with_targets) {
    select_micro(e, 0);
    stage_rows_host(e, 0, rows_tokens, rows, row_len, len, with_targets);
    CUDA_CHECK(cudaMemcpyAsync(e->inputs, e->h_inputs, e->BT * sizeof(int), cudaMemcpyHostToDevice, e->stream));
    CUDA_CHECK(cudaMemcpyAsync(e->targets, e->h_targets, e->BT * sizeof(int), cudaMemcpyHostToDevice, e->stream));
}

static void stage_buckets(Gpu *e) {
    int u = stage_buckets_host(e, 0);
    e->n_buckets = u;
    CUDA_CHECK(cudaMemcpyAsync(e->bucket_tok, e->h_bucket_tok, u * sizeof(int), cudaMemcpyHostToDevice, e->stream));
    CUDA_CHECK(cudaMemcpyAsync(e->bucket_start, e->h_bucket_start, (u + 1) * sizeof(int), cudaMemcpyHostToDevice, e->stream));
    CUDA_CHECK(cudaMemcpyAsync(e->positions, e->h_positions, e->BT * sizeof(int), cudaMemcpyHostToDevice, e->stream));
}

// Each row's mean token loss, summed in double in position order (as the
// CPU engine), from the pinned losses of `rows` rows (micro-batches one after
// another).
static void row_losses(Gpu *e, int rows, float *row_loss) {
    int T = e->T;
    for (int r = 0; r < rows; r++) {
        double sum = 0;
        for (int t = 0; t < T; t++) sum += e->h_losses[(size_t)r * T + t];
        row_loss[r] = (float)(sum / T);
    }
}

// The loss of the current micro-batch, and (grad_scale != 0 and write_grad)
// the logits' gradient in place.
template <typename Tx>
static void classifier_step(Gpu *e, float grad_scale, int write_grad) {
    if (e->ce_smem)
        fused_classifier_smem<Tx>((Tx *)e->logits, e->losses, e->targets, e->BT, e->V, grad_scale, write_grad, e->stream);
    else
        fused_classifier<Tx>((Tx *)e->logits, e->losses, e->targets, e->BT, e->V, grad_scale, write_grad, e->stream);
}

template <typename Tx>
static void run_step(Gpu *e, float grad_scale, int backward) {
    model_forward<Tx>(e);
    classifier_step<Tx>(e, grad_scale, backward);
    CUDA_CHECK(cudaMemcpyAsync(e->h_losses, e->losses, e->BT * sizeof(float), cudaMemcpyDeviceToHost, e->stream));
    CUDA_CHECK(cudaEventRecord(e->loss_ready, e->stream));
    if (backward) model_backward<Tx>(e);
}

static void gpu_forward_backward(void *impl, const uint16_t *rows_tokens, int rows, float grad_scale, float *row_loss) {
    Gpu *e = (Gpu *)impl;
    if (rows > e->B) mg_fail(MG_EXIT_PROTOCOL, "internal: %d rows for a batch of %d", rows, e->B);
    stage_rows(e, rows_tokens, rows, e->T + 1, e->T, 1);
    stage_buckets(e);
    e->reduce_now = e->dp && ++e->micro_done == e->micro_per_rank;
    if (e->bf16) run_step<bf16>(e, grad_scale, 1);
    else run_step<float>(e, grad_scale, 1);
    e->reduce_now = 0;
    // Wait for the losses only: the backward keeps running while the driver
    // sums them (grad_norm is the next call that waits for the GPU).
    CUDA_CHECK(cudaEventSynchronize(e->loss_ready));
    row_losses(e, rows, row_loss);
}

// ----------------------------------------------------------------------------
// The fused step (--fused, --cuda-graph): the whole optimizer step enqueued at
// once, reading everything that changes from step to step (tokens, buckets,
// learning rate and bias corrections) from pinned staging through copies
// that are part of the step, and computing the clip factor on the device, so
// that nothing in it waits for the host and the same enqueue can be captured
// once as a CUDA graph and replayed. Only the losses and the norm come back,
// at the end.
static void enqueue_step(Gpu *e, float grad_scale, float grad_clip) {
    cudaStream_t st = e->stream;
    size_t bt = (size_t)e->BT, K = (size_t)e->K;
    CUDA_CHECK(cudaMemcpyAsync(e->opt, e->h_opt, sizeof(AdamWStep), cudaMemcpyHostToDevice, st));
    CUDA_CHECK(cudaMemcpyAsync(e->inputs_all, e->h_inputs, K * bt * sizeof(int), cudaMemcpyHostToDevice, st));
    CUDA_CHECK(cudaMemcpyAsync(e->targets_all, e->h_targets, K * bt * sizeof(int), cudaMemcpyHostToDevice, st));
    CUDA_CHECK(cudaMemcpyAsync(e->bucket_tok_all, e->h_bucket_tok, K * bt * sizeof(int), cudaMemcpyHostToDevice, st));
    CUDA_CHECK(cudaMemcpyAsync(e->bucket_start_all, e->h_bucket_start, K * (bt + 1) * sizeof(int),
                               cudaMemcpyHostToDevice, st));
    CUDA_CHECK(cudaMemcpyAsync(e->positions_all, e->h_positions, K * bt * sizeof(int), cudaMemcpyHostToDevice, st));
    CUDA_CHECK(cudaMemcpyAsync(e->n_buckets_all, e->h_n_buckets, K * sizeof(int), cudaMemcpyHostToDevice, st));
    CUDA_CHECK(cudaMemsetAsync(e->grads, 0, e->lay.n * sizeof(float), st));
    for (int k = 0; k < e->K; k++) {
        select_micro(e, k);
        model_forward<bf16>(e);
        classifier_step<bf16>(e, grad_scale, 1);
        model_backward<bf16>(e);
    }
    global_norm_clip(e->norm_out, &e->opt->mult, &e->opt->skip, e->grads, e->lay.n, grad_clip, e->norm_partial, st);
    // A snapshot still copying the old state (recorded outside the graph: an
    // external wait inside it).
    CUDA_CHECK(cudaStreamWaitEvent(st, e->copy_done, e->capturing ? cudaEventWaitExternal : 0));
    const MgConfig *c = &e->cfg;
    adamw_update_fused<bf16>(e->params, (bf16 *)e->wx, e->grads, e->m, e->v, e->lay.n, e->dm, e->L, e->opt, c->beta1,
                             c->beta2, c->eps, c->weight_decay, st);
    CUDA_CHECK(cudaMemcpyAsync(e->h_losses, e->losses_all, K * bt * sizeof(float), cudaMemcpyDeviceToHost, st));
    CUDA_CHECK(cudaMemcpyAsync(e->h_norm, e->norm_out, sizeof(double), cudaMemcpyDeviceToHost, st));
    select_micro(e, 0);
}

// The step captured as a CUDA graph, once: at the first step, whose
// grad_scale and grad_clip (constants of the run) it keeps.
static void capture_step(Gpu *e, float grad_scale, float grad_clip) {
    cudaGraph_t g = NULL;
    e->capturing = 1;
    CUDA_CHECK(cudaStreamBeginCapture(e->stream, cudaStreamCaptureModeThreadLocal));
    enqueue_step(e, grad_scale, grad_clip);
    CUDA_CHECK(cudaStreamEndCapture(e->stream, &g));
    e->capturing = 0;
    CUDA_CHECK(cudaGraphInstantiate(&e->graph, g, 0));
    CUDA_CHECK(cudaGraphDestroy(g));
}

static void profile_begin_step(Gpu *e);
static void profile_end_step(Gpu *e);

static double gpu_train_step(void *impl, const uint16_t *tokens, int micro, float grad_scale, int step, float lr,
                             float grad_clip, float *row_loss) {
    Gpu *e = (Gpu *)impl;
    if (micro != e->K) mg_fail(MG_EXIT_PROTOCOL, "internal: %d micro-batches for --grad-accum %d", micro, e->K);
    for (int k = 0; k < e->K; k++) {
        stage_rows_host(e, k, tokens + (size_t)k * e->B * (e->T + 1), e->B, e->T + 1, e->T, 1);
        stage_buckets_host(e, k);
    }
    adamw_step_settings(e->h_opt, lr, e->cfg.beta1, e->cfg.beta2, step);
    profile_begin_step(e);
    if (e->use_graph) {
        if (!e->graph) capture_step(e, grad_scale, grad_clip);
        CUDA_CHECK(cudaGraphLaunch(e->graph, e->stream));
    } else {
        enqueue_step(e, grad_scale, grad_clip);
    }
    profile_end_step(e);
    CUDA_CHECK(cudaStreamSynchronize(e->stream));
    row_losses(e, e->K * e->B, row_loss);
    return *e->h_norm;
}

static void gpu_forward_loss(void *impl, const uint16_t *rows_tokens, int rows, float *row_loss) {
    Gpu *e = (Gpu *)impl;
    if (rows > e->B) mg_fail(MG_EXIT_PROTOCOL, "internal: %d rows for a batch of %d", rows, e->B);
    stage_rows(e, rows_tokens, rows, e->T + 1, e->T, 1);
    if (e->bf16) run_step<bf16>(e, 0.0f, 0);
    else run_step<float>(e, 0.0f, 0);
    CUDA_CHECK(cudaStreamSynchronize(e->stream));
    row_losses(e, rows, row_loss);
}

// Sampling: the row-local forward of cuda/sampling.cuh, on buffers the
// training step owns but does not need between steps (a SAMPLE frame is never
// interleaved with training). The KV cache is the qkv activations' memory
// (slot b, position t: row b * T + t of each layer, K and V in their columns);
// the recompute path's scratch slots are the FC activations' memory.
template <typename Tx> static SampleBuffers<Tx> sample_buffers(Gpu *e, int recompute) {
    size_t bt = (size_t)e->BT;
    SampleBuffers<Tx> s;
    s.params = e->params;
    s.wx = (const Tx *)e->wx;
    s.lay = e->lay;
    s.L = e->L; s.C = e->C; s.H = e->H; s.T = e->T; s.V = e->V;
    s.cache = recompute ? (Tx *)e->fch : (Tx *)e->qkv;
    s.layer_stride = bt * 3 * e->C;
    s.x_a = (Tx *)e->x0; s.x_b = (Tx *)e->res2; s.x2 = (Tx *)e->res3; s.ln = (Tx *)e->ln1; s.att = (Tx *)e->atty;
    s.qkv = (Tx *)e->dqkv; s.h = (Tx *)e->dfch; s.last = (Tx *)e->dln; s.last_ln = (Tx *)e->lnf;
    s.mean = e->lnf_mean; s.rstd = e->lnf_rstd;
    // The packed rows' tokens, positions and slots, and the last rows: device
    // twins of the staging below.
    s.tokens = e->inputs_all; s.positions = e->targets_all; s.slots = e->positions_all; s.last_rows = e->bucket_tok_all;
    return s;
}

// Runs N packed rows staged in h_inputs (tokens), h_targets (positions),
// h_positions (slots) and h_bucket_tok (the R last rows); out [R, V].
static void sample_rows(Gpu *e, int N, int R, int recompute, float *out) {
    cudaStream_t st = e->stream;
    select_micro(e, 0);
    CUDA_CHECK(cudaMemcpyAsync(e->inputs_all, e->h_inputs, N * sizeof(int), cudaMemcpyHostToDevice, st));
    CUDA_CHECK(cudaMemcpyAsync(e->targets_all, e->h_targets, N * sizeof(int), cudaMemcpyHostToDevice, st));
    CUDA_CHECK(cudaMemcpyAsync(e->positions_all, e->h_positions, N * sizeof(int), cudaMemcpyHostToDevice, st));
    CUDA_CHECK(cudaMemcpyAsync(e->bucket_tok_all, e->h_bucket_tok, R * sizeof(int), cudaMemcpyHostToDevice, st));
    if (e->bf16) sampling_forward<bf16>(sample_buffers<bf16>(e, recompute), N, R, e->logits_out, st);
    else sampling_forward<float>(sample_buffers<float>(e, recompute), N, R, e->logits_out, st);
    size_t n = (size_t)R * e->V;
    CUDA_CHECK(cudaMemcpyAsync(e->h_logits, e->logits_out, n * sizeof(float), cudaMemcpyDeviceToHost, st));
    CUDA_CHECK(cudaStreamSynchronize(st));
    memcpy(out, e->h_logits, n * sizeof(float));
}

// The recompute path: tokens at positions 0..len-1 of each row.
static void gpu_last_logits(void *impl, const uint16_t *tokens, int rows, int len, float *out) {
    Gpu *e = (Gpu *)impl;
    if (rows > e->B || len < 1 || len > e->T) mg_fail(MG_EXIT_PROTOCOL, "internal: last_logits(%d rows, len %d)", rows, len);
    if (e->sample_rowlocal) {  // every position new, row r in scratch slot r
        int N = 0;
        for (int r = 0; r < rows; r++) {
            for (int t = 0; t < len; t++, N++) {
                e->h_inputs[N] = tokens[(size_t)r * len + t];
                e->h_targets[N] = t;
                e->h_positions[N] = r;
            }
            e->h_bucket_tok[r] = N - 1;
        }
        sample_rows(e, N, rows, 1, out);
        return;
    }
    // Shapes sampling.cuh does not take: the training forward over the padded
    // batch (the attention is causal, so padding never reaches position len-1).
    stage_rows(e, tokens, rows, len, len, 0);
    size_t n = (size_t)rows * e->V;
    if (e->bf16) {
        model_forward<bf16>(e);
        gather_logits<bf16>(e->logits_out, (const bf16 *)e->logits, rows, e->T, len - 1, e->V, e->stream);
    } else {
        model_forward<float>(e);
        gather_logits<float>(e->logits_out, (const float *)e->logits, rows, e->T, len - 1, e->V, e->stream);
    }
    CUDA_CHECK(cudaMemcpyAsync(e->h_logits, e->logits_out, n * sizeof(float), cudaMemcpyDeviceToHost, e->stream));
    CUDA_CHECK(cudaStreamSynchronize(e->stream));
    memcpy(out, e->h_logits, n * sizeof(float));
}

// The KV-cache path (engine.h, kv_forward): only the new positions run; their
// keys and values join their slots.
static void gpu_kv_forward(void *impl, int rows, const int *slot, const int *pos, const int *n_new,
                           const uint16_t *tokens, float *out) {
    Gpu *e = (Gpu *)impl;
    int N = 0;
    for (int i = 0; i < rows; i++) {
        if (slot[i] < 0 || slot[i] >= e->B || pos[i] < 0 || n_new[i] < 1 || pos[i] + n_new[i] > e->T)
            mg_fail(MG_EXIT_PROTOCOL, "internal: kv_forward(slot %d, pos %d, %d new)", slot[i], pos[i], n_new[i]);
        for (int k = 0; k < n_new[i]; k++, N++) {
            e->h_inputs[N] = tokens[N];
            e->h_targets[N] = pos[i] + k;
            e->h_positions[N] = slot[i];
        }
        e->h_bucket_tok[i] = N - 1;
    }
    sample_rows(e, N, rows, 0, out);
}

// ----------------------------------------------------------------------------
// State, gradients, optimizer.

static void refresh_compute_copy(Gpu *e) {
    if (!e->bf16) return;
    convert<bf16>((bf16 *)e->wx, e->params, e->lay.n, e->stream);
}

static void gpu_set_state(void *impl, const float *w, const float *m, const float *v) {
    Gpu *e = (Gpu *)impl;
    size_t bytes = e->lay.n * sizeof(float);
    CUDA_CHECK(cudaMemcpyAsync(e->params, w, bytes, cudaMemcpyHostToDevice, e->stream));
    CUDA_CHECK(cudaMemcpyAsync(e->m, m, bytes, cudaMemcpyHostToDevice, e->stream));
    CUDA_CHECK(cudaMemcpyAsync(e->v, v, bytes, cudaMemcpyHostToDevice, e->stream));
    refresh_compute_copy(e);
    CUDA_CHECK(cudaStreamSynchronize(e->stream));
}

// The asynchronous snapshot (engine.h): the copies queue behind everything
// already enqueued on the main stream, on the side stream, so the step loop
// does not wait for them; the forward and backward of the next step overlap
// them, and only its update waits (gpu_update, enqueue_step).
static void gpu_snapshot(void *impl, float **w, float **m, float **v) {
    Gpu *e = (Gpu *)impl;
    size_t bytes = e->lay.n * sizeof(float);
    CUDA_CHECK(cudaEventRecord(e->update_done, e->stream));
    CUDA_CHECK(cudaStreamWaitEvent(e->copy_stream, e->update_done, 0));
    CUDA_CHECK(cudaMemcpyAsync(e->h_snap_w, e->params, bytes, cudaMemcpyDeviceToHost, e->copy_stream));
    CUDA_CHECK(cudaMemcpyAsync(e->h_snap_m, e->m, bytes, cudaMemcpyDeviceToHost, e->copy_stream));
    CUDA_CHECK(cudaMemcpyAsync(e->h_snap_v, e->v, bytes, cudaMemcpyDeviceToHost, e->copy_stream));
    CUDA_CHECK(cudaEventRecord(e->copy_done, e->copy_stream));
    *w = e->h_snap_w;
    *m = e->h_snap_m;
    *v = e->h_snap_v;
}

// Called by the checkpoint writer's thread: reports, never ends the process.
static int gpu_snapshot_wait(void *impl) {
    Gpu *e = (Gpu *)impl;
    cudaError_t err = cudaEventSynchronize(e->copy_done);
    if (err == cudaSuccess) return 0;
    fprintf(stderr, "microgpt: error: copying the checkpoint snapshot from the GPU: %s\n", cudaGetErrorString(err));
    return -1;
}

static void gpu_get_state(void *impl, float *w, float *m, float *v) {
    Gpu *e = (Gpu *)impl;
    size_t bytes = e->lay.n * sizeof(float);
    CUDA_CHECK(cudaMemcpyAsync(w, e->params, bytes, cudaMemcpyDeviceToHost, e->stream));
    CUDA_CHECK(cudaMemcpyAsync(m, e->m, bytes, cudaMemcpyDeviceToHost, e->stream));
    CUDA_CHECK(cudaMemcpyAsync(v, e->v, bytes, cudaMemcpyDeviceToHost, e->stream));
    CUDA_CHECK(cudaStreamSynchronize(e->stream));
}

// ----------------------------------------------------------------------------
// Profiling one step (MICROGPT_CUDA_PROFILE_STEP, see Profile).

static void profile_setup(Gpu *e) {
    const char *env = getenv("MICROGPT_CUDA_PROFILE_STEP");
    Profile *p = &e->prof;
    memset(p, 0, sizeof *p);
    if (!env || !*env) return;
    char *end = NULL;
    long step = strtol(env, &end, 10);
    if (*end || step < 1 || step > INT_MAX)
        mg_fail(MG_EXIT_USAGE, "MICROGPT_CUDA_PROFILE_STEP: '%s' is not a step number >= 1", env);
    p->step = (int)step;
    p->cap = e->L * e->cfg.grad_accum;
    CUDA_CHECK(cudaEventCreate(&p->begin));
    CUDA_CHECK(cudaEventCreate(&p->end));
    for (int k = 0; k < 2; k++) {
        p->ev[k] = (cudaEvent_t *)mg_calloc(2 * (size_t)p->cap, sizeof(cudaEvent_t));
        for (int i = 0; i < 2 * p->cap; i++) CUDA_CHECK(cudaEventCreate(&p->ev[k][i]));
    }
}

static void profile_mark(Gpu *e, int kind, int stop) {
    Profile *p = &e->prof;
    if (!p->active || e->capturing || p->n[kind] >= p->cap) return;
    CUDA_CHECK(cudaEventRecord(p->ev[kind][2 * p->n[kind] + stop], e->stream));
    if (stop) p->n[kind]++;
}

static void profile_begin_step(Gpu *e) {
    Profile *p = &e->prof;
    if (!p->step || ++p->seen != p->step) return;
    CUDA_CHECK(cudaStreamSynchronize(e->stream));
    CUDA_CHECK(cudaProfilerStart());
    CUDA_CHECK(cudaEventRecord(p->begin, e->stream));
    p->active = 1;
    p->n[0] = p->n[1] = 0;
}

static void profile_end_step(Gpu *e) {
    Profile *p = &e->prof;
    if (!p->active) return;
    p->active = 0;
    CUDA_CHECK(cudaEventRecord(p->end, e->stream));
    CUDA_CHECK(cudaEventSynchronize(p->end));
    CUDA_CHECK(cudaProfilerStop());
    float step_ms = 0, ms[2] = {0, 0};
    CUDA_CHECK(cudaEventElapsedTime(&step_ms, p->begin, p->end));
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < p->n[k]; i++) {
            float t = 0;
            CUDA_CHECK(cudaEventElapsedTime(&t, p->ev[k][2 * i], p->ev[k][2 * i + 1]));
            ms[k] += t;
        }
    fprintf(stderr, "microgpt: profile {\"step\":%d,\"step_ms\":%.4f,\"attention_forward_ms\":%.4f,"
            "\"attention_backward_ms\":%.4f,\"attention_calls\":[%d,%d],\"attention\":\"%s\",\"precision\":\"%s\"}\n",
            p->step, step_ms, ms[0], ms[1], p->n[0], p->n[1], attention_name(e->attention), e->bf16 ? "bf16" : "fp32");
    fflush(stderr);
}

static void gpu_zero_grads(void *impl) {
    Gpu *e = (Gpu *)impl;
    profile_begin_step(e);
    e->micro_done = 0;
    CUDA_CHECK(cudaMemsetAsync(e->grads, 0, e->lay.n * sizeof(float), e->stream));
}

// The sums the last micro-batch's backward started (engine.h, reduce_grads;
// caps.reduce_grads only in the NCCL build).
static void gpu_reduce_grads(void *impl) {
    Gpu *e = (Gpu *)impl;
    if (!e->dp || e->micro_done != e->micro_per_rank)
        mg_fail(MG_EXIT_PROTOCOL, "internal: gradients reduced after %d of %d micro-batches", e->micro_done,
                e->micro_per_rank);
#ifdef MG_NCCL
    nccl_wait(&e->nccl, e->stream);
#endif
}

static void gpu_get_grads(void *impl, float *out) {
    Gpu *e = (Gpu *)impl;
    CUDA_CHECK(cudaMemcpyAsync(out, e->grads, e->lay.n * sizeof(float), cudaMemcpyDeviceToHost, e->stream));
    CUDA_CHECK(cudaStreamSynchronize(e->stream));
}

static double gpu_grad_norm(void *impl) {
    Gpu *e = (Gpu *)impl;
    global_norm(e->norm_out, e->grads, e->lay.n, e->norm_partial, e->stream);
    CUDA_CHECK(cudaMemcpyAsync(e->h_norm, e->norm_out, sizeof(double), cudaMemcpyDeviceToHost, e->stream));
    CUDA_CHECK(cudaStreamSynchronize(e->stream));
    return *e->h_norm;
}

static void gpu_update(void *impl, int step, float lr, float grad_mult) {
    Gpu *e = (Gpu *)impl;
    const MgConfig *c = &e->cfg;
    CUDA_CHECK(cudaStreamWaitEvent(e->stream, e->copy_done, 0));  // a snapshot still copying the old state
    if (e->bf16)
        adamw_update<bf16>(e->params, (bf16 *)e->wx, e->grads, e->m, e->v, e->lay.n, e->dm, grad_mult, lr, c->beta1,
                           c->beta2, c->eps, c->weight_decay, step, e->stream);
    else
        adamw_update<float>(e->params, NULL, e->grads, e->m, e->v, e->lay.n, e->dm, grad_mult, lr, c->beta1, c->beta2,
                            c->eps, c->weight_decay, step, e->stream);
    profile_end_step(e);
}

// ----------------------------------------------------------------------------
// Device selection, allocation, warm-up.

static const char *gpu_configure(void *impl, MgConfig *cfg) {
    Gpu *e = (Gpu *)impl;
    static char msg[512];
    e->eng->threads = 1;
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
        snprintf(msg, sizeof msg, "no CUDA device: %s%s%s (use build/microgpt_cpu on machines without an NVIDIA GPU)",
                 err != cudaSuccess ? cudaGetErrorName(err) : "none visible", err != cudaSuccess ? ": " : "",
                 err == cudaErrorInsufficientDriver ? "no NVIDIA driver, or one too old for this CUDA runtime"
                 : err != cudaSuccess ? cudaGetErrorString(err) : "");
        return msg;
    }
    int device = 0;
#ifdef MG_NCCL
    device = nccl_local_device(count);  // before cudaSetDevice, which makes the context
#endif
    CUDA_CHECK(cudaSetDevice(device));
    CUDA_CHECK(cudaGetDeviceProperties(&e->prop, device));
    int has_bf16 = e->prop.major >= 8;
    if (!cfg->precision) cfg->precision = has_bf16 ? "bf16" : "fp32";
    // The FP8 GEMMs are not wired into this engine; the CPU engine runs the
    // FP8 recipe (docs/ENGINE.md, "FP8").
    if (strcmp(cfg->precision, "fp8") == 0)
        return "--precision fp8 is not built into the CUDA engine (use bf16; the CPU engine runs fp8)";
    e->bf16 = strcmp(cfg->precision, "bf16") == 0;
    if (e->bf16 && !has_bf16) {
        snprintf(msg, sizeof msg, "--precision bf16 needs compute capability 8.0 or newer; %s is %d.%d (use --precision fp32)",
                 e->prop.name, e->prop.major, e->prop.minor);
        return msg;
    }
    e->eng->precision = e->bf16 ? "bf16" : "fp32";
    snprintf(e->eng->device, sizeof e->eng->device, "%s (sm_%d%d, %d SMs, %.1f GiB)", e->prop.name, e->prop.major,
             e->prop.minor, e->prop.multiProcessorCount, e->prop.totalGlobalMem / 1073741824.0);
    const char *fuse_env = getenv("MICROGPT_CUDA_FUSE");
    e->fuse = e->bf16 && !(fuse_env && strcmp(fuse_env, "0") == 0);
    return NULL;
}

// The attention path (--attention): naive unless asked otherwise. flash takes
// the tensor-core kernels where they apply (bf16, head dim 32, 64 or 128,
// enough shared memory); cudnn takes cuDNN's SDPA where the build has it and
// cuDNN builds graphs for this shape (bf16); anywhere else either falls back
// to the naive kernels with one warning, never an error. auto takes the
// fastest that applies (cudnn, then flash, then naive), silently: it is a
// choice, not a verdict (the proxy qualifies paths before it uses them,
// docs/CUDA.md). One thing is said under auto too: a cuDNN library that
// cannot be loaded (cuda/cudnn_loader.h), a fact about the machine rather
// than about this shape. The choice is appended to the device string of the
// ready event and named in its `paths`, so every run says which it used.
static int flash_applies(Gpu *e, int warn) {
    size_t need = flash_attention_smem(e->hd);
    const char *why = NULL;
    char text[256];
    if (!e->bf16) why = "--attention flash needs --precision bf16; using the naive attention kernels (fp32)";
    else if (!flash_attention_supported(e->hd)) {
        snprintf(text, sizeof text, "--attention flash supports head dims 32, 64 and 128, not %d (--dim %d / --heads %d); "
                 "using the naive attention kernels", e->hd, e->C, e->H);
        why = text;
    } else if (need > e->prop.sharedMemPerBlockOptin) {
        snprintf(text, sizeof text, "--attention flash needs %zu bytes of shared memory per block, %.64s allows %zu; "
                 "using the naive attention kernels", need, e->prop.name, e->prop.sharedMemPerBlockOptin);
        why = text;
    }
    if (why && warn) mg_warn("%s", why);
    return why == NULL;
}

// `fallback` names the path the caller takes if cuDNN does not apply.
static int cudnn_applies(Gpu *e, int warn, const char *fallback) {
    const char *why = NULL;
    char text[640];
    if (!e->bf16) why = "--attention cudnn needs --precision bf16; using the naive attention kernels (fp32)";
#ifdef MICROGPT_CUDNN
    else {
        char reason[512] = "";
        if (!cudnn_library_load(reason, sizeof reason)) {
            mg_warn("--attention %s: %s; using the %s attention kernels", warn ? "cudnn" : "auto", reason, fallback);
            return 0;
        }
        e->cudnn = cudnn_attention_create(e->B, e->T, e->C, e->H, e->stream, reason, sizeof reason);
        if (!e->cudnn) {
            snprintf(text, sizeof text, "--attention cudnn: %s; using the naive attention kernels", reason);
            why = text;
        }
    }
#else
    else why = "--attention cudnn: this build has no cuDNN (docs/CUDA.md, \"Building\"); using the naive attention kernels";
#endif
    if (why && warn) mg_warn("%s", why);
    return why == NULL;
}

static void choose_attention(Gpu *e, const char *requested) {
    e->attention = ATTENTION_NAIVE;
    if (!requested || strcmp(requested, "naive") == 0) {
    } else if (strcmp(requested, "flash") == 0) {
        if (flash_applies(e, 1)) e->attention = ATTENTION_FLASH;
    } else if (strcmp(requested, "cudnn") == 0) {
        if (cudnn_applies(e, 1, "naive")) e->attention = ATTENTION_CUDNN;
    } else {  // auto
        int flash = flash_applies(e, 0);
        if (cudnn_applies(e, 0, flash ? "flash" : "naive")) e->attention = ATTENTION_CUDNN;
        else if (flash) e->attention = ATTENTION_FLASH;
    }
    if (e->attention == ATTENTION_FLASH) CUDA_CHECK(flash_attention_setup(e->hd));
#ifdef MICROGPT_CUDNN
    if (e->attention == ATTENTION_CUDNN) e->cudnn_workspace = dev_alloc(e, cudnn_attention_workspace_bytes(e->cudnn));
#endif
    size_t len = strlen(e->eng->device);
    snprintf(e->eng->device + len, sizeof e->eng->device - len, ", attention %s", attention_name(e->attention));
}

// --fused and --cuda-graph (on implies --fused on): the fused step where it
// applies (bf16, a width that is a multiple of 8), else one warning and the
// verified step. Which fused kernels then apply is
// decided per kernel at this shape; the others stay the verified ones.
static void choose_fused(Gpu *e, const MgConfig *cfg) {
    int graph = cfg->cuda_graph && strcmp(cfg->cuda_graph, "on") == 0;
    int fused = graph || (cfg->fused && strcmp(cfg->fused, "on") == 0);
    const char *flag = graph ? "--cuda-graph on" : "--fused on";
    if (fused && !e->bf16) {
        mg_warn("%s needs --precision bf16; using the verified step", flag);
        fused = graph = 0;
    } else if (fused && !(adamw_fused_applies(e->dm, e->lay.n) && embedding_backward_fused_applies<bf16>(e->C))) {
        // (the AdamW segments need 4, the wte backward, whose grid must not depend on the batch, 8)
        mg_warn("%s needs a --dim that is a multiple of 8 (not %d); using the verified step", flag, e->C);
        fused = graph = 0;
    }
#ifdef MG_NCCL
    if (fused) {  // the step's gradients are summed across the ranks between its backward and its update
        if (e->eng->rank == 0)
            mg_warn("%s is off in the NCCL build (build/microgpt_cuda_mpi): the gradients are summed across the "
                    "ranks between the backward and the update; using the verified step", flag);
        fused = graph = 0;
    }
#endif
    e->fused = fused;
    e->use_graph = graph;
    if (!fused) return;
    e->ln_fused = layernorm_backward_fused_chunks<bf16>(e->C) > 0;
    e->ce_smem = fused_classifier_smem_applies<bf16>(e->V, e->prop.sharedMemPerBlockOptin);
    e->wte_fused = embedding_backward_fused_applies<bf16>(e->C);
    if (e->ln_fused) CUDA_CHECK(layernorm_backward_fused_setup<bf16>(e->C));
    if (e->ce_smem) CUDA_CHECK(fused_classifier_smem_setup<bf16>(e->V));
}

static size_t gpu_init(void *impl, const MgConfig *cfg) {
    Gpu *e = (Gpu *)impl;
    e->cfg = *cfg;
    e->B = cfg->batch; e->T = cfg->ctx; e->C = cfg->dim; e->L = cfg->layers; e->H = cfg->heads; e->V = cfg->vocab;
    e->hd = e->C / e->H;
    e->BT = e->B * e->T;
    if ((size_t)e->B * e->T > (size_t)1 << 26) mg_fail(MG_EXIT_USAGE, "--batch * --ctx = %zu is too large for the CUDA engine", (size_t)e->B * e->T);
    if (e->hd > 128) mg_fail(MG_EXIT_USAGE, "the CUDA engine supports head dims up to 128 (--dim %d / --heads %d = %d)", e->C, e->H, e->hd);
    e->xs = e->bf16 ? sizeof(bf16) : sizeof(float);
    e->lay = mg_layout(e->V, e->T, e->C, e->L);
    CUDA_CHECK(cudaStreamCreate(&e->stream));
    CUDA_CHECK(cudaEventCreateWithFlags(&e->loss_ready, cudaEventDisableTiming));
    CUDA_CHECK(cudaStreamCreateWithFlags(&e->copy_stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&e->update_done, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&e->copy_done, cudaEventDisableTiming));
    choose_attention(e, cfg->attention);
    profile_setup(e);

    e->dm = decay_map(&e->lay, e->L);
    e->K = cfg->grad_accum;
    choose_fused(e, cfg);
    matmul_init(&e->mm, e->stream, dev_alloc(e, LT_WORKSPACE), e->fuse);

    size_t n = e->lay.n, B = e->B, T = e->T, C = e->C, L = e->L, H = e->H, V = e->V, bt = (size_t)e->BT, xs = e->xs;
    e->params = (float *)dev_alloc(e, n * sizeof(float));
    e->grads = (float *)dev_alloc(e, n * sizeof(float));
    e->m = (float *)dev_alloc(e, n * sizeof(float));
    e->v = (float *)dev_alloc(e, n * sizeof(float));
    e->wx = e->bf16 ? dev_alloc(e, n * xs) : (void *)e->params;

    e->x0 = dev_alloc(e, bt * C * xs);
    e->ln1 = dev_alloc(e, L * bt * C * xs);
    e->qkv = dev_alloc(e, L * bt * 3 * C * xs);
    e->atty = dev_alloc(e, L * bt * C * xs);
    e->res2 = dev_alloc(e, L * bt * C * xs);
    e->ln2 = dev_alloc(e, L * bt * C * xs);
    e->fch = dev_alloc(e, L * bt * 4 * C * xs);
    e->fch_gelu = dev_alloc(e, L * bt * 4 * C * xs);
    e->res3 = dev_alloc(e, L * bt * C * xs);
    e->ln1_mean = (float *)dev_alloc(e, L * bt * sizeof(float));
    e->ln1_rstd = (float *)dev_alloc(e, L * bt * sizeof(float));
    e->ln2_mean = (float *)dev_alloc(e, L * bt * sizeof(float));
    e->ln2_rstd = (float *)dev_alloc(e, L * bt * sizeof(float));
    e->lse = (float *)dev_alloc(e, L * B * H * T * sizeof(float));
    e->lnf = dev_alloc(e, bt * C * xs);
    e->lnf_mean = (float *)dev_alloc(e, bt * sizeof(float));
    e->lnf_rstd = (float *)dev_alloc(e, bt * sizeof(float));
    e->logits = dev_alloc(e, bt * V * xs);
    size_t K = (size_t)e->K;
    e->losses_all = (float *)dev_alloc(e, K * bt * sizeof(float));
    e->inputs_all = (int *)dev_alloc(e, K * bt * sizeof(int));
    e->targets_all = (int *)dev_alloc(e, K * bt * sizeof(int));

    e->dres = dev_alloc(e, bt * C * xs);
    e->dln = dev_alloc(e, bt * C * xs);
    e->dqkv = dev_alloc(e, bt * 3 * C * xs);
    e->datty = dev_alloc(e, bt * C * xs);
    e->dfch = dev_alloc(e, bt * 4 * C * xs);
    e->att_D = (float *)dev_alloc(e, B * H * T * sizeof(float));
    e->partial = (float *)dev_alloc(e, colsum_scratch_floats(bt, 4 * C) * sizeof(float));
    e->bucket_tok_all = (int *)dev_alloc(e, K * bt * sizeof(int));
    e->bucket_start_all = (int *)dev_alloc(e, K * (bt + 1) * sizeof(int));
    e->positions_all = (int *)dev_alloc(e, K * bt * sizeof(int));
    e->n_buckets_all = (int *)dev_alloc(e, K * sizeof(int));
    e->opt = (AdamWStep *)dev_alloc(e, sizeof(AdamWStep));
    if (e->ln_fused) e->ln_partial = (float *)dev_alloc(e, layernorm_backward_fused_scratch_floats(bt, C) * sizeof(float));
    select_micro(e, 0);
    e->logits_out = (float *)dev_alloc(e, B * V * sizeof(float));
    e->norm_partial = (double *)dev_alloc(e, NORM_BLOCKS * sizeof(double));
    e->norm_out = (double *)dev_alloc(e, sizeof(double));

    e->h_inputs = (int *)host_alloc(K * bt * sizeof(int));
    e->h_targets = (int *)host_alloc(K * bt * sizeof(int));
    e->h_bucket_tok = (int *)host_alloc(K * bt * sizeof(int));
    e->h_bucket_start = (int *)host_alloc(K * (bt + 1) * sizeof(int));
    e->h_positions = (int *)host_alloc(K * bt * sizeof(int));
    e->h_n_buckets = (int *)host_alloc(K * sizeof(int));
    e->h_cursor = (int *)host_alloc(V * sizeof(int));
    e->h_losses = (float *)host_alloc(K * bt * sizeof(float));
    e->h_logits = (float *)host_alloc(B * V * sizeof(float));
    e->h_norm = (double *)host_alloc(sizeof(double));
    e->h_opt = (AdamWStep *)host_alloc(sizeof(AdamWStep));
    e->h_snap_w = (float *)host_alloc(n * sizeof(float));
    e->h_snap_m = (float *)host_alloc(n * sizeof(float));
    e->h_snap_v = (float *)host_alloc(n * sizeof(float));
    // --sync-snapshot: the driver's get_state, the verified writer (qualification).
    e->eng->caps.snapshot = !cfg->sync_snapshot;
    // Sampling: the row-local forward (KV cache) where it applies; else the
    // training forward recomputes every window (no kv_forward).
    e->sample_rowlocal = e->bf16 ? sampling_applies<bf16>(e->C, e->H) : sampling_applies<float>(e->C, e->H);
    e->eng->caps.kv_forward = e->sample_rowlocal;

    // Warm-up: one forward+backward on zero weights and tokens makes every
    // GEMM plan and loads every kernel now, not inside the first step. The
    // gradients it leaves are cleared by the driver's zero_grads.
    // With --fused the warm-up is one whole fused step (enqueued, never
    // captured: the graph is made at the first real step); the weights and
    // moments it leaves are replaced by the driver's set_state.
    uint16_t *zeros = (uint16_t *)mg_calloc(K * e->B * (e->T + 1), sizeof(uint16_t));
    float *row_loss = (float *)mg_calloc(K * e->B, sizeof(float));
    if (e->fused) {  // staged and enqueued as train_step does, uncounted by the profiler
        for (int k = 0; k < e->K; k++) {
            stage_rows_host(e, k, zeros, e->B, e->T + 1, e->T, 1);
            stage_buckets_host(e, k);
        }
        adamw_step_settings(e->h_opt, 0.0f, cfg->beta1, cfg->beta2, 1);
        enqueue_step(e, 1.0f, cfg->grad_clip);
    } else {
        gpu_forward_backward(e, zeros, e->B, 1.0f, row_loss);
    }
    CUDA_CHECK(cudaStreamSynchronize(e->stream));
    CUDA_CHECK(cudaMemsetAsync(e->grads, 0, n * sizeof(float), e->stream));
    CUDA_CHECK(cudaStreamSynchronize(e->stream));
    free(zeros);
    free(row_loss);
    e->eng->caps.train_step = e->fused;  // the driver steps through gpu_train_step
#ifdef MG_NCCL
    // The communicator, once the warm-up (which must not reduce) is done.
    nccl_init(&e->nccl, MG_COMM, e->eng->rank, e->eng->ranks);
    e->dp = 1;
    e->micro_per_rank = e->K / e->eng->ranks;
#endif
    e->eng->caps.reduce_grads = e->dp;
    snprintf(e->eng->paths, sizeof e->eng->paths, "{\"attention\":\"%s\",\"fused\":%s,\"cuda_graph\":%s%s}",
             attention_name(e->attention), e->fused ? "true" : "false", e->use_graph ? "true" : "false",
             e->dp ? ",\"reduce\":\"nccl\"" : "");
    return e->bytes;
}

// ----------------------------------------------------------------------------
// The engine table (engine.h) and main(), which runs the shared driver
// (train.h) with it. Every slot is filled; init says in the caps which of the
// optional ones (the fused step, the asynchronous snapshot, the KV cache,
// the NCCL reduction of the build with -DMG_NCCL) this run takes.

static const MgEngineOps gpu_ops = {
    .configure = gpu_configure,
    .init = gpu_init,
    .set_state = gpu_set_state,
    .get_state = gpu_get_state,
    .zero_grads = gpu_zero_grads,
    .forward_backward = gpu_forward_backward,
    .forward_loss = gpu_forward_loss,
    .grad_norm = gpu_grad_norm,
    .update = gpu_update,
    .get_grads = gpu_get_grads,
    .set_grads = NULL,
    .last_logits = gpu_last_logits,
    .kv_forward = gpu_kv_forward,
    .train_step = gpu_train_step,
    .snapshot = gpu_snapshot,
    .snapshot_wait = gpu_snapshot_wait,
    .reduce_grads = gpu_reduce_grads,
};

int main(int argc, char **argv) {
    static Gpu impl;
    static MgEngine eng = {.name = "cuda", .ops = &gpu_ops, .impl = &impl};
    impl.eng = &eng;
    return mg_main(argc, argv, &eng);
}

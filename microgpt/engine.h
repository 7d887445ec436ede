// engine.h: the compute an engine provides, as a const table of functions
// (MgEngineOps), and what the driver knows of the engine it runs (MgEngine:
// its table, its state, what it describes itself as, and which optional
// slots init turned on). The CPU engine (microgpt_cpu.c) and the CUDA engine
// (microgpt_cuda.cu) each declare one table with every slot named; everything
// else is shared.
#ifndef MICROGPT_ENGINE_H
#define MICROGPT_ENGINE_H

#include "config.h"

// ----------------------------------------------------------------------------
// The compute an engine provides. All buffers are allocated in init; none of
// these functions allocates. Tokens are [rows, len] uint16; the training rows
// handed to forward_backward are [rows, T+1] (inputs and shifted targets).
// The table never changes at run time: an option (the attention path, the
// fused step, the CUDA graph, the KV cache, the asynchronous snapshot)
// changes flags in the engine's state, and init says which of the optional
// slots (train_step, snapshot with snapshot_wait, kv_forward, reduce_grads)
// the driver may call, in MgEngineCaps. An engine without one leaves its slot
// NULL.

typedef struct {
    // Checks engine-specific settings right after parsing (may fill in
    // defaults such as the precision) and fills in the MgEngine's device,
    // threads and precision (through the engine's back-pointer to it);
    // returns an error message or NULL.
    const char *(*configure)(void *impl, MgConfig *cfg);
    // Allocates everything for cfg (batch rows of ctx tokens) and sets the
    // MgEngine's caps; returns the bytes it holds.
    size_t (*init)(void *impl, const MgConfig *cfg);
    // Uploads weights and Adam moments (n floats each).
    void (*set_state)(void *impl, const float *w, const float *m, const float *v);
    // Downloads weights and moments into host arrays.
    void (*get_state)(void *impl, float *w, float *m, float *v);
    // Zeroes the gradient accumulators.
    void (*zero_grads)(void *impl);
    // Forward + backward of rows (<= batch) rows of T+1 tokens, adding
    // grad_scale * d(sum of token losses) into the gradients; writes each
    // row's mean token loss into row_loss.
    void (*forward_backward)(void *impl, const uint16_t *rows_tokens, int rows, float grad_scale, float *row_loss);
    // Forward only, same rows, row_loss out.
    void (*forward_loss)(void *impl, const uint16_t *rows_tokens, int rows, float *row_loss);
    // Global L2 norm of the gradients, computed in a fixed order.
    double (*grad_norm)(void *impl);
    // AdamW update for step `step` (1-based) with learning rate lr; grads are
    // multiplied by grad_mult first (the clip factor).
    void (*update)(void *impl, int step, float lr, float grad_mult);
    // Copies the gradients (n floats) to host memory.
    void (*get_grads)(void *impl, float *out);
    // Optional (NULL: the engine accumulates a step's micro-batches itself and
    // trains on one rank only, unless it has reduce_grads). Replaces the gradients with n host floats: the
    // step's gradient folded in comm.h's order from each micro-batch's,
    // which the driver reads with get_grads after zero_grads and one
    // forward_backward.
    void (*set_grads)(void *impl, const float *in);
    // Logits at the last position of each of rows rows of len tokens:
    // out is [rows, vocab]. Sampling's recompute path (sampler.h).
    void (*last_logits)(void *impl, const uint16_t *tokens, int rows, int len, float *out);
    // Optional (caps.kv_forward; else sampling recomputes through
    // last_logits). Sampling with a KV cache of `batch` slots, each holding
    // one sequence's keys and values for positions 0..ctx-1. Runs n_new[i] new tokens of the sequence in
    // slot[i], at positions pos[i] .. pos[i] + n_new[i] - 1, for i < rows
    // (tokens packed one sequence after another), attending to the slot's
    // cached positions before pos[i] and caching the new ones; writes the
    // logits of each sequence's last new position into out [rows, vocab].
    // pos[i] + n_new[i] <= ctx. The logits equal last_logits' on the whole
    // sequence, bit for bit.
    void (*kv_forward)(void *impl, int rows, const int *slot, const int *pos, const int *n_new,
                       const uint16_t *tokens, float *out);
    // Optional (caps.train_step; else the driver runs a step through the
    // calls above, waiting for the loss and the norm in between). The whole
    // optimizer step with no wait for the host inside it: zero_grads,
    // forward_backward of `micro` micro-batches of batch rows of T+1 tokens,
    // the gradient norm, the clip factor (grad_clip > 0 and norm > grad_clip:
    // grad_clip / (norm + 1e-6), as the driver computes it) and the AdamW
    // update of step `step` (1-based) at learning rate lr, skipped when the
    // norm is not finite. Then one wait: writes each row's mean loss into
    // row_loss and returns the norm before clipping. The gradients stay in
    // place until the next step (get_grads reads them).
    double (*train_step)(void *impl, const uint16_t *tokens, int micro, float grad_scale, int step, float lr,
                         float grad_clip, float *row_loss);
    // Optional, both (caps.snapshot; else the driver snapshots through
    // get_state, waiting for the copy). snapshot starts copying the current
    // weights and moments into host memory the engine owns, points *w, *m
    // and *v at it, and returns without waiting; snapshot_wait blocks until
    // that copy is complete (the checkpoint writer's thread calls it before
    // it reads, so it must be safe to call from another thread, and must not
    // end the process: a failure fails the write). Until then
    // the engine keeps what the copy reads unchanged (its next update waits
    // for the copy), and a new snapshot comes only after the write of the
    // last one has finished.
    void (*snapshot)(void *impl, float **w, float **m, float **v);
    int (*snapshot_wait)(void *impl);  // 0, or -1 (one line on stderr said why): the write then fails
    // Optional (caps.reduce_grads; else a data-parallel run reduces through
    // set_grads on the host). The engine's own reduction across the ranks
    // (the CUDA engine's NCCL build, cuda/nccl.cuh): after zero_grads and this
    // rank's forward_backward of its cfg.grad_accum / ranks micro-batches,
    // accumulated in place as one rank does, the driver calls it once; on
    // return the gradients are the sum over every rank's (grad_scale divides
    // by the global batch's tokens: the mean gradient of the whole step), the
    // same on every rank. The engine may start summing parts of them during
    // the last micro-batch's backward (it counts the micro-batches from
    // zero_grads).
    void (*reduce_grads)(void *impl);
} MgEngineOps;

// Which optional slots of the table this run uses: set by init (from the
// flags and the shape), read by the driver. An engine turns on only a slot
// its table fills in.
typedef struct {
    int train_step;   // the whole optimizer step on the device, one wait (CUDA --fused)
    int snapshot;     // snapshot and snapshot_wait: the asynchronous checkpoint copy (CUDA, unless --sync-snapshot)
    int kv_forward;   // sampling with a KV cache
    int reduce_grads; // the engine reduces the gradients across the ranks itself (CUDA with NCCL)
} MgEngineCaps;

typedef struct {
    const char *name;          // "cpu" or "cuda"
    const MgEngineOps *ops;    // the engine's table
    void *impl;                // the engine's state, handed to every slot
    // Filled in by configure (device, precision, threads), init (caps) and
    // mg_main (mem_bytes, init's answer):
    char device[256];          // human-readable device description
    const char *precision;     // "fp32", "bf16" or "fp8"
    int threads;
    size_t mem_bytes;          // bytes allocated for model, optimizer, activations, KV cache
    char paths[256];           // optional: a JSON object naming the code paths this run takes
                               // (the CUDA engine's attention, fused kernels, CUDA graph); "" = none
    MgEngineCaps caps;
    int rank, ranks;           // this process's place in a data-parallel job (comm.h), set before configure
} MgEngine;

#endif  // MICROGPT_ENGINE_H

// comm.h: the collectives of data-parallel training, as one small const
// table (MgCommOps), and the single-process implementation: one rank, no
// communication, no MPI needed to build or run. comm_mpi.h is the other
// implementation (the CPU engine built with mpicc: build/microgpt_cpu_mpi).
// The driver (train.h) calls these and nothing else to talk to other ranks.
//
// The reduction order (docs/ENGINE.md, "Data-parallel reduction"): a step's
// gradient is the left fold, in micro-batch order, of each micro-batch's
// gradient computed from zero:
//     G = (...((g_0 + g_1) + g_2) + ...) + g_{K-1}
// Rank r holds micro-batches r*m .. r*m+m-1 (m = K / ranks, contiguous), so
// the fold's order is the same whatever the rank count, and 1, 2 or 4 ranks
// give the same bits. Every implementation folds through mg_fold_into.
#ifndef MICROGPT_COMM_H
#define MICROGPT_COMM_H

#include "common.h"

#include <string.h>

typedef struct {
    const char *name;  // "single" or "mpi"
    // Joins the job; sets *rank and *size. Called once, first thing in main.
    void (*init)(int *argc, char ***argv, int *rank, int *size);
    // Rank 0's bytes reach every rank's buf.
    void (*broadcast)(void *buf, size_t bytes);
    // Each rank's `bytes` at all + rank * bytes reach every rank's all.
    void (*gather_all)(void *all, size_t bytes);
    // mine: this rank's m micro-batch gradients, [m][n], in micro-batch order.
    // out (n floats, every rank): the fold of all ranks' micro-batches in the
    // order above. mine may be overwritten.
    void (*reduce_ordered)(float *mine, int m, size_t n, float *out);
    // The bitwise OR of every rank's flags, on every rank.
    int (*agree)(int flags);
    void (*barrier)(void);
    // Leaves the job cleanly (before exit(0)).
    void (*finish)(void);
} MgCommOps;

// acc[i] = acc[i] + x[i]: the one addition every fold is made of.
static void mg_fold_into(float *acc, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) acc[i] = acc[i] + x[i];
}

// out = left fold of the m rows of parts ([m][n]); the first row is copied,
// not added to zero (0 + -0 is +0: the sign of a zero would change).
static void mg_fold_rows(const float *parts, int m, size_t n, float *out) {
    memcpy(out, parts, n * sizeof(float));
    for (int j = 1; j < m; j++) mg_fold_into(out, parts + (size_t)j * n, n);
}

// ----------------------------------------------------------------------------
// One process: every collective is the identity.

static void mg_single_init(int *argc, char ***argv, int *rank, int *size) {
    (void)argc;
    (void)argv;
    *rank = 0;
    *size = 1;
}
static void mg_single_broadcast(void *buf, size_t bytes) { (void)buf; (void)bytes; }
static void mg_single_gather_all(void *all, size_t bytes) { (void)all; (void)bytes; }
static void mg_single_reduce_ordered(float *mine, int m, size_t n, float *out) { mg_fold_rows(mine, m, n, out); }
static int mg_single_agree(int flags) { return flags; }
static void mg_single_barrier(void) {}
static void mg_single_finish(void) {}

static const MgCommOps mg_comm_single = {
    .name = "single",
    .init = mg_single_init,
    .broadcast = mg_single_broadcast,
    .gather_all = mg_single_gather_all,
    .reduce_ordered = mg_single_reduce_ordered,
    .agree = mg_single_agree,
    .barrier = mg_single_barrier,
    .finish = mg_single_finish,
};

#ifdef MG_MPI
#include "comm_mpi.h"
#define MG_COMM (&mg_comm_mpi)
#else
#define MG_COMM (&mg_comm_single)
#endif

#endif  // MICROGPT_COMM_H

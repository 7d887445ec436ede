// cuda/nccl.cuh: the CUDA engine's data-parallel gradient reduction over
// NCCL, for build/microgpt_cuda_mpi (nvcc with -DMG_MPI -DMG_NCCL; launched by
// mpirun or srun, docs/OPERATIONS.md). It owns the NCCL communicator: the
// local GPU, the pinned determinism settings, the communicator's creation
// (its id broadcast over comm.h), the in-place fp32 sums of gradient ranges
// on a stream of its own, and the waits. The gradients never leave the GPU.
//
// Every wait polls, never blocks inside NCCL or CUDA: a communicator whose
// peer died may never finish a collective, so each wait also asks NCCL for
// an asynchronous error, and on one aborts the communicator and ends this
// rank with one line (the launcher then ends the job, and the proxy restarts
// it from the newest checkpoint).
//
// Determinism (docs/ENGINE.md, "Data-parallel reduction"): NCCL picks its
// algorithm and protocol from the topology and the sizes, and NVLS reductions
// are not repeatable; the settings below are pinned before the communicator
// exists, and the ranges reduced are the same every step, so the same rank
// count, GPUs, placement and build give the same bits.
#ifndef MICROGPT_CUDA_NCCL_CUH
#define MICROGPT_CUDA_NCCL_CUH

#include <nccl.h>

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../comm.h"
#include "common.cuh"

typedef struct {
    ncclComm_t comm;
    cudaStream_t stream;  // the reductions' stream
    cudaEvent_t ready;    // recorded on the compute stream before each range's reduction
    cudaEvent_t done;     // recorded on the reductions' stream after the last one
    int rank, ranks;
} Nccl;

// The environment variables a launcher sets to a process's rank on its
// node, in the order they are read (Open MPI, SLURM, torchrun-style).
static const char *const NCCL_LOCAL_RANK_VARS[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "LOCAL_RANK"};

// This process's rank on its node: the first of those variables that is
// set, 0 when none is.
static int nccl_local_rank(void) {
    for (size_t i = 0; i < sizeof NCCL_LOCAL_RANK_VARS / sizeof *NCCL_LOCAL_RANK_VARS; i++) {
        const char *s = getenv(NCCL_LOCAL_RANK_VARS[i]);
        if (!s || !*s) continue;
        char *end = NULL;
        long v = strtol(s, &end, 10);
        if (*end || v < 0 || v > 1 << 20)
            mg_fail(MG_EXIT_USAGE, "%s=%s is not a local rank", NCCL_LOCAL_RANK_VARS[i], s);
        return (int)v;
    }
    return 0;
}

// The GPU this rank trains on, among `count` visible ones: its local rank.
// A launcher that gives each rank one GPU of its own (srun --gpus-per-task,
// a CUDA_VISIBLE_DEVICES per rank) leaves one visible: that one. Chosen
// before any call that makes a CUDA context (cudaSetDevice makes one).
static int nccl_local_device(int count) {
    int local = nccl_local_rank();
    if (count == 1) return 0;
    if (local >= count)
        mg_fail(MG_EXIT_USAGE, "local rank %d but only %d GPUs are visible on this node: launch at most %d ranks per "
                "node", local, count, count);
    return local;
}

// NCCL_ALGO=Ring, NCCL_PROTO=Simple, NCCL_NVLS_ENABLE=0, overwriting what the
// user set; rank 0 says in one line which it overwrote.
static void nccl_pin_determinism(int rank) {
    static const char *const pins[][2] = {{"NCCL_ALGO", "Ring"}, {"NCCL_PROTO", "Simple"}, {"NCCL_NVLS_ENABLE", "0"}};
    char changed[512] = "";
    for (size_t i = 0; i < sizeof pins / sizeof *pins; i++) {
        const char *old = getenv(pins[i][0]);
        if (old && strcmp(old, pins[i][1]) != 0) {
            size_t len = strlen(changed);
            snprintf(changed + len, sizeof changed - len, "%s%s=%.64s -> %s", len ? ", " : "", pins[i][0], old,
                     pins[i][1]);
        }
        if (setenv(pins[i][0], pins[i][1], 1) != 0) mg_fail(MG_EXIT_IO, "cannot set %s", pins[i][0]);
    }
    if (changed[0] && rank == 0)
        mg_warn("NCCL settings overridden for a repeatable reduction (docs/ENGINE.md): %s", changed);
}

// An NCCL error: the communicator is aborted (so no collective waits on it
// any more) and this rank ends with one line.
static void nccl_fail(Nccl *n, ncclResult_t rc, const char *what) {
    if (n->comm) ncclCommAbort(n->comm);
    n->comm = NULL;
    mg_fail(MG_EXIT_IO, "NCCL %s failed on rank %d of %d: %s%s", what, n->rank, n->ranks, ncclGetErrorString(rc),
            rc == ncclRemoteError || rc == ncclSystemError ? " (a peer rank may have died)" : "");
}

static void nccl_nap(long polls) {
    static const struct timespec nap = {0, 50 * 1000};  // 50 us
    if (polls > 100) nanosleep(&nap, NULL);
}

// A non-blocking communicator's call may return ncclInProgress: the
// communicator is busy until its asynchronous state says otherwise.
static void nccl_settle(Nccl *n, ncclResult_t rc, const char *what) {
    for (long polls = 0; rc == ncclInProgress; polls++) {
        nccl_nap(polls);
        ncclResult_t st = ncclCommGetAsyncError(n->comm, &rc);
        if (st != ncclSuccess) rc = st;
    }
    if (rc != ncclSuccess) nccl_fail(n, rc, what);
}

// The communicator of every rank's GPU: rank 0's id reaches every rank over
// comm (MPI), then each joins without blocking, polling until it is ready.
static void nccl_init(Nccl *n, const MgCommOps *comm, int rank, int ranks) {
    memset(n, 0, sizeof *n);
    n->rank = rank;
    n->ranks = ranks;
    nccl_pin_determinism(rank);
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (rank == 0) {
        ncclResult_t rc = ncclGetUniqueId(&id);
        if (rc != ncclSuccess) nccl_fail(n, rc, "id");
    }
    comm->broadcast(&id, sizeof id);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t rc = ncclCommInitRankConfig(&n->comm, ranks, id, rank, &config);
    if (rc != ncclSuccess && rc != ncclInProgress) nccl_fail(n, rc, "communicator creation");
    nccl_settle(n, rc, "communicator creation");
    CUDA_CHECK(cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&n->ready, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&n->done, cudaEventDisableTiming));
}

// Sums count floats at buf (a range of the gradients) over every rank, in
// place, on the reductions' stream, once the compute stream has done
// everything enqueued on it so far (the range's last writes).
static void nccl_reduce_range(Nccl *n, float *buf, size_t count, cudaStream_t compute) {
    CUDA_CHECK(cudaEventRecord(n->ready, compute));
    CUDA_CHECK(cudaStreamWaitEvent(n->stream, n->ready, 0));
    nccl_settle(n, ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, n->comm, n->stream), "all-reduce");
}

// Waits for every reduction enqueued (polling the stream and NCCL's
// asynchronous state), and orders the compute stream after them.
static void nccl_wait(Nccl *n, cudaStream_t compute) {
    CUDA_CHECK(cudaEventRecord(n->done, n->stream));
    for (long polls = 0;; polls++) {
        cudaError_t q = cudaStreamQuery(n->stream);
        if (q == cudaSuccess) break;
        if (q != cudaErrorNotReady) {
            if (n->comm) ncclCommAbort(n->comm);
            n->comm = NULL;
            mg_fail(MG_EXIT_IO, "CUDA error while rank %d waited for its gradient reduction: %s", n->rank,
                    cudaGetErrorString(q));
        }
        ncclResult_t async = ncclSuccess;
        ncclResult_t st = ncclCommGetAsyncError(n->comm, &async);
        if (st != ncclSuccess) nccl_fail(n, st, "error query");
        if (async != ncclSuccess && async != ncclInProgress) nccl_fail(n, async, "all-reduce");
        nccl_nap(polls);
    }
    CUDA_CHECK(cudaStreamWaitEvent(compute, n->done, 0));
}

#endif  // MICROGPT_CUDA_NCCL_CUH

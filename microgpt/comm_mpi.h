// comm_mpi.h: the collectives of comm.h over MPI (Open MPI or MPICH), for
// the CPU engine built with mpicc (build/microgpt_cpu_mpi; launched by
// mpirun or srun). Included by comm.h when MG_MPI is defined.
//
// The ordered reduction is not MPI_Allreduce: its summation order depends on
// the rank count (pairwise at 4 ranks), so N ranks would not match one. It
// is a reduce-scatter written out: the gradient is cut into `size` slices;
// an all-to-all hands rank s every rank's micro-batch gradients for slice s;
// rank s folds them in micro-batch order (mg_fold_into, as one process
// does); an all-gather hands every rank every folded slice.
#ifndef MICROGPT_COMM_MPI_H
#define MICROGPT_COMM_MPI_H

#include <mpi.h>
#include <time.h>

static int mg_mpi_rank, mg_mpi_size;

// An MPI error is a one-line failure of this rank (mpirun then ends the job).
static void mg_mpi_check(int rc, const char *what) {
    if (rc == MPI_SUCCESS) return;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    mg_fail(MG_EXIT_IO, "MPI %s failed on rank %d: %s", what, mg_mpi_rank, msg);
}

static void mg_mpi_init(int *argc, char ***argv, int *rank, int *size) {
    if (MPI_Init(argc, argv) != MPI_SUCCESS) mg_fail(MG_EXIT_IO, "MPI_Init failed");
    // Errors come back as codes, reported in one line, instead of MPI's own abort.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &mg_mpi_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &mg_mpi_size);
    *rank = mg_mpi_rank;
    *size = mg_mpi_size;
}

// Large buffers go in pieces: MPI counts are ints.
#define MG_MPI_CHUNK (1u << 30)

// A broadcast waited for by polling, sleeping between polls once it has
// not come at once: the other ranks wait here for rank 0's next command
// while rank 0 waits for frames, and MPI's blocking wait spins a core (on
// a small machine, the core rank 0 needs).
static void mg_mpi_wait(MPI_Request *req, const char *what) {
    struct timespec nap = {0, 100 * 1000};  // 0.1 ms
    for (long polls = 0;; polls++) {
        int done = 0;
        mg_mpi_check(MPI_Test(req, &done, MPI_STATUS_IGNORE), what);
        if (done) return;
        if (polls > 1000) nanosleep(&nap, NULL);
    }
}

static void mg_mpi_broadcast(void *buf, size_t bytes) {
    for (size_t off = 0; off < bytes; off += MG_MPI_CHUNK) {
        size_t len = bytes - off < MG_MPI_CHUNK ? bytes - off : MG_MPI_CHUNK;
        MPI_Request req;
        mg_mpi_check(MPI_Ibcast((char *)buf + off, (int)len, MPI_BYTE, 0, MPI_COMM_WORLD, &req), "broadcast");
        mg_mpi_wait(&req, "broadcast");
    }
}

static void mg_mpi_gather_all(void *all, size_t bytes) {
    if (bytes > MG_MPI_CHUNK) mg_fail(MG_EXIT_IO, "gather of %zu bytes per rank: too large", bytes);
    mg_mpi_check(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, all, (int)bytes, MPI_BYTE, MPI_COMM_WORLD),
                 "all-gather");
}

static void mg_mpi_reduce_ordered(float *mine, int m, size_t n, float *out) {
    int P = mg_mpi_size;
    size_t slice = (n + (size_t)P - 1) / (size_t)P;   // the last slice is padded
    size_t block = (size_t)m * slice;                  // what one rank sends another
    if (block > MG_MPI_CHUNK / sizeof(float)) mg_fail(MG_EXIT_IO, "gradient slices too large for one all-to-all");
    // The buffers live for the run: every step has the same m and n. calloc: the
    // last slice's padding is never written, so it stays zero.
    static float *send, *recv, *folded;
    static size_t held_block;
    if (held_block != block) {
        free(send);
        free(recv);
        free(folded);
        send = (float *)mg_calloc((size_t)P * block, sizeof(float));
        recv = (float *)mg_malloc((size_t)P * block * sizeof(float));
        folded = (float *)mg_calloc((size_t)P * slice, sizeof(float));
        held_block = block;
    }
    // send[dest][j][.] = slice dest of micro-batch j
    for (int dest = 0; dest < P; dest++)
        for (int j = 0; j < m; j++) {
            size_t lo = (size_t)dest * slice, hi = lo + slice < n ? lo + slice : n;
            if (lo < hi) memcpy(send + (size_t)dest * block + (size_t)j * slice, mine + (size_t)j * n + lo, (hi - lo) * sizeof(float));
        }
    mg_mpi_check(MPI_Alltoall(send, (int)block, MPI_FLOAT, recv, (int)block, MPI_FLOAT, MPI_COMM_WORLD), "all-to-all");
    // recv[src][j][.]: micro-batch src * m + j of this rank's slice; [src][j]
    // in memory order is micro-batch order, so the fold is over rows.
    float *my_slice = folded + (size_t)mg_mpi_rank * slice;
    mg_fold_rows(recv, P * m, slice, my_slice);
    mg_mpi_check(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, folded, (int)slice, MPI_FLOAT, MPI_COMM_WORLD),
                 "all-gather");
    memcpy(out, folded, n * sizeof(float));
}

static int mg_mpi_agree(int flags) {
    int all = 0;
    mg_mpi_check(MPI_Allreduce(&flags, &all, 1, MPI_INT, MPI_BOR, MPI_COMM_WORLD), "flag agreement");
    return all;
}

static void mg_mpi_barrier(void) { mg_mpi_check(MPI_Barrier(MPI_COMM_WORLD), "barrier"); }

static void mg_mpi_finish(void) { MPI_Finalize(); }

static const MgCommOps mg_comm_mpi = {
    .name = "mpi",
    .init = mg_mpi_init,
    .broadcast = mg_mpi_broadcast,
    .gather_all = mg_mpi_gather_all,
    .reduce_ordered = mg_mpi_reduce_ordered,
    .agree = mg_mpi_agree,
    .barrier = mg_mpi_barrier,
    .finish = mg_mpi_finish,
};

#endif  // MICROGPT_COMM_MPI_H

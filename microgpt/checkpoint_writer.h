// checkpoint_writer.h: checkpoints written off the training loop's critical
// path, by one background thread.
//
// The driver snapshots the state into host memory (the engine's get_state: a
// memcpy on the CPU; or its snapshot, an asynchronous copy the writer waits
// for: the CUDA engine's device-to-host copy on a side stream), hands the
// snapshot to the writer, and trains on. The
// writer thread does the slow part, mg_write_checkpoint (write, fsync, rename,
// fsync the directory), then records the result and writes one byte to a
// pipe. The driver polls for the result between steps and, idle in proxy
// mode, waits on the pipe beside stdin (ppoll), so a finished write is
// announced promptly, and only by the main thread (stdout has one writer).
//
// One write is in flight at a time: the snapshot buffers are not touched
// again until the result has been collected, and the next checkpoint waits
// for that. The thread blocks the driver's signals (SIGTERM, SIGINT,
// SIGUSR1), so they always interrupt the main thread's ppoll, never the
// writer's write().
#ifndef MICROGPT_CHECKPOINT_WRITER_H
#define MICROGPT_CHECKPOINT_WRITER_H

#include "checkpoint.h"
#include "common.h"
#include "config.h"
#include "signals.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

// The outcome of one write.
typedef struct {
    int step;
    int err;             // 0, or the errno value of the failed operation
    const char *what;    // the failed operation ("create", "write", "fsync", ...)
    char path[4096];     // the checkpoint's final name
    size_t bytes;
    size_t non_finite;   // weights and moments that are not finite: the write was refused (err EDOM)
    double write_ms;     // the writer thread's time, create to directory fsync
} MgWriteResult;

typedef struct {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t changed;  // signalled when a job is handed over and when one finishes
    int done_pipe[2];        // [0] read end (nonblocking, for ppoll), [1] the writer's end
    // The job. Set by the main thread under the lock while no job is in flight.
    const MgCkptDir *dir;
    const MgConfig *cfg;
    const char *engine;
    const MgState *state;
    int (*wait_snapshot)(void *impl);  // NULL, or what to wait for before reading state (0: landed)
    void *wait_impl;
    int job_ready;           // handed over, not yet picked up by the thread
    int in_flight;           // handed over, result not yet collected by the main thread
    int finished;            // the thread is done with it: result is valid
    MgWriteResult result;
} MgCkptWriter;

static void *mg_writer_thread(void *arg) {
    MgCkptWriter *w = (MgCkptWriter *)arg;
    pthread_mutex_lock(&w->lock);
    for (;;) {
        while (!w->job_ready) pthread_cond_wait(&w->changed, &w->lock);
        w->job_ready = 0;
        const MgCkptDir *dir = w->dir;
        const MgConfig *cfg = w->cfg;
        const char *engine = w->engine;
        const MgState *st = w->state;
        int (*wait_snapshot)(void *) = w->wait_snapshot;
        void *wait_impl = w->wait_impl;
        pthread_mutex_unlock(&w->lock);

        MgWriteResult r;
        memset(&r, 0, sizeof r);
        r.step = st->step;
        r.what = "";
        double t0 = mg_now_ms();
        if (wait_snapshot && wait_snapshot(wait_impl)) {  // the asynchronous copy did not land
            r.err = EIO;
            r.what = "copy the snapshot for";
            snprintf(r.path, sizeof r.path, "step %d", st->step);
        } else {
            r.err = mg_write_checkpoint(dir, cfg, engine, st, r.path, sizeof r.path, &r.bytes, &r.what,
                                         &r.non_finite);
        }
        r.write_ms = mg_now_ms() - t0;

        pthread_mutex_lock(&w->lock);
        w->result = r;
        w->finished = 1;
        pthread_cond_broadcast(&w->changed);
        char byte = 1;
        while (write(w->done_pipe[1], &byte, 1) < 0 && errno == EINTR) {
        }
    }
    return NULL;
}

// Creates the pipe and the thread (with the driver's signals blocked in it).
static void mg_writer_start(MgCkptWriter *w) {
    memset(w, 0, sizeof *w);
    if (pipe2(w->done_pipe, O_CLOEXEC)) mg_fail(MG_EXIT_IO, "cannot create the checkpoint writer's pipe: %s", strerror(errno));
    int flags = fcntl(w->done_pipe[0], F_GETFL);
    if (flags < 0 || fcntl(w->done_pipe[0], F_SETFL, flags | O_NONBLOCK))
        mg_fail(MG_EXIT_IO, "cannot set up the checkpoint writer's pipe: %s", strerror(errno));
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->changed, NULL);
    sigset_t block = mg_flag_signals(), old;
    pthread_sigmask(SIG_BLOCK, &block, &old);
    int rc = pthread_create(&w->thread, NULL, mg_writer_thread, w);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc) mg_fail(MG_EXIT_IO, "cannot start the checkpoint writer thread: %s", strerror(rc));
}

// The fd that becomes readable when a write finishes (for ppoll).
static int mg_writer_fd(const MgCkptWriter *w) { return w->done_pipe[0]; }

// Hands a snapshot to the thread (which first calls wait_snapshot(wait_impl),
// when given, to wait for an asynchronous copy into st). dir, st, cfg and
// engine must stay untouched until the result is collected. Only when nothing
// is in flight.
static void mg_writer_submit(MgCkptWriter *w, const MgCkptDir *dir, const MgConfig *cfg, const char *engine,
                             const MgState *st, int (*wait_snapshot)(void *impl), void *wait_impl) {
    pthread_mutex_lock(&w->lock);
    w->dir = dir;
    w->cfg = cfg;
    w->engine = engine;
    w->state = st;
    w->wait_snapshot = wait_snapshot;
    w->wait_impl = wait_impl;
    w->finished = 0;
    w->job_ready = 1;
    w->in_flight = 1;
    pthread_cond_broadcast(&w->changed);
    pthread_mutex_unlock(&w->lock);
}

// Collects the result of the write in flight: returns 1 and fills *out when
// it has finished (waiting for it first if `wait`), 0 when it is still being
// written or nothing is in flight.
static int mg_writer_collect(MgCkptWriter *w, int wait, MgWriteResult *out) {
    if (!w->in_flight) return 0;
    pthread_mutex_lock(&w->lock);
    while (wait && !w->finished) pthread_cond_wait(&w->changed, &w->lock);
    int finished = w->finished;
    if (finished) {
        *out = w->result;
        w->in_flight = 0;
        w->finished = 0;
        char drain[16];
        while (read(w->done_pipe[0], drain, sizeof drain) > 0) {
        }
    }
    pthread_mutex_unlock(&w->lock);
    return finished;
}

#endif  // MICROGPT_CHECKPOINT_WRITER_H

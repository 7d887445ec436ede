// train.h: the training driver both engines share. One train step (forward,
// backward, clip, AdamW through the engine table), evals, checkpoint
// emission, the proxy-mode frame loop, the standalone loop over a token
// shard, and mg_main, the entry point an engine's main() calls with its
// engine (engine.h).
#ifndef MICROGPT_TRAIN_H
#define MICROGPT_TRAIN_H

#include "checkpoint.h"
#include "checkpoint_writer.h"
#include "comm.h"
#include "common.h"
#include "config.h"
#include "engine.h"
#include "model.h"
#include "protocol.h"
#include "sampler.h"
#include "shard.h"
#include "signals.h"

#include <string.h>

// ----------------------------------------------------------------------------
// The driver: the training loop both engines share.

typedef struct {
    MgConfig cfg;
    MgEngine *eng;
    MgLayout lay;
    MgState st;          // snapshot the checkpoint writer writes from (weights, m, v)
    MgCkptDir ckdir;     // the checkpoint directory, opened at start: every checkpoint goes there
    int step;
    int saved_step;      // step of the last checkpoint started or loaded, -1 if none
    int durable_step;    // step of the last checkpoint announced (durable) or loaded, -1 if none
    int steps_here;      // optimizer steps this process has trained (--dump-grads-step counts them)
    uint64_t tokens_seen;
    MgTokenFrame frame;  // the rows of a TRAIN or EVAL frame (standalone: of the step), [batch * grad_accum] or more
    float *row_loss;     // each row's loss
    uint32_t row_loss_cap;
    MgCkptWriter writer;
    const char *ckpt_reason;  // of the write in flight
    double ckpt_wait_ms;      // how long it waited for the write before it
    double ckpt_snapshot_ms;  // how long the snapshot took the step loop (get_state, or starting the engine's copy)
    double last_ckpt_ms;      // when the last checkpoint started (or the engine did): --ckpt-every-seconds
    // Data-parallel (comm.h): this process is rank `rank` of `ranks`. Rank 0
    // reads frames (or the shard), writes events and checkpoints; the others
    // run mg_follower_loop.
    const MgCommOps *comm;
    int rank, ranks;
    float *grad_parts;   // [micro-batches of this rank][n]: each one's gradient (ranks > 1)
    float *grad_sum;     // [n]: the step's gradient, folded (engines with set_grads)
    int ckpt_to_agree;   // rank 0: a SIGUSR1 that came between steps, put to the ranks after the next one
    int ckpt_agreed;     // rank 0: the ranks agreed on a checkpoint after the last step
    int ckpt_agreed_step;  // rank 0: the step of the last agreed checkpoint (-2: none)
} MgDriver;

// What rank 0 tells the other ranks before each step (broadcast).
enum { MG_CMD_TRAIN = 1, MG_CMD_FINISH = 2 };
// The flags the ranks agree on after each step (comm->agree).
enum { MG_AGREE_STOP = 1, MG_AGREE_CKPT = 2 };

// Rank 0 tells the others to leave (a finish broadcast), then everyone
// leaves the job; the caller exits 0.
static void mg_leave_job(MgDriver *d) {
    if (d->ranks > 1 && d->rank == 0) {
        int cmd = MG_CMD_FINISH;
        d->comm->broadcast(&cmd, sizeof cmd);
    }
    d->comm->finish();
}

// ----------------------------------------------------------------------------
// Checkpoints. The step loop only waits for a snapshot (and for the previous
// write, if it is still in flight); the writer thread does the rest. The
// `ckpt` event comes once the file is durable, from the main thread: after a
// later step event, sometimes.

// Announces the write in flight once it has finished (waiting for it if
// `wait`): the ckpt event, then --keep-last pruning (standalone mode), so
// that pruning only ever sees durable files. Returns the write's errno value
// (0 for a success, or nothing finished); the caller decides what a failure
// means.
static int mg_ckpt_announce(MgDriver *d, int wait, MgWriteResult *r) {
    if (!mg_writer_collect(&d->writer, wait, r)) return 0;  // nothing finished
    if (r->err) return r->err;
    d->durable_step = r->step;
    printf("{\"event\":\"ckpt\",\"step\":%d,\"path\":", r->step);
    mg_json_string(stdout, r->path);
    printf(",\"bytes\":%zu,\"ms\":%.3f,\"wait_ms\":%.3f,\"snapshot_ms\":%.3f,\"reason\":\"%s\"}\n", r->bytes,
           r->write_ms, d->ckpt_wait_ms, d->ckpt_snapshot_ms, d->ckpt_reason);
    fflush(stdout);
    if (strcmp(d->cfg.data, "-") != 0) mg_prune_checkpoints(&d->ckdir, d->cfg.keep_last);
    return 0;
}

// The last durable checkpoint, for a message: "last checkpoint: step N".
static void mg_last_checkpoint(const MgDriver *d, char *out, size_t cap) {
    if (d->durable_step >= 0) snprintf(out, cap, "last checkpoint: step %d", d->durable_step);
    else snprintf(out, cap, "no checkpoint yet");
}

// Announces a finished write; a failed one ends the run (exit 5), as a
// synchronous write did: the writer removed its temp file, so the previous
// checkpoints are all there is. A state with non-finite weights or moments was
// refused, not written: the run has diverged (exit 6).
static void mg_ckpt_settle(MgDriver *d, int wait) {
    MgWriteResult r;
    memset(&r, 0, sizeof r);
    int err = mg_ckpt_announce(d, wait, &r);
    if (err && r.non_finite) {
        char last[64];
        mg_last_checkpoint(d, last, sizeof last);
        mg_fail(MG_EXIT_NUMERIC, "checkpoint at step %d not written: %zu of its %zu weights and Adam moments are "
                "not finite (the run diverged; %s)", r.step, r.non_finite, 3 * d->st.n, last);
    }
    if (err)
        mg_fail(MG_EXIT_IO, "checkpoint at step %d failed (%s %s: %s); previous checkpoints are intact", r.step,
                r.what, r.path, strerror(err));
}

// mg_fail's hook: another error ends the run, so let the write in flight
// finish (and be announced if it succeeded) before that error is reported.
static void mg_ckpt_settle_before_fail(void *driver) {
    MgWriteResult r;
    (void)mg_ckpt_announce((MgDriver *)driver, 1, &r);
}

// Starts a checkpoint of the current step: waits for the write in flight,
// snapshots the state, hands it to the writer.
static void mg_ckpt_begin(MgDriver *d, const char *reason) {
    double t0 = mg_now_ms();
    mg_ckpt_settle(d, 1);
    double t1 = mg_now_ms();
    if (d->eng->caps.snapshot) d->eng->ops->snapshot(d->eng->impl, &d->st.weights, &d->st.m, &d->st.v);
    else d->eng->ops->get_state(d->eng->impl, d->st.weights, d->st.m, d->st.v);
    d->st.step = d->step;
    d->st.tokens_seen = d->tokens_seen;
    d->ckpt_reason = reason;
    d->ckpt_wait_ms = t1 - t0;
    d->ckpt_snapshot_ms = mg_now_ms() - t1;
    d->last_ckpt_ms = t0;
    d->saved_step = d->step;
    mg_writer_submit(&d->writer, &d->ckdir, &d->cfg, d->eng->name, &d->st,
                     d->eng->caps.snapshot ? d->eng->ops->snapshot_wait : NULL, d->eng->impl);
}

static void mg_emit_exit(MgDriver *d, const char *reason) {
    printf("{\"event\":\"exit\",\"step\":%d,\"reason\":\"%s\"}\n", d->step, reason);
    fflush(stdout);
}

// Waits for the write in flight, checkpoints unless this exact step is
// already saved, waits for that too, then exits 0.
static void mg_finish(MgDriver *d, const char *ckpt_reason, const char *exit_reason) {
    if (d->saved_step != d->step) mg_ckpt_begin(d, ckpt_reason);
    mg_ckpt_settle(d, 1);
    mg_emit_exit(d, exit_reason);
    mg_leave_job(d);
    exit(0);
}

// Per-group mean of row losses, groups in ascending id order, printed as a
// JSON object. Sums run in row order in double: deterministic.
static void mg_print_groups(const float *row_loss, const uint16_t *groups, int rows, int T, int with_tokens) {
    static double sum[65536];
    static int count[65536];
    for (int r = 0; r < rows; r++) { sum[groups[r]] = 0; count[groups[r]] = 0; }
    for (int r = 0; r < rows; r++) { sum[groups[r]] += row_loss[r]; count[groups[r]]++; }
    fputs(",\"group_loss\":{", stdout);
    int first = 1;
    for (int g = 0; g < 65536; g++) {
        if (!count[g]) continue;
        printf(first ? "\"%d\":" : ",\"%d\":", g);
        mg_json_float(stdout, (float)(sum[g] / count[g]));
        first = 0;
    }
    fputc('}', stdout);
    if (with_tokens) {
        fputs(",\"group_tokens\":{", stdout);
        first = 1;
        for (int g = 0; g < 65536; g++) {
            if (!count[g]) continue;
            printf(first ? "\"%d\":%lld" : ",\"%d\":%lld", g, (long long)count[g] * T);
            first = 0;
        }
        fputc('}', stdout);
    }
    for (int r = 0; r < rows; r++) count[groups[r]] = 0;
}

static void mg_write_grads_file(MgDriver *d, float loss) {
    if (d->rank != 0) {  // every rank reaches this step; rank 0 writes
        d->comm->finish();
        exit(0);
    }
    float *grads = (float *)mg_malloc(d->lay.n * sizeof(float));
    d->eng->ops->get_grads(d->eng->impl, grads);
    FILE *f = fopen(d->cfg.dump_grads, "wb");
    if (!f || fwrite(grads, sizeof(float), d->lay.n, f) != d->lay.n || fclose(f))
        mg_fail(MG_EXIT_IO, "cannot write gradients to %s: %s", d->cfg.dump_grads, strerror(errno));
    free(grads);
    printf("{\"event\":\"grads\",\"step\":%d,\"loss\":", d->step + 1);
    mg_json_float(stdout, loss);
    fputs(",\"path\":", stdout);
    mg_json_string(stdout, d->cfg.dump_grads);
    puts("}");
    mg_ckpt_settle(d, 1);  // a checkpoint of an earlier step (--dump-grads-step) finishes first
    mg_emit_exit(d, "grads");
    d->comm->finish();
    exit(0);
}

// The clip factor of a gradient norm: grad_clip / (norm + 1e-6) above the
// threshold, else 1. (The CUDA engine's device-side step computes the same
// expression in the same precision.)
static float mg_clip_factor(double norm, float grad_clip) {
    return grad_clip > 0 && norm > grad_clip ? (float)(grad_clip / (norm + 1e-6)) : 1.0f;
}

static void mg_fail_nonfinite(const MgDriver *d, float loss) {
    char last[64];
    mg_last_checkpoint(d, last, sizeof last);
    mg_fail(MG_EXIT_NUMERIC, "non-finite %s at step %d; nothing written (%s)",
            isfinite(loss) ? "gradient norm" : "loss", d->step + 1, last);
}

// ----------------------------------------------------------------------------
// The data-parallel seams. A step's rows reach the engine, and its gradients
// become the step's, through these two functions and nowhere else. Rank 0
// broadcasts the step's rows (every rank gets them all; rank r trains
// micro-batches r*m .. r*m+m-1, m = grad_accum / ranks: contiguous), and
// mg_reduce_gradients folds the micro-batch gradients in the order comm.h
// defines and gathers the row losses to every rank. The engine's whole step
// (caps.train_step) runs on the device with no host wait inside, so there
// the reduction would have to be the engine's own: such a run has one rank.
// An engine with caps.reduce_grads (the CUDA engine over NCCL) accumulates
// its rank's micro-batches in place and sums them across the ranks itself
// (mg_reduce_on_engine): not in this order (docs/ENGINE.md).

// This rank's share of a step: `micro` micro-batches of batch rows of T+1
// tokens, their row losses written at row_loss (inside the step's).
typedef struct {
    const uint16_t *tokens;
    int micro;
    float *row_loss;
} MgRankRows;

static MgRankRows mg_rows_of_rank(MgDriver *d, const uint16_t *tokens) {
    const MgConfig *c = &d->cfg;
    if (d->ranks == 1) {
        MgRankRows all = {tokens, c->grad_accum, d->row_loss};
        return all;
    }
    size_t rows = (size_t)c->batch * c->grad_accum;
    if (d->rank == 0) {
        int cmd = MG_CMD_TRAIN;
        d->comm->broadcast(&cmd, sizeof cmd);
    }
    d->comm->broadcast((void *)tokens, rows * (c->ctx + 1) * sizeof(uint16_t));
    int m = c->grad_accum / d->ranks;
    size_t first = (size_t)d->rank * m * c->batch;
    MgRankRows mine = {tokens + first * (c->ctx + 1), m, d->row_loss + first};
    return mine;
}

// After micro-batch j of this rank's share: its gradient (computed from
// zero) is kept for the fold. One rank folds as it goes (grad_sum); several
// keep each one (grad_parts) for comm->reduce_ordered.
static void mg_keep_micro_gradient(MgDriver *d, int j) {
    if (d->ranks == 1) {
        if (j == 0) d->eng->ops->get_grads(d->eng->impl, d->grad_sum);
        else {
            d->eng->ops->get_grads(d->eng->impl, d->grad_parts);
            mg_fold_into(d->grad_sum, d->grad_parts, d->lay.n);
        }
    } else d->eng->ops->get_grads(d->eng->impl, d->grad_parts + (size_t)j * d->lay.n);
}

// After this rank's backward: every rank then holds the step's gradients,
// and d->row_loss every row's loss.
static void mg_reduce_gradients(MgDriver *d, int micro) {
    if (d->ranks > 1) {
        d->comm->reduce_ordered(d->grad_parts, micro, d->lay.n, d->grad_sum);
        d->comm->gather_all(d->row_loss, (size_t)micro * d->cfg.batch * sizeof(float));
    }
    d->eng->ops->set_grads(d->eng->impl, d->grad_sum);
}

// The engine's own reduction (caps.reduce_grads): after this rank's backward,
// its accumulated gradients become the sum over every rank's, on the device;
// the row losses are gathered as above.
static void mg_reduce_on_engine(MgDriver *d, int micro) {
    d->eng->ops->reduce_grads(d->eng->impl);
    if (d->ranks > 1) d->comm->gather_all(d->row_loss, (size_t)micro * d->cfg.batch * sizeof(float));
}

// After each step, every rank: the stop and checkpoint flags of any rank
// (a signal may reach one rank, or all of them) become rank 0's, which acts
// on them; the other ranks drop theirs.
// A SIGUSR1 sent to every rank (mpirun forwards it so) is one checkpoint:
// rank 0 checkpoints only on the agreed flag, never on its own.
// The flags are taken (read and cleared) with the signals blocked, before
// the collective: a signal that lands during it counts at the next step.
static void mg_agree_on_signals(MgDriver *d) {
    if (d->ranks == 1) return;
    sigset_t block = mg_flag_signals(), old;
    sigprocmask(SIG_BLOCK, &block, &old);
    int stop = mg_stop_requested, ckpt = mg_ckpt_requested || d->ckpt_to_agree;
    mg_ckpt_requested = 0;
    if (d->rank != 0) mg_stop_requested = 0;  // rank 0 keeps its own: it finishes
    sigprocmask(SIG_SETMASK, &old, NULL);
    d->ckpt_to_agree = 0;
    int all = d->comm->agree((stop ? MG_AGREE_STOP : 0) | (ckpt ? MG_AGREE_CKPT : 0));
    if (d->rank == 0) {
        if (all & MG_AGREE_STOP) mg_stop_requested = 1;
        // One SIGUSR1 sent to every rank may reach one rank before a step
        // boundary and another after it: a request agreed on the step right
        // after an agreed checkpoint is that same request.
        if ((all & MG_AGREE_CKPT) && d->step != d->ckpt_agreed_step + 1) {
            d->ckpt_agreed = 1;
            d->ckpt_agreed_step = d->step;
        }
    }
}

// One optimizer update from rows = batch * grad_accum rows of T+1 tokens:
// through the engine's train_step where it has one (the whole step on the
// device, one wait), else call by call.
static void mg_train_step(MgDriver *d, const uint16_t *tokens, const uint16_t *groups) {
    const MgConfig *c = &d->cfg;
    int B = c->batch, K = c->grad_accum, T = c->ctx, rows = B * K;
    double t0 = mg_now_ms();
    float grad_scale = 1.0f / ((float)rows * (float)T);
    int s = d->step + 1;
    float lr = mg_lr_at(c, s);
    int dump = c->dump_grads && d->steps_here + 1 == c->dump_grads_step;
    double norm;
    float loss;
    MgRankRows mine = mg_rows_of_rank(d, tokens);
    if (d->eng->caps.train_step) {
        norm = d->eng->ops->train_step(d->eng->impl, mine.tokens, mine.micro, grad_scale, s, lr, c->grad_clip,
                                       mine.row_loss);
        double loss_sum = 0;
        for (int r = 0; r < rows; r++) loss_sum += d->row_loss[r];
        loss = (float)(loss_sum / rows);
        if (dump) mg_write_grads_file(d, loss);  // the update does not touch the gradients
        if (!isfinite(loss) || !isfinite(norm)) mg_fail_nonfinite(d, loss);
    } else {
        // Each micro-batch's gradient from zero, folded in order (comm.h);
        // an engine without set_grads, or with its own reduction, accumulates
        // them itself.
        int fold = d->eng->ops->set_grads != NULL && !d->eng->caps.reduce_grads;
        if (!fold) d->eng->ops->zero_grads(d->eng->impl);
        for (int k = 0; k < mine.micro; k++) {
            if (fold) d->eng->ops->zero_grads(d->eng->impl);
            d->eng->ops->forward_backward(d->eng->impl, mine.tokens + (size_t)k * B * (T + 1), B, grad_scale,
                                          mine.row_loss + (size_t)k * B);
            if (fold) mg_keep_micro_gradient(d, k);
        }
        if (fold) mg_reduce_gradients(d, mine.micro);
        else if (d->eng->caps.reduce_grads) mg_reduce_on_engine(d, mine.micro);
        double loss_sum = 0;
        for (int r = 0; r < rows; r++) loss_sum += d->row_loss[r];
        loss = (float)(loss_sum / rows);
        if (dump) mg_write_grads_file(d, loss);
        norm = d->eng->ops->grad_norm(d->eng->impl);
        if (!isfinite(loss) || !isfinite(norm)) mg_fail_nonfinite(d, loss);
        d->eng->ops->update(d->eng->impl, s, lr, mg_clip_factor(norm, c->grad_clip));
    }
    d->step = s;
    d->steps_here++;
    d->tokens_seen += (uint64_t)rows * T;
    // its keys are the step-field table's (proxy/formats/step_fields.py; tests/engine/test_step_event_fields.py)
    printf("{\"event\":\"step\",\"step\":%d,\"loss\":", s);
    mg_json_float(stdout, loss);
    mg_print_groups(d->row_loss, groups, rows, T, 0);
    fputs(",\"lr\":", stdout);
    mg_json_float(stdout, lr);
    fputs(",\"grad_norm\":", stdout);
    mg_json_float(stdout, (float)norm);
    printf(",\"ms\":%.3f,\"tokens\":%d}\n", mg_now_ms() - t0, rows * T);
    fflush(stdout);
    mg_agree_on_signals(d);
}

// Periodic checkpoint after a training step.
static void mg_periodic_checkpoint(MgDriver *d) {
    const MgConfig *c = &d->cfg;
    if (d->saved_step == d->step) return;
    if (c->ckpt_every > 0 && d->step % c->ckpt_every == 0) mg_ckpt_begin(d, "periodic");
    else if (c->ckpt_every_seconds > 0 && mg_now_ms() - d->last_ckpt_ms >= 1000.0 * c->ckpt_every_seconds)
        mg_ckpt_begin(d, "timed");
}

// Acts on signal flags; called between steps and while idle.
static void mg_handle_signals(MgDriver *d) {
    if (d->ranks > 1 && mg_ckpt_requested) {  // between steps: agreed on after the next one
        d->ckpt_to_agree = 1;  // (set first: a SIGUSR1 landing between these two lines is the same request)
        mg_ckpt_requested = 0;
    }
    if (mg_ckpt_requested || d->ckpt_agreed) {
        mg_ckpt_requested = 0;
        d->ckpt_agreed = 0;
        if (d->saved_step != d->step) mg_ckpt_begin(d, "sigusr1");
    }
    if (mg_stop_requested) mg_finish(d, "signal", "signal");
}

// An EVAL frame's rows, B at a time, then one `eval` event. A stop between
// two forward passes abandons it (no event; the proxy asks again after the
// resume), as a stop abandons a sample audit.
static void mg_eval(MgDriver *d, uint64_t id, const uint16_t *tokens, const uint16_t *groups, int rows) {
    int B = d->cfg.batch, T = d->cfg.ctx;
    double t0 = mg_now_ms();
    double loss_sum = 0;
    for (int r0 = 0; r0 < rows; r0 += B) {
        if (mg_stop_requested) return;
        int n = rows - r0 < B ? rows - r0 : B;
        d->eng->ops->forward_loss(d->eng->impl, tokens + (size_t)r0 * (T + 1), n, d->row_loss + r0);
    }
    for (int r = 0; r < rows; r++) loss_sum += d->row_loss[r];
    printf("{\"event\":\"eval\",\"id\":%llu,\"step\":%d,\"loss\":", (unsigned long long)id, d->step);
    mg_json_float(stdout, (float)(loss_sum / rows));
    mg_print_groups(d->row_loss, groups, rows, T, 1);
    printf(",\"ms\":%.3f}\n", mg_now_ms() - t0);
    fflush(stdout);
}

// The row losses grow with the token frame (an EVAL frame may hold more rows
// than a step).
static void mg_reserve_row_loss(MgDriver *d) {
    if (d->row_loss_cap >= d->frame.cap) return;
    d->row_loss = (float *)realloc(d->row_loss, (size_t)d->frame.cap * sizeof(float));
    if (!d->row_loss) mg_fail(MG_EXIT_IO, "out of memory for a %u-row frame", d->frame.cap);
    d->row_loss_cap = d->frame.cap;
}

// Reads and executes frames until EOF, STOP or a signal. A stop signal is
// answered after the step in flight: the frames queued behind it are not
// trained (a TRAIN frame read after the signal landed is dropped too); the
// proxy sends them again after the resume, as after any crash, and the batch
// of a step depends only on the seed, the step and the mixture.
static void mg_proxy_loop(MgDriver *d) {
    const MgConfig *c = &d->cfg;
    for (;;) {
        mg_ckpt_settle(d, 0);  // a write that finished while idle or during the last frame
        mg_handle_signals(d);  // signals that arrived then
        if (!mg_wait_for_input(0, mg_writer_fd(&d->writer))) continue;
        MgFrameHeader h;
        if (!mg_read_frame_header(&h)) mg_finish(d, "eof", "eof");
        switch (h.type) {
        case MG_FRAME_TRAIN:
        case MG_FRAME_EVAL:
            mg_read_token_frame(&h, c->ctx + 1, c->batch * c->grad_accum, d->step, c->vocab, &d->frame);
            mg_reserve_row_loss(d);
            if (mg_stop_requested) break;  // a stop came while the frame was read: not trained
            if (h.type == MG_FRAME_TRAIN) {
                mg_train_step(d, d->frame.tokens, d->frame.groups);
                mg_periodic_checkpoint(d);
            } else mg_eval(d, h.id, d->frame.tokens, d->frame.groups, (int)d->frame.rows);
            break;
        case MG_FRAME_SAMPLE: {
            MgSampleRequest req;
            mg_read_sample_request(&h, c->vocab, &req);
            (void)mg_sample(d->eng, c, d->step, h.id, &req);  // abandoned for a stop: handled at the loop's top
            free(req.prompts);
            free(req.tokens);
            break;
        }
        case MG_FRAME_CHECKPOINT:
        case MG_FRAME_STOP:
            if (h.payload_bytes || h.rows || h.row_len)
                mg_fail(MG_EXIT_PROTOCOL, "malformed %s frame: it carries no payload", h.type == MG_FRAME_STOP ? "STOP" : "CHECKPOINT");
            if (h.type == MG_FRAME_STOP) mg_finish(d, "stop", "stop");
            if (d->saved_step != d->step) mg_ckpt_begin(d, "frame");
            break;
        default:
            mg_fail(MG_EXIT_PROTOCOL, "malformed frame: unknown type %u", h.type);
        }
    }
}

static void mg_standalone_loop(MgDriver *d, const MgShard *sh) {
    const MgConfig *c = &d->cfg;
    int rows = c->batch * c->grad_accum;
    uint16_t *groups = (uint16_t *)mg_calloc((size_t)rows, sizeof(uint16_t));
    while (d->step < c->steps) {
        mg_shard_batch(sh, c->seed, d->step + 1, rows, c->ctx + 1, d->frame.tokens);
        mg_train_step(d, d->frame.tokens, groups);
        mg_periodic_checkpoint(d);
        mg_ckpt_settle(d, 0);
        mg_handle_signals(d);
    }
    free(groups);
    mg_finish(d, "done", "done");
}

// Ranks other than 0: each step's rows come from rank 0 (mg_rows_of_rank),
// until rank 0 says the run is over. Rank 0 alone reads frames, evaluates,
// samples and checkpoints: the weights and moments are the same everywhere.
static void mg_follower_loop(MgDriver *d) {
    for (;;) {
        int cmd = 0;
        d->comm->broadcast(&cmd, sizeof cmd);
        if (cmd == MG_CMD_FINISH) break;
        if (cmd != MG_CMD_TRAIN) mg_fail(MG_EXIT_PROTOCOL, "rank %d: unknown command %d from rank 0", d->rank, cmd);
        mg_train_step(d, d->frame.tokens, d->frame.groups);
    }
    d->comm->finish();
    exit(0);
}

// Every rank gets rank 0's configuration (a shape may come from rank 0's
// checkpoint, which only rank 0 reads). The strings stay this rank's own
// pointers: the same command line, so the same text.
static void mg_share_config(MgDriver *d) {
    if (d->ranks == 1) return;
    MgConfig own = d->cfg;
    // A pointer is an address in rank 0's process: every pointer field below is this rank's own again,
    // and the schedule, which rank 0 may have taken from its checkpoint, travels as its code.
    int32_t schedule = mg_schedule_code(d->cfg.lr_schedule);
    d->comm->broadcast(&d->cfg, sizeof d->cfg);
    d->comm->broadcast(&schedule, sizeof schedule);
    d->cfg.lr_schedule = MG_SCHEDULES[schedule];
    d->cfg.data = own.data;
    d->cfg.ckpt_dir = own.ckpt_dir;
    d->cfg.resume = own.resume;
    d->cfg.precision = own.precision;
    d->cfg.attention = own.attention;
    d->cfg.fused = own.fused;
    d->cfg.cuda_graph = own.cuda_graph;
    d->cfg.meta = own.meta;
    d->cfg.dump_grads = own.dump_grads;
    d->cfg.dump_logits = own.dump_logits;
}

// The driver's entry point, called by an engine's main() with its engine:
// parse, load or initialise, `ready`, then the standalone or the proxy loop
// (neither returns).
static int mg_main(int argc, char **argv, MgEngine *eng) {
    setvbuf(stdout, NULL, _IOFBF, 1 << 16);
    mg_crc_init();
    MgDriver d;
    memset(&d, 0, sizeof d);
    d.eng = eng;
    mg_answer_info_flags(argc, argv);
    d.comm = MG_COMM;
    d.comm->init(&argc, &argv, &d.rank, &d.ranks);
    eng->rank = d.rank;
    eng->ranks = d.ranks;
    // Events come from rank 0 only: the launcher merges every rank's stdout.
    if (d.rank != 0 && !freopen("/dev/null", "w", stdout)) mg_fail(MG_EXIT_IO, "rank %d: cannot silence stdout", d.rank);
    mg_parse_args(&d.cfg, argc, argv);
    const char *bad = eng->ops->configure(eng->impl, &d.cfg);
    if (bad) mg_fail(MG_EXIT_USAGE, "%s", bad);
    mg_install_signals();
    if (d.rank == 0 && d.cfg.dump_logits) {  // start empty: every SAMPLE frame appends to it
        FILE *f = fopen(d.cfg.dump_logits, "wb");
        if (!f || fclose(f)) mg_fail(MG_EXIT_IO, "cannot create %s: %s", d.cfg.dump_logits, strerror(errno));
    }

    // Load before allocating: an unspecified shape comes from the checkpoint.
    char resumed_from[4096] = "";
    MgState loaded;
    memset(&loaded, 0, sizeof loaded);
    if (d.rank == 0) {  // only rank 0 touches the checkpoint directory
        mg_open_ckpt_dir(&d.ckdir, d.cfg.ckpt_dir);
        mg_remove_stale_temps(&d.ckdir);
        if (d.cfg.resume && mg_find_resume(&d.cfg, &d.ckdir, &loaded, resumed_from, sizeof resumed_from)) {
            mg_reconcile(&d.cfg, &loaded, resumed_from);
            // The file is fp32 whatever trained it (docs/ENGINE.md, "FP8"): a change of precision is said, not refused.
            if (loaded.precision[0] && strcmp(loaded.precision, eng->precision))
                mg_warn("%s was trained in %s; this run computes in %s", resumed_from, loaded.precision, eng->precision);
        } else
            resumed_from[0] = 0;
        mg_validate(&d.cfg);
    }
    mg_share_config(&d);
    if (d.ranks > 1) {
        // Checked on every rank alike (the same shared config); rank 0 says why.
        int reduces = eng->ops->set_grads || eng->ops->reduce_grads;  // on the host, or the engine's own
        const char *why = d.cfg.grad_accum % d.ranks ? "does not divide" : !reduces ? "engine" : NULL;
        if (why && d.rank != 0) {
            d.comm->finish();
            exit(MG_EXIT_USAGE);
        }
        if (why && !strcmp(why, "engine"))
            mg_fail(MG_EXIT_USAGE, "the %s engine trains on one rank only (it has no set_grads or reduce_grads), "
                    "not %d", eng->name, d.ranks);
        if (why)
            mg_fail(MG_EXIT_USAGE, "%d ranks do not divide the step's %d micro-batches (--grad-accum): each rank "
                    "trains an equal share", d.ranks, d.cfg.grad_accum);
    }

    const MgConfig *c = &d.cfg;
    MgShard shard = {NULL, 0};
    int standalone = strcmp(c->data, "-") != 0;
    if (standalone && d.rank == 0) shard = mg_load_shard(c->data, c->vocab, c->ctx + 1);

    d.lay = mg_layout(c->vocab, c->ctx, c->dim, c->layers);
    d.st.n = d.lay.n;
    d.st.weights = (float *)mg_malloc(d.lay.n * sizeof(float));
    d.st.m = (float *)mg_malloc(d.lay.n * sizeof(float));
    d.st.v = (float *)mg_malloc(d.lay.n * sizeof(float));
    mg_token_frame_alloc(&d.frame, (uint32_t)(c->batch * c->grad_accum), c->ctx + 1);
    d.row_loss_cap = d.frame.cap;
    d.row_loss = (float *)mg_malloc((size_t)d.row_loss_cap * sizeof(float));
    d.saved_step = d.durable_step = -1;
    d.ckpt_agreed_step = -2;
    if (eng->ops->set_grads) {  // the fold's buffers (comm.h)
        int parts = d.ranks == 1 ? (c->grad_accum > 1) : c->grad_accum / d.ranks;
        d.grad_sum = (float *)mg_malloc(d.lay.n * sizeof(float));
        if (parts) d.grad_parts = (float *)mg_malloc((size_t)parts * d.lay.n * sizeof(float));
    }
    if (d.rank == 0) {
        mg_writer_start(&d.writer);
        mg_fail_hook.fn = mg_ckpt_settle_before_fail;
        mg_fail_hook.ctx = &d;
    }

    eng->mem_bytes = eng->ops->init(eng->impl, c);
    if (d.ranks > 1) {  // rank 0's state (loaded or initialised) on every rank
        uint64_t where[3] = {(uint64_t)resumed_from[0], (uint64_t)loaded.step, (uint64_t)loaded.tokens_seen};
        d.comm->broadcast(where, sizeof where);
        if (d.rank != 0) {
            if (where[0]) {
                loaded.weights = (float *)mg_malloc(d.lay.n * sizeof(float));
                loaded.m = (float *)mg_malloc(d.lay.n * sizeof(float));
                loaded.v = (float *)mg_malloc(d.lay.n * sizeof(float));
                loaded.step = (int)where[1];
                loaded.tokens_seen = where[2];
                loaded.has_trailer = 1;
                strcpy(resumed_from, "rank 0");
            }
        } else if (!where[0]) mg_init_params(d.st.weights, c);
        float *w = where[0] ? loaded.weights : d.st.weights;
        d.comm->broadcast(w, d.lay.n * sizeof(float));
        if (where[0]) {
            d.comm->broadcast(loaded.m, d.lay.n * sizeof(float));
            d.comm->broadcast(loaded.v, d.lay.n * sizeof(float));
        }
    }
    if (resumed_from[0]) {
        eng->ops->set_state(eng->impl, loaded.weights, loaded.m, loaded.v);
        d.step = loaded.step;
        d.tokens_seen = loaded.has_trailer ? loaded.tokens_seen : (uint64_t)loaded.step * c->batch * c->grad_accum * c->ctx;
        d.saved_step = d.durable_step = loaded.step;
        mg_free_state(&loaded);
    } else {
        if (d.ranks == 1) mg_init_params(d.st.weights, c);  // (several: rank 0's, broadcast above)
        memset(d.st.m, 0, d.lay.n * sizeof(float));
        memset(d.st.v, 0, d.lay.n * sizeof(float));
        eng->ops->set_state(eng->impl, d.st.weights, d.st.m, d.st.v);
    }
    if (eng->caps.snapshot) {  // snapshots land in the engine's own host buffers
        free(d.st.weights);
        free(d.st.m);
        free(d.st.v);
        d.st.weights = d.st.m = d.st.v = NULL;
    }

    printf("{\"event\":\"ready\",\"step\":%d,\"n_params\":%zu,\"engine\":\"%s\",\"device\":", d.step, d.lay.n, eng->name);
    mg_json_string(stdout, eng->device);
    printf(",\"threads\":%d,\"ranks\":%d,\"precision\":\"%s\",\"resumed_from\":", eng->threads, d.ranks,
           eng->precision);
    if (resumed_from[0]) mg_json_string(stdout, resumed_from);
    else fputs("null", stdout);
    printf(",\"mem_bytes\":%zu,\"version\":\"%s\",\"source\":", eng->mem_bytes, MG_VERSION);
    mg_json_string(stdout, MG_SOURCE);  // the commit it was built from (`git describe`), for the dashboard
    putchar(',');
    if (eng->paths[0]) printf("\"paths\":%s,", eng->paths);
    mg_print_config(c);
    puts("}");
    fflush(stdout);

    d.last_ckpt_ms = mg_now_ms();  // --ckpt-every-seconds counts from here, resumed or not
    if (d.rank != 0) mg_follower_loop(&d);
    if (standalone) mg_standalone_loop(&d, &shard);
    else mg_proxy_loop(&d);
    return 0;
}

#endif  // MICROGPT_TRAIN_H

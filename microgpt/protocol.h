// protocol.h: how the proxy drives the engine (proxy mode, --data -). The
// frame header and its reader, the TRAIN/EVAL token frame and the SAMPLE
// frame, each read and checked by its own reader, and waiting for input
// without losing a signal. docs/FORMATS.md, "Engine frames".
#ifndef MICROGPT_PROTOCOL_H
#define MICROGPT_PROTOCOL_H

#include "common.h"
#include "signals.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// The frame header, and the bytes of a frame read from stdin.

enum { MG_FRAME_TRAIN = 1, MG_FRAME_EVAL = 2, MG_FRAME_SAMPLE = 3, MG_FRAME_CHECKPOINT = 4, MG_FRAME_STOP = 5 };

typedef struct {
    char magic[4];
    uint16_t type;
    uint16_t flags;
    uint64_t id;
    uint32_t rows;
    uint32_t row_len;
    uint32_t payload_bytes;
    uint32_t reserved;
} MgFrameHeader;

// A frame's token ids must be < vocab.
static void mg_check_tokens(const uint16_t *tokens, size_t count, int vocab) {
    for (size_t i = 0; i < count; i++)
        if (tokens[i] >= vocab)
            mg_fail(MG_EXIT_PROTOCOL, "malformed frame: token id %u at index %zu >= vocab %d", tokens[i], i, vocab);
}

// Reads exactly len bytes. Returns len, 0 on EOF before any byte (only when
// allow_eof), and fails with a protocol error on EOF inside the frame.
// EINTR inside a frame is retried: a frame in flight is always finished.
static size_t mg_read_exact(int fd, void *buf, size_t len, int allow_eof) {
    size_t got = 0;
    while (got < len) {
        ssize_t r = read(fd, (char *)buf + got, len - got);
        if (r < 0) {
            if (errno == EINTR) continue;
            mg_fail(MG_EXIT_PROTOCOL, "reading frames from stdin: %s", strerror(errno));
        }
        if (r == 0) {
            if (got == 0 && allow_eof) return 0;
            mg_fail(MG_EXIT_PROTOCOL, "malformed frame: stdin ended inside a frame (%zu of %zu bytes)", got, len);
        }
        got += (size_t)r;
    }
    return got;
}

// Reads the next frame's header, its magic and zero fields checked. Returns 0
// at the end of input (EOF between two frames), else 1.
static int mg_read_frame_header(MgFrameHeader *h) {
    if (mg_read_exact(0, h, sizeof *h, 1) == 0) return 0;
    if (memcmp(h->magic, "MGF1", 4)) mg_fail(MG_EXIT_PROTOCOL, "malformed frame: bad magic");
    if (h->flags || h->reserved) mg_fail(MG_EXIT_PROTOCOL, "malformed frame: nonzero flags or reserved field");
    return 1;
}

// ----------------------------------------------------------------------------
// TRAIN and EVAL frames: rows of tokens, then one group id per row.

// A token frame's rows, read into buffers that grow to the largest frame
// seen (an EVAL frame may hold more rows than a step).
typedef struct {
    uint16_t *tokens;  // [rows, row_len]
    uint16_t *groups;  // [rows]: each row's group id
    uint32_t rows;     // of the frame read last
    uint32_t cap;      // rows the buffers hold
} MgTokenFrame;

// Buffers for cap rows of row_len tokens (the groups zeroed: standalone mode
// has one group).
static void mg_token_frame_alloc(MgTokenFrame *f, uint32_t cap, int row_len) {
    f->tokens = (uint16_t *)mg_malloc((size_t)cap * row_len * sizeof(uint16_t));
    f->groups = (uint16_t *)mg_calloc(cap, sizeof(uint16_t));
    f->rows = 0;
    f->cap = cap;
}

// Reads the payload of a TRAIN or EVAL frame whose header is h into f; any
// inconsistency is a one-line protocol error. A TRAIN frame holds exactly
// train_rows rows (batch * grad_accum) and is the one for step + 1 (step: the
// engine's); every row is row_len (ctx + 1) tokens, each < vocab.
static void mg_read_token_frame(const MgFrameHeader *h, int row_len, int train_rows, int step, int vocab,
                                MgTokenFrame *f) {
    const char *kind = h->type == MG_FRAME_TRAIN ? "TRAIN" : "EVAL";
    if (h->row_len != (uint32_t)row_len)
        mg_fail(MG_EXIT_PROTOCOL, "malformed %s frame: row_len %u, expected ctx+1 = %d", kind, h->row_len, row_len);
    if (h->type == MG_FRAME_TRAIN && h->rows != (uint32_t)train_rows)
        mg_fail(MG_EXIT_PROTOCOL, "malformed TRAIN frame: %u rows, expected batch*grad_accum = %d", h->rows, train_rows);
    if (h->rows == 0 || h->rows > (1u << 20)) mg_fail(MG_EXIT_PROTOCOL, "malformed %s frame: %u rows", kind, h->rows);
    uint64_t expect = (uint64_t)h->rows * row_len * 2 + (uint64_t)h->rows * 2;
    if (h->payload_bytes != expect)
        mg_fail(MG_EXIT_PROTOCOL, "malformed %s frame: payload %u bytes, expected %llu", kind, h->payload_bytes,
                (unsigned long long)expect);
    if (h->type == MG_FRAME_TRAIN && h->id != (uint64_t)step + 1)
        mg_fail(MG_EXIT_PROTOCOL, "TRAIN frame for step %llu, but the engine is at step %d (expects %d)",
                (unsigned long long)h->id, step, step + 1);
    if (h->rows > f->cap) {
        f->cap = h->rows;
        f->tokens = (uint16_t *)realloc(f->tokens, (size_t)h->rows * row_len * 2);
        f->groups = (uint16_t *)realloc(f->groups, (size_t)h->rows * 2);
        if (!f->tokens || !f->groups) mg_fail(MG_EXIT_IO, "out of memory for a %u-row frame", h->rows);
    }
    f->rows = h->rows;
    mg_read_exact(0, f->tokens, (size_t)h->rows * row_len * 2, 0);
    mg_read_exact(0, f->groups, (size_t)h->rows * 2, 0);
    mg_check_tokens(f->tokens, (size_t)h->rows * row_len, vocab);
}

// ----------------------------------------------------------------------------
// SAMPLE frames: parameters, prompt headers, the prompts' tokens.

// A SAMPLE frame's payload: these parameters, n_prompts MgSamplePrompt, then
// every prompt's tokens, one prompt after another (docs/FORMATS.md).
typedef struct {
    uint32_t n_prompts;
    uint32_t max_new;      // new tokens per completion
    uint32_t top_k;        // 0: no top-k
    float temperature;     // 0: greedy
} MgSampleParams;

typedef struct {
    uint32_t n_tokens;     // prompt length
    uint32_t count;        // completions of this prompt
    uint64_t seed;
} MgSamplePrompt;

#define MG_SAMPLE_MAX_PROMPTS 4096   // prompts in one frame
#define MG_SAMPLE_MAX_COUNT 4096     // completions in one frame, all prompts together
#define MG_SAMPLE_MAX_TOKENS (1u << 20)  // max_new, and one prompt's length

// A SAMPLE frame, read and checked.
typedef struct {
    MgSampleParams params;
    MgSamplePrompt *prompts;   // [n_prompts]
    uint16_t *tokens;          // the prompts' tokens, concatenated
    uint32_t total_count;      // completions, all prompts together
} MgSampleRequest;

#ifdef __cplusplus
static_assert(sizeof(MgSampleParams) == 16 && sizeof(MgSamplePrompt) == 16, "SAMPLE payload layout");
#else
_Static_assert(sizeof(MgSampleParams) == 16 && sizeof(MgSamplePrompt) == 16, "SAMPLE payload layout");
#endif

// Reads the payload of a SAMPLE frame whose header is h; any inconsistency is
// a one-line protocol error. The caller frees req->prompts and req->tokens.
static void mg_read_sample_request(const MgFrameHeader *h, int vocab, MgSampleRequest *req) {
    memset(req, 0, sizeof *req);
    MgSampleParams *p = &req->params;
    if (h->rows || h->row_len) mg_fail(MG_EXIT_PROTOCOL, "malformed SAMPLE frame: rows and row_len must be 0");
    if (h->payload_bytes < sizeof *p)
        mg_fail(MG_EXIT_PROTOCOL, "malformed SAMPLE frame: payload %u bytes, less than its %zu-byte parameters",
                h->payload_bytes, sizeof *p);
    mg_read_exact(0, p, sizeof *p, 0);
    if (p->n_prompts == 0 || p->n_prompts > MG_SAMPLE_MAX_PROMPTS)
        mg_fail(MG_EXIT_PROTOCOL, "malformed SAMPLE frame: %u prompts (1 to %d)", p->n_prompts, MG_SAMPLE_MAX_PROMPTS);
    if (p->max_new > MG_SAMPLE_MAX_TOKENS)
        mg_fail(MG_EXIT_PROTOCOL, "malformed SAMPLE frame: max_new %u (at most %u)", p->max_new, MG_SAMPLE_MAX_TOKENS);
    if (!isfinite(p->temperature) || p->temperature < 0)
        mg_fail(MG_EXIT_PROTOCOL, "malformed SAMPLE frame: temperature %g (a finite number >= 0)", p->temperature);
    uint64_t head = sizeof *p + (uint64_t)p->n_prompts * sizeof(MgSamplePrompt);
    if (h->payload_bytes < head)
        mg_fail(MG_EXIT_PROTOCOL, "malformed SAMPLE frame: payload %u bytes, less than the %llu bytes of its %u prompt headers",
                h->payload_bytes, (unsigned long long)head, p->n_prompts);
    req->prompts = (MgSamplePrompt *)mg_malloc(p->n_prompts * sizeof(MgSamplePrompt));
    mg_read_exact(0, req->prompts, p->n_prompts * sizeof(MgSamplePrompt), 0);
    uint64_t n_tokens = 0, count = 0;
    for (uint32_t i = 0; i < p->n_prompts; i++) {
        const MgSamplePrompt *q = &req->prompts[i];
        if (q->n_tokens == 0 || q->n_tokens > MG_SAMPLE_MAX_TOKENS)
            mg_fail(MG_EXIT_PROTOCOL, "malformed SAMPLE frame: prompt %u has %u tokens (1 to %u)", i, q->n_tokens,
                    MG_SAMPLE_MAX_TOKENS);
        if (q->count == 0)
            mg_fail(MG_EXIT_PROTOCOL, "malformed SAMPLE frame: prompt %u asks for 0 completions", i);
        n_tokens += q->n_tokens;
        count += q->count;
    }
    if (count > MG_SAMPLE_MAX_COUNT)
        mg_fail(MG_EXIT_PROTOCOL, "malformed SAMPLE frame: %llu completions (at most %d)", (unsigned long long)count,
                MG_SAMPLE_MAX_COUNT);
    if (h->payload_bytes != head + 2 * n_tokens)
        mg_fail(MG_EXIT_PROTOCOL, "malformed SAMPLE frame: payload %u bytes, expected %llu for %llu prompt tokens",
                h->payload_bytes, (unsigned long long)(head + 2 * n_tokens), (unsigned long long)n_tokens);
    req->total_count = (uint32_t)count;
    req->tokens = (uint16_t *)mg_malloc((size_t)n_tokens * sizeof(uint16_t));
    mg_read_exact(0, req->tokens, (size_t)n_tokens * sizeof(uint16_t), 0);
    mg_check_tokens(req->tokens, (size_t)n_tokens, vocab);
}

// ----------------------------------------------------------------------------
// Waiting for the next frame.

// Waits until stdin (fd) is readable, a signal arrives or wake_fd (the
// checkpoint writer's pipe; -1: none) becomes readable, without the race
// where a signal lands between checking the flags and blocking in read():
// signals are blocked while the flags are checked and unblocked atomically
// by ppoll. Returns 1 when fd is readable, 0 when a signal flag is set or
// wake_fd is readable (the caller then acts on those first).
static int mg_wait_for_input(int fd, int wake_fd) {
    sigset_t block = mg_flag_signals(), old;
    sigprocmask(SIG_BLOCK, &block, &old);
    int ready = 0;
    while (!mg_stop_requested && !mg_ckpt_requested) {
        struct pollfd p[2] = {{fd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
        int rc = ppoll(p, wake_fd >= 0 ? 2 : 1, NULL, &old);
        if (rc > 0) {
            ready = !(wake_fd >= 0 && p[1].revents);
            break;
        }
        if (rc < 0 && errno != EINTR) mg_fail(MG_EXIT_PROTOCOL, "waiting for frames: %s", strerror(errno));
    }
    sigprocmask(SIG_SETMASK, &old, NULL);
    return ready;
}

#endif  // MICROGPT_PROTOCOL_H

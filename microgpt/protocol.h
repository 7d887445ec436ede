// protocol.h: how the engine is driven. Signals (handlers only set flags),
// the frame header and its reader, waiting for input without losing a
// signal, and the token shard of standalone mode (docs/FORMATS.md).
#ifndef MICROGPT_PROTOCOL_H
#define MICROGPT_PROTOCOL_H

#include "common.h"
#include "model.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// Signals: the handlers only set flags; the driver acts between steps.

static volatile sig_atomic_t mg_stop_requested = 0;   // SIGTERM, SIGINT
static volatile sig_atomic_t mg_ckpt_requested = 0;   // SIGUSR1

static void mg_on_signal(int sig) {
    if (sig == SIGUSR1) mg_ckpt_requested = 1;
    else mg_stop_requested = 1;
}

static void mg_install_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = mg_on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;  // no SA_RESTART: a blocked read returns EINTR
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    // A write past RLIMIT_FSIZE must fail with EFBIG, not kill us mid-save;
    // a vanished proxy must not kill us with SIGPIPE before we checkpoint.
    signal(SIGXFSZ, SIG_IGN);
    signal(SIGPIPE, SIG_IGN);
}

// ----------------------------------------------------------------------------
// Frames (proxy mode). docs/FORMATS.md, "Engine frames".

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

typedef struct {
    uint32_t n_prompt, count, max_new, top_k;
    float temperature;
    uint32_t reserved;
    uint64_t seed;
} MgSampleParams;

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

// Waits until stdin is readable or a signal arrives, without the race where a
// signal lands between checking the flags and blocking in read(): signals are
// blocked while the flags are checked and unblocked atomically by ppoll.
// Returns 1 when readable, 0 when a signal flag is set.
static int mg_wait_for_input(int fd) {
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGUSR1);
    sigprocmask(SIG_BLOCK, &block, &old);
    int ready = 0;
    while (!mg_stop_requested && !mg_ckpt_requested) {
        struct pollfd p = {fd, POLLIN, 0};
        int rc = ppoll(&p, 1, NULL, &old);
        if (rc > 0) { ready = 1; break; }
        if (rc < 0 && errno != EINTR) mg_fail(MG_EXIT_PROTOCOL, "waiting for frames: %s", strerror(errno));
    }
    sigprocmask(SIG_SETMASK, &old, NULL);
    return ready;
}

// ----------------------------------------------------------------------------
// Token shard (standalone mode). docs/FORMATS.md, "Token shard".

typedef struct {
    uint16_t *tokens;
    uint64_t n;
} MgShard;

static MgShard mg_load_shard(const char *path, int vocab, int row_len) {
    MgShard sh = {NULL, 0};
    FILE *f = fopen(path, "rb");
    if (!f) mg_fail(MG_EXIT_PROTOCOL, "cannot open token shard %s: %s", path, strerror(errno));
    unsigned char head[32];
    if (fread(head, 1, 32, f) != 32) mg_fail(MG_EXIT_PROTOCOL, "%s: not a token shard (shorter than its 32-byte header)", path);
    uint32_t version, shard_vocab;
    memcpy(&version, head + 8, 4);
    memcpy(&shard_vocab, head + 12, 4);
    memcpy(&sh.n, head + 16, 8);
    if (memcmp(head, "MGPTTOKS", 8)) mg_fail(MG_EXIT_PROTOCOL, "%s: not a token shard (bad magic)", path);
    if (version != 1) mg_fail(MG_EXIT_PROTOCOL, "%s: unsupported token shard version %u", path, version);
    struct stat sb;
    if (fstat(fileno(f), &sb) || (uint64_t)sb.st_size != 32 + 2 * sh.n)
        mg_fail(MG_EXIT_PROTOCOL, "%s: size does not match its header's %llu tokens", path, (unsigned long long)sh.n);
    if (sh.n < (uint64_t)row_len) mg_fail(MG_EXIT_PROTOCOL, "%s: %llu tokens, fewer than one row of %d", path, (unsigned long long)sh.n, row_len);
    sh.tokens = (uint16_t *)mg_malloc(sh.n * sizeof(uint16_t));
    if (fread(sh.tokens, 2, sh.n, f) != sh.n) mg_fail(MG_EXIT_PROTOCOL, "%s: read failed", path);
    fclose(f);
    for (uint64_t i = 0; i < sh.n; i++)
        if (sh.tokens[i] >= vocab)
            mg_fail(MG_EXIT_PROTOCOL, "%s: token id %u at position %llu >= vocab %d", path, sh.tokens[i], (unsigned long long)i, vocab);
    (void)shard_vocab;
    return sh;
}

// Row r of step s starts at a position drawn from (seed, s, r): the batch of
// a step never depends on what ran before it, so resume is exact.
static void mg_shard_batch(const MgShard *sh, uint64_t seed, int step, int rows, int row_len, uint16_t *out) {
    uint64_t span = sh->n - (uint64_t)row_len + 1;
    for (int r = 0; r < rows; r++) {
        uint64_t start = mg_hash3(seed ^ MG_STREAM_BATCH, (uint64_t)step, (uint64_t)r) % span;
        memcpy(out + (size_t)r * row_len, sh->tokens + start, (size_t)row_len * sizeof(uint16_t));
    }
}

#endif  // MICROGPT_PROTOCOL_H

// shard.h: the token shard of standalone mode (--data FILE), read whole and
// checked, and the rows of a step drawn from it. docs/FORMATS.md, "Token
// shard".
#ifndef MICROGPT_SHARD_H
#define MICROGPT_SHARD_H

#include "common.h"
#include "model.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>

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

#endif  // MICROGPT_SHARD_H

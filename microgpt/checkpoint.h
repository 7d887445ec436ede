// checkpoint.h: the checkpoint file (docs/FORMATS.md): CRC-32, the trailer
// and footer, the atomic durable write, the verifying read, listing, pruning
// and stale-temp cleanup of a checkpoint directory, and on resume choosing
// the file and reconciling its settings with the command line.
#ifndef MICROGPT_CHECKPOINT_H
#define MICROGPT_CHECKPOINT_H

#include "config.h"
#include "model.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// CRC-32 (IEEE 802.3, as zlib.crc32), slicing by 8: fast enough to checksum a
// 1.5 GB checkpoint in well under a second.

static uint32_t mg_crc_table[8][256];

static void mg_crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        mg_crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            mg_crc_table[t][i] = (mg_crc_table[t - 1][i] >> 8) ^ mg_crc_table[0][mg_crc_table[t - 1][i] & 0xFF];
}

// crc: 0 to start; feed the previous return value to continue.
static uint32_t mg_crc32(uint32_t crc, const void *data, size_t len) {
    const unsigned char *p = (const unsigned char *)data;
    crc = ~crc;
    while (len >= 8) {
        uint32_t lo, hi;
        memcpy(&lo, p, 4);
        memcpy(&hi, p + 4, 4);
        lo ^= crc;
        crc = mg_crc_table[7][lo & 0xFF] ^ mg_crc_table[6][(lo >> 8) & 0xFF] ^
              mg_crc_table[5][(lo >> 16) & 0xFF] ^ mg_crc_table[4][lo >> 24] ^
              mg_crc_table[3][hi & 0xFF] ^ mg_crc_table[2][(hi >> 8) & 0xFF] ^
              mg_crc_table[1][(hi >> 16) & 0xFF] ^ mg_crc_table[0][hi >> 24];
        p += 8;
        len -= 8;
    }
    while (len--) crc = mg_crc_table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

// ----------------------------------------------------------------------------
// Checkpoint file (docs/FORMATS.md). Little-endian hosts only (x86-64, aarch64).

#define MG_TRAILER_MAGIC "MGPTTRLR"
#define MG_END_MAGIC "MGPTEND1"
#define MG_TRAILER_FIXED 128
#define MG_FOOTER 24

typedef struct {
    char magic[8];
    uint32_t version;
    uint32_t meta_bytes;
    int32_t vocab, ctx, dim, layers, heads, batch, grad_accum, warmup, max_steps;
    float lr, min_lr, beta1, beta2, eps, weight_decay, grad_clip;
    uint64_t seed;
    uint64_t tokens_seen;
    int32_t lr_schedule;   // version 2: the code of MG_SCHEDULES (config.h); version 1 holds zeros here: cosine
    float decay_fraction;  // version 2: --decay-fraction
    unsigned char reserved[24];
} MgTrailer;

// The trailer version written; version 1 (no schedule fields) is still read, as cosine.
#define MG_TRAILER_VERSION 2

typedef struct {
    uint64_t trailer_bytes;
    uint32_t crc;
    uint32_t reserved;
    char end_magic[8];
} MgFooter;

#ifdef __cplusplus
static_assert(sizeof(MgTrailer) == MG_TRAILER_FIXED, "trailer layout");
static_assert(sizeof(MgFooter) == MG_FOOTER, "footer layout");
#else
_Static_assert(sizeof(MgTrailer) == MG_TRAILER_FIXED, "trailer layout");
_Static_assert(sizeof(MgFooter) == MG_FOOTER, "footer layout");
#endif

// The state a checkpoint holds, in host memory.
typedef struct {
    int step;
    size_t n;
    float *weights, *m, *v;  // n each
    uint64_t tokens_seen;
    int has_trailer;
    MgTrailer trailer;
    char precision[8];  // the precision its metadata names ("fp32", "bf16", "fp8"), or "" where it names none
} MgState;

// A checkpoint's file name (temp: the name it is written under before the rename).
static void mg_ckpt_file(char *out, size_t cap, int step, int temp) {
    snprintf(out, cap, temp ? ".step_%06d.bin.tmp" : "step_%06d.bin", step);
}

// The checkpoint directory, opened once when the engine starts. Every write,
// rename, listing and unlink happens relative to this descriptor, so a
// directory moved away, replaced, or swapped for a symlink to somewhere else
// while the engine runs never receives a checkpoint and never loses one: the
// engine keeps writing into the directory it started with. `path` is only for
// messages and events.
typedef struct {
    const char *path;
    int fd;
} MgCkptDir;

static void mg_mkdirs(const char *dir);

static void mg_open_ckpt_dir(MgCkptDir *d, const char *path) {
    mg_mkdirs(path);
    d->path = path;
    d->fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (d->fd < 0) mg_fail(MG_EXIT_IO, "cannot open checkpoint directory %s: %s", path, strerror(errno));
}

// A fresh handle on the directory for readdir (its own position, so listings never share one).
static DIR *mg_ckpt_dir_list(const MgCkptDir *d) {
    int fd = openat(d->fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return NULL;
    DIR *dir = fdopendir(fd);
    if (!dir) close(fd);
    return dir;
}

// Non-finite floats among n (IEEE exponent all ones: an infinity or a NaN). A
// bit test, so no compiler flag can fold it away.
static size_t mg_count_non_finite(const float *x, size_t n) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &x[i], 4);
        bad += (bits & 0x7f800000u) == 0x7f800000u;
    }
    return bad;
}

// Writes everything or fails; returns 0 or an errno value.
static int mg_write_all(int fd, const void *buf, size_t len, uint32_t *crc) {
    const char *p = (const char *)buf;
    if (crc) *crc = mg_crc32(*crc, buf, len);
    while (len > 0) {
        size_t chunk = len < (1u << 26) ? len : (1u << 26);
        ssize_t w = write(fd, p, chunk);
        if (w < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (w == 0) return EIO;
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

static void mg_mkdirs(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s", dir);
    for (char *p = path + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(path, 0755) && errno != EEXIST) mg_fail(MG_EXIT_IO, "cannot create directory %s: %s", path, strerror(errno));
        *p = '/';
    }
    if (mkdir(path, 0755) && errno != EEXIST) mg_fail(MG_EXIT_IO, "cannot create directory %s: %s", path, strerror(errno));
}

// The metadata JSON is deterministic: the same state gives the same bytes.
// --meta was validated as JSON when parsed, so it is embedded verbatim. The
// precision is the one the state was trained in (configure set it), which a
// resume under another precision names (mg_main).
#define MG_META_PRECISION "\",\"precision\":\""
static size_t mg_meta_json(char *out, size_t cap, const char *engine, const char *precision, const char *meta) {
    return (size_t)snprintf(out, cap, "{\"engine\":\"%s" MG_META_PRECISION "%s\",\"meta\":%s}", engine,
                            precision ? precision : "fp32", meta ? meta : "null");
}

// The precision an engine's metadata names: the value after `"engine":"...","precision":"`, written
// before the free-form meta, so a --meta that holds the word cannot be mistaken for it.
static void mg_meta_precision(char *out, size_t cap, const char *meta, size_t meta_bytes) {
    out[0] = 0;
    const char *engine = "{\"engine\":\"";
    size_t el = strlen(engine), pl = strlen(MG_META_PRECISION);
    if (meta_bytes < el || memcmp(meta, engine, el)) return;
    size_t i = el;
    while (i < meta_bytes && i < 64 && meta[i] != '"') i++;
    if (i + pl > meta_bytes || memcmp(meta + i, MG_META_PRECISION, pl)) return;
    i += pl;
    size_t k = 0;
    while (i + k < meta_bytes && meta[i + k] != '"' && k + 1 < cap) k++;
    if (i + k >= meta_bytes || meta[i + k] != '"') return;
    memcpy(out, meta + i, k);
    out[k] = 0;
}

// Atomic, durable write of a checkpoint into `dir`. On failure removes the temp
// file, leaves every existing checkpoint untouched, and returns an errno value
// with `what` naming the failed operation. A state holding a non-finite weight
// or moment is never written: EDOM, with their count in *non_finite (a
// diverged model must not become a resume point).
static int mg_write_checkpoint(const MgCkptDir *dir, const MgConfig *cfg, const char *engine, const MgState *st,
                               char *path_out, size_t path_cap, size_t *bytes_out, const char **what,
                               size_t *non_finite) {
    char tmp[64], name[64];
    mg_ckpt_file(tmp, sizeof tmp, st->step, 1);
    mg_ckpt_file(name, sizeof name, st->step, 0);
    snprintf(path_out, path_cap, "%s/%s", dir->path, name);
    *non_finite = mg_count_non_finite(st->weights, st->n) + mg_count_non_finite(st->m, st->n) +
                  mg_count_non_finite(st->v, st->n);
    if (*non_finite) { *what = "check"; return EDOM; }
    static char meta[8192];
    size_t meta_bytes = mg_meta_json(meta, sizeof meta, engine, cfg->precision, cfg->meta);

    MgTrailer tr;
    memset(&tr, 0, sizeof tr);
    memcpy(tr.magic, MG_TRAILER_MAGIC, 8);
    tr.version = MG_TRAILER_VERSION;
    tr.meta_bytes = (uint32_t)meta_bytes;
    tr.vocab = cfg->vocab; tr.ctx = cfg->ctx; tr.dim = cfg->dim; tr.layers = cfg->layers; tr.heads = cfg->heads;
    tr.batch = cfg->batch; tr.grad_accum = cfg->grad_accum; tr.warmup = cfg->warmup; tr.max_steps = cfg->steps;
    tr.lr = cfg->lr; tr.min_lr = cfg->min_lr; tr.beta1 = cfg->beta1; tr.beta2 = cfg->beta2;
    tr.eps = cfg->eps; tr.weight_decay = cfg->weight_decay; tr.grad_clip = cfg->grad_clip;
    tr.seed = cfg->seed;
    tr.tokens_seen = st->tokens_seen;
    tr.lr_schedule = mg_schedule_code(cfg->lr_schedule);
    tr.decay_fraction = cfg->decay_fraction;

    // A new file: a stale temp, or anything left under its name (a symlink too), is removed, never written through.
    unlinkat(dir->fd, tmp, 0);
    int fd = openat(dir->fd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) { *what = "create"; return errno; }
    int32_t head[2] = {st->step, (int32_t)st->n};
    uint32_t crc = 0;
    int rc = 0;
    *what = "write";
    if (!rc) rc = mg_write_all(fd, head, sizeof head, &crc);
    if (!rc) rc = mg_write_all(fd, st->weights, st->n * sizeof(float), &crc);
    if (!rc) rc = mg_write_all(fd, st->m, st->n * sizeof(float), &crc);
    if (!rc) rc = mg_write_all(fd, st->v, st->n * sizeof(float), &crc);
    if (!rc) rc = mg_write_all(fd, &tr, sizeof tr, &crc);
    if (!rc) rc = mg_write_all(fd, meta, meta_bytes, &crc);
    MgFooter foot;
    memset(&foot, 0, sizeof foot);
    foot.trailer_bytes = MG_TRAILER_FIXED + meta_bytes + MG_FOOTER;
    memcpy(foot.end_magic, MG_END_MAGIC, 8);
    if (!rc) rc = mg_write_all(fd, &foot.trailer_bytes, 8, &crc);
    foot.crc = crc;
    if (!rc) rc = mg_write_all(fd, &foot.crc, 16, NULL);
    if (!rc && fsync(fd)) { rc = errno; *what = "fsync"; }
    if (close(fd) && !rc) { rc = errno; *what = "close"; }
    if (!rc && renameat(dir->fd, tmp, dir->fd, name)) { rc = errno; *what = "rename"; }
    if (rc) { unlinkat(dir->fd, tmp, 0); return rc; }
    if (fsync(dir->fd)) { *what = "fsync directory"; return errno; }
    *bytes_out = 8 + 12 * st->n + (size_t)foot.trailer_bytes;
    return 0;
}

// Reads and verifies a checkpoint into st (allocating its arrays). On failure
// returns -1 with the reason in err; never modifies the file.
static int mg_read_checkpoint(const char *path, MgState *st, char *err, size_t errcap) {
    memset(st, 0, sizeof *st);
    int fd = open(path, O_RDONLY);
    if (fd < 0) { snprintf(err, errcap, "%s: cannot open: %s", path, strerror(errno)); return -1; }
    struct stat sb;
    if (fstat(fd, &sb) || !S_ISREG(sb.st_mode)) { snprintf(err, errcap, "%s: not a regular file", path); close(fd); return -1; }
    size_t size = (size_t)sb.st_size;
    unsigned char *raw = (unsigned char *)malloc(size ? size : 1);
    if (!raw) { snprintf(err, errcap, "%s: out of memory reading %zu bytes", path, size); close(fd); return -1; }
    size_t got = 0;
    while (got < size) {
        ssize_t r = read(fd, raw + got, size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    int ok = -1;
    if (got != size) { snprintf(err, errcap, "%s: read failed", path); goto done; }
    if (size < 8) { snprintf(err, errcap, "%s: truncated (%zu bytes)", path, size); goto done; }
    int32_t head[2];
    memcpy(head, raw, 8);
    if (head[0] < 0 || head[1] <= 0) {
        snprintf(err, errcap, "%s: not a microgpt checkpoint (step %d, n_params %d)", path, head[0], head[1]);
        goto done;
    }
    st->step = head[0];
    st->n = (size_t)head[1];
    size_t body;  // assigned, not initialized: C++ (nvcc) forbids a goto past an initialization
    body = 8 + 12 * st->n;
    if (size == body) {
        st->has_trailer = 0;
    } else if (size < body + MG_TRAILER_FIXED + MG_FOOTER) {
        snprintf(err, errcap, size < body ? "%s: truncated (%zu bytes, n_params %zu needs %zu)" : "%s: trailer truncated or missing (%zu bytes, n_params %zu, body %zu)",
                 path, size, st->n, body);
        goto done;
    } else {
        MgFooter foot;
        memcpy(&foot, raw + size - MG_FOOTER, MG_FOOTER);
        if (memcmp(foot.end_magic, MG_END_MAGIC, 8)) { snprintf(err, errcap, "%s: no end magic (truncated or not a microgpt checkpoint)", path); goto done; }
        if (body + foot.trailer_bytes != size) { snprintf(err, errcap, "%s: size %zu does not match n_params %zu and its trailer", path, size, st->n); goto done; }
        if (mg_crc32(0, raw, size - 16) != foot.crc) { snprintf(err, errcap, "%s: checksum mismatch", path); goto done; }
        memcpy(&st->trailer, raw + body, MG_TRAILER_FIXED);
        if (memcmp(st->trailer.magic, MG_TRAILER_MAGIC, 8)) { snprintf(err, errcap, "%s: bad trailer magic", path); goto done; }
        if (st->trailer.version != 1 && st->trailer.version != MG_TRAILER_VERSION) { snprintf(err, errcap, "%s: unsupported trailer version %u", path, st->trailer.version); goto done; }
        if (st->trailer.version == 1) {  // written before schedules: the cosine, and --decay-fraction's default
            st->trailer.lr_schedule = MG_SCHEDULE_COSINE;
            st->trailer.decay_fraction = 0.2f;
        }
        if (st->trailer.lr_schedule < 0 || st->trailer.lr_schedule >= MG_N_SCHEDULES) { snprintf(err, errcap, "%s: unknown learning-rate schedule %d in its trailer", path, st->trailer.lr_schedule); goto done; }
        if ((uint64_t)MG_TRAILER_FIXED + st->trailer.meta_bytes + MG_FOOTER != foot.trailer_bytes) { snprintf(err, errcap, "%s: trailer sizes disagree", path); goto done; }
        MgLayout lay = mg_layout(st->trailer.vocab, st->trailer.ctx, st->trailer.dim, st->trailer.layers);
        if (st->trailer.vocab <= 0 || st->trailer.ctx <= 0 || st->trailer.dim <= 0 || st->trailer.layers <= 0 || lay.n != st->n) {
            snprintf(err, errcap, "%s: n_params %zu does not match the shape in its trailer", path, st->n);
            goto done;
        }
        st->has_trailer = 1;
        st->tokens_seen = st->trailer.tokens_seen;
        mg_meta_precision(st->precision, sizeof st->precision, (const char *)raw + body + MG_TRAILER_FIXED,
                          st->trailer.meta_bytes);
    }
    st->weights = (float *)mg_malloc(st->n * sizeof(float));
    st->m = (float *)mg_malloc(st->n * sizeof(float));
    st->v = (float *)mg_malloc(st->n * sizeof(float));
    memcpy(st->weights, raw + 8, st->n * 4);
    memcpy(st->m, raw + 8 + 4 * st->n, st->n * 4);
    memcpy(st->v, raw + 8 + 8 * st->n, st->n * 4);
    size_t bad;  // assigned, not initialized: see `body`
    bad = mg_count_non_finite(st->weights, st->n) + mg_count_non_finite(st->m, st->n) + mg_count_non_finite(st->v, st->n);
    if (bad) {  // a diverged state (written before the engine refused them): never a resume point
        snprintf(err, errcap, "%s: %zu of its %zu weights and Adam moments are not finite (a diverged state)", path, bad,
                 3 * st->n);
        free(st->weights); free(st->m); free(st->v);
        st->weights = st->m = st->v = NULL;
        goto done;
    }
    ok = 0;
done:
    free(raw);
    return ok;
}

static void mg_free_state(MgState *st) {
    free(st->weights); free(st->m); free(st->v);
    st->weights = st->m = st->v = NULL;
}

// Step numbers of step_NNNNNN.bin files in dir, newest first. Returns count.
static int mg_parse_ckpt_name(const char *name) {
    if (strncmp(name, "step_", 5)) return -1;
    const char *p = name + 5;
    int digits = 0;
    long step = 0;
    while (*p >= '0' && *p <= '9') { step = step * 10 + (*p - '0'); p++; digits++; if (step > 0x7fffffff) return -1; }
    if (digits < 6 || strcmp(p, ".bin")) return -1;
    return (int)step;
}

static int mg_cmp_desc(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x < y) - (x > y);
}

static int mg_list_checkpoints(const MgCkptDir *ck, int **steps_out) {
    DIR *d = mg_ckpt_dir_list(ck);
    int cap = 64, n = 0;
    int *steps = (int *)mg_malloc(cap * sizeof(int));
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            int s = mg_parse_ckpt_name(e->d_name);
            if (s < 0) continue;
            if (n == cap) {
                cap *= 2;
                int *grown = (int *)realloc(steps, cap * sizeof(int));
                if (!grown) mg_fail(MG_EXIT_IO, "out of memory listing %s", ck->path);
                steps = grown;
            }
            steps[n++] = s;
        }
        closedir(d);
    }
    qsort(steps, n, sizeof(int), mg_cmp_desc);
    *steps_out = steps;
    return n;
}

// Removes temp files a killed writer left behind. Only names this engine
// writes (.step_*.bin.tmp) are touched.
static void mg_remove_stale_temps(const MgCkptDir *ck) {
    DIR *d = mg_ckpt_dir_list(ck);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (strncmp(e->d_name, ".step_", 6) || len < 14 || strcmp(e->d_name + len - 8, ".bin.tmp")) continue;
        if (unlinkat(ck->fd, e->d_name, 0) == 0) mg_warn("removed stale temp file %s/%s", ck->path, e->d_name);
    }
    closedir(d);
}

// Deletes all but the newest `keep` checkpoints (standalone --keep-last).
static void mg_prune_checkpoints(const MgCkptDir *ck, int keep) {
    if (keep <= 0) return;
    int *steps;
    int n = mg_list_checkpoints(ck, &steps);
    char name[64];
    for (int i = keep; i < n; i++) {
        mg_ckpt_file(name, sizeof name, steps[i], 0);
        if (unlinkat(ck->fd, name, 0)) mg_warn("cannot remove %s/%s: %s", ck->path, name, strerror(errno));
    }
    free(steps);
}

// ----------------------------------------------------------------------------
// Resuming: find the file, verify it, reconcile its shape and settings with
// the command line. Flags the user gave must agree; the rest are adopted.

static int mg_find_resume(const MgConfig *cfg, const MgCkptDir *ck, MgState *st, char *path, size_t cap) {
    char err[1024];
    if (strcmp(cfg->resume, "latest")) {
        snprintf(path, cap, "%s", cfg->resume);
        if (mg_read_checkpoint(path, st, err, sizeof err)) mg_fail(MG_EXIT_CKPT, "cannot resume: %s", err);
        return 1;
    }
    int *steps;
    int n = mg_list_checkpoints(ck, &steps), rejected = 0;
    char name[64];
    for (int i = 0; i < n; i++) {
        mg_ckpt_file(name, sizeof name, steps[i], 0);
        snprintf(path, cap, "%s/%s", ck->path, name);
        if (mg_read_checkpoint(path, st, err, sizeof err) == 0) { free(steps); return 1; }
        mg_warn("skipping %s", err);
        rejected++;
    }
    free(steps);
    if (rejected) mg_fail(MG_EXIT_CKPT, "no valid checkpoint in %s (%d rejected)", ck->path, rejected);
    return 0;  // nothing there: start fresh
}

static void mg_reconcile_int(MgConfig *cfg, const char *flag, int *value, int in_file, int is_shape, const char *path) {
    if (*value == in_file) return;
    if (!mg_given(cfg, flag)) { *value = in_file; return; }
    if (is_shape) mg_fail(MG_EXIT_CKPT, "shape mismatch with %s: --%s %d in file, %d requested", path, flag, in_file, *value);
    if (!cfg->allow_hparam_change)
        mg_fail(MG_EXIT_CKPT, "--%s %d differs from %d in %s (pass --allow-hparam-change to accept)", flag, *value, in_file, path);
    mg_warn("--%s changed from %d to %d on resume", flag, in_file, *value);
}

static void mg_reconcile_float(MgConfig *cfg, const char *flag, float *value, float in_file, const char *path) {
    if (memcmp(value, &in_file, sizeof(float)) == 0) return;
    if (!mg_given(cfg, flag)) { *value = in_file; return; }
    if (!cfg->allow_hparam_change)
        mg_fail(MG_EXIT_CKPT, "--%s %g differs from %g in %s (pass --allow-hparam-change to accept)", flag, *value, in_file, path);
    mg_warn("--%s changed from %g to %g on resume", flag, in_file, *value);
}

static void mg_reconcile_schedule(MgConfig *cfg, int in_file, const char *path) {
    int code = mg_schedule_code(cfg->lr_schedule);
    if (code < 0 || code == in_file) return;  // an unknown name: mg_validate says so
    if (!mg_given(cfg, "lr-schedule")) { cfg->lr_schedule = MG_SCHEDULES[in_file]; return; }
    if (!cfg->allow_hparam_change)
        mg_fail(MG_EXIT_CKPT, "--lr-schedule %s differs from %s in %s (pass --allow-hparam-change to accept)",
                cfg->lr_schedule, MG_SCHEDULES[in_file], path);
    mg_warn("--lr-schedule changed from %s to %s on resume", MG_SCHEDULES[in_file], cfg->lr_schedule);
}

static void mg_reconcile(MgConfig *cfg, const MgState *st, const char *path) {
    if (!st->has_trailer) {
        MgLayout lay = mg_layout(cfg->vocab, cfg->ctx, cfg->dim, cfg->layers);
        if (lay.n != st->n)
            mg_fail(MG_EXIT_CKPT, "shape mismatch with %s: %zu parameters in file, %zu for the requested shape", path, st->n, lay.n);
        mg_warn("%s: no trailer: checksum and shape not verified (bare ANDREA file)", path);
        return;
    }
    const MgTrailer *t = &st->trailer;
    mg_reconcile_int(cfg, "vocab", &cfg->vocab, t->vocab, 1, path);
    mg_reconcile_int(cfg, "ctx", &cfg->ctx, t->ctx, 1, path);
    mg_reconcile_int(cfg, "dim", &cfg->dim, t->dim, 1, path);
    mg_reconcile_int(cfg, "layers", &cfg->layers, t->layers, 1, path);
    mg_reconcile_int(cfg, "heads", &cfg->heads, t->heads, 1, path);
    mg_reconcile_int(cfg, "batch", &cfg->batch, t->batch, 0, path);
    mg_reconcile_int(cfg, "grad-accum", &cfg->grad_accum, t->grad_accum, 0, path);
    mg_reconcile_int(cfg, "warmup", &cfg->warmup, t->warmup, 0, path);
    mg_reconcile_int(cfg, "steps", &cfg->steps, t->max_steps, 0, path);
    mg_reconcile_float(cfg, "lr", &cfg->lr, t->lr, path);
    mg_reconcile_float(cfg, "min-lr", &cfg->min_lr, t->min_lr, path);
    mg_reconcile_schedule(cfg, t->lr_schedule, path);
    mg_reconcile_float(cfg, "decay-fraction", &cfg->decay_fraction, t->decay_fraction, path);
    mg_reconcile_float(cfg, "beta1", &cfg->beta1, t->beta1, path);
    mg_reconcile_float(cfg, "beta2", &cfg->beta2, t->beta2, path);
    mg_reconcile_float(cfg, "eps", &cfg->eps, t->eps, path);
    mg_reconcile_float(cfg, "weight-decay", &cfg->weight_decay, t->weight_decay, path);
    mg_reconcile_float(cfg, "grad-clip", &cfg->grad_clip, t->grad_clip, path);
    if (cfg->seed != t->seed) {
        if (!mg_given(cfg, "seed")) cfg->seed = t->seed;
        else if (!cfg->allow_hparam_change)
            mg_fail(MG_EXIT_CKPT, "--seed %llu differs from %llu in %s (pass --allow-hparam-change to accept)",
                    (unsigned long long)cfg->seed, (unsigned long long)t->seed, path);
    }
}

#endif  // MICROGPT_CHECKPOINT_H

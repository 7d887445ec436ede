// microgpt.h: everything the CPU and CUDA engines share.
//
// The engines differ only in where the arithmetic runs. Everything a user or
// the proxy can observe lives here, once: the command line, the checkpoint
// file (docs/FORMATS.md), the frame reader, the JSON events, the signal
// handling and the training driver. An engine fills in an MgEngine (a small
// table of compute functions) and calls mg_main().
//
// Written in the common subset of C11 and C++17 so nvcc can include it.
#ifndef MICROGPT_H
#define MICROGPT_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE  // ppoll
#endif

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#define MG_VERSION "0.1.0"

// Exit codes (docs/FORMATS.md, "Engine exit codes").
enum { MG_EXIT_OK = 0, MG_EXIT_USAGE = 2, MG_EXIT_CKPT = 3, MG_EXIT_PROTOCOL = 4, MG_EXIT_IO = 5, MG_EXIT_NUMERIC = 6 };

// ----------------------------------------------------------------------------
// Errors and events. Every failure is one line on stderr ("microgpt: error:
// ...") and, so a supervising proxy sees it too, one `error` event on stdout.

static void mg_json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') { fputc('\\', f); fputc(*p, f); }
        else if (*p == '\n') fputs("\\n", f);
        else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}

// %.9g round-trips a float32 exactly; JSON has no NaN, so non-finite is null.
static void mg_json_float(FILE *f, double x) {
    if (isfinite(x)) fprintf(f, "%.9g", x);
    else fputs("null", f);
}

static void mg_fail(int code, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "microgpt: error: %s\n", msg);
    fputs("{\"event\":\"error\",\"message\":", stdout);
    mg_json_string(stdout, msg);
    fprintf(stdout, ",\"code\":%d}\n", code);
    fflush(stdout);
    fflush(stderr);
    exit(code);
}

static void mg_warn(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("microgpt: warning: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static void *mg_malloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) mg_fail(MG_EXIT_IO, "out of memory allocating %zu bytes", bytes);
    return p;
}

static void *mg_calloc(size_t count, size_t size) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) mg_fail(MG_EXIT_IO, "out of memory allocating %zu bytes", count * size);
    return p;
}

static double mg_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

// ----------------------------------------------------------------------------
// Configuration: every setting is a long flag. `given` remembers which flags
// the user typed, so a resume can adopt the checkpoint's value for the rest.

typedef struct {
    const char *data;
    const char *ckpt_dir;
    const char *resume;
    int ckpt_every, keep_last;
    int vocab, ctx, dim, layers, heads;
    int batch, grad_accum, steps, warmup;
    float lr, min_lr, beta1, beta2, eps, weight_decay, grad_clip;
    uint64_t seed;
    int threads;
    const char *precision;
    const char *attention;  // CUDA engine: "naive" or "flash"; NULL = naive
    const char *meta;
    const char *dump_grads;
    int allow_hparam_change;
    uint64_t given;  // bit i set: flag i of MG_FLAGS was on the command line
} MgConfig;

typedef enum { MG_INT, MG_FLOAT, MG_U64, MG_STR, MG_BOOL } MgFlagType;

typedef struct {
    const char *name;
    MgFlagType type;
    size_t offset;
    long min_int;  // inclusive bounds for MG_INT
    long max_int;
    const char *help;
} MgFlag;

#define MG_OFF(field) offsetof(MgConfig, field)
static const MgFlag MG_FLAGS[] = {
    {"data", MG_STR, MG_OFF(data), 0, 0, "token shard (standalone mode) or - for frames on stdin (proxy mode)"},
    {"ckpt-dir", MG_STR, MG_OFF(ckpt_dir), 0, 0, "checkpoint directory (default checkpoints)"},
    {"resume", MG_STR, MG_OFF(resume), 0, 0, "checkpoint to load, or 'latest' (newest valid in --ckpt-dir)"},
    {"ckpt-every", MG_INT, MG_OFF(ckpt_every), 0, 1 << 30, "periodic checkpoint every N steps, 0 = off (default 100)"},
    {"keep-last", MG_INT, MG_OFF(keep_last), 0, 1 << 30, "keep only the newest K checkpoints, 0 = all (default 0)"},
    {"vocab", MG_INT, MG_OFF(vocab), 2, 65536, "vocabulary size (default 4608)"},
    {"ctx", MG_INT, MG_OFF(ctx), 1, 1 << 16, "context length T (default 1024)"},
    {"dim", MG_INT, MG_OFF(dim), 1, 1 << 15, "model width C (default 384)"},
    {"layers", MG_INT, MG_OFF(layers), 1, 1024, "transformer blocks L (default 6)"},
    {"heads", MG_INT, MG_OFF(heads), 1, 1024, "attention heads, must divide --dim (default 12)"},
    {"batch", MG_INT, MG_OFF(batch), 1, 1 << 16, "rows per micro-batch B (default 8)"},
    {"grad-accum", MG_INT, MG_OFF(grad_accum), 1, 1 << 16, "micro-batches per optimizer step (default 1)"},
    {"steps", MG_INT, MG_OFF(steps), 1, 0x7fffffff, "schedule horizon; standalone stops here (default 5000)"},
    {"warmup", MG_INT, MG_OFF(warmup), 0, 0x7fffffff, "linear warmup steps (default 100)"},
    {"lr", MG_FLOAT, MG_OFF(lr), 0, 0, "peak learning rate (default 6e-4)"},
    {"min-lr", MG_FLOAT, MG_OFF(min_lr), 0, 0, "cosine floor (default 6e-5)"},
    {"beta1", MG_FLOAT, MG_OFF(beta1), 0, 0, "AdamW beta1 (default 0.9)"},
    {"beta2", MG_FLOAT, MG_OFF(beta2), 0, 0, "AdamW beta2 (default 0.95)"},
    {"eps", MG_FLOAT, MG_OFF(eps), 0, 0, "AdamW epsilon (default 1e-8)"},
    {"weight-decay", MG_FLOAT, MG_OFF(weight_decay), 0, 0, "decoupled weight decay on 2-D tensors (default 0.1)"},
    {"grad-clip", MG_FLOAT, MG_OFF(grad_clip), 0, 0, "global-norm gradient clip, 0 = off (default 1.0)"},
    {"seed", MG_U64, MG_OFF(seed), 0, 0, "initialisation and standalone sampling seed (default 1337)"},
    {"threads", MG_INT, MG_OFF(threads), 0, 4096, "CPU threads, 0 = all cores (default 0)"},
    {"precision", MG_STR, MG_OFF(precision), 0, 0, "fp32 or bf16 (CUDA engine; default fp32 on CPU)"},
    {"attention", MG_STR, MG_OFF(attention), 0, 0, "naive or flash: CUDA attention kernels (default naive; flash is bf16, head dim 32/64/128)"},
    {"meta", MG_STR, MG_OFF(meta), 0, 0, "JSON value (up to 4096 bytes) stored in checkpoint trailers"},
    {"dump-grads", MG_STR, MG_OFF(dump_grads), 0, 0, "write the first step's raw gradients (f32[n_params]) here and exit"},
    {"allow-hparam-change", MG_BOOL, MG_OFF(allow_hparam_change), 0, 0, "on resume, accept optimizer flags that differ from the checkpoint"},
};
#define MG_NFLAGS (sizeof MG_FLAGS / sizeof MG_FLAGS[0])

static int mg_flag_index(const char *name) {
    for (size_t i = 0; i < MG_NFLAGS; i++)
        if (strcmp(MG_FLAGS[i].name, name) == 0) return (int)i;
    return -1;
}

static int mg_given(const MgConfig *cfg, const char *name) {
    int i = mg_flag_index(name);
    return i >= 0 && (cfg->given >> i) & 1;
}

static void mg_defaults(MgConfig *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->ckpt_dir = "checkpoints";
    cfg->ckpt_every = 100;
    cfg->vocab = 4608; cfg->ctx = 1024; cfg->dim = 384; cfg->layers = 6; cfg->heads = 12;
    cfg->batch = 8; cfg->grad_accum = 1; cfg->steps = 5000; cfg->warmup = 100;
    cfg->lr = 6e-4f; cfg->min_lr = 6e-5f; cfg->beta1 = 0.9f; cfg->beta2 = 0.95f;
    cfg->eps = 1e-8f; cfg->weight_decay = 0.1f; cfg->grad_clip = 1.0f;
    cfg->seed = 1337;
    cfg->precision = NULL;  // engine default
}

static void mg_usage(const char *prog, FILE *f) {
    fprintf(f, "usage: %s --data FILE|- [flags]\n\nflags:\n", prog);
    for (size_t i = 0; i < MG_NFLAGS; i++)
        fprintf(f, "  --%-20s %s\n", MG_FLAGS[i].name, MG_FLAGS[i].help);
    fprintf(f, "  --%-20s %s\n", "help", "print this and exit");
}

// A minimal JSON validator (RFC 8259 grammar, no semantic checks): --meta is
// embedded verbatim in every checkpoint's metadata, which must stay valid JSON.
static const char *mg_json_skip_ws(const char *p) {
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
    return p;
}

static const char *mg_json_value(const char *p, int depth);

static const char *mg_json_str(const char *p) {
    if (*p++ != '"') return NULL;
    while (*p && *p != '"') {
        if ((unsigned char)*p < 0x20) return NULL;
        if (*p == '\\') {
            p++;
            if (*p == 'u') {
                for (int i = 1; i <= 4; i++) if (!strchr("0123456789abcdefABCDEF", p[i]) || !p[i]) return NULL;
                p += 4;
            } else if (!*p || !strchr("\"\\/bfnrt", *p)) return NULL;
        }
        p++;
    }
    return *p == '"' ? p + 1 : NULL;
}

static const char *mg_json_number(const char *p) {
    if (*p == '-') p++;
    if (*p == '0') p++;
    else if (*p >= '1' && *p <= '9') while (*p >= '0' && *p <= '9') p++;
    else return NULL;
    if (*p == '.') { p++; if (*p < '0' || *p > '9') return NULL; while (*p >= '0' && *p <= '9') p++; }
    if (*p == 'e' || *p == 'E') {
        p++;
        if (*p == '+' || *p == '-') p++;
        if (*p < '0' || *p > '9') return NULL;
        while (*p >= '0' && *p <= '9') p++;
    }
    return p;
}

static const char *mg_json_value(const char *p, int depth) {
    if (depth > 64) return NULL;
    p = mg_json_skip_ws(p);
    if (*p == '{' || *p == '[') {
        char close = *p == '{' ? '}' : ']';
        int object = *p == '{';
        p = mg_json_skip_ws(p + 1);
        if (*p == close) return p + 1;
        for (;;) {
            if (object) {
                p = mg_json_str(mg_json_skip_ws(p));
                if (!p) return NULL;
                p = mg_json_skip_ws(p);
                if (*p++ != ':') return NULL;
            }
            p = mg_json_value(p, depth + 1);
            if (!p) return NULL;
            p = mg_json_skip_ws(p);
            if (*p == close) return p + 1;
            if (*p++ != ',') return NULL;
        }
    }
    if (*p == '"') return mg_json_str(p);
    if (!strncmp(p, "true", 4)) return p + 4;
    if (!strncmp(p, "false", 5)) return p + 5;
    if (!strncmp(p, "null", 4)) return p + 4;
    return mg_json_number(p);
}

static int mg_json_valid(const char *text) {
    const char *end = mg_json_value(text, 0);
    return end && *mg_json_skip_ws(end) == 0;
}

static void mg_set_flag(MgConfig *cfg, const MgFlag *flag, const char *value) {
    char *end = NULL;
    void *field = (char *)cfg + flag->offset;
    errno = 0;
    switch (flag->type) {
    case MG_INT: {
        long v = strtol(value, &end, 10);
        if (errno || end == value || *end)
            mg_fail(MG_EXIT_USAGE, "--%s: '%s' is not an integer", flag->name, value);
        if (v < flag->min_int || v > flag->max_int)
            mg_fail(MG_EXIT_USAGE, "--%s: %ld is out of range [%ld, %ld]", flag->name, v, flag->min_int, flag->max_int);
        *(int *)field = (int)v;
        break;
    }
    case MG_U64: {
        if (value[0] == '-') mg_fail(MG_EXIT_USAGE, "--%s: '%s' must be a non-negative integer", flag->name, value);
        unsigned long long v = strtoull(value, &end, 10);
        if (errno || end == value || *end) mg_fail(MG_EXIT_USAGE, "--%s: '%s' is not an integer", flag->name, value);
        *(uint64_t *)field = (uint64_t)v;
        break;
    }
    case MG_FLOAT: {
        float v = strtof(value, &end);
        if (errno || end == value || *end || !isfinite(v))
            mg_fail(MG_EXIT_USAGE, "--%s: '%s' is not a finite number", flag->name, value);
        *(float *)field = v;
        break;
    }
    case MG_STR:
        if (!value[0]) mg_fail(MG_EXIT_USAGE, "--%s: empty value", flag->name);
        *(const char **)field = value;
        break;
    case MG_BOOL:
        *(int *)field = 1;
        break;
    }
}

// Range checks that involve more than one flag, or floats.
static void mg_validate(const MgConfig *cfg) {
    if (cfg->dim % cfg->heads)
        mg_fail(MG_EXIT_USAGE, "--heads %d does not divide --dim %d", cfg->heads, cfg->dim);
    if (cfg->lr < 0 || cfg->min_lr < 0) mg_fail(MG_EXIT_USAGE, "--lr and --min-lr must be >= 0");
    if (cfg->beta1 < 0 || cfg->beta1 >= 1) mg_fail(MG_EXIT_USAGE, "--beta1 must be in [0, 1)");
    if (cfg->beta2 < 0 || cfg->beta2 >= 1) mg_fail(MG_EXIT_USAGE, "--beta2 must be in [0, 1)");
    if (cfg->eps <= 0) mg_fail(MG_EXIT_USAGE, "--eps must be > 0");
    if (cfg->weight_decay < 0) mg_fail(MG_EXIT_USAGE, "--weight-decay must be >= 0");
    if (cfg->grad_clip < 0) mg_fail(MG_EXIT_USAGE, "--grad-clip must be >= 0");
    if (cfg->precision && strcmp(cfg->precision, "fp32") && strcmp(cfg->precision, "bf16"))
        mg_fail(MG_EXIT_USAGE, "--precision: '%s' is not fp32 or bf16", cfg->precision);
    if (cfg->attention && strcmp(cfg->attention, "naive") && strcmp(cfg->attention, "flash"))
        mg_fail(MG_EXIT_USAGE, "--attention: '%s' is not naive or flash", cfg->attention);
    double n = (double)cfg->vocab * cfg->dim + (double)cfg->ctx * cfg->dim +
               (double)cfg->layers * (12.0 * cfg->dim * cfg->dim + 13.0 * cfg->dim) + 2.0 * cfg->dim;
    if (n > 2147483647.0) mg_fail(MG_EXIT_USAGE, "model too large: %.0f parameters do not fit the int32 n_params field", n);
}

static void mg_parse_args(MgConfig *cfg, int argc, char **argv) {
    mg_defaults(cfg);
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) { mg_usage(argv[0], stdout); exit(0); }
        if (strncmp(arg, "--", 2) != 0) mg_fail(MG_EXIT_USAGE, "unexpected argument '%s' (flags start with --; see --help)", arg);
        char name[64];
        const char *eq = strchr(arg + 2, '=');
        size_t len = eq ? (size_t)(eq - arg - 2) : strlen(arg + 2);
        if (len >= sizeof name) mg_fail(MG_EXIT_USAGE, "unknown flag '%s' (see --help)", arg);
        memcpy(name, arg + 2, len);
        name[len] = 0;
        int idx = mg_flag_index(name);
        if (idx < 0) mg_fail(MG_EXIT_USAGE, "unknown flag '--%s' (see --help)", name);
        const MgFlag *flag = &MG_FLAGS[idx];
        const char *value = NULL;
        if (flag->type == MG_BOOL) {
            if (eq) mg_fail(MG_EXIT_USAGE, "--%s takes no value", name);
        } else if (eq) {
            value = eq + 1;
        } else {
            if (i + 1 >= argc) mg_fail(MG_EXIT_USAGE, "--%s needs a value", name);
            value = argv[++i];
        }
        mg_set_flag(cfg, flag, value);
        cfg->given |= 1ull << idx;
    }
    if (!cfg->data) mg_fail(MG_EXIT_USAGE, "--data is required (a token shard, or - for frames on stdin)");
    if (cfg->meta && !mg_json_valid(cfg->meta)) mg_fail(MG_EXIT_USAGE, "--meta: not valid JSON");
    if (cfg->meta && strlen(cfg->meta) > 4096) mg_fail(MG_EXIT_USAGE, "--meta: longer than 4096 bytes");
    // mg_validate runs after a resume has adopted the checkpoint's shape.
}

// ----------------------------------------------------------------------------
// The model's parameter layout (DESIGN.md): one flat fp32 array.

enum { MG_LN1W, MG_LN1B, MG_QKVW, MG_QKVB, MG_PROJW, MG_PROJB, MG_LN2W, MG_LN2B,
       MG_FCW, MG_FCB, MG_FCPROJW, MG_FCPROJB, MG_PER_LAYER };

typedef struct {
    size_t wte, wpe;                 // offsets of the embeddings
    size_t layer0;                   // offset of layer 0's first tensor
    size_t layer_size;               // parameters per layer
    size_t in_layer[MG_PER_LAYER];   // offset of each tensor within a layer
    size_t size[MG_PER_LAYER];       // element count of each tensor within a layer
    size_t lnfw, lnfb;
    size_t n;                        // total
} MgLayout;

static MgLayout mg_layout(int V, int T, int C, int L) {
    MgLayout lay;
    size_t c = (size_t)C;
    size_t sizes[MG_PER_LAYER] = {c, c, 3 * c * c, 3 * c, c * c, c, c, c, 4 * c * c, 4 * c, 4 * c * c, c};
    lay.wte = 0;
    lay.wpe = (size_t)V * c;
    lay.layer0 = lay.wpe + (size_t)T * c;
    lay.layer_size = 0;
    for (int i = 0; i < MG_PER_LAYER; i++) {
        lay.in_layer[i] = lay.layer_size;
        lay.size[i] = sizes[i];
        lay.layer_size += sizes[i];
    }
    lay.lnfw = lay.layer0 + (size_t)L * lay.layer_size;
    lay.lnfb = lay.lnfw + c;
    lay.n = lay.lnfb + c;
    return lay;
}

static size_t mg_param(const MgLayout *lay, int layer, int tensor) {
    return lay->layer0 + (size_t)layer * lay->layer_size + lay->in_layer[tensor];
}

// Weight decay applies to the 2-D tensors only: the embeddings and the four
// matmul weights of each layer. Writes one flag per parameter range.
typedef struct { size_t begin, end; int decay; } MgRange;

// Fills ranges (capacity 2 + 12L + 2) and returns how many.
static int mg_decay_ranges(const MgLayout *lay, int L, MgRange *ranges) {
    int k = 0;
    ranges[k++] = (MgRange){lay->wte, lay->wpe, 1};
    ranges[k++] = (MgRange){lay->wpe, lay->layer0, 1};
    for (int l = 0; l < L; l++)
        for (int t = 0; t < MG_PER_LAYER; t++) {
            size_t b = mg_param(lay, l, t);
            int decay = t == MG_QKVW || t == MG_PROJW || t == MG_FCW || t == MG_FCPROJW;
            ranges[k++] = (MgRange){b, b + lay->size[t], decay};
        }
    ranges[k++] = (MgRange){lay->lnfw, lay->lnfw + lay->size[MG_LN1W], 0};
    ranges[k++] = (MgRange){lay->lnfb, lay->n, 0};
    return k;
}

// ----------------------------------------------------------------------------
// Counter-based randomness: every random number is a pure function of
// (seed, stream, counter), so results do not depend on thread count or order.

static uint64_t mg_mix64(uint64_t x) {  // splitmix64 finaliser
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static uint64_t mg_hash3(uint64_t seed, uint64_t a, uint64_t b) {
    return mg_mix64(mg_mix64(mg_mix64(seed) ^ a) ^ b);
}

// Uniform in [0, 1) with 53 random bits.
static double mg_uniform(uint64_t bits) { return (bits >> 11) * (1.0 / 9007199254740992.0); }

enum { MG_STREAM_INIT = 1, MG_STREAM_BATCH = 2, MG_STREAM_SAMPLE = 3 };

// GPT-2 initialisation: N(0, 0.02) for matrices and embeddings, the two
// residual projections scaled by 1/sqrt(2L), LayerNorm weights 1, biases 0.
static void mg_init_params(float *w, const MgConfig *cfg) {
    MgLayout lay = mg_layout(cfg->vocab, cfg->ctx, cfg->dim, cfg->layers);
    double resid_std = 0.02 / sqrt(2.0 * cfg->layers);
    for (size_t i = 0; i < lay.n; i++) w[i] = 0.0f;
    for (int l = -1; l <= cfg->layers; l++) {
        // l = -1: embeddings; 0..L-1: layers; L: final LayerNorm.
        size_t begin[4], end[4]; double stdv[4]; int nr = 0;
        if (l == -1) {
            begin[nr] = lay.wte; end[nr] = lay.layer0; stdv[nr++] = 0.02;
        } else if (l == cfg->layers) {
            for (size_t i = lay.lnfw; i < lay.lnfb; i++) w[i] = 1.0f;
        } else {
            int mats[4] = {MG_QKVW, MG_PROJW, MG_FCW, MG_FCPROJW};
            for (int j = 0; j < 4; j++) {
                begin[nr] = mg_param(&lay, l, mats[j]);
                end[nr] = begin[nr] + lay.size[mats[j]];
                stdv[nr++] = (mats[j] == MG_PROJW || mats[j] == MG_FCPROJW) ? resid_std : 0.02;
            }
            size_t ln1 = mg_param(&lay, l, MG_LN1W), ln2 = mg_param(&lay, l, MG_LN2W);
            for (int c = 0; c < cfg->dim; c++) { w[ln1 + c] = 1.0f; w[ln2 + c] = 1.0f; }
        }
        for (int r = 0; r < nr; r++)
            for (size_t i = begin[r]; i < end[r]; i++) {
                uint64_t h = mg_hash3(cfg->seed, MG_STREAM_INIT, i);
                double u1 = mg_uniform(h), u2 = mg_uniform(mg_mix64(h));
                double z = sqrt(-2.0 * log(1.0 - u1)) * cos(6.283185307179586 * u2);
                w[i] = (float)(z * stdv[r]);
            }
    }
}

// ----------------------------------------------------------------------------
// Learning rate: a pure function of the step, so restoring the step restores
// the schedule. Step s is 1-based: the update that produces step s.

static float mg_lr_at(const MgConfig *cfg, int s) {
    if (cfg->warmup > 0 && s <= cfg->warmup) return (float)((double)cfg->lr * s / cfg->warmup);
    int span = cfg->steps - cfg->warmup;
    double progress = span > 0 ? (double)(s - cfg->warmup) / span : 1.0;
    if (progress > 1.0) progress = 1.0;
    double cosine = 0.5 * (1.0 + cos(3.141592653589793 * progress));
    return (float)(cfg->min_lr + (cfg->lr - cfg->min_lr) * cosine);
}

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
    unsigned char reserved[32];
} MgTrailer;

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
} MgState;

static void mg_ckpt_name(char *out, size_t cap, const char *dir, int step, int temp) {
    snprintf(out, cap, temp ? "%s/.step_%06d.bin.tmp" : "%s/step_%06d.bin", dir, step);
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

static int mg_fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return errno;
    int rc = fsync(fd) ? errno : 0;
    close(fd);
    return rc;
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
// --meta was validated as JSON when parsed, so it is embedded verbatim.
static size_t mg_meta_json(char *out, size_t cap, const char *engine, const char *meta) {
    return (size_t)snprintf(out, cap, "{\"engine\":\"%s\",\"meta\":%s}", engine, meta ? meta : "null");
}

// Atomic, durable write of a checkpoint. On failure removes the temp file,
// leaves every existing checkpoint untouched, and returns an errno value with
// `what` naming the failed operation.
static int mg_write_checkpoint(const MgConfig *cfg, const char *engine, const MgState *st,
                               char *path_out, size_t path_cap, size_t *bytes_out, const char **what) {
    char tmp[4096];
    mg_ckpt_name(tmp, sizeof tmp, cfg->ckpt_dir, st->step, 1);
    mg_ckpt_name(path_out, path_cap, cfg->ckpt_dir, st->step, 0);
    static char meta[8192];
    size_t meta_bytes = mg_meta_json(meta, sizeof meta, engine, cfg->meta);

    MgTrailer tr;
    memset(&tr, 0, sizeof tr);
    memcpy(tr.magic, MG_TRAILER_MAGIC, 8);
    tr.version = 1;
    tr.meta_bytes = (uint32_t)meta_bytes;
    tr.vocab = cfg->vocab; tr.ctx = cfg->ctx; tr.dim = cfg->dim; tr.layers = cfg->layers; tr.heads = cfg->heads;
    tr.batch = cfg->batch; tr.grad_accum = cfg->grad_accum; tr.warmup = cfg->warmup; tr.max_steps = cfg->steps;
    tr.lr = cfg->lr; tr.min_lr = cfg->min_lr; tr.beta1 = cfg->beta1; tr.beta2 = cfg->beta2;
    tr.eps = cfg->eps; tr.weight_decay = cfg->weight_decay; tr.grad_clip = cfg->grad_clip;
    tr.seed = cfg->seed;
    tr.tokens_seen = st->tokens_seen;

    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
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
    if (!rc && rename(tmp, path_out)) { rc = errno; *what = "rename"; }
    if (rc) { unlink(tmp); return rc; }
    if ((rc = mg_fsync_dir(cfg->ckpt_dir))) { *what = "fsync directory"; return rc; }
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
        if (st->trailer.version != 1) { snprintf(err, errcap, "%s: unsupported trailer version %u", path, st->trailer.version); goto done; }
        if ((uint64_t)MG_TRAILER_FIXED + st->trailer.meta_bytes + MG_FOOTER != foot.trailer_bytes) { snprintf(err, errcap, "%s: trailer sizes disagree", path); goto done; }
        MgLayout lay = mg_layout(st->trailer.vocab, st->trailer.ctx, st->trailer.dim, st->trailer.layers);
        if (st->trailer.vocab <= 0 || st->trailer.ctx <= 0 || st->trailer.dim <= 0 || st->trailer.layers <= 0 || lay.n != st->n) {
            snprintf(err, errcap, "%s: n_params %zu does not match the shape in its trailer", path, st->n);
            goto done;
        }
        st->has_trailer = 1;
        st->tokens_seen = st->trailer.tokens_seen;
    }
    st->weights = (float *)mg_malloc(st->n * sizeof(float));
    st->m = (float *)mg_malloc(st->n * sizeof(float));
    st->v = (float *)mg_malloc(st->n * sizeof(float));
    memcpy(st->weights, raw + 8, st->n * 4);
    memcpy(st->m, raw + 8 + 4 * st->n, st->n * 4);
    memcpy(st->v, raw + 8 + 8 * st->n, st->n * 4);
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

static int mg_list_checkpoints(const char *dir, int **steps_out) {
    DIR *d = opendir(dir);
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
                if (!grown) mg_fail(MG_EXIT_IO, "out of memory listing %s", dir);
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
static void mg_remove_stale_temps(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[4096];
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (strncmp(e->d_name, ".step_", 6) || len < 14 || strcmp(e->d_name + len - 8, ".bin.tmp")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (unlink(path) == 0) mg_warn("removed stale temp file %s", path);
    }
    closedir(d);
}

// Deletes all but the newest `keep` checkpoints (standalone --keep-last).
static void mg_prune_checkpoints(const char *dir, int keep) {
    if (keep <= 0) return;
    int *steps;
    int n = mg_list_checkpoints(dir, &steps);
    char path[4096];
    for (int i = keep; i < n; i++) {
        mg_ckpt_name(path, sizeof path, dir, steps[i], 0);
        if (unlink(path)) mg_warn("cannot remove %s: %s", path, strerror(errno));
    }
    free(steps);
}

// ----------------------------------------------------------------------------
// Resuming: find the file, verify it, reconcile its shape and settings with
// the command line. Flags the user gave must agree; the rest are adopted.

static int mg_find_resume(const MgConfig *cfg, MgState *st, char *path, size_t cap) {
    char err[1024];
    if (strcmp(cfg->resume, "latest")) {
        snprintf(path, cap, "%s", cfg->resume);
        if (mg_read_checkpoint(path, st, err, sizeof err)) mg_fail(MG_EXIT_CKPT, "cannot resume: %s", err);
        return 1;
    }
    int *steps;
    int n = mg_list_checkpoints(cfg->ckpt_dir, &steps), rejected = 0;
    for (int i = 0; i < n; i++) {
        mg_ckpt_name(path, cap, cfg->ckpt_dir, steps[i], 0);
        if (mg_read_checkpoint(path, st, err, sizeof err) == 0) { free(steps); return 1; }
        mg_warn("skipping %s", err);
        rejected++;
    }
    free(steps);
    if (rejected) mg_fail(MG_EXIT_CKPT, "no valid checkpoint in %s (%d rejected)", cfg->ckpt_dir, rejected);
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

// ----------------------------------------------------------------------------
// The compute an engine provides. All buffers are allocated in init; none of
// these functions allocates. Tokens are [rows, len] uint16; the training rows
// handed to forward_backward are [rows, T+1] (inputs and shifted targets).

typedef struct {
    const char *name;          // "cpu" or "cuda"
    char device[256];          // human-readable device description
    const char *precision;     // "fp32" or "bf16"
    int threads;
    size_t mem_bytes;          // bytes allocated for model, optimizer, activations
    void *impl;

    // Checks engine-specific settings right after parsing (may fill in
    // defaults such as the precision); returns an error message or NULL.
    const char *(*configure)(void *impl, MgConfig *cfg);
    // Allocates everything for cfg (batch rows of ctx tokens); returns the
    // bytes it holds.
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
    // Logits at the last position of each of rows rows of len tokens:
    // out is [rows, vocab].
    void (*last_logits)(void *impl, const uint16_t *tokens, int rows, int len, float *out);
} MgEngine;

// ----------------------------------------------------------------------------
// The driver: the training loop both engines share.

typedef struct {
    MgConfig cfg;
    MgEngine *eng;
    MgLayout lay;
    MgState st;          // host copy used for checkpoints (weights, m, v)
    int step;
    int saved_step;      // step of the last checkpoint written or loaded, -1 if none
    uint64_t tokens_seen;
    float *row_loss;     // [batch * grad_accum] or eval rows chunk
    uint16_t *rows_buf;  // [batch * grad_accum * (T+1)] tokens
    uint16_t *groups_buf;
    uint32_t rows_cap;
} MgDriver;

static void mg_emit_ckpt(MgDriver *d, const char *reason) {
    double t0 = mg_now_ms();
    d->eng->get_state(d->eng->impl, d->st.weights, d->st.m, d->st.v);
    d->st.step = d->step;
    d->st.tokens_seen = d->tokens_seen;
    char path[4096];
    size_t bytes = 0;
    const char *what = "";
    mg_mkdirs(d->cfg.ckpt_dir);
    int rc = mg_write_checkpoint(&d->cfg, d->eng->name, &d->st, path, sizeof path, &bytes, &what);
    if (rc) mg_fail(MG_EXIT_IO, "checkpoint at step %d failed (%s %s: %s); previous checkpoints are intact", d->step, what, path, strerror(rc));
    d->saved_step = d->step;
    printf("{\"event\":\"ckpt\",\"step\":%d,\"path\":", d->step);
    mg_json_string(stdout, path);
    printf(",\"bytes\":%zu,\"ms\":%.3f,\"reason\":\"%s\"}\n", bytes, mg_now_ms() - t0, reason);
    fflush(stdout);
    if (strcmp(d->cfg.data, "-") != 0) mg_prune_checkpoints(d->cfg.ckpt_dir, d->cfg.keep_last);
}

static void mg_emit_exit(MgDriver *d, const char *reason) {
    printf("{\"event\":\"exit\",\"step\":%d,\"reason\":\"%s\"}\n", d->step, reason);
    fflush(stdout);
}

// Checkpoint unless this exact step is already on disk, then exit 0.
static void mg_finish(MgDriver *d, const char *ckpt_reason, const char *exit_reason) {
    if (d->saved_step != d->step) mg_emit_ckpt(d, ckpt_reason);
    mg_emit_exit(d, exit_reason);
    exit(0);
}

static void mg_check_tokens(const MgDriver *d, const uint16_t *tokens, size_t count) {
    for (size_t i = 0; i < count; i++)
        if (tokens[i] >= d->cfg.vocab)
            mg_fail(MG_EXIT_PROTOCOL, "malformed frame: token id %u at index %zu >= vocab %d", tokens[i], i, d->cfg.vocab);
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
    float *grads = (float *)mg_malloc(d->lay.n * sizeof(float));
    d->eng->get_grads(d->eng->impl, grads);
    FILE *f = fopen(d->cfg.dump_grads, "wb");
    if (!f || fwrite(grads, sizeof(float), d->lay.n, f) != d->lay.n || fclose(f))
        mg_fail(MG_EXIT_IO, "cannot write gradients to %s: %s", d->cfg.dump_grads, strerror(errno));
    free(grads);
    printf("{\"event\":\"grads\",\"step\":%d,\"loss\":", d->step + 1);
    mg_json_float(stdout, loss);
    fputs(",\"path\":", stdout);
    mg_json_string(stdout, d->cfg.dump_grads);
    puts("}");
    mg_emit_exit(d, "grads");
    exit(0);
}

// One optimizer update from rows = batch * grad_accum rows of T+1 tokens.
static void mg_train_step(MgDriver *d, const uint16_t *tokens, const uint16_t *groups) {
    const MgConfig *c = &d->cfg;
    int B = c->batch, K = c->grad_accum, T = c->ctx, rows = B * K;
    double t0 = mg_now_ms();
    d->eng->zero_grads(d->eng->impl);
    float grad_scale = 1.0f / ((float)rows * (float)T);
    for (int k = 0; k < K; k++)
        d->eng->forward_backward(d->eng->impl, tokens + (size_t)k * B * (T + 1), B, grad_scale, d->row_loss + (size_t)k * B);
    double loss_sum = 0;
    for (int r = 0; r < rows; r++) loss_sum += d->row_loss[r];
    float loss = (float)(loss_sum / rows);
    if (c->dump_grads) mg_write_grads_file(d, loss);
    double norm = d->eng->grad_norm(d->eng->impl);
    if (!isfinite(loss) || !isfinite(norm))
    {
        char last[64];
        if (d->saved_step >= 0) snprintf(last, sizeof last, "last checkpoint: step %d", d->saved_step);
        else snprintf(last, sizeof last, "no checkpoint yet");
        mg_fail(MG_EXIT_NUMERIC, "non-finite %s at step %d; nothing written (%s)",
                isfinite(loss) ? "gradient norm" : "loss", d->step + 1, last);
    }
    float mult = 1.0f;
    if (c->grad_clip > 0 && norm > c->grad_clip) mult = (float)(c->grad_clip / (norm + 1e-6));
    int s = d->step + 1;
    float lr = mg_lr_at(c, s);
    d->eng->update(d->eng->impl, s, lr, mult);
    d->step = s;
    d->tokens_seen += (uint64_t)rows * T;
    printf("{\"event\":\"step\",\"step\":%d,\"loss\":", s);
    mg_json_float(stdout, loss);
    mg_print_groups(d->row_loss, groups, rows, T, 0);
    fputs(",\"lr\":", stdout);
    mg_json_float(stdout, lr);
    fputs(",\"grad_norm\":", stdout);
    mg_json_float(stdout, (float)norm);
    printf(",\"ms\":%.3f,\"tokens\":%d}\n", mg_now_ms() - t0, rows * T);
    fflush(stdout);
}

// Periodic checkpoint after a training step.
static void mg_periodic_checkpoint(MgDriver *d) {
    if (d->cfg.ckpt_every > 0 && d->step % d->cfg.ckpt_every == 0 && d->saved_step != d->step) mg_emit_ckpt(d, "periodic");
}

// Acts on signal flags; called between steps and while idle.
static void mg_handle_signals(MgDriver *d) {
    if (mg_ckpt_requested) {
        mg_ckpt_requested = 0;
        if (d->saved_step != d->step) mg_emit_ckpt(d, "sigusr1");
    }
    if (mg_stop_requested) mg_finish(d, "signal", "signal");
}

static void mg_eval(MgDriver *d, uint64_t id, const uint16_t *tokens, const uint16_t *groups, int rows) {
    int B = d->cfg.batch, T = d->cfg.ctx;
    double t0 = mg_now_ms();
    double loss_sum = 0;
    for (int r0 = 0; r0 < rows; r0 += B) {
        int n = rows - r0 < B ? rows - r0 : B;
        d->eng->forward_loss(d->eng->impl, tokens + (size_t)r0 * (T + 1), n, d->row_loss + r0);
    }
    for (int r = 0; r < rows; r++) loss_sum += d->row_loss[r];
    printf("{\"event\":\"eval\",\"id\":%llu,\"step\":%d,\"loss\":", (unsigned long long)id, d->step);
    mg_json_float(stdout, (float)(loss_sum / rows));
    mg_print_groups(d->row_loss, groups, rows, T, 1);
    printf(",\"ms\":%.3f}\n", mg_now_ms() - t0);
    fflush(stdout);
}

// The k-th largest of n values (k >= 1), by quickselect on a scratch copy:
// O(n), deterministic (middle pivot, no randomness).
static float mg_kth_largest(const float *values, int n, int k, float *scratch) {
    memcpy(scratch, values, (size_t)n * sizeof(float));
    int lo = 0, hi = n - 1, want = k - 1;  // index in descending order
    while (lo < hi) {
        float pivot = scratch[lo + (hi - lo) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (scratch[i] > pivot) i++;
            while (scratch[j] < pivot) j--;
            if (i <= j) { float t = scratch[i]; scratch[i] = scratch[j]; scratch[j] = t; i++; j--; }
        }
        if (want <= j) hi = j;
        else if (want >= i) lo = i;
        else break;
    }
    return scratch[want];
}

// Picks a token from logits: greedy at temperature 0, else softmax sampling
// over the logits >= the k-th largest (ties at the cutoff are all kept), with
// a uniform drawn from (seed, sample, position).
static int mg_pick_token(const float *logits, int V, const MgSampleParams *p, uint64_t sample, uint64_t pos,
                         double *probs, float *scratch) {
    int best = 0;
    for (int i = 1; i < V; i++) if (logits[i] > logits[best]) best = i;
    if (p->temperature <= 0.0f) return best;
    float cutoff = -INFINITY;
    if (p->top_k > 0 && p->top_k < (uint32_t)V) cutoff = mg_kth_largest(logits, V, (int)p->top_k, scratch);
    double total = 0;
    for (int i = 0; i < V; i++) {
        probs[i] = logits[i] >= cutoff ? exp(((double)logits[i] - logits[best]) / p->temperature) : 0.0;
        total += probs[i];
    }
    double u = mg_uniform(mg_hash3(p->seed ^ MG_STREAM_SAMPLE, sample, pos)) * total, acc = 0;
    for (int i = 0; i < V; i++) {
        acc += probs[i];
        if (u < acc && probs[i] > 0) return i;
    }
    return best;
}

static void mg_sample(MgDriver *d, uint64_t id, const MgSampleParams *p, const uint16_t *prompt) {
    int B = d->cfg.batch, T = d->cfg.ctx, V = d->cfg.vocab;
    double t0 = mg_now_ms();
    size_t cap = (size_t)p->n_prompt + p->max_new;
    uint16_t *seqs = (uint16_t *)mg_malloc((size_t)p->count * cap * sizeof(uint16_t));
    uint16_t *window = (uint16_t *)mg_malloc((size_t)B * T * sizeof(uint16_t));
    float *logits = (float *)mg_malloc((size_t)B * V * sizeof(float));
    double *probs = (double *)mg_malloc((size_t)V * sizeof(double));
    float *scratch = (float *)mg_malloc((size_t)V * sizeof(float));
    for (uint32_t s = 0; s < p->count; s++) memcpy(seqs + s * cap, prompt, p->n_prompt * sizeof(uint16_t));
    for (uint32_t s0 = 0; s0 < p->count; s0 += (uint32_t)B) {
        int rows = (int)(p->count - s0 < (uint32_t)B ? p->count - s0 : (uint32_t)B);
        for (uint32_t j = 0; j < p->max_new; j++) {
            size_t len = p->n_prompt + j;
            int win = len < (size_t)T ? (int)len : T;
            for (int r = 0; r < rows; r++)
                memcpy(window + (size_t)r * win, seqs + (s0 + r) * cap + len - win, win * sizeof(uint16_t));
            d->eng->last_logits(d->eng->impl, window, rows, win, logits);
            for (int r = 0; r < rows; r++)
                seqs[(s0 + r) * cap + len] = (uint16_t)mg_pick_token(logits + (size_t)r * V, V, p, s0 + r, j, probs, scratch);
        }
    }
    printf("{\"event\":\"sample\",\"id\":%llu,\"step\":%d,\"tokens\":[", (unsigned long long)id, d->step);
    for (uint32_t s = 0; s < p->count; s++) {
        fputs(s ? ",[" : "[", stdout);
        for (uint32_t j = 0; j < p->max_new; j++) printf(j ? ",%u" : "%u", seqs[s * cap + p->n_prompt + j]);
        fputc(']', stdout);
    }
    printf("],\"ms\":%.3f}\n", mg_now_ms() - t0);
    fflush(stdout);
    free(seqs); free(window); free(logits); free(probs); free(scratch);
}

// Reads and executes frames until EOF, STOP or a signal.
static void mg_proxy_loop(MgDriver *d) {
    const MgConfig *c = &d->cfg;
    int rowlen = c->ctx + 1;
    for (;;) {
        mg_handle_signals(d);  // signals that arrived while idle or during the last frame
        if (!mg_wait_for_input(0)) continue;
        MgFrameHeader h;
        if (mg_read_exact(0, &h, sizeof h, 1) == 0) mg_finish(d, "eof", "eof");
        if (memcmp(h.magic, "MGF1", 4)) mg_fail(MG_EXIT_PROTOCOL, "malformed frame: bad magic");
        if (h.flags || h.reserved) mg_fail(MG_EXIT_PROTOCOL, "malformed frame: nonzero flags or reserved field");
        switch (h.type) {
        case MG_FRAME_TRAIN:
        case MG_FRAME_EVAL: {
            const char *kind = h.type == MG_FRAME_TRAIN ? "TRAIN" : "EVAL";
            if (h.row_len != (uint32_t)rowlen)
                mg_fail(MG_EXIT_PROTOCOL, "malformed %s frame: row_len %u, expected ctx+1 = %d", kind, h.row_len, rowlen);
            if (h.type == MG_FRAME_TRAIN && h.rows != (uint32_t)(c->batch * c->grad_accum))
                mg_fail(MG_EXIT_PROTOCOL, "malformed TRAIN frame: %u rows, expected batch*grad_accum = %d", h.rows, c->batch * c->grad_accum);
            if (h.rows == 0 || h.rows > (1u << 20)) mg_fail(MG_EXIT_PROTOCOL, "malformed %s frame: %u rows", kind, h.rows);
            uint64_t expect = (uint64_t)h.rows * rowlen * 2 + (uint64_t)h.rows * 2;
            if (h.payload_bytes != expect)
                mg_fail(MG_EXIT_PROTOCOL, "malformed %s frame: payload %u bytes, expected %llu", kind, h.payload_bytes, (unsigned long long)expect);
            if (h.type == MG_FRAME_TRAIN && h.id != (uint64_t)d->step + 1)
                mg_fail(MG_EXIT_PROTOCOL, "TRAIN frame for step %llu, but the engine is at step %d (expects %d)",
                        (unsigned long long)h.id, d->step, d->step + 1);
            if (h.rows > d->rows_cap) {
                d->rows_cap = h.rows;
                d->rows_buf = (uint16_t *)realloc(d->rows_buf, (size_t)h.rows * rowlen * 2);
                d->groups_buf = (uint16_t *)realloc(d->groups_buf, (size_t)h.rows * 2);
                d->row_loss = (float *)realloc(d->row_loss, (size_t)h.rows * sizeof(float));
                if (!d->rows_buf || !d->groups_buf || !d->row_loss) mg_fail(MG_EXIT_IO, "out of memory for a %u-row frame", h.rows);
            }
            mg_read_exact(0, d->rows_buf, (size_t)h.rows * rowlen * 2, 0);
            mg_read_exact(0, d->groups_buf, (size_t)h.rows * 2, 0);
            mg_check_tokens(d, d->rows_buf, (size_t)h.rows * rowlen);
            if (h.type == MG_FRAME_TRAIN) {
                mg_train_step(d, d->rows_buf, d->groups_buf);
                mg_periodic_checkpoint(d);
            } else mg_eval(d, h.id, d->rows_buf, d->groups_buf, (int)h.rows);
            break;
        }
        case MG_FRAME_SAMPLE: {
            MgSampleParams p;
            if (h.payload_bytes < sizeof p) mg_fail(MG_EXIT_PROTOCOL, "malformed SAMPLE frame: payload %u bytes", h.payload_bytes);
            mg_read_exact(0, &p, sizeof p, 0);
            if (p.reserved || p.n_prompt == 0 || p.count == 0 || p.count > 4096 || p.max_new > (1u << 20) ||
                h.payload_bytes != sizeof p + 2ull * p.n_prompt || !isfinite(p.temperature) || p.temperature < 0)
                mg_fail(MG_EXIT_PROTOCOL, "malformed SAMPLE frame: bad parameters or payload size");
            uint16_t *prompt = (uint16_t *)mg_malloc((size_t)p.n_prompt * 2);
            mg_read_exact(0, prompt, (size_t)p.n_prompt * 2, 0);
            mg_check_tokens(d, prompt, p.n_prompt);
            mg_sample(d, h.id, &p, prompt);
            free(prompt);
            break;
        }
        case MG_FRAME_CHECKPOINT:
        case MG_FRAME_STOP:
            if (h.payload_bytes || h.rows || h.row_len)
                mg_fail(MG_EXIT_PROTOCOL, "malformed %s frame: it carries no payload", h.type == MG_FRAME_STOP ? "STOP" : "CHECKPOINT");
            if (h.type == MG_FRAME_STOP) mg_finish(d, "stop", "stop");
            if (d->saved_step != d->step) mg_emit_ckpt(d, "frame");
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
        mg_shard_batch(sh, c->seed, d->step + 1, rows, c->ctx + 1, d->rows_buf);
        mg_train_step(d, d->rows_buf, groups);
        mg_periodic_checkpoint(d);
        mg_handle_signals(d);
    }
    free(groups);
    mg_finish(d, "done", "done");
}

static void mg_print_config(const MgConfig *c) {
    printf("\"config\":{\"vocab\":%d,\"ctx\":%d,\"dim\":%d,\"layers\":%d,\"heads\":%d,\"batch\":%d,\"grad_accum\":%d,"
           "\"steps\":%d,\"warmup\":%d,\"lr\":", c->vocab, c->ctx, c->dim, c->layers, c->heads, c->batch, c->grad_accum, c->steps, c->warmup);
    mg_json_float(stdout, c->lr); fputs(",\"min_lr\":", stdout);
    mg_json_float(stdout, c->min_lr); fputs(",\"beta1\":", stdout);
    mg_json_float(stdout, c->beta1); fputs(",\"beta2\":", stdout);
    mg_json_float(stdout, c->beta2); fputs(",\"eps\":", stdout);
    mg_json_float(stdout, c->eps); fputs(",\"weight_decay\":", stdout);
    mg_json_float(stdout, c->weight_decay); fputs(",\"grad_clip\":", stdout);
    mg_json_float(stdout, c->grad_clip);
    printf(",\"seed\":%llu,\"ckpt_every\":%d,\"ckpt_dir\":", (unsigned long long)c->seed, c->ckpt_every);
    mg_json_string(stdout, c->ckpt_dir);
    fputc('}', stdout);
}

// Entry point both engines call after filling in eng (name, function table).
static int mg_main(int argc, char **argv, MgEngine *eng) {
    setvbuf(stdout, NULL, _IOFBF, 1 << 16);
    mg_crc_init();
    MgDriver d;
    memset(&d, 0, sizeof d);
    d.eng = eng;
    mg_parse_args(&d.cfg, argc, argv);
    const char *bad = eng->configure(eng->impl, &d.cfg);
    if (bad) mg_fail(MG_EXIT_USAGE, "%s", bad);
    mg_install_signals();

    // Load before allocating: an unspecified shape comes from the checkpoint.
    char resumed_from[4096] = "";
    MgState loaded;
    memset(&loaded, 0, sizeof loaded);
    mg_remove_stale_temps(d.cfg.ckpt_dir);
    if (d.cfg.resume && mg_find_resume(&d.cfg, &loaded, resumed_from, sizeof resumed_from))
        mg_reconcile(&d.cfg, &loaded, resumed_from);
    else
        resumed_from[0] = 0;
    mg_validate(&d.cfg);

    const MgConfig *c = &d.cfg;
    MgShard shard = {NULL, 0};
    int standalone = strcmp(c->data, "-") != 0;
    if (standalone) shard = mg_load_shard(c->data, c->vocab, c->ctx + 1);

    d.lay = mg_layout(c->vocab, c->ctx, c->dim, c->layers);
    d.st.n = d.lay.n;
    d.st.weights = (float *)mg_malloc(d.lay.n * sizeof(float));
    d.st.m = (float *)mg_malloc(d.lay.n * sizeof(float));
    d.st.v = (float *)mg_malloc(d.lay.n * sizeof(float));
    d.rows_cap = (uint32_t)(c->batch * c->grad_accum);
    d.rows_buf = (uint16_t *)mg_malloc((size_t)d.rows_cap * (c->ctx + 1) * sizeof(uint16_t));
    d.groups_buf = (uint16_t *)mg_calloc(d.rows_cap, sizeof(uint16_t));
    d.row_loss = (float *)mg_malloc((size_t)d.rows_cap * sizeof(float));
    d.saved_step = -1;

    eng->mem_bytes = eng->init(eng->impl, c);
    if (resumed_from[0]) {
        eng->set_state(eng->impl, loaded.weights, loaded.m, loaded.v);
        d.step = loaded.step;
        d.tokens_seen = loaded.has_trailer ? loaded.tokens_seen : (uint64_t)loaded.step * c->batch * c->grad_accum * c->ctx;
        d.saved_step = loaded.step;
        mg_free_state(&loaded);
    } else {
        mg_init_params(d.st.weights, c);
        memset(d.st.m, 0, d.lay.n * sizeof(float));
        memset(d.st.v, 0, d.lay.n * sizeof(float));
        eng->set_state(eng->impl, d.st.weights, d.st.m, d.st.v);
    }

    printf("{\"event\":\"ready\",\"step\":%d,\"n_params\":%zu,\"engine\":\"%s\",\"device\":", d.step, d.lay.n, eng->name);
    mg_json_string(stdout, eng->device);
    printf(",\"threads\":%d,\"precision\":\"%s\",\"resumed_from\":", eng->threads, eng->precision);
    if (resumed_from[0]) mg_json_string(stdout, resumed_from);
    else fputs("null", stdout);
    printf(",\"mem_bytes\":%zu,\"version\":\"%s\",", eng->mem_bytes, MG_VERSION);
    mg_print_config(c);
    puts("}");
    fflush(stdout);

    if (standalone) mg_standalone_loop(&d, &shard);
    else mg_proxy_loop(&d);
    return 0;
}

#endif  // MICROGPT_H

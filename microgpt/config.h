// config.h: the command line. MgConfig holds every setting; MG_FLAGS is the
// one table of flags (name, type, bounds, help) that parsing, --help and the
// `given` bits are driven by; a minimal JSON validator guards --meta; the
// range checks that involve floats or several flags; the config as JSON for
// the `ready` event.
#ifndef MICROGPT_CONFIG_H
#define MICROGPT_CONFIG_H

#include "common.h"

#include <errno.h>
#include <string.h>

// ----------------------------------------------------------------------------
// Configuration: every setting is a long flag. `given` remembers which flags
// the user typed, so a resume can adopt the checkpoint's value for the rest.

typedef struct {
    const char *data;
    const char *ckpt_dir;
    const char *resume;
    int ckpt_every, keep_last;
    float ckpt_every_seconds;
    int vocab, ctx, dim, layers, heads;
    int batch, grad_accum, steps, warmup;
    float lr, min_lr, beta1, beta2, eps, weight_decay, grad_clip;
    const char *lr_schedule;  // one of MG_SCHEDULES (model.h's mg_lr_at)
    float decay_fraction;     // wsd: the final fraction of --steps that decays to --min-lr
    uint64_t seed;
    int threads;
    const char *precision;
    const char *attention;  // CUDA engine: "naive", "flash", "cudnn" or "auto"; NULL = naive
    const char *fused;      // CUDA engine: "on" or "off" (NULL = off): the fused step kernels
    const char *cuda_graph; // CUDA engine: "on" or "off" (NULL = off): the step as one CUDA graph
    const char *meta;
    const char *dump_grads;
    int dump_grads_step;      // the step whose gradients --dump-grads writes (default 1)
    const char *dump_logits;  // SAMPLE frames append the logits they picked from here
    int allow_hparam_change;
    int sample_recompute;
    int sync_snapshot;  // CUDA engine: checkpoints through get_state, waiting for the copy (the verified writer)
    uint64_t given;  // bit i set: flag i of MG_FLAGS was on the command line
} MgConfig;

typedef enum { MG_INT, MG_FLOAT, MG_U64, MG_STR, MG_BOOL } MgFlagType;

// The learning-rate schedules, by their code in a checkpoint's trailer (docs/FORMATS.md): a version 1
// trailer, written before schedules existed, holds none and means cosine (code 0).
static const char *const MG_SCHEDULES[] = {"cosine", "wsd", "constant", "linear"};
enum { MG_SCHEDULE_COSINE, MG_SCHEDULE_WSD, MG_SCHEDULE_CONSTANT, MG_SCHEDULE_LINEAR, MG_N_SCHEDULES };

static int mg_schedule_code(const char *name) {
    for (int i = 0; i < MG_N_SCHEDULES; i++)
        if (name && strcmp(name, MG_SCHEDULES[i]) == 0) return i;
    return -1;
}

typedef struct {
    const char *name;
    MgFlagType type;
    size_t offset;
    long min_int;  // inclusive bounds for MG_INT
    long max_int;
    const char *help;
} MgFlag;

// The CUDA engine's attention paths, as --help lists them: the engine defines
// MG_ATTENTION_PATHS before including this header when its build has cuDNN.
#ifndef MG_ATTENTION_PATHS
#define MG_ATTENTION_PATHS "naive, flash or auto"
#endif

#define MG_OFF(field) offsetof(MgConfig, field)
static const MgFlag MG_FLAGS[] = {
    {"data", MG_STR, MG_OFF(data), 0, 0, "token shard (standalone mode) or - for frames on stdin (proxy mode)"},
    {"ckpt-dir", MG_STR, MG_OFF(ckpt_dir), 0, 0, "checkpoint directory (default checkpoints)"},
    {"resume", MG_STR, MG_OFF(resume), 0, 0, "checkpoint to load, or 'latest' (newest valid in --ckpt-dir)"},
    {"ckpt-every", MG_INT, MG_OFF(ckpt_every), 0, 1 << 30, "periodic checkpoint every N steps, 0 = off (default 100)"},
    {"ckpt-every-seconds", MG_FLOAT, MG_OFF(ckpt_every_seconds), 0, 0, "also checkpoint when S seconds have passed since the last one started, 0 = off (default 0)"},
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
    {"lr", MG_FLOAT, MG_OFF(lr), 0, 0, "peak learning rate, > 0 (default 6e-4)"},
    {"min-lr", MG_FLOAT, MG_OFF(min_lr), 0, 0, "the rate a decaying schedule ends at (default 6e-5)"},
    {"lr-schedule", MG_STR, MG_OFF(lr_schedule), 0, 0, "after warmup: cosine, wsd (stable, then linear decay over --decay-fraction), constant or linear (default cosine)"},
    {"decay-fraction", MG_FLOAT, MG_OFF(decay_fraction), 0, 0, "wsd: the final fraction of --steps that decays to --min-lr, in (0, 1] (default 0.2)"},
    {"beta1", MG_FLOAT, MG_OFF(beta1), 0, 0, "AdamW beta1 (default 0.9)"},
    {"beta2", MG_FLOAT, MG_OFF(beta2), 0, 0, "AdamW beta2 (default 0.95)"},
    {"eps", MG_FLOAT, MG_OFF(eps), 0, 0, "AdamW epsilon (default 1e-8)"},
    {"weight-decay", MG_FLOAT, MG_OFF(weight_decay), 0, 0, "decoupled weight decay on 2-D tensors (default 0.1)"},
    {"grad-clip", MG_FLOAT, MG_OFF(grad_clip), 0, 0, "global-norm gradient clip, 0 = off (default 1.0)"},
    {"seed", MG_U64, MG_OFF(seed), 0, 0, "initialisation and standalone sampling seed (default 1337)"},
    {"threads", MG_INT, MG_OFF(threads), 0, 4096, "CPU threads, 0 = all cores (default 0)"},
    {"precision", MG_STR, MG_OFF(precision), 0, 0, "fp32, bf16 (CUDA engine) or fp8 (CPU engine: the linear layers' GEMMs through FP8); default fp32 on CPU"},
    {"attention", MG_STR, MG_OFF(attention), 0, 0, MG_ATTENTION_PATHS ": the CUDA engine's attention (default naive; flash and cudnn are bf16; auto: the fastest that applies, unqualified)"},
    {"fused", MG_STR, MG_OFF(fused), 0, 0, "on or off: the CUDA engine's fused step kernels, no host sync inside a step (default off)"},
    {"cuda-graph", MG_STR, MG_OFF(cuda_graph), 0, 0, "on or off: the CUDA engine's training step as one CUDA graph; on implies --fused on (default off)"},
    {"meta", MG_STR, MG_OFF(meta), 0, 0, "JSON value (up to 4096 bytes) stored in checkpoint trailers"},
    {"dump-grads", MG_STR, MG_OFF(dump_grads), 0, 0, "write a step's raw gradients (f32[n_params]) here and exit"},
    {"dump-grads-step", MG_INT, MG_OFF(dump_grads_step), 1, 0x7fffffff, "the step --dump-grads writes, counted from the start or resume (default 1)"},
    {"dump-logits", MG_STR, MG_OFF(dump_logits), 0, 0, "each SAMPLE frame appends the logits it picked from (f32[count, max_new, vocab]) here"},
    {"allow-hparam-change", MG_BOOL, MG_OFF(allow_hparam_change), 0, 0, "on resume, accept optimizer flags that differ from the checkpoint"},
    {"sample-recompute", MG_BOOL, MG_OFF(sample_recompute), 0, 0, "sample without the KV cache, recomputing the window per token (tests, benchmarks, the verified path)"},
    {"sync-snapshot", MG_BOOL, MG_OFF(sync_snapshot), 0, 0, "CUDA engine: copy a checkpoint's state from the GPU before training on, not asynchronously (the verified path)"},
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
    cfg->lr_schedule = MG_SCHEDULES[0]; cfg->decay_fraction = 0.2f;
    cfg->seed = 1337;
    cfg->precision = NULL;  // engine default
    cfg->dump_grads_step = 1;
}

// --version: the engine's version, kind, the source it was built from and
// the compiler (`proxy --version` prints it beside the package's version).
static void mg_print_version(FILE *f) {
#if defined(__CUDACC__)
    fprintf(f, "microgpt engine %s (cuda; source %s; nvcc %d.%d)\n", MG_VERSION, MG_SOURCE, __CUDACC_VER_MAJOR__,
            __CUDACC_VER_MINOR__);
#elif defined(__VERSION__)
    fprintf(f, "microgpt engine %s (cpu; source %s; cc %s)\n", MG_VERSION, MG_SOURCE, __VERSION__);
#else
    fprintf(f, "microgpt engine %s (cpu; source %s)\n", MG_VERSION, MG_SOURCE);
#endif
}

static void mg_usage(const char *prog, FILE *f) {
    fprintf(f, "usage: %s --data FILE|- [flags]\n\nflags:\n", prog);
    for (size_t i = 0; i < MG_NFLAGS; i++)
        fprintf(f, "  --%-20s %s\n", MG_FLAGS[i].name, MG_FLAGS[i].help);
    fprintf(f, "  --%-20s %s\n", "help", "print this and exit");
    fprintf(f, "  --%-20s %s\n", "version", "print the engine's version and build, and exit");
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
    // lr > 0, as the experiment schema (proxy/config/experiment.py) requires.
    if (cfg->lr <= 0) mg_fail(MG_EXIT_USAGE, "--lr must be > 0");
    if (cfg->min_lr < 0) mg_fail(MG_EXIT_USAGE, "--min-lr must be >= 0");
    if (mg_schedule_code(cfg->lr_schedule) < 0)
        mg_fail(MG_EXIT_USAGE, "--lr-schedule: '%s' is not cosine, wsd, constant or linear", cfg->lr_schedule);
    if (!(cfg->decay_fraction > 0 && cfg->decay_fraction <= 1)) mg_fail(MG_EXIT_USAGE, "--decay-fraction must be in (0, 1]");
    if (cfg->beta1 < 0 || cfg->beta1 >= 1) mg_fail(MG_EXIT_USAGE, "--beta1 must be in [0, 1)");
    if (cfg->beta2 < 0 || cfg->beta2 >= 1) mg_fail(MG_EXIT_USAGE, "--beta2 must be in [0, 1)");
    if (cfg->eps <= 0) mg_fail(MG_EXIT_USAGE, "--eps must be > 0");
    if (cfg->weight_decay < 0) mg_fail(MG_EXIT_USAGE, "--weight-decay must be >= 0");
    if (cfg->grad_clip < 0) mg_fail(MG_EXIT_USAGE, "--grad-clip must be >= 0");
    if (cfg->ckpt_every_seconds < 0) mg_fail(MG_EXIT_USAGE, "--ckpt-every-seconds must be >= 0");
    if (cfg->precision && strcmp(cfg->precision, "fp32") && strcmp(cfg->precision, "bf16") &&
        strcmp(cfg->precision, "fp8"))
        mg_fail(MG_EXIT_USAGE, "--precision: '%s' is not fp32, bf16 or fp8", cfg->precision);
    if (cfg->attention && strcmp(cfg->attention, "naive") && strcmp(cfg->attention, "flash") &&
        strcmp(cfg->attention, "cudnn") && strcmp(cfg->attention, "auto"))
        mg_fail(MG_EXIT_USAGE, "--attention: '%s' is not naive, flash, cudnn or auto", cfg->attention);
    if (cfg->fused && strcmp(cfg->fused, "on") && strcmp(cfg->fused, "off"))
        mg_fail(MG_EXIT_USAGE, "--fused: '%s' is not on or off", cfg->fused);
    if (cfg->cuda_graph && strcmp(cfg->cuda_graph, "on") && strcmp(cfg->cuda_graph, "off"))
        mg_fail(MG_EXIT_USAGE, "--cuda-graph: '%s' is not on or off", cfg->cuda_graph);
    double n = (double)cfg->vocab * cfg->dim + (double)cfg->ctx * cfg->dim +
               (double)cfg->layers * (12.0 * cfg->dim * cfg->dim + 13.0 * cfg->dim) + 2.0 * cfg->dim;
    if (n > 2147483647.0) mg_fail(MG_EXIT_USAGE, "model too large: %.0f parameters do not fit the int32 n_params field", n);
}

// --help and --version answer and exit 0 before anything else, the job too:
// under mpirun a rank that joined the job (MPI_Init) and exits without
// leaving it fails the launch.
static void mg_answer_info_flags(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) { mg_usage(argv[0], stdout); exit(0); }
        if (strcmp(argv[i], "--version") == 0) { mg_print_version(stdout); exit(0); }
    }
}

// The flags of a run (after mg_answer_info_flags).
static void mg_parse_args(MgConfig *cfg, int argc, char **argv) {
    mg_defaults(cfg);
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
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

static void mg_print_config(const MgConfig *c) {
    printf("\"config\":{\"vocab\":%d,\"ctx\":%d,\"dim\":%d,\"layers\":%d,\"heads\":%d,\"batch\":%d,\"grad_accum\":%d,"
           "\"steps\":%d,\"warmup\":%d,\"lr\":", c->vocab, c->ctx, c->dim, c->layers, c->heads, c->batch, c->grad_accum, c->steps, c->warmup);
    mg_json_float(stdout, c->lr); fputs(",\"min_lr\":", stdout);
    mg_json_float(stdout, c->min_lr); fputs(",\"lr_schedule\":", stdout);
    mg_json_string(stdout, c->lr_schedule); fputs(",\"decay_fraction\":", stdout);
    mg_json_float(stdout, c->decay_fraction); fputs(",\"beta1\":", stdout);
    mg_json_float(stdout, c->beta1); fputs(",\"beta2\":", stdout);
    mg_json_float(stdout, c->beta2); fputs(",\"eps\":", stdout);
    mg_json_float(stdout, c->eps); fputs(",\"weight_decay\":", stdout);
    mg_json_float(stdout, c->weight_decay); fputs(",\"grad_clip\":", stdout);
    mg_json_float(stdout, c->grad_clip);
    printf(",\"seed\":%llu,\"ckpt_every\":%d,\"ckpt_every_seconds\":", (unsigned long long)c->seed, c->ckpt_every);
    mg_json_float(stdout, c->ckpt_every_seconds);
    fputs(",\"ckpt_dir\":", stdout);
    mg_json_string(stdout, c->ckpt_dir);
    fputc('}', stdout);
}

#endif  // MICROGPT_CONFIG_H

// common.h: what every other header uses: exit codes, the one-line error
// (stderr plus an `error` event), JSON output helpers, checked allocation and
// the monotonic clock.
//
// Every header in microgpt/ includes this one before any system header, so
// _GNU_SOURCE (ppoll, pipe2) is defined first in every translation unit. The
// headers are written in the common subset of C11 and C++17 so nvcc can
// include them.
#ifndef MICROGPT_COMMON_H
#define MICROGPT_COMMON_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE  // ppoll, pipe2
#endif

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define MG_VERSION "0.1.0"
// The source the binary was built from (`git describe --always --dirty` at
// build time; the Makefile passes it), shown by --version.
#ifndef MG_SOURCE
#define MG_SOURCE "unknown"
#endif

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

// What mg_fail runs before it reports. The driver points it at a function
// that finishes the checkpoint write in flight (and announces it if it
// completed), so no complete file goes unannounced, no temp file is left
// behind, and the `error` event stays the last line the engine prints.
typedef struct {
    void (*fn)(void *ctx);
    void *ctx;
} MgFailHook;
static MgFailHook mg_fail_hook = {NULL, NULL};

static void mg_fail(int code, const char *fmt, ...) {
    if (mg_fail_hook.fn) {
        MgFailHook hook = mg_fail_hook;
        mg_fail_hook.fn = NULL;  // once: a failure inside the hook reports at once
        hook.fn(hook.ctx);
    }
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

#endif  // MICROGPT_COMMON_H

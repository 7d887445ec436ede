// sampler.h: sampling completions of a prompt for the SAMPLE frame: picking
// a token from logits (greedy, temperature, top-k) and the generation loop.
#ifndef MICROGPT_SAMPLER_H
#define MICROGPT_SAMPLER_H

#include "engine.h"
#include "model.h"
#include "protocol.h"

#include <string.h>

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

// --dump-logits: appends one SAMPLE frame's logits, f32[count, max_new, V],
// to the file (created empty at start-up), before the `sample` event is
// printed, so a reader that saw the event sees the whole frame's logits.
static void mg_append_logits(const char *path, const float *logits, size_t n) {
    FILE *f = fopen(path, "ab");
    if (!f || fwrite(logits, sizeof(float), n, f) != n || fclose(f))
        mg_fail(MG_EXIT_IO, "cannot write logits to %s: %s", path, strerror(errno));
}

// Samples p->count completions of prompt, B (= --batch) at a time, and
// prints the `sample` event; step is the engine's step, echoed in the event.
static void mg_sample(MgEngine *eng, const MgConfig *cfg, int step, uint64_t id, const MgSampleParams *p,
                      const uint16_t *prompt) {
    int B = cfg->batch, T = cfg->ctx, V = cfg->vocab;
    double t0 = mg_now_ms();
    size_t cap = (size_t)p->n_prompt + p->max_new;
    uint16_t *seqs = (uint16_t *)mg_malloc((size_t)p->count * cap * sizeof(uint16_t));
    uint16_t *window = (uint16_t *)mg_malloc((size_t)B * T * sizeof(uint16_t));
    float *logits = (float *)mg_malloc((size_t)B * V * sizeof(float));
    double *probs = (double *)mg_malloc((size_t)V * sizeof(double));
    float *scratch = (float *)mg_malloc((size_t)V * sizeof(float));
    float *dump = cfg->dump_logits ? (float *)mg_malloc((size_t)p->count * p->max_new * V * sizeof(float)) : NULL;
    for (uint32_t s = 0; s < p->count; s++) memcpy(seqs + s * cap, prompt, p->n_prompt * sizeof(uint16_t));
    for (uint32_t s0 = 0; s0 < p->count; s0 += (uint32_t)B) {
        int rows = (int)(p->count - s0 < (uint32_t)B ? p->count - s0 : (uint32_t)B);
        for (uint32_t j = 0; j < p->max_new; j++) {
            size_t len = p->n_prompt + j;
            int win = len < (size_t)T ? (int)len : T;
            for (int r = 0; r < rows; r++)
                memcpy(window + (size_t)r * win, seqs + (s0 + r) * cap + len - win, win * sizeof(uint16_t));
            eng->last_logits(eng->impl, window, rows, win, logits);
            for (int r = 0; dump && r < rows; r++)
                memcpy(dump + ((size_t)(s0 + r) * p->max_new + j) * V, logits + (size_t)r * V, (size_t)V * sizeof(float));
            for (int r = 0; r < rows; r++)
                seqs[(s0 + r) * cap + len] = (uint16_t)mg_pick_token(logits + (size_t)r * V, V, p, s0 + r, j, probs, scratch);
        }
    }
    if (dump) mg_append_logits(cfg->dump_logits, dump, (size_t)p->count * p->max_new * V);
    printf("{\"event\":\"sample\",\"id\":%llu,\"step\":%d,\"tokens\":[", (unsigned long long)id, step);
    for (uint32_t s = 0; s < p->count; s++) {
        fputs(s ? ",[" : "[", stdout);
        for (uint32_t j = 0; j < p->max_new; j++) printf(j ? ",%u" : "%u", seqs[s * cap + p->n_prompt + j]);
        fputc(']', stdout);
    }
    printf("],\"ms\":%.3f}\n", mg_now_ms() - t0);
    fflush(stdout);
    free(seqs); free(window); free(logits); free(probs); free(scratch); free(dump);
}

#endif  // MICROGPT_SAMPLER_H

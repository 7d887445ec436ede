// sampler.h: the SAMPLE frame's completions: picking a token from logits
// (greedy, temperature, top-k) and the generation loop, through the engine's
// KV cache where it has one, else by recomputing the window for every token.
#ifndef MICROGPT_SAMPLER_H
#define MICROGPT_SAMPLER_H

#include "engine.h"
#include "model.h"
#include "protocol.h"
#include "signals.h"

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
static int mg_pick_token(const float *logits, int V, const MgSampleParams *p, uint64_t seed, uint64_t sample,
                         uint64_t pos, double *probs, float *scratch) {
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
    double u = mg_uniform(mg_hash3(seed ^ MG_STREAM_SAMPLE, sample, pos)) * total, acc = 0;
    for (int i = 0; i < V; i++) {
        acc += probs[i];
        if (u < acc && probs[i] > 0) return i;
    }
    return best;
}

// --dump-logits: appends one SAMPLE frame's logits, f32[completions, max_new, V]
// (completions: every prompt's count, prompt after prompt),
// to the file (created empty at start-up), before the `sample` event is
// printed, so a reader that saw the event sees the whole frame's logits.
static void mg_append_logits(const char *path, const float *logits, size_t n) {
    FILE *f = fopen(path, "ab");
    if (!f || fwrite(logits, sizeof(float), n, f) != n || fclose(f))
        mg_fail(MG_EXIT_IO, "cannot write logits to %s: %s", path, strerror(errno));
}

// One completion being generated.
typedef struct {
    uint16_t *tokens;   // its prompt, then its new tokens
    uint32_t n_prompt;
    uint64_t seed;      // its prompt's seed
    uint32_t index;     // which completion of its prompt: the sample counter of the RNG
    int cached;         // leading positions whose keys and values are in its KV-cache slot
} MgCompletion;

// Scratch of the generation loop, B rows (= --batch) at a time.
typedef struct {
    int *slot, *pos, *n_new;   // [B] the rows of one kv_forward call
    uint16_t *packed;          // [B * T] their new tokens
    float *kv_logits;          // [B, V]
    int *win_rows;             // [B] the rows of one last_logits call
    uint16_t *windows;         // [B * T]
    float *win_logits;         // [B, V]
    const float **logits;      // [B] each row's logits for this position
    int *pending;              // [B] 1: still needs logits for this position
    double *probs;             // [V]
    float *scratch;            // [V]
} MgSampleScratch;

// How many trailing tokens of a sequence of len the model sees: its window.
static int mg_window(uint32_t len, int T) { return len < (uint32_t)T ? (int)len : T; }

// Logits for position len-1 of the `rows` completions at c (len = prompt +
// new so far), into s->logits. A completion within the context (len <= T)
// goes through the KV cache when use_kv: its uncached positions (the whole
// prompt at first, then the one newest token) run in one kv_forward call
// with the others. The rest, and every row when !use_kv, recompute their
// window, the last min(len, T) tokens, one last_logits call per window length.
static void mg_next_logits(MgEngine *eng, MgCompletion *c, int rows, uint32_t j, int T, int V, int use_kv,
                           MgSampleScratch *s) {
    int n_kv = 0;
    size_t packed = 0;
    for (int r = 0; r < rows; r++) {
        int len = (int)(c[r].n_prompt + j);
        s->pending[r] = !(use_kv && len <= T);
        if (s->pending[r]) continue;
        s->slot[n_kv] = r;
        s->pos[n_kv] = c[r].cached;
        s->n_new[n_kv] = len - c[r].cached;
        memcpy(s->packed + packed, c[r].tokens + c[r].cached, (size_t)s->n_new[n_kv] * sizeof(uint16_t));
        packed += (size_t)s->n_new[n_kv];
        c[r].cached = len;
        n_kv++;
    }
    if (n_kv) eng->ops->kv_forward(eng->impl, n_kv, s->slot, s->pos, s->n_new, s->packed, s->kv_logits);
    for (int i = 0; i < n_kv; i++) s->logits[s->slot[i]] = s->kv_logits + (size_t)i * V;
    int placed = 0;  // rows of win_logits filled so far
    for (int first = 0; first < rows; first++) {
        if (!s->pending[first]) continue;
        int win = mg_window(c[first].n_prompt + j, T), n_win = 0;
        for (int r = first; r < rows; r++) {
            uint32_t len = c[r].n_prompt + j;
            if (!s->pending[r] || mg_window(len, T) != win) continue;
            memcpy(s->windows + (size_t)n_win * win, c[r].tokens + len - win, (size_t)win * sizeof(uint16_t));
            s->win_rows[n_win++] = r;
            s->pending[r] = 0;
        }
        float *out = s->win_logits + (size_t)placed * V;
        eng->ops->last_logits(eng->impl, s->windows, n_win, win, out);
        for (int i = 0; i < n_win; i++) s->logits[s->win_rows[i]] = out + (size_t)i * V;
        placed += n_win;
    }
}

// The completions of a SAMPLE frame: each prompt's count, prompt after
// prompt, generated B (= --batch) at a time as the rows of one batch, then
// one `sample` event (step: the engine's step) listing them in that order.
// Completion k of a prompt draws from (its prompt's seed, k, position), so a
// completion does not depend on which others share its frame or batch.
// A stop (SIGTERM, SIGINT) is looked at between sampled tokens: an audit can
// take minutes, and a stop must be answered within one token's forward pass.
// The audit is then abandoned (no event; the proxy asks again after the
// resume) and 0 returned; 1 when the event was printed.
static int mg_sample(MgEngine *eng, const MgConfig *cfg, int step, uint64_t id, const MgSampleRequest *req) {
    const MgSampleParams *p = &req->params;
    int B = cfg->batch, T = cfg->ctx, V = cfg->vocab;
    int use_kv = eng->caps.kv_forward && !cfg->sample_recompute;
    double t0 = mg_now_ms();
    uint32_t n = req->total_count;
    MgCompletion *c = (MgCompletion *)mg_calloc(n, sizeof(MgCompletion));
    const uint16_t *prompt = req->tokens;
    for (uint32_t i = 0, k = 0; i < p->n_prompts; i++) {
        const MgSamplePrompt *q = &req->prompts[i];
        for (uint32_t index = 0; index < q->count; index++, k++) {
            c[k].tokens = (uint16_t *)mg_malloc(((size_t)q->n_tokens + p->max_new) * sizeof(uint16_t));
            memcpy(c[k].tokens, prompt, (size_t)q->n_tokens * sizeof(uint16_t));
            c[k].n_prompt = q->n_tokens;
            c[k].seed = q->seed;
            c[k].index = index;
        }
        prompt += q->n_tokens;
    }
    MgSampleScratch s;
    s.slot = (int *)mg_malloc((size_t)B * sizeof(int));
    s.pos = (int *)mg_malloc((size_t)B * sizeof(int));
    s.n_new = (int *)mg_malloc((size_t)B * sizeof(int));
    s.packed = (uint16_t *)mg_malloc((size_t)B * T * sizeof(uint16_t));
    s.kv_logits = (float *)mg_malloc((size_t)B * V * sizeof(float));
    s.win_rows = (int *)mg_malloc((size_t)B * sizeof(int));
    s.windows = (uint16_t *)mg_malloc((size_t)B * T * sizeof(uint16_t));
    s.win_logits = (float *)mg_malloc((size_t)B * V * sizeof(float));
    s.logits = (const float **)mg_malloc((size_t)B * sizeof(float *));
    s.pending = (int *)mg_malloc((size_t)B * sizeof(int));
    s.probs = (double *)mg_malloc((size_t)V * sizeof(double));
    s.scratch = (float *)mg_malloc((size_t)V * sizeof(float));
    float *dump = cfg->dump_logits ? (float *)mg_malloc((size_t)n * p->max_new * V * sizeof(float)) : NULL;
    int done = 1;
    for (uint32_t s0 = 0; s0 < n && done; s0 += (uint32_t)B) {
        int rows = (int)(n - s0 < (uint32_t)B ? n - s0 : (uint32_t)B);
        MgCompletion *batch = c + s0;
        for (uint32_t j = 0; j < p->max_new; j++) {
            if (mg_stop_requested) { done = 0; break; }
            mg_next_logits(eng, batch, rows, j, T, V, use_kv, &s);
            for (int r = 0; r < rows; r++)
                batch[r].tokens[batch[r].n_prompt + j] = (uint16_t)mg_pick_token(
                    s.logits[r], V, p, batch[r].seed, batch[r].index, j, s.probs, s.scratch);
            for (int r = 0; dump && r < rows; r++)
                memcpy(dump + ((size_t)(s0 + r) * p->max_new + j) * V, s.logits[r], (size_t)V * sizeof(float));
        }
    }
    if (done && dump) mg_append_logits(cfg->dump_logits, dump, (size_t)n * p->max_new * V);
    if (done) {
        printf("{\"event\":\"sample\",\"id\":%llu,\"step\":%d,\"tokens\":[", (unsigned long long)id, step);
        for (uint32_t k = 0; k < n; k++) {
            fputs(k ? ",[" : "[", stdout);
            for (uint32_t j = 0; j < p->max_new; j++) printf(j ? ",%u" : "%u", c[k].tokens[c[k].n_prompt + j]);
            fputc(']', stdout);
        }
        printf("],\"ms\":%.3f}\n", mg_now_ms() - t0);
        fflush(stdout);
    }
    for (uint32_t k = 0; k < n; k++) free(c[k].tokens);
    free(c);
    free(s.slot); free(s.pos); free(s.n_new); free(s.packed); free(s.kv_logits); free(s.win_rows);
    free(s.windows); free(s.win_logits); free(s.logits); free(s.pending); free(s.probs); free(s.scratch); free(dump);
    return done;
}

#endif  // MICROGPT_SAMPLER_H

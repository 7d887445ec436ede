// cpu_ops.c: the CPU engine's ops, from microgpt_cpu.c itself, for the
// kernel checks to compare with. The engine's main() is renamed away; the
// entry points below only supply the scratch an op takes (one thread: the
// engine's results do not depend on the thread count).
#define main microgpt_cpu_engine_main
#include "../../microgpt/microgpt_cpu.c"
#undef main

// Packing buffers, 64-byte aligned as the engine's (the micro-kernel's aligned loads need it).
static float *buffer(size_t count) {
    float *p = (float *)aligned_alloc(64, (count * sizeof(float) + 63) & ~(size_t)63);
    if (!p) mg_fail(MG_EXIT_IO, "out of memory");
    memset(p, 0, count * sizeof(float));
    return p;
}

static GemmScratch *scratch(void) {
    static GemmScratch gs;
    static float *apack;
    if (!gs.bpack) {
        gs.threads = 1;
        gs.bpack = buffer((size_t)KC * NC);
        apack = buffer((size_t)MC * KC);
        gs.apack = &apack;
    }
    return &gs;
}

static AttentionScratch attention_scratch(int T) {
    static GemmThreadBuffers buf;
    static float *dscores;
    static int cap;
    if (!buf.bpack) {
        buf.bpack = buffer((size_t)KC * NC);
        buf.apack = buffer((size_t)MC * KC);
    }
    if (T * T > cap) {
        free(dscores);
        cap = T * T;
        dscores = buffer((size_t)cap);
    }
    AttentionScratch as = {&buf, dscores, 1};
    return as;
}

void cpu_embedding_forward(float *x0, const int *inputs, const float *wte, const float *wpe, int BT, int T, int C) {
    embedding_forward(x0, inputs, wte, wpe, BT, T, C, NULL, 1);
}
void cpu_embedding_backward(float *dwte, float *dwpe, const float *dx, const int *inputs, int BT, int T, int C) {
    embedding_backward(dwte, dwpe, dx, inputs, BT, T, C, 1);
}
void cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *x, const float *w, const float *b, int R,
                           int C) {
    layernorm_forward(out, mean, rstd, x, w, b, R, C, 1);
}
void cpu_layernorm_backward(float *dx, float *dw, float *db, const float *dout, const float *x, const float *w,
                            const float *mean, const float *rstd, int R, int C, int accumulate) {
    layernorm_backward(dx, dw, db, dout, x, w, mean, rstd, R, C, accumulate, 1);
}
void cpu_matmul_forward(float *out, const float *x, const float *W, const float *bias, const float *residual, int R,
                        int IC, int OC, float *gelu_pre) {
    matmul_forward(out, x, W, bias, residual, R, IC, OC, gelu_pre, scratch());
}
void cpu_matmul_backward(float *dx, float *dW, float *db, const float *dout, const float *x, const float *W, int R,
                         int IC, int OC, const float *gelu_pre) {
    matmul_backward(dx, dW, db, dout, x, W, R, IC, OC, gelu_pre, scratch());
}
void cpu_gelu_forward(float *out, const float *x, size_t n) { gelu_forward(out, x, n, 1); }
void cpu_fp8_round_trip(float *dst, const float *src, size_t n, int fmt) {
    fp8_round_trip(dst, src, n, (MgFp8Format)fmt, 1);
}
void cpu_gelu_backward(float *dx, const float *x, const float *dout, size_t n) { gelu_backward(dx, x, dout, n, 1); }
void cpu_attention_forward(float *y, float *att, const float *qkv, int B, int T, int C, int H) {
    AttentionScratch as = attention_scratch(T);
    attention_forward(y, att, qkv, B, T, C, H, &as);
}
void cpu_attention_backward(float *dqkv, const float *dy, const float *qkv, const float *att, int B, int T, int C,
                            int H) {
    AttentionScratch as = attention_scratch(T);
    attention_backward(dqkv, dy, qkv, att, B, T, C, H, &as);
}
void cpu_fused_classifier(float *logits, float *losses, const int *targets, int BT, int V, float grad_scale,
                          int write_grad) {
    fused_classifier(logits, losses, targets, BT, V, grad_scale, write_grad, 1);
}
double cpu_global_norm(const float *g, size_t n) { return global_norm(g, n, 1); }
// AdamW over the parameters of a (V, T, C, L) model, with its decay ranges.
void cpu_adamw_update(float *params, const float *grads, float *m, float *v, int V, int T, int C, int L,
                      float grad_mult, float lr, float beta1, float beta2, float eps, float weight_decay, int step) {
    MgLayout lay = mg_layout(V, T, C, L);
    MgRange *ranges = (MgRange *)mg_malloc((4 + 12 * (size_t)L) * sizeof(MgRange));
    int n = mg_decay_ranges(&lay, L, ranges);
    adamw_update(params, grads, m, v, ranges, n, grad_mult, lr, beta1, beta2, eps, weight_decay, step, 1);
    free(ranges);
}

// kernels_sampling.cpp: the checks of sampling's forward on the GPU
// (microgpt/cuda/sampling.cuh): each kernel against a float64 reference, the
// row-locality the KV cache rests on (a row's outputs have the same bits
// alone or among others), and the whole forward: a small model's logits
// against the CPU engine's ops, and the KV-cache path (a prompt, then one
// token at a time) against the recompute path (every position again) bit for
// bit, as the engine's kv_forward contract asks.
//
// Compiled inside kernels_ops.cpp (included at its end), as kernels_fused.cpp.
#include "cuda_on_cpu.h"

#include "../../microgpt/cuda/sampling.cuh"

#include "cases.h"

using namespace check;

template <typename T> static bool bits_equal(const T *a, const T *b, size_t n) { return memcmp(a, b, n * sizeof(T)) == 0; }

static double gelu64(double v) { return 0.5 * v * (1.0 + tanh(MG_GELU_SCALE * (v + MG_GELU_C * v * v * v))); }

// ----------------------------------------------------------------------------
// The matmul: 7 rows (a partial row group), IC = 72 (16-byte chunks that
// leave lanes idle), OC = 37 (a partial block of warps); bias, residual and
// GELU each; then every row again alone, which must give the same bits.

template <typename Tx, typename To> static void sample_matmul_case(Run &run, bool residual, bool gelu) {
    const int N = 7, IC = 72, OC = 37;
    Rng rng(51 + residual + 2 * gelu);
    std::vector<float> x = normals(rng, (size_t)N * IC), W = normals(rng, (size_t)OC * IC, 0.2f);
    std::vector<float> bias = normals(rng, OC, 0.1f), res = normals(rng, (size_t)N * OC);
    Tx *d_x = upload<Tx>(run, x, "x"), *d_W = upload<Tx>(run, W, "W");
    Tx *d_res = residual ? upload<Tx>(run, res, "residual") : nullptr;
    float *d_bias = upload<float>(run, bias, "bias");
    To *out = run.device<To>((size_t)N * OC, "out"), *alone = run.device<To>((size_t)N * OC, "alone");
    sample_matmul<Tx, To>(out, d_x, d_W, d_bias, d_res, N, IC, OC, gelu, nullptr);
    for (int r = 0; r < N; r++)
        sample_matmul<Tx, To>(alone + (size_t)r * OC, d_x + (size_t)r * IC, d_W, d_bias,
                              d_res ? d_res + (size_t)r * OC : nullptr, 1, IC, OC, gelu, nullptr);
    std::vector<double> ref((size_t)N * OC);
    for (int r = 0; r < N; r++)
        for (int o = 0; o < OC; o++) {
            double v = bias[o];
            for (int k = 0; k < IC; k++) v += (double)x[(size_t)r * IC + k] * W[(size_t)o * IC + k];
            if (residual) v += res[(size_t)r * OC + o];
            ref[(size_t)r * OC + o] = gelu ? gelu64(v) : v;
        }
    run.compare("out", result(run, "out", out, ref.size()), ref, OC, bound<To>(), row_bound<To>());
    if (!bits_equal(out, alone, (size_t)N * OC)) run.fail("a row's outputs alone differ from the same row among 7");
}

// ----------------------------------------------------------------------------
// The embedding at explicit positions: exactly the sum of the two rows.

template <typename Tx> static void embedding_at_case(Run &run) {
    const int N = 11, C = 24, V = 29, T = 17;
    Rng rng(53);
    std::vector<int> tokens(N), positions(N);
    for (int i = 0; i < N; i++) { tokens[i] = rng.below(V); positions[i] = rng.below(T); }
    std::vector<float> wte = normals(rng, (size_t)V * C), wpe = normals(rng, (size_t)T * C);
    float *d_wte = upload<float>(run, wte, "wte"), *d_wpe = upload<float>(run, wpe, "wpe");
    Tx *x = run.device<Tx>((size_t)N * C, "x");
    LAUNCH(ceil_div((size_t)N * C, 256), 256, 0, nullptr, embedding_at_kernel<Tx>)(
        x, upload_ints(run, tokens, "tokens"), upload_ints(run, positions, "positions"), d_wte, d_wpe, N, C);
    run.output("x", x, (size_t)N * C * sizeof(Tx));
    for (int i = 0; i < N; i++)
        for (int c = 0; c < C; c++) {
            Tx want = from_float<Tx>(wte[(size_t)tokens[i] * C + c] + wpe[(size_t)positions[i] * C + c]);
            if (memcmp(&want, &x[(size_t)i * C + c], sizeof want)) {
                run.fail("row %d col %d: %g, not %g", i, c, (double)value(x[(size_t)i * C + c]), (double)value(want));
                return;
            }
        }
}

// ----------------------------------------------------------------------------
// The cache and the attention against it: 2 slots of T = 1100 positions (more
// than one SAMPLE_KEYS chunk), 2 heads of 16; queries at positions 5, 1099
// and 1030 (the last two over two chunks) read keys 0..p of their slot.

template <typename Tx> static void attention_sample_case(Run &run) {
    const int T = 1100, H = 2, hd = 16, C = H * hd, slots = 2;
    const int N = 3, qpos[N] = {5, 1099, 1030}, qslot[N] = {0, 1, 0};
    Rng rng(55);
    // Every position of both slots, as qkv rows: the cache is filled by kv_store_kernel from them.
    std::vector<float> all = normals(rng, (size_t)slots * T * 3 * C);
    Tx *d_all = upload<Tx>(run, all, "qkv_all");
    std::vector<int> fill_slot(slots * T), fill_pos(slots * T);
    for (int s = 0; s < slots; s++)
        for (int t = 0; t < T; t++) { fill_slot[s * T + t] = s; fill_pos[s * T + t] = t; }
    Tx *cache = run.device<Tx>((size_t)slots * T * 3 * C, "cache");
    LAUNCH(ceil_div((size_t)slots * T * 2 * C, 256), 256, 0, nullptr, kv_store_kernel<Tx>)(
        cache, d_all, upload_ints(run, fill_slot, "fill_slots"), upload_ints(run, fill_pos, "fill_positions"),
        slots * T, C, T);
    // The queries: the q third of the rows at those positions.
    std::vector<float> q((size_t)N * 3 * C);
    for (int i = 0; i < N; i++)
        for (int c = 0; c < 3 * C; c++) q[(size_t)i * 3 * C + c] = all[((size_t)qslot[i] * T + qpos[i]) * 3 * C + c];
    Tx *d_q = upload<Tx>(run, q, "qkv");
    Tx *y = run.device<Tx>((size_t)N * C, "y");
    float scale = 1.0f / sqrtf((float)hd);
    LAUNCH(dim3(N, H), SAMPLE_ATT_THREADS, 0, nullptr, attention_sample_kernel<Tx>)(
        y, d_q, cache, upload_ints(run, std::vector<int>(qslot, qslot + N), "slots"),
        upload_ints(run, std::vector<int>(qpos, qpos + N), "positions"), C, H, T, scale);
    std::vector<double> ref((size_t)N * C);
    for (int i = 0; i < N; i++)
        for (int h = 0; h < H; h++) {
            int p = qpos[i];
            std::vector<double> s(p + 1);
            double mx = -INFINITY, sum = 0;
            for (int j = 0; j <= p; j++) {
                double dot = 0;
                for (int d = 0; d < hd; d++)
                    dot += (double)q[(size_t)i * 3 * C + h * hd + d] * all[((size_t)qslot[i] * T + j) * 3 * C + C + h * hd + d];
                s[j] = dot * scale;
                mx = std::max(mx, s[j]);
            }
            for (int j = 0; j <= p; j++) sum += s[j] = exp(s[j] - mx);
            for (int d = 0; d < hd; d++) {
                double o = 0;
                for (int j = 0; j <= p; j++) o += s[j] * all[((size_t)qslot[i] * T + j) * 3 * C + 2 * C + h * hd + d];
                ref[(size_t)i * C + h * hd + d] = o / sum;
            }
        }
    run.compare("y", result(run, "y", y, ref.size()), ref, C, bound<Tx>(), row_bound<Tx>());
}

// ----------------------------------------------------------------------------
// The whole forward of a small model (V = 61, T = 24, C = 32, H = 2, L = 2):
// two sequences (prompts of 5 and 3 tokens, then 4 generated tokens each).
// The KV-cache path (the prompts in one call, then one token per sequence per
// call) and the recompute path (every position again, in scratch slots) must
// give the same logits bit for bit at every step, and the logits must match
// the CPU engine's ops (a forward assembled from them, in fp32).

struct SmallModel {
    static const int V = 61, T = 24, C = 32, H = 2, L = 2;
};

// The CPU engine's forward of one sequence (its ops from cpu_ops.c): the
// logits of its last position.
static std::vector<float> cpu_last_logits(const std::vector<float> &P, const MgLayout &lay, const std::vector<int> &tok) {
    const int V = SmallModel::V, C = SmallModel::C, H = SmallModel::H, L = SmallModel::L, n = (int)tok.size();
    std::vector<float> x((size_t)n * C), ln((size_t)n * C), qkv((size_t)n * 3 * C), att((size_t)H * n * n),
        y((size_t)n * C), x2((size_t)n * C), pre((size_t)n * 4 * C), h((size_t)n * 4 * C), x3((size_t)n * C),
        mean(n), rstd(n);
    cpu_embedding_forward(x.data(), tok.data(), &P[lay.wte], &P[lay.wpe], n, n, C);
    for (int l = 0; l < L; l++) {
        auto at = [&](int t) { return &P[mg_param(&lay, l, t)]; };
        cpu_layernorm_forward(ln.data(), mean.data(), rstd.data(), x.data(), at(MG_LN1W), at(MG_LN1B), n, C);
        cpu_matmul_forward(qkv.data(), ln.data(), at(MG_QKVW), at(MG_QKVB), nullptr, n, C, 3 * C, nullptr);
        cpu_attention_forward(y.data(), att.data(), qkv.data(), 1, n, C, H);
        cpu_matmul_forward(x2.data(), y.data(), at(MG_PROJW), at(MG_PROJB), x.data(), n, C, C, nullptr);
        cpu_layernorm_forward(ln.data(), mean.data(), rstd.data(), x2.data(), at(MG_LN2W), at(MG_LN2B), n, C);
        cpu_matmul_forward(h.data(), ln.data(), at(MG_FCW), at(MG_FCB), nullptr, n, C, 4 * C, pre.data());
        cpu_matmul_forward(x3.data(), h.data(), at(MG_FCPROJW), at(MG_FCPROJB), x2.data(), n, 4 * C, C, nullptr);
        x = x3;
    }
    std::vector<float> last(x.end() - C, x.end()), lnl(C), logits(V), m1(1), r1(1), no_bias(V, 0.0f);
    cpu_layernorm_forward(lnl.data(), m1.data(), r1.data(), last.data(), &P[lay.lnfw], &P[lay.lnfb], 1, C);
    cpu_matmul_forward(logits.data(), lnl.data(), &P[lay.wte], no_bias.data(), nullptr, 1, C, V, nullptr);
    return logits;
}

template <typename Tx> static void sampling_forward_case(Run &run) {
    typedef SmallModel M;
    const int V = M::V, T = M::T, C = M::C, H = M::H, L = M::L, B = 2, steps = 4;
    MgLayout lay = mg_layout(V, T, C, L);
    Rng rng(57);
    std::vector<float> P = normals(rng, lay.n, 0.3f);
    for (int l = 0; l < L; l++)
        for (int t : {MG_LN1W, MG_LN2W})
            for (int c = 0; c < C; c++) P[mg_param(&lay, l, t) + c] += 1.0f;
    for (int c = 0; c < C; c++) P[lay.lnfw + c] += 1.0f;
    float *d_P = upload<float>(run, P, "params");  // exact in fp32
    std::vector<float> px = P;
    Tx *d_wx = upload<Tx>(run, px, "params_x");    // the compute copy; P keeps the master
    // The weights the device matmuls see are the compute copy: the CPU
    // reference uses them too (the master elsewhere), so both compute the same model.
    std::vector<float> Pref = P;
    for (int l = 0; l < L; l++)
        for (int t : {MG_QKVW, MG_PROJW, MG_FCW, MG_FCPROJW})
            for (size_t k = 0; k < lay.size[t]; k++) Pref[mg_param(&lay, l, t) + k] = px[mg_param(&lay, l, t) + k];
    for (size_t k = 0; k < (size_t)V * C; k++) Pref[lay.wte + k] = P[lay.wte + k];  // embeddings: the master

    size_t bt = (size_t)B * T, stride = bt * 3 * C;
    SampleBuffers<Tx> kv, re;
    kv.params = d_P; kv.wx = d_wx; kv.lay = lay; kv.L = L; kv.C = C; kv.H = H; kv.T = T; kv.V = V;
    kv.layer_stride = stride;
    kv.cache = run.device<Tx>(L * stride, "kv_cache");
    kv.x_a = run.device<Tx>(bt * C, "x_a"); kv.x_b = run.device<Tx>(bt * C, "x_b"); kv.x2 = run.device<Tx>(bt * C, "x2");
    kv.ln = run.device<Tx>(bt * C, "ln"); kv.att = run.device<Tx>(bt * C, "att"); kv.qkv = run.device<Tx>(bt * 3 * C, "qkv");
    kv.h = run.device<Tx>(bt * 4 * C, "h"); kv.last = run.device<Tx>(B * C, "last"); kv.last_ln = run.device<Tx>(B * C, "last_ln");
    kv.mean = run.device<float>(bt, "mean"); kv.rstd = run.device<float>(bt, "rstd");
    int *tokens = run.device<int>(bt, "tokens"), *positions = run.device<int>(bt, "positions");
    int *slots = run.device<int>(bt, "slots"), *last_rows = run.device<int>(B, "last_rows");
    kv.tokens = tokens; kv.positions = positions; kv.slots = slots; kv.last_rows = last_rows;
    re = kv;
    re.cache = run.device<Tx>(L * stride, "scratch_cache");
    float *out_kv = run.device<float>((size_t)B * V, "logits_kv"), *out_re = run.device<float>((size_t)B * V, "logits_re");

    std::vector<std::vector<int>> seq = {{3, 17, 42, 5, 60}, {9, 1, 33}};
    std::vector<int> cached = {0, 0};
    for (int step = 0; step <= steps; step++) {
        // KV path: the uncached positions of both sequences in one call.
        int N = 0;
        for (int b = 0; b < B; b++) {
            for (int t = cached[b]; t < (int)seq[b].size(); t++, N++) { tokens[N] = seq[b][t]; positions[N] = t; slots[N] = b; }
            last_rows[b] = N - 1;
            cached[b] = (int)seq[b].size();
        }
        sampling_forward<Tx>(kv, N, B, out_kv, nullptr);
        // Recompute path: every position again.
        N = 0;
        for (int b = 0; b < B; b++) {
            for (int t = 0; t < (int)seq[b].size(); t++, N++) { tokens[N] = seq[b][t]; positions[N] = t; slots[N] = b; }
            last_rows[b] = N - 1;
        }
        sampling_forward<Tx>(re, N, B, out_re, nullptr);
        char name[64];
        snprintf(name, sizeof name, "logits_step%d", step);
        std::vector<double> got = result(run, name, out_kv, (size_t)B * V), ref;
        for (int b = 0; b < B; b++) {
            std::vector<float> want = cpu_last_logits(Pref, lay, seq[b]);
            ref.insert(ref.end(), want.begin(), want.end());
        }
        // bf16: activations rounded at each of the forward's 13 ops (about
        // 2e-3 each) against a forward entirely in fp32: 3e-2.
        run.compare(name, got, ref, V, sizeof(Tx) == 4 ? FP32_BOUND : 3e-2, row_bound<Tx>());
        if (!bits_equal(out_kv, out_re, (size_t)B * V))
            run.fail("step %d: the KV-cache logits differ from the recompute path's", step);
        // The next token of each sequence: the greedy pick (any fixed rule will do).
        for (int b = 0; b < B; b++) {
            int best = 0;
            for (int v = 1; v < V; v++)
                if (out_kv[(size_t)b * V + v] > out_kv[(size_t)b * V + best]) best = v;
            seq[b].push_back(best);
        }
    }
}

// ----------------------------------------------------------------------------

template <typename Tx> static void add_sampling() {
    const char *t = type_name<Tx>();
    add_case(shape("sample_matmul", t, "N7_IC72_OC37"), [](Run &r) { sample_matmul_case<Tx, Tx>(r, false, false); });
    add_case(shape("sample_matmul", t, "N7_IC72_OC37_residual"), [](Run &r) { sample_matmul_case<Tx, Tx>(r, true, false); });
    add_case(shape("sample_matmul", t, "N7_IC72_OC37_gelu"), [](Run &r) { sample_matmul_case<Tx, Tx>(r, false, true); });
    add_case(shape("sample_matmul", t, "N7_IC72_OC37_fp32_out"), [](Run &r) { sample_matmul_case<Tx, float>(r, false, false); });
    add_case(shape("embedding_at", t, "N11_C24"), embedding_at_case<Tx>);
    add_case(shape("attention_sample", t, "T1100_H2_hd16"), attention_sample_case<Tx>);
    add_case(shape("sampling_forward", t, "V61_T24_C32_H2_L2"), sampling_forward_case<Tx>);
}

static int registered_sampling = [] {
    add_sampling<float>();
    add_sampling<__nv_bfloat16>();
    return 0;
}();

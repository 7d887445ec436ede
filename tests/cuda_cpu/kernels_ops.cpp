// kernels_ops.cpp: the checks of every kernel outside attention: the
// embeddings, LayerNorm, the column sums, bias and residual, GELU, the
// classifier, the norm, AdamW, the convert and the FP8 amax and cast. Sizes are never multiples of
// the block sizes or the row chunks; every templated kernel runs in fp32 and
// bf16.
#include "cuda_on_cpu.h"

#include "../../microgpt/cuda/adamw.cuh"
#include "../../microgpt/cuda/bias.cuh"
#include "../../microgpt/cuda/classifier.cuh"
#include "../../microgpt/cuda/convert.cuh"
#include "../../microgpt/cuda/embedding.cuh"
#include "../../microgpt/cuda/fp8.cuh"
#include "../../microgpt/cuda/gelu.cuh"
#include "../../microgpt/cuda/global_norm.cuh"
#include "../../microgpt/cuda/layernorm.cuh"

#include "adamw_case.h"
#include "cases.h"
#include "layernorm_case.h"

using namespace check;

// ----------------------------------------------------------------------------
// Embeddings: B = 3 rows of T = 37, C = 72, a vocabulary of 61 (tokens repeat,
// some never appear).

template <typename Tx> static void embedding_case(Run &run) {
    const int B = 3, T = 37, C = 72, V = 61, BT = B * T;
    Rng rng(11);
    std::vector<int> inputs(BT);
    for (int &t : inputs) t = rng.below(V - 5);
    std::vector<float> wte = normals(rng, (size_t)V * C), wpe = normals(rng, (size_t)T * C);
    int *d_inputs = upload_ints(run, inputs, "inputs");
    float *d_wte = upload<float>(run, wte, "wte"), *d_wpe = upload<float>(run, wpe, "wpe");
    Tx *x0 = run.device<Tx>((size_t)BT * C, "x0");
    embedding_forward<Tx>(x0, d_inputs, d_wte, d_wpe, BT, T, C, nullptr);
    std::vector<float> ref((size_t)BT * C);
    cpu_embedding_forward(ref.data(), inputs.data(), wte.data(), wpe.data(), BT, T, C);
    run.compare("x0", result(run, "x0", x0, ref.size()), doubles(ref), C, bound<Tx>(), row_bound<Tx>());

    // Backward: the gradients accumulate onto what is there.
    std::vector<float> dx = normals(rng, (size_t)BT * C), dwte = normals(rng, (size_t)V * C), dwpe = normals(rng, (size_t)T * C);
    Tx *d_dx = upload<Tx>(run, dx, "dx");
    float *d_dwte = upload<float>(run, dwte, "dwte"), *d_dwpe = upload<float>(run, dwpe, "dwpe");
    std::vector<int> cursor(V), tok(BT), start(BT + 1), positions(BT);
    int n = embedding_buckets(inputs.data(), BT, V, cursor.data(), tok.data(), start.data(), positions.data());
    embedding_backward<Tx>(d_dwte, d_dwpe, d_dx, upload_ints(run, tok, "bucket_tok"), upload_ints(run, start, "bucket_start"),
                           upload_ints(run, positions, "positions"), n, BT, T, C, nullptr);
    cpu_embedding_backward(dwte.data(), dwpe.data(), dx.data(), inputs.data(), BT, T, C);
    run.compare("dwte", result(run, "dwte", d_dwte, dwte.size()), doubles(dwte), C, FP32_BOUND, FP32_ROW_BOUND);
    run.compare("dwpe", result(run, "dwpe", d_dwpe, dwpe.size()), doubles(dwpe), C, FP32_BOUND, FP32_ROW_BOUND);
}

// ----------------------------------------------------------------------------
// LayerNorm: R = 300 rows (two column-sum chunks, the second partial; 38
// blocks of 8 rows, the last partial), C = 72 channels (not a multiple of 32).

template <typename Tx> static void layernorm_case(Run &run, int accumulate) {
    const int R = 300, C = 72;
    Rng rng(12 + accumulate);
    LayerNormCase<Tx> ln = layernorm_forward_case<Tx>(run, rng, R, C);
    run.compare("out", result(run, "out", ln.out, ln.ref_out.size()), doubles(ln.ref_out), C, bound<Tx>(),
                row_bound<Tx>());
    run.compare("mean", result(run, "mean", ln.mean, R), doubles(ln.ref_mean), 1, FP32_BOUND, FP32_ROW_BOUND);
    run.compare("rstd", result(run, "rstd", ln.rstd, R), doubles(ln.ref_rstd), 1, FP32_BOUND, FP32_ROW_BOUND);

    std::vector<float> dout = normals(rng, (size_t)R * C), dx = normals(rng, (size_t)R * C);
    std::vector<float> dw = normals(rng, C), db = normals(rng, C);
    Tx *d_dout = upload<Tx>(run, dout, "dout"), *d_dx = upload<Tx>(run, dx, "dx");
    float *d_dw = upload<float>(run, dw, "dw"), *d_db = upload<float>(run, db, "db");
    float *partial = run.device<float>(colsum_scratch_floats(R, C), "partial");
    layernorm_backward<Tx>(d_dx, d_dw, d_db, d_dout, ln.d_x, ln.d_w, ln.mean, ln.rstd, R, C, accumulate, partial,
                           nullptr);
    check_layernorm_backward(run, ln, dout, dx, dw, db, d_dx, d_dw, d_db, accumulate);
}

// ----------------------------------------------------------------------------
// Bias and residual (the unfused matmul): R = 300, W = 200. The forward is a
// sum, checked against float64; the bias gradient against the CPU engine's
// matmul_backward (its db).

template <typename Tx> static void bias_case(Run &run, bool with_residual, bool with_bias) {
    const int R = 300, W = 200;
    Rng rng(13);
    std::vector<float> residual = normals(rng, (size_t)R * W), bias = normals(rng, W);
    Tx *d_res = with_residual ? upload<Tx>(run, residual, "residual") : nullptr;
    float *d_bias = with_bias ? upload<float>(run, bias, "bias") : nullptr;
    Tx *out = run.device<Tx>((size_t)R * W, "out");
    bias_residual_forward<Tx>(out, d_res, d_bias, R, W, nullptr);
    std::vector<double> ref((size_t)R * W);
    for (size_t i = 0; i < ref.size(); i++)
        ref[i] = (with_residual ? (double)residual[i] : 0.0) + (with_bias ? (double)bias[i % W] : 0.0);
    run.compare("out", result(run, "out", out, ref.size()), ref, W, bound<Tx>(), row_bound<Tx>());
    if (!with_bias) return;

    std::vector<float> dout = normals(rng, (size_t)R * W), db = normals(rng, W);
    Tx *d_dout = upload<Tx>(run, dout, "dout");
    float *d_db = upload<float>(run, db, "db");
    float *partial = run.device<float>(colsum_scratch_floats(R, W), "partial");
    bias_backward<Tx>(d_db, d_dout, R, W, partial, nullptr);
    std::vector<float> x = normals(rng, R), Wm = normals(rng, W), dx(R), dW(W);
    cpu_matmul_backward(dx.data(), dW.data(), db.data(), dout.data(), x.data(), Wm.data(), R, 1, W, nullptr);
    run.compare("db", result(run, "db", d_db, W), doubles(db), W, FP32_BOUND, FP32_ROW_BOUND);
}

// ----------------------------------------------------------------------------
// GELU: 1000 elements (not a multiple of 256), forward, backward into its own
// buffer and in place (as matmul_backward runs it).

template <typename Tx> static void gelu_case(Run &run) {
    const size_t n = 1000;
    Rng rng(14);
    std::vector<float> x = normals(rng, n, 2.0f), dout = normals(rng, n);
    Tx *d_x = upload<Tx>(run, x, "x"), *d_dout = upload<Tx>(run, dout, "dout");
    Tx *out = run.device<Tx>(n, "out"), *dx = run.device<Tx>(n, "dx");
    gelu_forward<Tx>(out, d_x, n, nullptr);
    gelu_backward<Tx>(dx, d_x, d_dout, n, nullptr);
    std::vector<float> ref(n), ref_dx(n);
    cpu_gelu_forward(ref.data(), x.data(), n);
    cpu_gelu_backward(ref_dx.data(), x.data(), dout.data(), n);
    run.compare("out", result(run, "out", out, n), doubles(ref), 1, bound<Tx>(), row_bound<Tx>() * 10);
    run.compare("dx", result(run, "dx", dx, n), doubles(ref_dx), 1, bound<Tx>(), row_bound<Tx>() * 10);
    gelu_backward<Tx>(d_dout, d_x, d_dout, n, nullptr);
    run.compare("dx_in_place", result(run, "dx_in_place", d_dout, n), doubles(ref_dx), 1, bound<Tx>(), row_bound<Tx>() * 10);
}

// ----------------------------------------------------------------------------
// The classifier: 37 rows of a vocabulary of 517 (not a multiple of the 256
// threads), two of them padded (target -1: loss 0, gradient 0).

template <typename Tx> static void classifier_case(Run &run, int write_grad) {
    const int BT = 37, V = 517;
    const float grad_scale = 1.0f / BT;
    ClassifierInput<Tx> in = classifier_input<Tx>(run, BT, V, 15);
    fused_classifier<Tx>(in.d_logits, in.losses, in.d_targets, BT, V, grad_scale, write_grad, nullptr);
    check_classifier<Tx>(run, in.logits, in.targets, BT, V, grad_scale, write_grad, in.d_logits, in.losses);
}

// The logits sampling reads: 3 of 4 rows at position 2 of 5, exactly.
template <typename Tx> static void gather_logits_case(Run &run) {
    const int rows = 3, T = 5, V = 517, pos = 2;
    Rng rng(16);
    std::vector<float> logits = normals(rng, (size_t)4 * T * V);
    Tx *d_logits = upload<Tx>(run, logits, "logits");
    float *out = run.device<float>((size_t)rows * V, "out");
    gather_logits<Tx>(out, d_logits, rows, T, pos, V, nullptr);
    std::vector<double> got = result(run, "out", out, (size_t)rows * V);
    for (int r = 0; r < rows; r++)
        for (int v = 0; v < V; v++)
            if (got[(size_t)r * V + v] != logits[((size_t)r * T + pos) * V + v]) {
                run.fail("row %d, logit %d: %g, not %g", r, v, got[(size_t)r * V + v], logits[((size_t)r * T + pos) * V + v]);
                return;
            }
}

// ----------------------------------------------------------------------------
// The optimizer.

// The global norm of n gradients (n < NORM_BLOCKS leaves blocks empty),
// against the CPU engine's (both sum in double, in different orders).
static void global_norm_case(Run &run, size_t n) {
    Rng rng(17);
    std::vector<float> g = normals(rng, n, 0.01f);
    float *d_g = upload<float>(run, g, "grads");
    double *partial = run.device<double>(NORM_BLOCKS, "partial"), *out = run.device<double>(1, "norm");
    global_norm(out, d_g, n, partial, nullptr);
    run.output("norm", out, sizeof(double));
    run.compare("norm", {*out}, {cpu_global_norm(g.data(), n)}, 1, 1e-12, 1e-12);
}

// AdamW over a whole small model's parameters (its weight-decay map checked
// against mg_decay_ranges by decay_map), against the CPU engine's update.
template <typename Tx> static void adamw_case(Run &run) {
    AdamwCase<Tx> a(run, 18);
    adamw_update<Tx>(a.d_p, a.d_px, a.d_g, a.d_m, a.d_v, a.n, decay_map(&a.lay, a.L), a.grad_mult, a.lr, a.beta1,
                     a.beta2, a.eps, a.wd, a.step, nullptr);
    a.check(run);
}

// fp32 -> bf16, round to nearest even, bit for bit against a reference that
// picks the nearer of the two neighbouring bf16 values in double.
static uint16_t reference_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if (isnan(f)) return 0x7fc0;  // any NaN will do (compared as NaN)
    if (isinf(f)) return (uint16_t)(u >> 16);
    uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;  // the bf16 values around f (by magnitude)
    float flo;
    memcpy(&flo, &lo, 4);
    double vlo = flo, vhi;
    if ((hi & 0x7fffffffu) == 0x7f800000u) {
        vhi = copysign(ldexp(1.0, 128), f);  // past the largest finite bf16, as IEEE rounding sees it
    } else {
        float fhi;
        memcpy(&fhi, &hi, 4);
        vhi = fhi;
    }
    double dlo = fabs((double)f - vlo), dhi = fabs((double)f - vhi);
    bool up = dhi < dlo || (dhi == dlo && ((lo >> 16) & 1));
    return (uint16_t)((up ? hi : lo) >> 16);
}

static void convert_case(Run &run) {
    Rng rng(19);
    std::vector<float> x = normals(rng, 70001);
    const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-40f, -1e-40f, 3.3895314e38f, 1.0f + 1.0f / 256,
                              1.0f + 3.0f / 256, 1.0f + 1.0f / 512, 1.0f + 3.0f / 512, 65504.0f, 3.3961776e38f, -3.3961776e38f};
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++) x[i] = specials[i];
    float *d_x = upload<float>(run, x, "in");
    __nv_bfloat16 *out = run.device<__nv_bfloat16>(x.size(), "out");
    convert<__nv_bfloat16>(out, d_x, x.size(), nullptr);
    run.output("out", out, x.size() * sizeof *out);
    size_t wrong = 0, first = 0;
    for (size_t i = 0; i < x.size(); i++) {
        uint16_t want = reference_bf16(x[i]), got = out[i].bits;
        bool nan_ok = isnan(x[i]) && (got & 0x7fff) > 0x7f80;
        if (got != want && !nan_ok && !wrong++) first = i;
    }
    if (wrong) run.fail("%zu of %zu conversions differ from round-to-nearest-even (first: %a -> %#06x)", wrong, x.size(),
                        x[first], out[first].bits);
}

// ----------------------------------------------------------------------------
// FP8: the amax, the scale exponent and the codes of n values (normals at
// several magnitudes, the specials among them), against fp8.h bit for bit and
// the CPU engine's fp8_round_trip (decode(code) / scale). n = 3 leaves most
// amax blocks empty; zeros gives amax 0 and scale 1.

static void fp8_case(Run &run, MgFp8Format fmt, size_t n, bool zeros) {
    Rng rng(23);
    std::vector<float> x(n, 0.0f);
    if (!zeros) {
        for (size_t i = 0; i < n; i++) x[i] = rng.normal() * ldexpf(1.0f, (int)(i % 29) - 14);
        const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-40f, -3.0e-8f, 2.5e5f};
        for (size_t i = 0; i < sizeof specials / sizeof specials[0] && i < n; i++) x[(i * 7919) % n] = specials[i];
    }
    float *d_x = upload<float>(run, x, "x");
    float *partial = run.device<float>(FP8_AMAX_BLOCKS, "partial");
    float *amax = run.device<float>(1, "amax");
    int *scale_exp = run.device<int>(1, "scale_exp");
    uint8_t *codes = run.device<uint8_t>(n, "codes");
    fp8_amax_scale(amax, scale_exp, d_x, n, fmt, partial, nullptr);
    fp8_cast(codes, d_x, scale_exp, n, fmt, nullptr);
    run.output("amax", amax, sizeof *amax);
    run.output("scale_exp", scale_exp, sizeof *scale_exp);
    run.output("codes", codes, n);
    float want_amax = 0.0f;
    for (float v : x)
        if (fabsf(v) <= 3.4028235e38f && fabsf(v) > want_amax) want_amax = fabsf(v);
    int want_k = mg_fp8_scale_exp(want_amax, fmt);
    if (*amax != want_amax || *scale_exp != want_k)
        run.fail("amax %a, scale exponent %d; fp8.h: %a, %d", *amax, *scale_exp, want_amax, want_k);
    if (zeros && want_k != 0) run.fail("an all-zero tensor got scale exponent %d", want_k);
    std::vector<float> cpu(n);
    cpu_fp8_round_trip(cpu.data(), x.data(), n, (int)fmt);
    float scale = mg_fp8_scale(want_k), inv = mg_fp8_scale(-want_k);
    size_t wrong = 0, first = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t want = mg_fp8_encode(x[i] * scale, fmt);
        float back = mg_fp8_decode(codes[i], fmt) * inv;
        bool same_cpu = isnan(back) ? isnan(cpu[i]) : back == cpu[i] && signbit(back) == signbit(cpu[i]);
        if ((codes[i] != want || !same_cpu) && !wrong++) first = i;
    }
    if (wrong)
        run.fail("%zu of %zu codes differ from fp8.h or the CPU engine (first: %a -> %#04x)", wrong, n, x[first],
                 codes[first]);
}

// ----------------------------------------------------------------------------

template <typename Tx> static void add_templated() {
    const char *t = type_name<Tx>();
    add_case(shape("embedding", t, "B3_T37_C72_V61"), embedding_case<Tx>);
    add_case(shape("layernorm", t, "R300_C72"), [](Run &r) { layernorm_case<Tx>(r, 0); });
    add_case(shape("layernorm", t, "R300_C72_accumulate"), [](Run &r) { layernorm_case<Tx>(r, 1); });
    add_case(shape("bias", t, "R300_W200"), [](Run &r) { bias_case<Tx>(r, true, true); });
    add_case(shape("bias", t, "R300_W200_no_residual"), [](Run &r) { bias_case<Tx>(r, false, true); });
    add_case(shape("bias", t, "R300_W200_no_bias"), [](Run &r) { bias_case<Tx>(r, true, false); });
    add_case(shape("gelu", t, "n1000"), gelu_case<Tx>);
    add_case(shape("classifier", t, "BT37_V517"), [](Run &r) { classifier_case<Tx>(r, 1); });
    add_case(shape("classifier", t, "BT37_V517_loss_only"), [](Run &r) { classifier_case<Tx>(r, 0); });
    add_case(shape("gather_logits", t, "rows3_T5_V517"), gather_logits_case<Tx>);
    add_case(shape("adamw", t, "V61_T37_C24_L2"), adamw_case<Tx>);
}

static int registered = [] {
    add_templated<float>();
    add_templated<__nv_bfloat16>();
    add_case("global_norm/fp32/n100003", [](Run &r) { global_norm_case(r, 100003); });
    add_case("global_norm/fp32/n1000", [](Run &r) { global_norm_case(r, 1000); });
    add_case("convert/bf16/n70001", convert_case);
    add_case("fp8/e4m3/n70001", [](Run &r) { fp8_case(r, MG_FP8_E4M3, 70001, false); });
    add_case("fp8/e5m2/n70001", [](Run &r) { fp8_case(r, MG_FP8_E5M2, 70001, false); });
    add_case("fp8/e4m3/n3", [](Run &r) { fp8_case(r, MG_FP8_E4M3, 3, false); });
    add_case("fp8/e4m3/n1000_zeros", [](Run &r) { fp8_case(r, MG_FP8_E4M3, 1000, true); });
    return 0;
}();

// The fused step's and sampling's kernels: compiled in this unit, as the op
// headers they include define kernels that are not templates.
#include "kernels_fused.cpp"
#include "kernels_sampling.cpp"

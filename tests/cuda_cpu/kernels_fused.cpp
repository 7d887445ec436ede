// kernels_fused.cpp: the checks of the fused step's kernels (--fused,
// docs/CUDA.md "The fused step"): the one-pass LayerNorm backward with the
// next bias gradient folded in, the 16-byte bias column sums, the classifier
// with its row in shared memory, the 16-byte wte backward, the norm with the
// clip factor on the device, and the vectorised AdamW reading its settings
// from device memory. Each against the CPU engine's op (and, where the fused
// kernel promises the verified kernel's bits, against that kernel bit for
// bit). Sizes are never multiples of the row chunks or the block sizes.
//
// Compiled inside kernels_ops.cpp (included at its end), not as a unit of its
// own: the op headers define kernels that are not templates, which two units
// including the same header would both define.
#include "cuda_on_cpu.h"

#include "../../microgpt/cuda/adamw.cuh"
#include "../../microgpt/cuda/bias.cuh"
#include "../../microgpt/cuda/classifier.cuh"
#include "../../microgpt/cuda/embedding.cuh"
#include "../../microgpt/cuda/global_norm.cuh"
#include "../../microgpt/cuda/layernorm.cuh"

#include "adamw_case.h"
#include "cases.h"
#include "layernorm_case.h"

using namespace check;

// Bit-for-bit equality of two device arrays of n values.
template <typename T> static void same_bits(Run &run, const char *what, const T *a, const T *b, size_t n) {
    if (memcmp(a, b, n * sizeof(T)) == 0) return;
    for (size_t i = 0; i < n; i++)
        if (memcmp(a + i, b + i, sizeof(T))) {
            run.fail("%s: element %zu differs from the verified kernel's (%g vs %g)", what, i, (double)value(a[i]),
                     (double)value(b[i]));
            return;
        }
}

// ----------------------------------------------------------------------------
// The fused LayerNorm backward: R = 300 rows (64-row blocks, the last
// partial), C columns whose 16-byte chunks leave some lanes of the last chunk
// round idle. dnext is the column sum of the dx it wrote, checked against the
// column sums of the reference dx.

template <typename Tx> static void layernorm_fused_case(Run &run, int C, int accumulate, int with_next) {
    const int R = 300;
    Rng rng(31 + C + accumulate);
    LayerNormCase<Tx> ln = layernorm_forward_case<Tx>(run, rng, R, C);

    std::vector<float> dout = normals(rng, (size_t)R * C), dx = normals(rng, (size_t)R * C);
    std::vector<float> dw = normals(rng, C), db = normals(rng, C), dnext = normals(rng, C);
    Tx *d_dout = upload<Tx>(run, dout, "dout"), *d_dx = upload<Tx>(run, dx, "dx");
    float *d_dw = upload<float>(run, dw, "dw"), *d_db = upload<float>(run, db, "db");
    float *d_dnext = with_next ? upload<float>(run, dnext, "dnext") : nullptr;
    if (!layernorm_backward_fused_chunks<Tx>(C)) {
        run.fail("the fused LayerNorm backward does not apply at C = %d", C);
        return;
    }
    if (layernorm_backward_fused_setup<Tx>(C) != cudaSuccess) run.fail("setup failed at C = %d", C);
    float *partial = run.device<float>(layernorm_backward_fused_scratch_floats(R, C), "partial");
    layernorm_backward_fused<Tx>(d_dx, d_dw, d_db, d_dnext, d_dout, ln.d_x, ln.d_w, ln.mean, ln.rstd, R, C, accumulate,
                                 partial, nullptr);
    std::vector<double> got_dx = check_layernorm_backward(run, ln, dout, dx, dw, db, d_dx, d_dw, d_db, accumulate);
    if (with_next) {
        // The sums of the dx the kernel stored (its own rounding), in double.
        std::vector<double> want(C);
        for (int c = 0; c < C; c++) {
            double t = 0;
            for (int r = 0; r < R; r++) t += got_dx[(size_t)r * C + c];
            want[c] = dnext[c] + t;
        }
        run.compare("dnext", result(run, "dnext", d_dnext, C), want, C, FP32_BOUND, FP32_ROW_BOUND);
    }
}

// ----------------------------------------------------------------------------
// The 16-byte bias column sums: against the CPU engine's bias gradient, and
// bit for bit against the verified column sums (colsum_partial_kernel).

template <typename Tx> static void bias_fused_case(Run &run) {
    const int R = 300, W = 200;
    Rng rng(33);
    std::vector<float> dout = normals(rng, (size_t)R * W), db = normals(rng, W);
    Tx *d_dout = upload<Tx>(run, dout, "dout");
    float *d_db = upload<float>(run, db, "db"), *d_db_verified = upload<float>(run, db, "db_verified");
    float *partial = run.device<float>(colsum_scratch_floats(R, W), "partial");
    if (!colsum_vec_applies(d_dout, W)) run.fail("the 16-byte column sums do not apply at W = %d", W);
    bias_backward_fused<Tx>(d_db, d_dout, R, W, partial, nullptr);
    bias_backward<Tx>(d_db_verified, d_dout, R, W, partial, nullptr);
    std::vector<float> x = normals(rng, R), Wm = normals(rng, W), dx(R), dW(W);
    cpu_matmul_backward(dx.data(), dW.data(), db.data(), dout.data(), x.data(), Wm.data(), R, 1, W, nullptr);
    run.compare("db", result(run, "db", d_db, W), doubles(db), W, FP32_BOUND, FP32_ROW_BOUND);
    same_bits(run, "db", d_db, d_db_verified, W);
}

// ----------------------------------------------------------------------------
// The classifier with its row in shared memory: 37 rows of a vocabulary of
// 520 (whole 16-byte chunks, not a multiple of the 512 threads' stride), two
// padded.

template <typename Tx> static void classifier_smem_case(Run &run, int write_grad) {
    const int BT = 37, V = 520;
    const float grad_scale = 1.0f / BT;
    ClassifierInput<Tx> in = classifier_input<Tx>(run, BT, V, 35, 7);  // row 7: the last column of the last chunk
    if (!fused_classifier_smem_applies<Tx>(V, 99 << 10)) run.fail("the shared-memory classifier does not apply at V = %d", V);
    if (fused_classifier_smem_setup<Tx>(V) != cudaSuccess) run.fail("setup failed");
    fused_classifier_smem<Tx>(in.d_logits, in.losses, in.d_targets, BT, V, grad_scale, write_grad, nullptr);
    check_classifier<Tx>(run, in.logits, in.targets, BT, V, grad_scale, write_grad, in.d_logits, in.losses);
}

// ----------------------------------------------------------------------------
// The 16-byte wte backward, its bucket count read from device memory: against
// the CPU engine, and bit for bit against the verified kernel.

template <typename Tx> static void embedding_fused_case(Run &run) {
    const int B = 3, T = 37, C = 72, V = 61, BT = B * T;
    Rng rng(37);
    std::vector<int> inputs(BT);
    for (int &t : inputs) t = rng.below(V - 5);
    std::vector<float> dx = normals(rng, (size_t)BT * C), dwte = normals(rng, (size_t)V * C), dwpe = normals(rng, (size_t)T * C);
    Tx *d_dx = upload<Tx>(run, dx, "dx");
    float *d_dwte = upload<float>(run, dwte, "dwte"), *d_dwpe = upload<float>(run, dwpe, "dwpe");
    std::vector<float> dwte_v = dwte, dwpe_v = dwpe;
    float *v_dwte = upload<float>(run, dwte_v, "dwte_verified"), *v_dwpe = upload<float>(run, dwpe_v, "dwpe_verified");
    std::vector<int> cursor(V), tok(BT), start(BT + 1), positions(BT);
    int n = embedding_buckets(inputs.data(), BT, V, cursor.data(), tok.data(), start.data(), positions.data());
    int *d_tok = upload_ints(run, tok, "bucket_tok"), *d_start = upload_ints(run, start, "bucket_start");
    int *d_pos = upload_ints(run, positions, "positions");
    int *d_n = upload_ints(run, std::vector<int>{n}, "n_buckets");
    if (!embedding_backward_fused_applies<Tx>(C)) run.fail("the fused wte backward does not apply at C = %d", C);
    embedding_backward_fused<Tx>(d_dwte, d_dwpe, d_dx, d_tok, d_start, d_pos, d_n, BT < V ? BT : V, BT, T, C, nullptr);
    embedding_backward<Tx>(v_dwte, v_dwpe, d_dx, d_tok, d_start, d_pos, n, BT, T, C, nullptr);
    cpu_embedding_backward(dwte.data(), dwpe.data(), dx.data(), inputs.data(), BT, T, C);
    run.compare("dwte", result(run, "dwte", d_dwte, dwte.size()), doubles(dwte), C, FP32_BOUND, FP32_ROW_BOUND);
    run.compare("dwpe", result(run, "dwpe", d_dwpe, dwpe.size()), doubles(dwpe), C, FP32_BOUND, FP32_ROW_BOUND);
    same_bits(run, "dwte", d_dwte, v_dwte, dwte.size());
}

// ----------------------------------------------------------------------------
// The norm with the clip factor on the device: the norm's bits are
// global_norm's; the factor is the driver's expression (train.h,
// mg_clip_factor: clip below the norm scales, above it does not); a
// non-finite gradient sets the skip flag.

static float driver_clip_factor(double norm, float grad_clip) {
    return grad_clip > 0 && norm > grad_clip ? (float)(grad_clip / (norm + 1e-6)) : 1.0f;
}

static void global_norm_clip_case(Run &run, size_t n, float clip_fraction, bool poison) {
    Rng rng(39);
    std::vector<float> g = normals(rng, n, 0.01f);
    if (poison) g[n / 3] = NAN;
    float *d_g = upload<float>(run, g, "grads");
    double *partial = run.device<double>(NORM_BLOCKS, "partial"), *out = run.device<double>(1, "norm");
    double *out_verified = run.device<double>(1, "norm_verified");
    AdamWStep *st = run.device<AdamWStep>(1, "step");
    global_norm(out_verified, d_g, n, partial, nullptr);
    double norm = *out_verified;
    float grad_clip = poison ? 1.0f : (float)(norm * clip_fraction);
    global_norm_clip(out, &st->mult, &st->skip, d_g, n, grad_clip, partial, nullptr);
    run.output("norm", out, sizeof(double));
    run.output("mult", &st->mult, sizeof(float));
    run.output("skip", &st->skip, sizeof(int));
    if (memcmp(out, out_verified, sizeof(double)) != 0 && !(poison && isnan(*out) && isnan(*out_verified)))
        run.fail("norm %.17g differs from global_norm's %.17g", *out, *out_verified);
    if (poison) {
        if (st->skip != 1) run.fail("a NaN gradient did not set the skip flag (norm %g)", *out);
        return;
    }
    if (st->skip != 0) run.fail("a finite norm %g set the skip flag", *out);
    float want = driver_clip_factor(*out, grad_clip);
    if (memcmp(&st->mult, &want, sizeof want) != 0)
        run.fail("clip factor %.9g, the driver's expression gives %.9g (norm %.17g, clip %.9g)", st->mult, want, *out,
                 grad_clip);
    if (clip_fraction < 1.0f && !(st->mult < 1.0f)) run.fail("a norm above the clip did not scale: %g", st->mult);
}

// ----------------------------------------------------------------------------
// The vectorised AdamW over a whole small model, its settings in device
// memory: against the CPU engine's update, and with the skip flag set, no
// change at all.

template <typename Tx> static void adamw_fused_case(Run &run, bool skip) {
    AdamwCase<Tx> a(run, 41);
    std::vector<float> p0 = a.p, m0 = a.m, v0 = a.v;
    DecayMap dm = decay_map(&a.lay, a.L);
    if (!adamw_fused_applies(dm, a.n)) run.fail("the fused AdamW does not apply at C = %d", a.C);
    AdamWStep *st = run.device<AdamWStep>(1, "step");
    adamw_step_settings(st, a.lr, a.beta1, a.beta2, a.step);
    st->mult = a.grad_mult;
    st->skip = skip;
    adamw_update_fused<Tx>(a.d_p, a.d_px, a.d_g, a.d_m, a.d_v, a.n, dm, a.L, st, a.beta1, a.beta2, a.eps, a.wd, nullptr);
    if (skip) {
        if (memcmp(a.d_p, p0.data(), a.n * 4) || memcmp(a.d_m, m0.data(), a.n * 4) || memcmp(a.d_v, v0.data(), a.n * 4))
            run.fail("the update ran with the skip flag set");
        run.output("params", a.d_p, a.n * 4);
        return;
    }
    a.check(run);
}

// ----------------------------------------------------------------------------

template <typename Tx> static void add_fused() {
    const char *t = type_name<Tx>();
    // bf16: 72 columns = 9 chunks (1 per lane); 520 = 65 chunks (3 per lane, the third only for lane 0).
    // fp32: 72 = 18 chunks (1 per lane); 264 = 66 chunks (3 per lane).
    int wide = sizeof(Tx) == 2 ? 520 : 264;
    add_case(shape("layernorm_fused", t, "R300_C72"), [](Run &r) { layernorm_fused_case<Tx>(r, 72, 0, 1); });
    add_case(shape("layernorm_fused", t, "R300_C72_accumulate"), [](Run &r) { layernorm_fused_case<Tx>(r, 72, 1, 1); });
    add_case(shape("layernorm_fused", t, "R300_C72_no_next"), [](Run &r) { layernorm_fused_case<Tx>(r, 72, 1, 0); });
    add_case(shape("layernorm_fused", t, "R300_C" + std::to_string(wide) + "_accumulate"),
             [wide](Run &r) { layernorm_fused_case<Tx>(r, wide, 1, 1); });
    add_case(shape("bias_fused", t, "R300_W200"), bias_fused_case<Tx>);
    add_case(shape("classifier_smem", t, "BT37_V520"), [](Run &r) { classifier_smem_case<Tx>(r, 1); });
    add_case(shape("classifier_smem", t, "BT37_V520_loss_only"), [](Run &r) { classifier_smem_case<Tx>(r, 0); });
    add_case(shape("embedding_fused", t, "B3_T37_C72_V61"), embedding_fused_case<Tx>);
    add_case(shape("adamw_fused", t, "V61_T37_C24_L2"), [](Run &r) { adamw_fused_case<Tx>(r, false); });
    add_case(shape("adamw_fused", t, "V61_T37_C24_L2_skip"), [](Run &r) { adamw_fused_case<Tx>(r, true); });
}

static int registered_fused = [] {
    add_fused<float>();
    add_fused<__nv_bfloat16>();
    add_case("global_norm_clip/fp32/n100003_clipped", [](Run &r) { global_norm_clip_case(r, 100003, 0.5f, false); });
    add_case("global_norm_clip/fp32/n1000_unclipped", [](Run &r) { global_norm_clip_case(r, 1000, 2.0f, false); });
    add_case("global_norm_clip/fp32/n1000_nan", [](Run &r) { global_norm_clip_case(r, 1000, 1.0f, true); });
    return 0;
}();

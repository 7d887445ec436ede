// adamw_case.h: the AdamW checks' shared case (after adamw.cuh and cases.h).
#ifndef CUDA_CPU_ADAMW_CASE_H
#define CUDA_CPU_ADAMW_CASE_H

#include "cases.h"

namespace check {

// An AdamW case: a whole small model's parameters (its weight-decay map from mg_layout) at step 3, random
// params, grads and moments, uploaded (with a bf16 compute copy for Tx = bf16; fp32's master weights are its
// compute copy). `check` runs the CPU engine's update on the host copies and compares everything.
template <typename Tx> struct AdamwCase {
    static constexpr int V = 61, T = 37, C = 24, L = 2, step = 3;
    static constexpr float grad_mult = 0.7f, lr = 1e-3f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    MgLayout lay;
    size_t n;
    std::vector<float> p, g, m, v;
    float *d_p, *d_g, *d_m, *d_v;
    Tx *d_px;

    AdamwCase(Run &run, uint64_t seed) : lay(mg_layout(V, T, C, L)), n(lay.n) {
        Rng rng(seed);
        p = normals(rng, n, 0.02f);
        g = normals(rng, n, 0.01f);
        m = normals(rng, n, 0.001f);
        v.resize(n);
        for (float &x : v) x = 1e-5f * (float)rng.uniform();
        d_p = upload<float>(run, p, "params");
        d_g = upload<float>(run, g, "grads");
        d_m = upload<float>(run, m, "m");
        d_v = upload<float>(run, v, "v");
        d_px = sizeof(Tx) == 4 ? nullptr : run.device<Tx>(n, "params_x");
    }

    void check(Run &run) {
        cpu_adamw_update(p.data(), g.data(), m.data(), v.data(), V, T, C, L, grad_mult, lr, beta1, beta2, eps, wd,
                         step);
        run.compare("params", result(run, "params", d_p, n), doubles(p), C, FP32_BOUND, FP32_ROW_BOUND);
        run.compare("m", result(run, "m", d_m, n), doubles(m), C, FP32_BOUND, FP32_ROW_BOUND);
        run.compare("v", result(run, "v", d_v, n), doubles(v), C, FP32_BOUND, FP32_ROW_BOUND);
        if (d_px) run.compare("params_x", result(run, "params_x", d_px, n), doubles(p), C, bound<Tx>(), row_bound<Tx>());
    }
};

}  // namespace check

#endif

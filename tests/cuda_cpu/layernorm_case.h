// layernorm_case.h: the data and the checks the verified and the fused LayerNorm backward cases share
// (after layernorm.cuh and cases.h).
#ifndef CUDA_CPU_LAYERNORM_CASE_H
#define CUDA_CPU_LAYERNORM_CASE_H

#include "cases.h"

namespace check {

// A LayerNorm case: x (shifted so that its mean is not 0), w around 1 and b, drawn in this order from
// `rng`, uploaded, and the forward run by the kernel (out, mean, rstd) and by the CPU engine (ref_*).
// The verified backward's cases and the fused backward's start from it.
template <typename Tx> struct LayerNormCase {
    int R, C;
    std::vector<float> x, w, b, ref_out, ref_mean, ref_rstd;
    Tx *d_x, *out;
    float *d_w, *d_b, *mean, *rstd;
};

template <typename Tx> LayerNormCase<Tx> layernorm_forward_case(Run &run, Rng &rng, int R, int C) {
    LayerNormCase<Tx> c{R, C};
    c.x = normals(rng, (size_t)R * C);
    c.w = normals(rng, C, 0.5f);
    c.b = normals(rng, C, 0.1f);
    for (size_t i = 0; i < c.x.size(); i++) c.x[i] += 0.5f + 0.01f * (float)(i % C);
    for (float &v : c.w) v += 1.0f;
    c.d_x = upload<Tx>(run, c.x, "x");
    c.d_w = upload<float>(run, c.w, "w");
    c.d_b = upload<float>(run, c.b, "b");
    c.out = run.device<Tx>((size_t)R * C, "out");
    c.mean = run.device<float>(R, "mean");
    c.rstd = run.device<float>(R, "rstd");
    layernorm_forward<Tx>(c.out, c.mean, c.rstd, c.d_x, c.d_w, c.d_b, R, C, nullptr);
    c.ref_out.resize((size_t)R * C);
    c.ref_mean.resize(R);
    c.ref_rstd.resize(R);
    cpu_layernorm_forward(c.ref_out.data(), c.ref_mean.data(), c.ref_rstd.data(), c.x.data(), c.w.data(), c.b.data(),
                          R, C);
    return c;
}

// After a LayerNorm backward kernel wrote d_dx, d_dw, d_db (uploaded from dx, dw, db, with dout): the CPU
// engine's backward of the same into dx, dw, db, compared; returns the kernel's dx.
template <typename Tx>
std::vector<double> check_layernorm_backward(Run &run, const LayerNormCase<Tx> &c, const std::vector<float> &dout,
                                             std::vector<float> &dx, std::vector<float> &dw, std::vector<float> &db,
                                             const Tx *d_dx, const float *d_dw, const float *d_db, int accumulate) {
    cpu_layernorm_backward(dx.data(), dw.data(), db.data(), dout.data(), c.x.data(), c.w.data(), c.ref_mean.data(),
                           c.ref_rstd.data(), c.R, c.C, accumulate);
    std::vector<double> got_dx = result(run, "dx", d_dx, dx.size());
    run.compare("dx", got_dx, doubles(dx), c.C, bound<Tx>(), row_bound<Tx>());
    run.compare("dw", result(run, "dw", d_dw, c.C), doubles(dw), c.C, FP32_BOUND, FP32_ROW_BOUND);
    run.compare("db", result(run, "db", d_db, c.C), doubles(db), c.C, FP32_BOUND, FP32_ROW_BOUND);
    return got_dx;
}

}  // namespace check

#endif  // CUDA_CPU_LAYERNORM_CASE_H

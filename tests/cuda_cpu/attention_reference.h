// attention_reference.h: what the attention checks share: their inputs, the
// float64 log-sum-exp and D, and the comparison of y, lse, D and dq/dk/dv
// with the CPU engine's attention (which keeps the probabilities and has no
// lse) and with float64.
#ifndef CUDA_CPU_ATTENTION_REFERENCE_H
#define CUDA_CPU_ATTENTION_REFERENCE_H

#include "cases.h"

namespace check {

struct AttentionShape {
    int B, T, H, hd;
    int C() const { return H * hd; }
    std::string name() const {
        return "B" + std::to_string(B) + "_T" + std::to_string(T) + "_H" + std::to_string(H) + "_hd" + std::to_string(hd);
    }
};

// The log-sum-exp bound: fp32 arithmetic on exact scores (test_flash_kernels.py).
const double LSE_BOUND = 1e-5, LSE_ROW_BOUND = 1e-4;

// Inputs (qkv peaky enough to exercise the running max), as the device holds them.
struct AttentionInputs {
    std::vector<float> qkv, dy;
};

template <typename Tx> AttentionInputs attention_inputs(const AttentionShape &s, uint64_t seed) {
    Rng rng(seed);
    AttentionInputs in;
    in.qkv = normals(rng, (size_t)s.B * s.T * 3 * s.C(), 1.5f);
    in.dy = normals(rng, (size_t)s.B * s.T * s.C());
    for (float &x : in.qkv) x = value(from_float<Tx>(x));
    for (float &x : in.dy) x = value(from_float<Tx>(x));
    return in;
}

// The inputs on the device, and the outputs of a forward and a backward pass: y, lse, D, dqkv.
template <typename Tx> struct AttentionBuffers {
    Tx *qkv, *dy, *y, *dqkv;
    float *lse, *D;
};

template <typename Tx> AttentionBuffers<Tx> attention_buffers(Run &run, const AttentionShape &s, AttentionInputs in) {
    size_t BTC = (size_t)s.B * s.T * s.C(), BHT = (size_t)s.B * s.H * s.T;
    AttentionBuffers<Tx> b;
    b.qkv = upload<Tx>(run, in.qkv, "qkv");
    b.dy = upload<Tx>(run, in.dy, "dy");
    b.y = run.device<Tx>(BTC, "y");
    b.dqkv = run.device<Tx>(3 * BTC, "dqkv");
    b.lse = run.device<float>(BHT, "lse");
    b.D = run.device<float>(BHT, "D");
    return b;
}

// Compares the device's y [B,T,C], lse [B*H,T], D [B*H,T] and dqkv [B,T,3C]
// with the CPU engine's attention and with float64 (lse; D = dY . Y, from the
// device's own y, as the kernels compute it).
template <typename Tx>
void compare_attention(Run &run, const AttentionShape &s, const AttentionInputs &in, const Tx *y, const float *lse,
                       const float *D, const Tx *dqkv) {
    int B = s.B, T = s.T, H = s.H, hd = s.hd, C = s.C();
    size_t BTC = (size_t)B * T * C, BHT = (size_t)B * H * T;
    std::vector<float> ref_y(BTC), att((size_t)B * H * T * T), ref_dqkv(3 * BTC);
    cpu_attention_forward(ref_y.data(), att.data(), in.qkv.data(), B, T, C, H);
    cpu_attention_backward(ref_dqkv.data(), in.dy.data(), in.qkv.data(), att.data(), B, T, C, H);
    std::vector<double> got_y = result(run, "y", y, BTC);
    run.compare("y", got_y, doubles(ref_y), hd, bound<Tx>(), row_bound<Tx>());

    std::vector<double> ref_lse(BHT), ref_D(BHT);
    double scale = 1.0 / sqrt((double)hd);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < T; i++) {
                const float *q = &in.qkv[((size_t)b * T + i) * 3 * C + h * hd];
                std::vector<double> sc(i + 1);
                double mx = -INFINITY, sum = 0, d = 0;
                for (int j = 0; j <= i; j++) {
                    const float *k = &in.qkv[((size_t)b * T + j) * 3 * C + C + h * hd];
                    double dot = 0;
                    for (int e = 0; e < hd; e++) dot += (double)q[e] * k[e];
                    sc[j] = dot * scale;
                    mx = std::max(mx, sc[j]);
                }
                for (int j = 0; j <= i; j++) sum += exp(sc[j] - mx);
                ref_lse[((size_t)b * H + h) * T + i] = mx + log(sum);
                for (int e = 0; e < hd; e++) {
                    size_t at = ((size_t)b * T + i) * C + h * hd + e;
                    d += (double)in.dy[at] * got_y[at];
                }
                ref_D[((size_t)b * H + h) * T + i] = d;
            }
    run.compare("lse", result(run, "lse", lse, BHT), ref_lse, 1, LSE_BOUND, LSE_ROW_BOUND);
    run.compare("D", result(run, "D", D, BHT), ref_D, 1, FP32_BOUND, FP32_ROW_BOUND);

    std::vector<double> got = result(run, "dqkv", dqkv, 3 * BTC);
    const char *names[3] = {"dq", "dk", "dv"};
    for (int part = 0; part < 3; part++) {
        std::vector<double> g(BTC), r(BTC);
        for (size_t row = 0; row < (size_t)B * T; row++)
            for (int c = 0; c < C; c++) {
                g[row * C + c] = got[row * 3 * C + part * C + c];
                r[row * C + c] = ref_dqkv[row * 3 * C + part * C + c];
            }
        // One key (T = 1) gives dq = dk = 0 exactly: measure those against dv's scale.
        if (T == 1 && part < 2) {
            double e = 0, sv = 0;
            for (size_t i = 0; i < BTC; i++) e += g[i] * g[i], sv += (double)ref_dqkv[(i / C) * 3 * C + 2 * C + i % C] * ref_dqkv[(i / C) * 3 * C + 2 * C + i % C];
            if (!(sqrt(e) <= bound<Tx>() * sqrt(sv))) run.fail("%s: not zero for a single key", names[part]);
            continue;
        }
        run.compare(names[part], g, r, hd, bound<Tx>(), row_bound<Tx>());
    }
}

}  // namespace check

#endif  // CUDA_CPU_ATTENTION_REFERENCE_H

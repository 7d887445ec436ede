// flash_attention_check.cu: the kernels of microgpt/cuda/attention_flash.cuh
// alone, on the GPU, against a float64 attention computed here on the CPU.
// Built by `make cuda` as build/flash_attention_check; run by
// tests/gpu/test_flash_kernels.py (which holds the bounds) and by
// scripts/gpu_session.sh.
//
//   flash_attention_check            one JSON line per case (head dims 32/64/128,
//                                    T = 1, 64, 100, 1024): errors, unwritten
//                                    elements, bitwise repeat
//   flash_attention_check --time     forward and backward times (CUDA events,
//                                    median of 20) at the ANDREA-12M and GPT-2
//                                    124M attention shapes, B = 8
//   flash_attention_check --quick    small cases only (T = 100, 200; one head):
//                                    for compute-sanitizer (memcheck, racecheck,
//                                    synccheck), which runs kernels far slower
//
// Every output (y, lse, dqkv) is poisoned with NaN before each launch, so an
// element no kernel writes is counted; inputs are random bf16 (never zeros).
#include "../../microgpt/cuda/attention_flash.cuh"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

typedef __nv_bfloat16 bf16;

static void check(cudaError_t err, const char *what) {
    if (err != cudaSuccess) {
        fprintf(stderr, "flash_attention_check: %s: %s\n", what, cudaGetErrorString(err));
        exit(1);
    }
}

// A fixed-seed generator (xorshift64*, Box-Muller): the same inputs every run.
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double uniform01(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return ((rng_state * 2685821657736338717ull) >> 11) * (1.0 / 9007199254740992.0);
}
static float normal(void) {
    double u = uniform01() + 1e-300, v = uniform01();
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

static float bf(bf16 x) { return __bfloat162float(x); }

struct Case {
    int B, T, H, hd;
};

// The float64 reference: y, lse, dq, dk, dv (each [B, T, C] or [B*H, T]).
static void reference(const Case &c, const std::vector<bf16> &qkv, const std::vector<bf16> &dy, std::vector<double> &y,
                      std::vector<double> &lse, std::vector<double> &dq, std::vector<double> &dk,
                      std::vector<double> &dv) {
    int B = c.B, T = c.T, H = c.H, hd = c.hd, C = H * hd;
    size_t C3 = 3 * (size_t)C;
    double scale = 1.0 / sqrt((double)hd);
    y.assign((size_t)B * T * C, 0.0);
    lse.assign((size_t)B * H * T, 0.0);
    dq.assign((size_t)B * T * C, 0.0);
    dk.assign((size_t)B * T * C, 0.0);
    dv.assign((size_t)B * T * C, 0.0);
    std::vector<double> p(T), dp(T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            auto q = [&](int i, int d) { return (double)bf(qkv[((size_t)b * T + i) * C3 + h * hd + d]); };
            auto k = [&](int i, int d) { return (double)bf(qkv[((size_t)b * T + i) * C3 + C + h * hd + d]); };
            auto v = [&](int i, int d) { return (double)bf(qkv[((size_t)b * T + i) * C3 + 2 * C + h * hd + d]); };
            auto g = [&](int i, int d) { return (double)bf(dy[((size_t)b * T + i) * C + h * hd + d]); };
            for (int i = 0; i < T; i++) {
                double mx = -INFINITY;
                for (int j = 0; j <= i; j++) {
                    double s = 0;
                    for (int d = 0; d < hd; d++) s += q(i, d) * k(j, d);
                    p[j] = s * scale;
                    mx = std::max(mx, p[j]);
                }
                double sum = 0;
                for (int j = 0; j <= i; j++) sum += (p[j] = exp(p[j] - mx));
                lse[((size_t)b * H + h) * T + i] = mx + log(sum);
                size_t row = ((size_t)b * T + i) * C + h * hd;
                for (int j = 0; j <= i; j++) p[j] /= sum;
                for (int d = 0; d < hd; d++) {
                    double o = 0;
                    for (int j = 0; j <= i; j++) o += p[j] * v(j, d);
                    y[row + d] = o;
                }
                double D = 0;
                for (int d = 0; d < hd; d++) D += g(i, d) * y[row + d];
                for (int j = 0; j <= i; j++) {
                    double s = 0;
                    for (int d = 0; d < hd; d++) s += g(i, d) * v(j, d);
                    dp[j] = p[j] * (s - D);  // dS
                }
                for (int j = 0; j <= i; j++) {
                    size_t rj = ((size_t)b * T + j) * C + h * hd;
                    for (int d = 0; d < hd; d++) {
                        dq[row + d] += dp[j] * k(j, d) * scale;
                        dk[rj + d] += dp[j] * q(i, d) * scale;
                        dv[rj + d] += p[j] * g(i, d);
                    }
                }
            }
        }
}

// Norm-relative error, and the worst row's error over the RMS row norm.
struct Err {
    double norm, row;
};
static Err compare(const std::vector<float> &got, const std::vector<double> &ref, size_t row_len) {
    double e2 = 0, r2 = 0, worst = 0;
    size_t rows = ref.size() / row_len;
    for (size_t r = 0; r < rows; r++) {
        double re = 0;
        for (size_t i = r * row_len; i < (r + 1) * row_len; i++) {
            double d = got[i] - ref[i];
            re += d * d;
            r2 += ref[i] * ref[i];
        }
        e2 += re;
        worst = std::max(worst, re);
    }
    double rms_row = sqrt(r2 / rows);
    return {sqrt(e2) / std::max(sqrt(r2), 1e-300), sqrt(worst) / std::max(rms_row, 1e-300)};
}

struct Device {
    bf16 *qkv, *dy, *y, *dqkv;
    float *lse, *D;
};

static void poison(const Case &c, Device &d) {
    size_t BTC = (size_t)c.B * c.T * c.H * c.hd;
    check(cudaMemset(d.y, 0xFF, BTC * sizeof(bf16)), "memset y");  // 0xFFFF is a bf16 NaN
    check(cudaMemset(d.dqkv, 0xFF, 3 * BTC * sizeof(bf16)), "memset dqkv");
    check(cudaMemset(d.lse, 0xFF, (size_t)c.B * c.H * c.T * sizeof(float)), "memset lse");  // a float NaN
    check(cudaMemset(d.D, 0xFF, (size_t)c.B * c.H * c.T * sizeof(float)), "memset D");
}

static void run(const Case &c, Device &d) {
    int C = c.H * c.hd;
    check(flash_attention_forward(0, d.y, d.lse, d.qkv, c.B, c.T, C, c.H, c.hd), "forward launch");
    check(flash_attention_backward(0, d.dqkv, d.D, d.dy, d.y, d.qkv, d.lse, c.B, c.T, C, c.H, c.hd), "backward launch");
    check(cudaDeviceSynchronize(), "kernels");
}

static Device upload(const Case &c, const std::vector<bf16> &qkv, const std::vector<bf16> &dy) {
    Device d;
    size_t BTC = (size_t)c.B * c.T * c.H * c.hd, BHT = (size_t)c.B * c.H * c.T;
    check(cudaMalloc(&d.qkv, 3 * BTC * sizeof(bf16)), "malloc");
    check(cudaMalloc(&d.dy, BTC * sizeof(bf16)), "malloc");
    check(cudaMalloc(&d.y, BTC * sizeof(bf16)), "malloc");
    check(cudaMalloc(&d.dqkv, 3 * BTC * sizeof(bf16)), "malloc");
    check(cudaMalloc(&d.lse, BHT * sizeof(float)), "malloc");
    check(cudaMalloc(&d.D, BHT * sizeof(float)), "malloc");
    check(cudaMemcpy(d.qkv, qkv.data(), 3 * BTC * sizeof(bf16), cudaMemcpyHostToDevice), "upload");
    check(cudaMemcpy(d.dy, dy.data(), BTC * sizeof(bf16), cudaMemcpyHostToDevice), "upload");
    return d;
}

static void release(Device &d) {
    cudaFree(d.qkv); cudaFree(d.dy); cudaFree(d.y); cudaFree(d.dqkv); cudaFree(d.lse); cudaFree(d.D);
}

static void random_inputs(const Case &c, std::vector<bf16> &qkv, std::vector<bf16> &dy) {
    size_t BTC = (size_t)c.B * c.T * c.H * c.hd;
    qkv.resize(3 * BTC);
    dy.resize(BTC);
    for (auto &x : qkv) x = __float2bfloat16_rn(1.5f * normal());  // peaky enough to exercise the running max
    for (auto &x : dy) x = __float2bfloat16_rn(normal());
}

static int check_case(const Case &c) {
    int C = c.H * c.hd;
    size_t BTC = (size_t)c.B * c.T * C, BHT = (size_t)c.B * c.H * c.T;
    std::vector<bf16> qkv, dy;
    random_inputs(c, qkv, dy);
    Device d = upload(c, qkv, dy);
    std::vector<bf16> y(BTC), dqkv(3 * BTC), y2(BTC), dqkv2(3 * BTC);
    std::vector<float> lse(BHT), lse2(BHT);
    poison(c, d);
    run(c, d);
    check(cudaMemcpy(y.data(), d.y, BTC * sizeof(bf16), cudaMemcpyDeviceToHost), "download");
    check(cudaMemcpy(dqkv.data(), d.dqkv, 3 * BTC * sizeof(bf16), cudaMemcpyDeviceToHost), "download");
    check(cudaMemcpy(lse.data(), d.lse, BHT * sizeof(float), cudaMemcpyDeviceToHost), "download");
    poison(c, d);
    run(c, d);
    check(cudaMemcpy(y2.data(), d.y, BTC * sizeof(bf16), cudaMemcpyDeviceToHost), "download");
    check(cudaMemcpy(dqkv2.data(), d.dqkv, 3 * BTC * sizeof(bf16), cudaMemcpyDeviceToHost), "download");
    check(cudaMemcpy(lse2.data(), d.lse, BHT * sizeof(float), cudaMemcpyDeviceToHost), "download");
    release(d);
    bool repeat = memcmp(y.data(), y2.data(), BTC * sizeof(bf16)) == 0 &&
                  memcmp(dqkv.data(), dqkv2.data(), 3 * BTC * sizeof(bf16)) == 0 &&
                  memcmp(lse.data(), lse2.data(), BHT * sizeof(float)) == 0;

    std::vector<float> fy(BTC), fq(BTC), fk(BTC), fv(BTC);
    size_t nonfinite = 0;
    for (size_t i = 0; i < BTC; i++) fy[i] = bf(y[i]);
    for (size_t r = 0; r < (size_t)c.B * c.T; r++)
        for (int col = 0; col < C; col++) {
            fq[r * C + col] = bf(dqkv[r * 3 * C + col]);
            fk[r * C + col] = bf(dqkv[r * 3 * C + C + col]);
            fv[r * C + col] = bf(dqkv[r * 3 * C + 2 * C + col]);
        }
    for (float x : fy) nonfinite += !isfinite(x);
    for (size_t i = 0; i < 3 * BTC; i++) nonfinite += !isfinite(bf(dqkv[i]));
    for (float x : lse) nonfinite += !isfinite(x);

    std::vector<double> ry, rl, rq, rk, rv;
    reference(c, qkv, dy, ry, rl, rq, rk, rv);
    // Gradients are compared per head row (hd wide); lse per element.
    Err ey = compare(fy, ry, c.hd), el = compare(lse, rl, 1), eq = compare(fq, rq, c.hd), ek = compare(fk, rk, c.hd),
        ev = compare(fv, rv, c.hd);
    // dq and dk of a one-key problem are exactly zero: measure them against dv's scale then.
    if (c.T == 1) {
        double sq = 0, sv = 0;
        for (size_t i = 0; i < BTC; i++) { sq += (double)fq[i] * fq[i] + (double)fk[i] * fk[i]; sv += rv[i] * rv[i]; }
        eq.norm = ek.norm = sqrt(sq) / std::max(sqrt(sv), 1e-300);
        eq.row = ek.row = eq.norm;
    }
    printf("{\"hd\":%d,\"T\":%d,\"B\":%d,\"H\":%d,\"nonfinite\":%zu,\"bitwise_repeat\":%s,"
           "\"y\":%.3e,\"lse\":%.3e,\"dq\":%.3e,\"dk\":%.3e,\"dv\":%.3e,"
           "\"y_row\":%.3e,\"dq_row\":%.3e,\"dk_row\":%.3e,\"dv_row\":%.3e}\n",
           c.hd, c.T, c.B, c.H, nonfinite, repeat ? "true" : "false", ey.norm, el.norm, eq.norm, ek.norm, ev.norm,
           ey.row, eq.row, ek.row, ev.row);
    fflush(stdout);
    return 0;
}

static void time_case(const char *name, const Case &c) {
    int C = c.H * c.hd;
    std::vector<bf16> qkv, dy;
    random_inputs(c, qkv, dy);
    Device d = upload(c, qkv, dy);
    cudaEvent_t e0, e1, e2;
    check(cudaEventCreate(&e0), "event");
    check(cudaEventCreate(&e1), "event");
    check(cudaEventCreate(&e2), "event");
    std::vector<float> fwd, bwd;
    for (int rep = 0; rep < 25; rep++) {
        check(cudaEventRecord(e0), "record");
        check(flash_attention_forward(0, d.y, d.lse, d.qkv, c.B, c.T, C, c.H, c.hd), "forward launch");
        check(cudaEventRecord(e1), "record");
        check(flash_attention_backward(0, d.dqkv, d.D, d.dy, d.y, d.qkv, d.lse, c.B, c.T, C, c.H, c.hd), "backward");
        check(cudaEventRecord(e2), "record");
        check(cudaEventSynchronize(e2), "sync");
        float a, b;
        check(cudaEventElapsedTime(&a, e0, e1), "elapsed");
        check(cudaEventElapsedTime(&b, e1, e2), "elapsed");
        if (rep >= 5) { fwd.push_back(a); bwd.push_back(b); }  // the first five warm up
    }
    std::sort(fwd.begin(), fwd.end());
    std::sort(bwd.begin(), bwd.end());
    double f_ms = fwd[fwd.size() / 2], b_ms = bwd[bwd.size() / 2];
    // Causal useful flops: forward 2 products of B*H*T*T/2*hd multiply-adds;
    // backward 5 (FlashAttention-2's count; this split computes 7).
    double fwd_flop = 4.0 * c.B * c.H * (double)c.T * c.T / 2 * c.hd, bwd_flop = 2.5 * fwd_flop;
    printf("{\"shape\":\"%s\",\"B\":%d,\"T\":%d,\"H\":%d,\"hd\":%d,\"fwd_ms\":%.4f,\"bwd_ms\":%.4f,"
           "\"fwd_tflops\":%.1f,\"bwd_tflops\":%.1f}\n",
           name, c.B, c.T, c.H, c.hd, f_ms, b_ms, fwd_flop / f_ms / 1e9, bwd_flop / b_ms / 1e9);
    fflush(stdout);
    release(d);
}

int main(int argc, char **argv) {
    int count = 0;
    check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
    for (int hd : {32, 64, 128}) check(flash_attention_setup(hd), "flash_attention_setup");
    if (argc > 1 && strcmp(argv[1], "--time") == 0) {
        time_case("andrea-12m", {8, 1024, 12, 32});
        time_case("gpt2-124m", {8, 1024, 12, 64});
        time_case("hd128", {8, 1024, 6, 128});
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "--quick") == 0) {
        for (int hd : {32, 64, 128})
            for (int T : {100, 200}) check_case({1, T, 1, hd});
        return 0;
    }
    if (argc > 1) {
        fprintf(stderr, "usage: flash_attention_check [--time | --quick]\n");
        return 2;
    }
    for (int hd : {32, 64, 128})
        for (int T : {1, 64, 100, 1024}) check_case({T == 1024 ? 1 : 2, T, 2, hd});
    return 0;
}

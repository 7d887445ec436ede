// cuda_cpu_check.h: what the kernel checks (kernels_*.cpp) use: device
// memory, the runs of a case, comparisons, and the CPU engine's ops they are
// compared with.
//
// A case launches kernels through the engine's own launchers (the source in
// microgpt/cuda/, compiled for the CPU by cuda_on_cpu.h) on inputs it makes,
// and compares their outputs with the CPU engine's op on the same inputs
// (cpu_ops.c compiles microgpt_cpu.c itself) or with a float64 reference.
// main (cuda_cpu_check.cpp) runs every case twice, the second time with the
// threads and blocks in reverse order, and prints one JSON line per case:
// its errors against their bounds, whether the two runs agreed bit for bit,
// the hazards the shadow found, and the kernels it launched.
#ifndef CUDA_CPU_CHECK_H
#define CUDA_CPU_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include <functional>
#include <string>
#include <vector>

namespace cuda_on_cpu {

// Device memory: an arena with a poisoned gap after every allocation, so an
// access past an allocation's end is an out-of-bounds access (ASan in the
// asan build, the shadow in the hazard build). 256-byte aligned, as cudaMalloc.
void *device_alloc(size_t bytes, const char *name);
void device_free_all();
bool device_arena_contains(const void *p);
void shadow_register(const void *p, size_t bytes, const char *name);

void set_schedule(int schedule);              // 0: in order; 1: threads and blocks reversed
std::vector<std::string> take_launched();     // kernels launched since the last call
long hazard_count();                          // -1 where the build has no shadow
std::vector<std::string> take_hazard_reports();

}  // namespace cuda_on_cpu

namespace check {

// One run of a case.
struct Run {
    int schedule = 0;
    std::vector<std::pair<std::string, std::vector<unsigned char>>> outputs;  // for the run-to-run comparison
    std::vector<std::string> errors;   // JSON objects: "name": {...}
    std::vector<std::string> failures;

    // n elements of device memory, filled with NaN bytes (0xFF), so an element
    // no kernel writes shows.
    template <typename T> T *device(size_t n, const char *name) {
        return (T *)cuda_on_cpu::device_alloc(n * sizeof(T), name);
    }
    // Bytes to compare with the other run's.
    void output(const char *name, const void *p, size_t bytes);
    // got against ref: the norm-relative error ||got - ref|| / ||ref||, and the
    // worst row's error against the RMS row norm (rows of row_len elements),
    // each within its bound; any non-finite element in got fails.
    void compare(const char *name, const std::vector<double> &got, const std::vector<double> &ref, size_t row_len,
                 double bound, double row_bound);
    void fail(const char *fmt, ...) __attribute__((format(printf, 2, 3)));
};

struct Case {
    std::string name;
    std::function<void(Run &)> fn;
};
int add_case(const std::string &name, std::function<void(Run &)> fn);

// Bounds (tests/gpu): fp32 kernels against the CPU engine's op 1e-4
// norm-relative (test_vs_cpu.py's gradient bound); bf16 kernels 1e-2 and a
// worst row of 5e-2 (test_flash_kernels.py's), which is several times the
// bf16 rounding of the outputs.
const double FP32_BOUND = 1e-4, FP32_ROW_BOUND = 1e-3;
const double BF16_BOUND = 1e-2, BF16_ROW_BOUND = 5e-2;

// A fixed-seed generator: the same inputs in both runs.
struct Rng {
    uint64_t s;
    explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
    double uniform();  // [0, 1)
    float normal();
    int below(int n);
};

}  // namespace check

// The CPU engine's ops (cpu_ops.c: microgpt_cpu.c compiled as it is, plus
// these plain entry points).
extern "C" {
void cpu_embedding_forward(float *x0, const int *inputs, const float *wte, const float *wpe, int BT, int T, int C);
void cpu_embedding_backward(float *dwte, float *dwpe, const float *dx, const int *inputs, int BT, int T, int C);
void cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *x, const float *w, const float *b, int R,
                           int C);
void cpu_layernorm_backward(float *dx, float *dw, float *db, const float *dout, const float *x, const float *w,
                            const float *mean, const float *rstd, int R, int C, int accumulate);
void cpu_matmul_forward(float *out, const float *x, const float *W, const float *bias, const float *residual, int R,
                        int IC, int OC, float *gelu_pre);
void cpu_matmul_backward(float *dx, float *dW, float *db, const float *dout, const float *x, const float *W, int R,
                         int IC, int OC, const float *gelu_pre);
void cpu_gelu_forward(float *out, const float *x, size_t n);
void cpu_fp8_round_trip(float *dst, const float *src, size_t n, int fmt);  // fmt: MgFp8Format
void cpu_gelu_backward(float *dx, const float *x, const float *dout, size_t n);
void cpu_attention_forward(float *y, float *att, const float *qkv, int B, int T, int C, int H);
void cpu_attention_backward(float *dqkv, const float *dy, const float *qkv, const float *att, int B, int T, int C, int H);
void cpu_fused_classifier(float *logits, float *losses, const int *targets, int BT, int V, float grad_scale,
                          int write_grad);
double cpu_global_norm(const float *g, size_t n);
void cpu_adamw_update(float *params, const float *grads, float *m, float *v, int V, int T, int C, int L,
                      float grad_mult, float lr, float beta1, float beta2, float eps, float weight_decay, int step);
}

#endif  // CUDA_CPU_CHECK_H

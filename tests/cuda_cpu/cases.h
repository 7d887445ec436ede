// cases.h: helpers the kernel checks share (after the op headers).
#ifndef CUDA_CPU_CASES_H
#define CUDA_CPU_CASES_H

#include "cuda_on_cpu.h"
#include "cuda_cpu_check.h"

#include <string>
#include <vector>

namespace check {

inline float value(float x) { return x; }
inline float value(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> T from_float(float x);
template <> inline float from_float<float>(float x) { return x; }
template <> inline __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

template <typename T> const char *type_name();
template <> inline const char *type_name<float>() { return "fp32"; }
template <> inline const char *type_name<__nv_bfloat16>() { return "bf16"; }

// The bounds for outputs of type T.
template <typename T> double bound() { return sizeof(T) == 4 ? FP32_BOUND : BF16_BOUND; }
template <typename T> double row_bound() { return sizeof(T) == 4 ? FP32_ROW_BOUND : BF16_ROW_BOUND; }

inline std::vector<float> normals(Rng &rng, size_t n, float scale = 1.0f) {
    std::vector<float> v(n);
    for (float &x : v) x = scale * rng.normal();
    return v;
}

// A device copy of xs in type T; xs becomes what the device holds (rounded to
// bf16 where T is), so a reference computed from xs sees the kernel's inputs.
template <typename T> T *upload(Run &run, std::vector<float> &xs, const char *name) {
    T *d = run.device<T>(xs.size(), name);
    for (size_t i = 0; i < xs.size(); i++) {
        d[i] = from_float<T>(xs[i]);
        xs[i] = value(d[i]);
    }
    return d;
}

template <typename T> T *upload_ints(Run &run, const std::vector<T> &xs, const char *name) {
    T *d = run.device<T>(xs.size(), name);
    for (size_t i = 0; i < xs.size(); i++) d[i] = xs[i];
    return d;
}

template <typename T> std::vector<double> values(const T *p, size_t n) {
    std::vector<double> v(n);
    for (size_t i = 0; i < n; i++) v[i] = value(p[i]);
    return v;
}

inline std::vector<double> doubles(const std::vector<float> &x) { return std::vector<double>(x.begin(), x.end()); }

// Records n elements of a device output for the run-to-run comparison and
// returns them as doubles.
template <typename T> std::vector<double> result(Run &run, const char *name, const T *p, size_t n) {
    run.output(name, p, n * sizeof(T));
    return values(p, n);
}

inline std::string shape(const char *op, const char *type, const std::string &dims) {
    return std::string(op) + "/" + type + "/" + dims;
}

}  // namespace check

#endif  // CUDA_CPU_CASES_H

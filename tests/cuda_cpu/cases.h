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

// A classifier case's inputs: BT rows of V logits, a random target per row but rows 5 and 20 padded (target
// -1) and row `last_column_row` (when >= 0) aiming at the last column; uploaded, with a loss per row.
template <typename Tx> struct ClassifierInput {
    std::vector<float> logits;
    std::vector<int> targets;
    Tx *d_logits;
    int *d_targets;
    float *losses;
};

template <typename Tx>
ClassifierInput<Tx> classifier_input(Run &run, int BT, int V, uint64_t seed, int last_column_row = -1) {
    ClassifierInput<Tx> in;
    Rng rng(seed);
    in.logits = normals(rng, (size_t)BT * V, 3.0f);
    in.targets.resize(BT);
    for (int &t : in.targets) t = rng.below(V);
    in.targets[5] = in.targets[20] = -1;
    if (last_column_row >= 0) in.targets[last_column_row] = V - 1;
    in.d_logits = upload<Tx>(run, in.logits, "logits");
    in.d_targets = upload_ints(run, in.targets, "targets");
    in.losses = run.device<float>(BT, "losses");
    return in;
}

// After a classifier kernel ran on `logits` (as uploaded) in place at d_logits, writing `losses`: the CPU
// engine's op on the rows that have a target, compared; a padded row (target -1) has loss 0 and, with
// write_grad, gradient 0; without write_grad the logits stay as they were. Both classifier variants' cases.
template <typename Tx>
void check_classifier(Run &run, const std::vector<float> &logits, const std::vector<int> &targets, int BT, int V,
                      float grad_scale, int write_grad, const Tx *d_logits, const float *losses) {
    std::vector<float> rows, ref_losses;
    std::vector<int> kept_targets, kept;
    for (int i = 0; i < BT; i++)
        if (targets[i] >= 0) {
            rows.insert(rows.end(), logits.begin() + (size_t)i * V, logits.begin() + (size_t)(i + 1) * V);
            kept_targets.push_back(targets[i]);
            kept.push_back(i);
        }
    int n = (int)kept.size();
    ref_losses.resize(n);
    cpu_fused_classifier(rows.data(), ref_losses.data(), kept_targets.data(), n, V, grad_scale, 1);
    std::vector<double> got_losses = result(run, "losses", losses, BT);
    std::vector<double> got_grads = result(run, "logits", d_logits, (size_t)BT * V);
    std::vector<double> kept_losses, kept_grads;
    for (int i : kept) {
        kept_losses.push_back(got_losses[i]);
        kept_grads.insert(kept_grads.end(), got_grads.begin() + (size_t)i * V, got_grads.begin() + (size_t)(i + 1) * V);
    }
    run.compare("losses", kept_losses, doubles(ref_losses), 1, FP32_BOUND, FP32_ROW_BOUND);
    if (write_grad)
        run.compare("dlogits", kept_grads, doubles(rows), V, bound<Tx>(), row_bound<Tx>());
    for (int i = 0; i < BT; i++) {
        if (targets[i] >= 0) {
            if (!write_grad)  // the logits stay as they were
                for (int j = 0; j < V; j++)
                    if (got_grads[(size_t)i * V + j] != logits[(size_t)i * V + j]) {
                        run.fail("row %d: logit %d changed without write_grad", i, j);
                        break;
                    }
            continue;
        }
        if (got_losses[i] != 0.0) run.fail("padded row %d: loss %g, not 0", i, got_losses[i]);
        for (int j = 0; write_grad && j < V; j++)
            if (got_grads[(size_t)i * V + j] != 0.0) {
                run.fail("padded row %d: gradient %g at %d, not 0", i, got_grads[(size_t)i * V + j], j);
                break;
            }
    }
}
}  // namespace check

#endif  // CUDA_CPU_CASES_H

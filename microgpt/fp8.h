// fp8.h: the FP8 numbers of --precision fp8 (docs/ENGINE.md, "FP8"): the two
// formats, round-to-nearest-even conversion from fp32, exact decoding, and the
// per-tensor scale. Pure scalar functions in the common subset of C11 and
// C++17, so the CPU engine, the CUDA kernels (__host__ __device__ where nvcc
// compiles them) and the tests all use this one definition.
//
//   E4M3 (OCP "e4m3fn"): 1 sign, 4 exponent bits (bias 7), 3 mantissa bits; no
//        infinity, NaN = S.1111.111; largest finite 448, smallest 2^-9.
//   E5M2: 1 sign, 5 exponent bits (bias 15), 2 mantissa bits (IEEE-like: the
//        upper byte of an fp16); infinity and NaN; largest finite 57344,
//        smallest 2^-16.
//
// Conversion: round to nearest, ties to even, on the fp32 bits (no use of the
// floating-point environment). Finite values beyond the largest finite code
// saturate to it (as cuda_fp8.h's __NV_SATFINITE). Non-finite values stay
// non-finite so a diverged tensor reaches the engine's non-finite check:
// NaN -> NaN; +-inf -> +-inf in E5M2 and NaN in E4M3, which has no infinity.
//
// Scale (per tensor, current: from the tensor being converted): x is stored as
// q = fp8(x * scale) and read back as decode(q) / scale. The scale is the
// largest power of two with amax * scale <= FP8_MAX, amax = max |x| over the
// tensor's finite values. A power of two, so multiplying by it and dividing by
// it are exact: the dequantised product of two tensors equals the fp8 GEMM's
// fp32 sum of code products times 1 / (scale_a * scale_b), whatever order the
// scales are applied in, and the CPU engine reproduces the GPU's numbers up to
// the order of the fp32 accumulation. It gives up at most one binade of range
// against FP8_MAX / amax. amax 0 (an all-zero tensor) gives scale 1; the
// exponent is clamped to [-MG_FP8_SCALE_EXP_MAX, MG_FP8_SCALE_EXP_MAX], so a
// tiny amax cannot make an infinite scale. A tensor holding inf or NaN keeps
// the scale of its finite values; those elements convert as above.
#ifndef MICROGPT_FP8_H
#define MICROGPT_FP8_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define MG_FP8_FN __host__ __device__ static inline
#else
#define MG_FP8_FN static inline
#endif

typedef enum { MG_FP8_E4M3 = 0, MG_FP8_E5M2 = 1 } MgFp8Format;

#define MG_FP8_E4M3_MAX 448.0f
#define MG_FP8_E5M2_MAX 57344.0f
#define MG_FP8_SCALE_EXP_MAX 100

MG_FP8_FN int mg_fp8_mbits(MgFp8Format f) { return f == MG_FP8_E4M3 ? 3 : 2; }
MG_FP8_FN int mg_fp8_bias(MgFp8Format f) { return f == MG_FP8_E4M3 ? 7 : 15; }
MG_FP8_FN float mg_fp8_max(MgFp8Format f) { return f == MG_FP8_E4M3 ? MG_FP8_E4M3_MAX : MG_FP8_E5M2_MAX; }
MG_FP8_FN uint8_t mg_fp8_max_code(MgFp8Format f) { return f == MG_FP8_E4M3 ? 0x7E : 0x7B; }
MG_FP8_FN uint8_t mg_fp8_nan_code(MgFp8Format f) { return f == MG_FP8_E4M3 ? 0x7F : 0x7E; }

MG_FP8_FN uint32_t mg_fp8_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

// fp32 -> fp8 code, round to nearest even, saturating (see the top of the file).
MG_FP8_FN uint8_t mg_fp8_encode(float x, MgFp8Format f) {
    uint32_t u = mg_fp8_bits(x);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80);
    uint32_t mag = u & 0x7FFFFFFFu;
    int mbits = mg_fp8_mbits(f), bias = mg_fp8_bias(f);
    if (mag > 0x7F800000u) return (uint8_t)(sign | mg_fp8_nan_code(f));         // NaN
    if (mag == 0x7F800000u) return (uint8_t)(sign | (f == MG_FP8_E4M3 ? 0x7F : 0x7C));  // inf
    if (mag == 0) return sign;
    float a;
    memcpy(&a, &mag, 4);
    if (a >= mg_fp8_max(f)) return (uint8_t)(sign | mg_fp8_max_code(f));
    // a = M * 2^(E - 23) with M the 24-bit significand (implicit bit included).
    int e_field = (int)(mag >> 23);
    uint64_t M = (mag & 0x7FFFFFu) | (e_field ? 0x800000u : 0);
    int E = e_field ? e_field - 127 : -126;
    // The fp8 quantum at a: 2^(E - mbits) among normals, 2^(1 - bias - mbits)
    // below the smallest normal. q = a / quantum, rounded to nearest even.
    int qexp = E > 1 - bias ? E - mbits : 1 - bias - mbits;
    int shift = 23 - E + qexp;  // a / quantum = M / 2^shift; shift >= 23 - mbits > 0
    uint64_t q;
    if (shift > 40) {
        q = 0;  // a < quantum / 2^17: rounds to zero
    } else {
        uint64_t half = (uint64_t)1 << (shift - 1), rem = M & ((half << 1) - 1);
        q = M >> shift;
        if (rem > half || (rem == half && (q & 1))) q++;
    }
    // q in [0, 2^(mbits+1)]: below 2^mbits a subnormal (exponent field 0); at
    // 2^mbits or above a normal whose exponent field is qexp + mbits + bias
    // (and q = 2^(mbits+1), a carry, is the next binade's 1.0: the same sum).
    uint32_t code;
    if (q < ((uint64_t)1 << mbits) && qexp == 1 - bias - mbits) code = (uint32_t)q;
    else code = ((uint32_t)(qexp + mbits + bias) << mbits) + (uint32_t)(q - ((uint64_t)1 << mbits));
    return (uint8_t)(sign | code);
}

// fp8 code -> fp32, exact.
MG_FP8_FN float mg_fp8_decode(uint8_t code, MgFp8Format f) {
    int mbits = mg_fp8_mbits(f), bias = mg_fp8_bias(f);
    int e = (code & 0x7F) >> mbits, m = code & ((1 << mbits) - 1);
    float s = (code & 0x80) ? -1.0f : 1.0f;
    if (f == MG_FP8_E4M3 && (code & 0x7F) == 0x7F) return NAN;
    if (f == MG_FP8_E5M2 && e == 31) return m ? NAN : s * INFINITY;
    if (e == 0) return s * ldexpf((float)m, 1 - bias - mbits);
    return s * ldexpf((float)(m + (1 << mbits)), e - bias - mbits);
}

// The scale's exponent k (scale = 2^k) for a tensor whose largest finite
// |value| is amax: the largest k with amax * 2^k <= FP8_MAX, clamped.
MG_FP8_FN int mg_fp8_scale_exp(float amax, MgFp8Format f) {
    if (!(amax > 0) || !(amax <= 3.4028235e38f)) return 0;  // zero, or not a finite positive number
    int k_amax;
    float m = frexpf(amax, &k_amax);  // amax = m * 2^k_amax, m in [0.5, 1)
    // FP8_MAX = 0.875 * 2^(9 or 16): amax * 2^k <= it iff m * 2^(k_amax + k) <= 0.875 * 2^top.
    int top = f == MG_FP8_E4M3 ? 9 : 16;
    int k = (m <= 0.875f ? top : top - 1) - k_amax;
    if (k > MG_FP8_SCALE_EXP_MAX) k = MG_FP8_SCALE_EXP_MAX;
    if (k < -MG_FP8_SCALE_EXP_MAX) k = -MG_FP8_SCALE_EXP_MAX;
    return k;
}

// x rounded through the format at scale 2^k and read back: decode(encode(x *
// 2^k)) * 2^-k, given scale = 2^k and inv_scale = 2^-k (mg_fp8_scale). Both
// products are exact for |k| <= MG_FP8_SCALE_EXP_MAX: the first can only lose
// bits below 2^-126, which round to zero in either format anyway, and the
// second multiplies a code's value by a power of two that keeps it normal.
MG_FP8_FN float mg_fp8_round_trip(float x, MgFp8Format f, float scale, float inv_scale) {
    return mg_fp8_decode(mg_fp8_encode(x * scale, f), f) * inv_scale;
}

MG_FP8_FN float mg_fp8_scale(int k) { return ldexpf(1.0f, k); }

#endif  // MICROGPT_FP8_H

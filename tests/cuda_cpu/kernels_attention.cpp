// kernels_attention.cpp: the naive attention kernels (forward, dQ, dK/dV),
// through attention_forward / attention_backward as the engine calls them,
// at a head dim in each of the five template buckets (8, 16, 32, 64, 128;
// 12, 24 and 80 padded), in fp32 and bf16, with T not a multiple of the row
// or key tiles.
#include "cuda_on_cpu.h"

#include "../../microgpt/cuda/attention.cuh"

#include "attention_reference.h"

using namespace check;

template <typename Tx> static void naive_case(Run &run, AttentionShape s) {
    AttentionInputs in = attention_inputs<Tx>(s, 21 + s.hd);
    AttentionBuffers<Tx> b = attention_buffers<Tx>(run, s, in);
    attention_forward<Tx>(b.y, b.lse, b.qkv, s.B, s.T, s.C(), s.H, ATTENTION_NAIVE, nullptr);
    attention_backward<Tx>(b.dqkv, b.dy, b.y, b.qkv, b.lse, s.B, s.T, s.C(), s.H, b.D, ATTENTION_NAIVE, nullptr);
    compare_attention<Tx>(run, s, in, b.y, b.lse, b.D, b.dqkv);
}

template <typename Tx> static void add_naive() {
    // T = 70: two key tiles at head dims up to 64 (64-row tiles), three at 80
    // (32-row tiles), and a partial row tile everywhere.
    for (int hd : {8, 12, 24, 64, 80}) {
        AttentionShape s = {2, 70, 2, hd};
        add_case(shape("attention_naive", type_name<Tx>(), s.name()), [s](Run &r) { naive_case<Tx>(r, s); });
    }
    AttentionShape one = {2, 1, 2, 64};  // a single key: dq = dk = 0
    add_case(shape("attention_naive", type_name<Tx>(), one.name()), [one](Run &r) { naive_case<Tx>(r, one); });
}

static int registered = [] {
    add_naive<float>();
    add_naive<__nv_bfloat16>();
    return 0;
}();

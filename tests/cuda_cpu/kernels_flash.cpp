// kernels_flash.cpp: the tensor-core attention kernels (forward, backward
// preprocess, dK/dV, dQ), through flash_attention_setup / _forward /
// _backward as the engine calls them, at head dims 32, 64 and 128 and T = 64
// (whole tiles), 100 and 130 (partial ones), and T = 1, bf16 (their only
// type).
#include "cuda_on_cpu.h"

#include "../../microgpt/cuda/attention_flash.cuh"

#include "attention_reference.h"

using namespace check;

static void flash_case(Run &run, AttentionShape s) {
    typedef __nv_bfloat16 bf16;
    AttentionInputs in = attention_inputs<bf16>(s, 31 + s.hd + s.T);
    AttentionBuffers<bf16> b = attention_buffers<bf16>(run, s, in);
    cudaError_t err = flash_attention_setup(s.hd);
    if (err == cudaSuccess) err = flash_attention_forward(nullptr, b.y, b.lse, b.qkv, s.B, s.T, s.C(), s.H, s.hd);
    if (err == cudaSuccess)
        err = flash_attention_backward(nullptr, b.dqkv, b.D, b.dy, b.y, b.qkv, b.lse, s.B, s.T, s.C(), s.H, s.hd);
    if (err != cudaSuccess) {
        run.fail("launch: %s", cudaGetErrorString(err));
        return;
    }
    compare_attention<bf16>(run, s, in, b.y, b.lse, b.D, b.dqkv);
}

static int registered = [] {
    for (int hd : {32, 64, 128})
        for (int T : {64, 100, 130}) {
            AttentionShape s = {1, T, 2, hd};
            add_case(shape("attention_flash", "bf16", s.name()), [s](Run &r) { flash_case(r, s); });
        }
    AttentionShape one = {2, 1, 2, 64};  // a single key: dq = dk = 0
    add_case(shape("attention_flash", "bf16", one.name()), [one](Run &r) { flash_case(r, one); });
    return 0;
}();

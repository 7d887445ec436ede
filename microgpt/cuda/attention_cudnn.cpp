// cuda/attention_cudnn.cpp: the cuDNN SDPA graphs behind attention_cudnn.h.
//
// One translation unit of its own because cudnn-frontend is a large
// header-only C++ library: the engine's other sources never see it, and it
// is compiled once per build, not with every kernel change. Host code only:
// cuDNN runs its own kernels.
//
// Why cuDNN: its fused SDPA kernels are the fastest causal attention on
// sm_80 and sm_90 at the head dims GPT models use (64, 128), faster than the
// engine's own tensor-core kernels (attention_flash.cuh), which stay for
// builds without cuDNN and as a cross-check.
#include "attention_cudnn.h"

#include "cudnn_loader.h"  // cuDNN is loaded at run time: the engine does not link it

#include <cudnn.h>
#include <cudnn_frontend.h>

#include <stdio.h>

#include <memory>
#include <string>
#include <unordered_map>

namespace fe = cudnn_frontend;

// Fixed ids of the graphs' tensors: a variant pack maps them to pointers.
enum : int64_t { UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_DO, UID_DQ, UID_DK, UID_DV };

struct CudnnAttention {
    cudnnHandle_t handle = nullptr;
    int C = 0;
    std::shared_ptr<fe::graph::Graph> forward, backward;
    int64_t workspace = 0;
};

// A [B, H, T, hd] view of one third of qkv [B, T, 3C] (or of y / dy [B, T, C]
// with row = C): head h of token t of row b at b*T*row + t*row + h*hd.
static std::shared_ptr<fe::graph::Tensor_attributes> view(fe::graph::Graph &g, const char *name, int64_t uid, int B,
                                                          int H, int T, int hd, int64_t row) {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_uid(uid)
                        .set_dim({B, H, T, hd})
                        .set_stride({(int64_t)T * row, hd, row, 1}));
}

static std::shared_ptr<fe::graph::Tensor_attributes> stats_tensor(fe::graph::Graph &g, int B, int H, int T) {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name("stats")
                        .set_uid(UID_STATS)
                        .set_dim({B, H, T, 1})
                        .set_stride({(int64_t)H * T, T, 1, 1})
                        .set_data_type(fe::DataType_t::FLOAT));
}

static std::shared_ptr<fe::graph::Graph> new_graph() {
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    return g;
}

// validate, lower, pick a plan by the heuristic, check it runs here, build it.
static bool finish_graph(fe::graph::Graph &g, cudnnHandle_t handle, const char *what, char *why, size_t why_len) {
    fe::error_t st = g.validate();
    if (st.is_good()) st = g.build_operation_graph(handle);
    if (st.is_good()) st = g.create_execution_plans({fe::HeurMode_t::A});
    if (st.is_good()) st = g.check_support(handle);
    if (st.is_good()) st = g.build_plans(handle);
    if (st.is_good()) return true;
    snprintf(why, why_len, "cuDNN cannot build the attention %s graph: %s", what, st.get_message().c_str());
    return false;
}

static void destroy(CudnnAttention *a) {
    if (!a) return;
    a->forward.reset();
    a->backward.reset();
    if (a->handle) cudnnDestroy(a->handle);
    delete a;
}

CudnnAttention *cudnn_attention_create(int B, int T, int C, int H, cudaStream_t stream, char *why, size_t why_len) {
    if (!cudnn_library_load(why, why_len)) return nullptr;
    int hd = C / H;
    CudnnAttention *a = new CudnnAttention();
    a->C = C;
    try {
        cudnnStatus_t cs = cudnnCreate(&a->handle);
        if (cs == CUDNN_STATUS_SUCCESS) cs = cudnnSetStream(a->handle, stream);
        if (cs != CUDNN_STATUS_SUCCESS) {
            snprintf(why, why_len, "cuDNN did not start: %s", cudnnGetErrorString(cs));
            destroy(a);
            return nullptr;
        }
        float scale = 1.0f / sqrtf((float)hd);
        int64_t row3 = 3 * (int64_t)C;

        // Forward, with the statistics the backward needs.
        auto f = new_graph();
        auto q = view(*f, "q", UID_Q, B, H, T, hd, row3), k = view(*f, "k", UID_K, B, H, T, hd, row3),
             v = view(*f, "v", UID_V, B, H, T, hd, row3);
        auto fopt = fe::graph::SDPA_attributes()
                        .set_name("attention_forward")
                        .set_generate_stats(true)
                        .set_causal_mask(true)
                        .set_attn_scale(scale);
        auto [o, stats] = f->sdpa(q, k, v, fopt);
        o->set_output(true).set_uid(UID_O).set_dim({B, H, T, hd}).set_stride({(int64_t)T * C, hd, C, 1});
        stats->set_output(true)
            .set_uid(UID_STATS)
            .set_dim({B, H, T, 1})
            .set_stride({(int64_t)H * T, T, 1, 1})
            .set_data_type(fe::DataType_t::FLOAT);  // lse [B*H, T], as the backward reads it
        if (!finish_graph(*f, a->handle, "forward", why, why_len)) {
            destroy(a);
            return nullptr;
        }

        // Backward, with the deterministic algorithm: the same inputs give the same bits.
        auto g = new_graph();
        auto bq = view(*g, "q", UID_Q, B, H, T, hd, row3), bk = view(*g, "k", UID_K, B, H, T, hd, row3),
             bv = view(*g, "v", UID_V, B, H, T, hd, row3), bo = view(*g, "o", UID_O, B, H, T, hd, C),
             bdo = view(*g, "do", UID_DO, B, H, T, hd, C);
        auto bstats = stats_tensor(*g, B, H, T);
        auto bopt = fe::graph::SDPA_backward_attributes()
                        .set_name("attention_backward")
                        .set_causal_mask(true)
                        .set_attn_scale(scale)
                        .set_deterministic_algorithm(true);
        auto [dq, dk, dv] = g->sdpa_backward(bq, bk, bv, bo, bdo, bstats, bopt);
        dq->set_output(true).set_uid(UID_DQ).set_dim({B, H, T, hd}).set_stride({(int64_t)T * row3, hd, row3, 1});
        dk->set_output(true).set_uid(UID_DK).set_dim({B, H, T, hd}).set_stride({(int64_t)T * row3, hd, row3, 1});
        dv->set_output(true).set_uid(UID_DV).set_dim({B, H, T, hd}).set_stride({(int64_t)T * row3, hd, row3, 1});
        if (!finish_graph(*g, a->handle, "backward", why, why_len)) {
            destroy(a);
            return nullptr;
        }
        int64_t wf = 0, wb = 0;
        if (!f->get_workspace_size(wf).is_good() || !g->get_workspace_size(wb).is_good()) {
            snprintf(why, why_len, "cuDNN did not report the attention graphs' workspace");
            destroy(a);
            return nullptr;
        }
        a->workspace = wf > wb ? wf : wb;
        a->forward = f;
        a->backward = g;
    } catch (const std::exception &ex) {
        snprintf(why, why_len, "cuDNN failed building the attention graphs: %s", ex.what());
        destroy(a);
        return nullptr;
    }
    return a;
}

size_t cudnn_attention_workspace_bytes(const CudnnAttention *a) { return (size_t)a->workspace; }

static int run(const fe::graph::Graph &g, cudnnHandle_t handle, std::unordered_map<int64_t, void *> &pack,
               void *workspace, const char *what, char *err, size_t err_len) {
    try {
        fe::error_t st = g.execute(handle, pack, workspace);
        if (st.is_good()) return 0;
        snprintf(err, err_len, "cuDNN attention %s: %s", what, st.get_message().c_str());
    } catch (const std::exception &ex) {
        snprintf(err, err_len, "cuDNN attention %s: %s", what, ex.what());
    }
    return -1;
}

int cudnn_attention_forward(CudnnAttention *a, void *workspace, void *y, float *lse, const void *qkv, char *err,
                            size_t err_len) {
    char *base = (char *)qkv;
    size_t third = (size_t)a->C * 2;  // bytes of C bf16 values
    std::unordered_map<int64_t, void *> pack = {
        {UID_Q, base}, {UID_K, base + third}, {UID_V, base + 2 * third}, {UID_O, y}, {UID_STATS, lse}};
    return run(*a->forward, a->handle, pack, workspace, "forward", err, err_len);
}

int cudnn_attention_backward(CudnnAttention *a, void *workspace, void *dqkv, const void *dy, const void *y,
                             const void *qkv, const float *lse, char *err, size_t err_len) {
    char *base = (char *)qkv, *dbase = (char *)dqkv;
    size_t third = (size_t)a->C * 2;
    std::unordered_map<int64_t, void *> pack = {
        {UID_Q, base},          {UID_K, base + third},           {UID_V, base + 2 * third}, {UID_O, (void *)y},
        {UID_DO, (void *)dy},   {UID_STATS, (void *)lse},        {UID_DQ, dbase},           {UID_DK, dbase + third},
        {UID_DV, dbase + 2 * third}};
    return run(*a->backward, a->handle, pack, workspace, "backward", err, err_len);
}

const char *cudnn_attention_version(void) {
    static char text[96];
    size_t v = cudnnGetVersion();  // 9xxyy: major * 10000 + minor * 100 + patch
    snprintf(text, sizeof text, "cuDNN %zu.%zu.%zu (frontend %d.%d.%d)", v / 10000, v / 100 % 100, v % 100,
             CUDNN_FRONTEND_MAJOR_VERSION, CUDNN_FRONTEND_MINOR_VERSION, CUDNN_FRONTEND_PATCH_VERSION);
    return text;
}

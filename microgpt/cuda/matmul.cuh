// cuda/matmul.cuh: the matmuls, through cuBLASLt, and the linear layer built
// on them: matmul_forward (x W^T + bias, plus a residual or a GELU) and
// matmul_backward (dx, dW, db).
//
// cuBLASLt is column-major: D[m x n] = op(A)[m x k] op(B)[k x n] + beta C
// (+ epilogue). Our tensors are row-major, and a row-major [R, S] array is a
// column-major S x R matrix with leading dimension S. So each product of a
// linear layer with x [R, IC], W [OC, IC], y [R, OC] is one cuBLASLt call:
//   gemm_xwt   y   = x W^T    m=OC n=R  k=IC  A=W (T, ld IC)  B=x  (N, ld IC)
//   gemm_dyw   dx  = dy W     m=IC n=R  k=OC  A=W (N, ld IC)  B=dy (N, ld OC)
//   gemm_dytx  dW += dy^T x   m=IC n=OC k=R   A=x (N, ld IC)  B=dy (T, ld OC)
// A plan (descriptor, layouts, the heuristic's algorithm) is made once per
// distinct key and reused, so every call of a shape runs the same algorithm:
// part of the determinism promise. The minimum-alignment preferences are the
// pointers' real alignments, since tensors inside the flat parameter array
// need not be 256-byte aligned (cuBLASLt's default assumption).
//
// In bf16 the layer fuses what cuBLASLt can: BIAS (with the residual as C,
// beta = 1), GELU_AUX_BIAS (the pre-activation saved as aux) and DGELU. An
// epilogue cuBLASLt refuses falls back, for that plan and for good, to the
// unfused kernels (bias.cuh, gelu.cuh), with one warning.
#ifndef MICROGPT_CUDA_MATMUL_CUH
#define MICROGPT_CUDA_MATMUL_CUH

#include <cublasLt.h>

#include "bias.cuh"
#include "common.cuh"
#include "gelu.cuh"

static void cublas_check(cublasStatus_t st, const char *file, int line, const char *what) {
    if (st != CUBLAS_STATUS_SUCCESS)
        mg_fail(MG_EXIT_IO, "cuBLASLt error at %s:%d: %s (%s)", file, line, cublasLtGetStatusString(st), what);
}
#define CUBLAS_CHECK(call) cublas_check((call), __FILE__, __LINE__, #call)

template <typename T> struct CudaType;
template <> struct CudaType<float> { static const cudaDataType_t value = CUDA_R_32F; };
template <> struct CudaType<bf16> { static const cudaDataType_t value = CUDA_R_16BF; };

#define MAX_PLANS 256
#define LT_WORKSPACE (32u << 20)  // cuBLASLt workspace: 32 MiB, NVIDIA's advice for Hopper

// One GEMM in cuBLASLt's terms; also the key its plan is found by (with
// memcmp: the longs first, so the struct has no padding).
typedef struct {
    long lda, ldb, ldd, aux_ld;
    int m, n, k, ta, tb;
    int ab_type, d_type, epilogue;
    int align_a, align_b, align_c, align_d;
} GemmKey;

typedef struct {
    GemmKey key;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c, d;
    cublasLtMatmulAlgo_t algo;
    int ok;  // 0: cuBLASLt refused this form (only fused forms may be refused)
} GemmPlan;

// The cuBLASLt context of one engine: the handle, its workspace and stream,
// the plans made so far, and whether to try the fused epilogues.
typedef struct {
    cublasLtHandle_t lt;
    void *workspace;  // LT_WORKSPACE bytes of device memory
    cudaStream_t stream;
    int fuse;         // try the epilogues (bf16 only)
    int warned_unfused;
    GemmPlan plans[MAX_PLANS];
    int n_plans;
} Matmul;

// What cuBLASLt adds to a product: an epilogue (CUBLASLT_EPILOGUE_DEFAULT:
// none), its bias vector and its aux tensor.
typedef struct {
    cublasLtEpilogue_t kind;
    const void *bias;
    const void *aux;
} GemmEpilogue;
static const GemmEpilogue NO_EPILOGUE = {CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL};

static void matmul_init(Matmul *mm, cudaStream_t stream, void *workspace, int fuse) {
    memset(mm, 0, sizeof *mm);
    CUBLAS_CHECK(cublasLtCreate(&mm->lt));
    mm->workspace = workspace;
    mm->stream = stream;
    mm->fuse = fuse;
}

static int ptr_align(const void *p) {
    uintptr_t a = (uintptr_t)p;
    int al = 256;
    while (al > 1 && a % (uintptr_t)al) al >>= 1;
    return al;
}

static GemmPlan *gemm_plan(Matmul *mm, const GemmKey *key, const void *bias, const void *aux) {
    for (int i = 0; i < mm->n_plans; i++)
        if (memcmp(&mm->plans[i].key, key, sizeof *key) == 0) return &mm->plans[i];
    if (mm->n_plans == MAX_PLANS) mg_fail(MG_EXIT_IO, "internal: more than %d distinct GEMM shapes", MAX_PLANS);
    GemmPlan *p = &mm->plans[mm->n_plans++];
    memset(p, 0, sizeof *p);
    p->key = *key;
    cudaDataType_t ab = (cudaDataType_t)key->ab_type, dt = (cudaDataType_t)key->d_type;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t opa = key->ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = key->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    cublasLtEpilogue_t epi = (cublasLtEpilogue_t)key->epilogue;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    if (bias) CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    if (aux) {
        int64_t ld = key->aux_ld;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld));
    }
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, ab, key->ta ? key->k : key->m, key->ta ? key->m : key->k, key->lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, ab, key->tb ? key->n : key->k, key->tb ? key->k : key->n, key->ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, dt, key->m, key->n, key->ldd));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->d, dt, key->m, key->n, key->ldd));
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = LT_WORKSPACE;
    uint32_t al[4] = {(uint32_t)key->align_a, (uint32_t)key->align_b, (uint32_t)key->align_c, (uint32_t)key->align_d};
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al[0], sizeof al[0]));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al[1], sizeof al[1]));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al[2], sizeof al[2]));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al[3], sizeof al[3]));
    cublasLtMatmulHeuristicResult_t heur;
    memset(&heur, 0, sizeof heur);
    int found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(mm->lt, p->desc, p->a, p->b, p->c, p->d, pref, 1, &heur, &found);
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    if (st == CUBLAS_STATUS_SUCCESS && found > 0 && heur.state == CUBLAS_STATUS_SUCCESS) {
        p->algo = heur.algo;
        p->ok = 1;
    } else if (key->epilogue == CUBLASLT_EPILOGUE_DEFAULT) {
        mg_fail(MG_EXIT_IO, "cuBLASLt has no algorithm for a %dx%dx%d GEMM (trans %d%d, types %d/%d): %s", key->m, key->n,
                key->k, key->ta, key->tb, key->ab_type, key->d_type, cublasLtGetStatusString(st));
    }
    return p;
}

// D = op(A) op(B) + beta C, then the epilogue (aux with leading dimension
// key->aux_ld); key holds the shape, transposes, types and leading
// dimensions, and gets the epilogue and the alignments here. Returns 1 when
// done; 0 when a fused epilogue is not available (the caller then runs the
// unfused kernels). Plain GEMMs never return 0.
static int gemm(Matmul *mm, GemmKey key, const void *A, const void *Bm, float beta, const void *Cm, void *D,
                GemmEpilogue epi) {
    if (!Cm) Cm = D;
    key.epilogue = (int)epi.kind;
    if (!epi.aux) key.aux_ld = 0;
    key.align_a = ptr_align(A); key.align_b = ptr_align(Bm); key.align_c = ptr_align(Cm); key.align_d = ptr_align(D);
    GemmPlan *p = gemm_plan(mm, &key, epi.bias, epi.aux);
    if (!p->ok) return 0;
    if (epi.bias)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &epi.bias, sizeof epi.bias));
    if (epi.aux)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &epi.aux,
                                                    sizeof epi.aux));
    float alpha = 1.0f;
    cublasStatus_t st = cublasLtMatmul(mm->lt, p->desc, &alpha, A, p->a, Bm, p->b, &beta, Cm, p->c, D, p->d, &p->algo,
                                       mm->workspace, LT_WORKSPACE, mm->stream);
    if (st != CUBLAS_STATUS_SUCCESS && epi.kind != CUBLASLT_EPILOGUE_DEFAULT) {
        // Validation failures are reported before any work is queued.
        p->ok = 0;
        return 0;
    }
    CUBLAS_CHECK(st);
    return 1;
}

static GemmKey gemm_key(int ta, int tb, int m, int n, int k, long lda, long ldb, long ldd, cudaDataType_t ab,
                        cudaDataType_t dt, long aux_ld) {
    GemmKey key;
    memset(&key, 0, sizeof key);
    key.m = m; key.n = n; key.k = k; key.ta = ta; key.tb = tb;
    key.lda = lda; key.ldb = ldb; key.ldd = ldd; key.aux_ld = aux_ld;
    key.ab_type = (int)ab; key.d_type = (int)dt;
    return key;
}

// out[R, OC] = x[R, IC] W[OC, IC]^T, plus addend[R, OC] when given (beta = 1;
// addend may be out), then the epilogue (aux [R, OC]). All of type t.
static int gemm_xwt(Matmul *mm, cudaDataType_t t, void *out, const void *x, const void *W, const void *addend, int R,
                    int IC, int OC, GemmEpilogue epi) {
    return gemm(mm, gemm_key(1, 0, OC, R, IC, IC, IC, OC, t, t, OC), W, x, addend ? 1.0f : 0.0f, addend, out, epi);
}

// dx[R, IC] = dy[R, OC] W[OC, IC], then the epilogue (aux [R, IC]). All of type t.
static int gemm_dyw(Matmul *mm, cudaDataType_t t, void *dx, const void *dy, const void *W, int R, int IC, int OC,
                    GemmEpilogue epi) {
    return gemm(mm, gemm_key(0, 0, IC, R, OC, IC, OC, IC, t, t, IC), W, dy, 0.0f, NULL, dx, epi);
}

// dW[OC, IC] += dy[R, OC]^T x[R, IC]: dy and x of type t, dW fp32.
static void gemm_dytx(Matmul *mm, cudaDataType_t t, float *dW, const void *dy, const void *x, int R, int IC, int OC) {
    gemm(mm, gemm_key(0, 1, IC, OC, R, IC, OC, IC, t, CUDA_R_32F, 0), x, dy, 1.0f, NULL, dW, NO_EPILOGUE);
}

static void note_unfused(Matmul *mm, const char *what) {
    if (mm->warned_unfused) return;
    mm->warned_unfused = 1;
    mg_warn("cuBLASLt refused the %s epilogue here; using the unfused kernels for it", what);
}

// ----------------------------------------------------------------------------
// The linear layer, forward and backward.

// out[R, OC] = (residual or 0) + bias + x[R, IC] W[OC, IC]^T; with gelu_pre,
// out = GELU(that) and gelu_pre keeps the pre-activation for the backward.
// W and bias_x are in the activation type (the compute copy), bias in fp32
// (the master weights): the epilogue takes the first, the unfused kernels
// the second.
template <typename Tx>
static void matmul_forward(Tx *out, const Tx *x, const Tx *W, const Tx *bias_x, const float *bias, const Tx *residual,
                           int R, int IC, int OC, Tx *gelu_pre, Matmul *mm) {
    cudaDataType_t t = CudaType<Tx>::value;
    if (mm->fuse && bias_x && ptr_align(bias_x) >= 16) {
        if (gelu_pre && !residual && OC % 8 == 0 && ptr_align(gelu_pre) >= 16) {
            GemmEpilogue epi = {CUBLASLT_EPILOGUE_GELU_AUX_BIAS, bias_x, gelu_pre};
            if (gemm_xwt(mm, t, out, x, W, NULL, R, IC, OC, epi)) return;
            note_unfused(mm, "GELU_AUX_BIAS");
        } else if (!gelu_pre) {
            GemmEpilogue epi = {CUBLASLT_EPILOGUE_BIAS, bias_x, NULL};
            if (gemm_xwt(mm, t, out, x, W, residual, R, IC, OC, epi)) return;
            note_unfused(mm, "BIAS");
        }
    }
    // Unfused: target = residual + bias, then target += x W^T, then GELU.
    Tx *target = gelu_pre ? gelu_pre : out;
    int beta_one = residual || bias;
    if (beta_one) bias_residual_forward<Tx>(target, residual, bias, R, OC, mm->stream);
    gemm_xwt(mm, t, target, x, W, beta_one ? target : NULL, R, IC, OC, NO_EPILOGUE);
    if (gelu_pre) gelu_forward<Tx>(out, gelu_pre, (size_t)R * OC, mm->stream);
}

// dx = dout W (times gelu'(gelu_pre) when given: the backward of the GELU
// that produced x); dW += dout^T x (fp32); db += column sums of dout.
// partial: colsum_scratch_floats(R, OC) floats.
template <typename Tx>
static void matmul_backward(Tx *dx, float *dW, float *db, const Tx *dout, const Tx *x, const Tx *W, int R, int IC,
                            int OC, const Tx *gelu_pre, float *partial, Matmul *mm) {
    cudaDataType_t t = CudaType<Tx>::value;
    int done = 0;
    if (gelu_pre && mm->fuse && IC % 8 == 0 && ptr_align(gelu_pre) >= 16) {
        GemmEpilogue epi = {CUBLASLT_EPILOGUE_DGELU, NULL, gelu_pre};
        done = gemm_dyw(mm, t, dx, dout, W, R, IC, OC, epi);
        if (!done) note_unfused(mm, "DGELU");
    }
    if (!done) {
        gemm_dyw(mm, t, dx, dout, W, R, IC, OC, NO_EPILOGUE);
        if (gelu_pre) gelu_backward<Tx>(dx, gelu_pre, dx, (size_t)R * IC, mm->stream);
    }
    gemm_dytx(mm, t, dW, dout, x, R, IC, OC);
    if (db) bias_backward<Tx>(db, dout, R, OC, partial, mm->stream);
}

#endif  // MICROGPT_CUDA_MATMUL_CUH

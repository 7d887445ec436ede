// cuda/attention_flash.cuh: causal self-attention on bf16 tensor cores
// (`--attention flash`), the FlashAttention-2 scheme with mma.sync.
//
// attention.cuh dispatches here from attention_forward and attention_backward
// when the run is bf16 and the head dim is 32, 64 or 128; every other case
// runs the CUDA-core kernels there (the fp32 reference path). Same tensors
// and contract as those kernels:
//   qkv  [B, T, 3C]  rows [q | k | v], head h at columns h*HD of each third
//   y    [B, T, C]   the attention output (head h at columns h*HD)
//   lse  [B*H, T]    natural-log log-sum-exp of each query row's scaled scores
//   D    [B*H, T]    D_i = dY_i . Y_i (backward scratch)
//   dqkv [B, T, 3C]  written (not accumulated) by the backward
// Scores are s = (q . k) / sqrt(HD); query i sees keys j <= i.
//
// Tensor-core arithmetic: mma.sync.m16n8k16, bf16 operands, fp32 accumulators.
// A warp owns 16 rows of a tile; the fragment layouts (PTX ISA, "Matrix
// Fragments for mma.m16n8k16"), with g = lane / 4 and t = lane % 4:
//   A 16x16 (4 regs of 2 bf16): a0 (row g, cols 2t, 2t+1), a1 (row g+8, same
//     cols), a2 (row g, cols 2t+8, 2t+9), a3 (row g+8, cols 2t+8, 2t+9)
//   B 16x8  (2 regs): b0 (k rows 2t, 2t+1, col g), b1 (k rows 2t+8, 2t+9, col g)
//   C 16x8  (4 fp32): c0, c1 (row g, cols 2t, 2t+1), c2, c3 (row g+8, same cols)
// Two C tiles side by side (16 columns) are exactly one A operand once packed
// to bf16, which is how P (or dS) goes from one product into the next without
// leaving registers. Operands come from shared memory through ldmatrix (four
// 8x8 matrices per instruction; .trans when the product needs the transpose
// of the stored tile), tiles arrive through cp.async, double-buffered.
//
// Why this split (each kernel's comment says more):
//   forward    one block per 64-query tile, looping over key tiles 0..diagonal,
//              online softmax in fp32 registers, the LSE saved.
//   backward   preprocess (D), then dK/dV (one block per key tile, looping
//              over query tiles from the diagonal on) and dQ (one block per
//              query tile, looping over key tiles up to the diagonal). Each
//              output row is summed by one warp in one fixed order: no atomics,
//              bit-identical results run to run. It recomputes S and dP twice
//              (once per kernel), 9 products instead of FlashAttention-2's 7,
//              the price of determinism without a T x T buffer.
// Tiles above the causal diagonal are never loaded or computed. Rows at and
// beyond T (the last, partial tile) are zero-filled by cp.async, so they are
// finite and contribute exactly zero; they are never written back.
#ifndef MICROGPT_CUDA_ATTENTION_FLASH_CUH
#define MICROGPT_CUDA_ATTENTION_FLASH_CUH

#include "common.cuh"
#include "ptx.cuh"

#define FLASH_THREADS 128  // four warps per block, 16 rows each
#define FLASH_LOG2E 1.4426950408889634f
#define FLASH_LN2 0.6931471805599453f

// Two fp32 values as one register of two bf16 (lo in the low half: the
// element with the smaller column index, as the fragments want it). memcpy,
// not a pointer cast: reading a __nv_bfloat162 through a uint32_t pointer
// breaks C++'s aliasing rules, which a compiler may exploit.
__device__ __forceinline__ uint32_t flash_pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return u;
}

// ----------------------------------------------------------------------------
// Tiles in shared memory: [rows][HD + 8] bf16. The 16 bytes of padding per
// row move each row's start by 16 bytes modulo 128, so the eight row
// addresses of one ldmatrix matrix fall in eight different bank groups (no
// conflicts), and every row start stays 16-byte aligned for cp.async.

template <int HD> struct FlashTile {
    static constexpr int LD = HD + 8;  // row stride in elements
};

// Rows [r0, r0 + ROWS) of one head's slice (row stride ld elements in global
// memory, `base` = row 0 of the slice) into a tile; rows >= T are zero-filled.
template <int ROWS, int HD>
__device__ __forceinline__ void flash_load_tile(__nv_bfloat16 *tile, const __nv_bfloat16 *base, size_t ld, int r0,
                                                int T) {
    const int chunks = HD / 8;  // 16-byte pieces per row
    for (int idx = threadIdx.x; idx < ROWS * chunks; idx += FLASH_THREADS) {
        int r = idx / chunks, c = idx % chunks, row = r0 + r;
        bool valid = row < T;
        cp_async16(tile + r * FlashTile<HD>::LD + c * 8, base + (size_t)(valid ? row : 0) * ld + c * 8, valid);
    }
}

// ROWS floats of a [B*H, T] row vector (lse, D) into shared memory; zero
// beyond T.
template <int ROWS>
__device__ __forceinline__ void flash_load_vec(float *dst, const float *src, int r0, int T) {
    for (int r = threadIdx.x; r < ROWS; r += FLASH_THREADS) dst[r] = r0 + r < T ? src[r0 + r] : 0.0f;
}

// Key-streaming loop step of the forward and dQ kernels: at iteration j of
// n, start loading K/V tile j + 1 into the other buffer, then wait until tile
// j (and everything committed before it) has landed in this thread; the
// caller's __syncthreads makes every thread's copies visible.
template <int BN, int HD>
__device__ __forceinline__ void flash_next_kv(__nv_bfloat16 *ks, __nv_bfloat16 *vs, const __nv_bfloat16 *kg,
                                              const __nv_bfloat16 *vg, size_t ld, int j, int n, int T) {
    const int LD = FlashTile<HD>::LD;
    if (j + 1 < n) {
        flash_load_tile<BN, HD>(ks + ((j + 1) & 1) * BN * LD, kg, ld, (j + 1) * BN, T);
        flash_load_tile<BN, HD>(vs + ((j + 1) & 1) * BN * LD, vg, ld, (j + 1) * BN, T);
        cp_async_commit();
        cp_async_wait<1>();  // tile j has landed; j + 1 may still be in flight
    } else {
        cp_async_wait<0>();
    }
}

// The three operand patterns. `tile` is a [*][LD] tile; `row0` the first of
// the 16 rows (queries or keys) this fragment covers; `col0` the first of its
// 16 columns.
//
// A operand (16x16, rows x k) from a row-major tile: matrices (rows 0-7,
// cols 0-7), (rows 8-15, cols 0-7), (rows 0-7, cols 8-15), (rows 8-15,
// cols 8-15) are a0..a3, so lane l points at row l%16, column 8*(l/16).
template <int HD>
__device__ __forceinline__ void flash_load_a(uint32_t a[4], const __nv_bfloat16 *tile, int row0, int col0) {
    int lane = threadIdx.x % 32;
    ldmatrix_x4(a, tile + (row0 + lane % 16) * FlashTile<HD>::LD + col0 + (lane / 16) * 8);
}

// B operands of two adjacent n8 tiles for X Y^T, Y stored row-major with the
// n index as its row (keys in Q K^T): b[0], b[1] are b0, b1 of n rows
// row0..row0+7 and b[2], b[3] those of rows row0+8..row0+15, k columns
// col0..col0+15. Matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7),
// (n 8-15, k 8-15): lane l points at n row 8*(l/16) + l%8, k column
// 8*((l/8)%2).
template <int HD>
__device__ __forceinline__ void flash_load_b_rows(uint32_t b[4], const __nv_bfloat16 *tile, int row0, int col0) {
    int lane = threadIdx.x % 32;
    ldmatrix_x4(b, tile + (row0 + (lane / 16) * 8 + lane % 8) * FlashTile<HD>::LD + col0 + ((lane / 8) % 2) * 8);
}

// B operands of two adjacent n8 tiles for X Y, Y stored row-major with the k
// index as its row (V in P V): .trans gives each lane (k rows 2t, 2t+1, n col
// g). b[0], b[1] are b0, b1 of n columns col0..col0+7, b[2], b[3] those of
// col0+8..col0+15; k rows row0..row0+15. Matrices (k 0-7, n 0-7), (k 8-15,
// n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15): the same lane addresses as the A
// operand.
template <int HD>
__device__ __forceinline__ void flash_load_b_cols(uint32_t b[4], const __nv_bfloat16 *tile, int row0, int col0) {
    int lane = threadIdx.x % 32;
    ldmatrix_x4_trans(b, tile + (row0 + lane % 16) * FlashTile<HD>::LD + col0 + (lane / 16) * 8);
}

// acc[N/8][4] += X Y^T for this warp's 16 rows of X (tile xs, from row x0)
// against N rows of Y (tile ys, from row 0), summing over the HD columns.
template <int HD, int N>
__device__ __forceinline__ void flash_mm_abt(float (*acc)[4], const __nv_bfloat16 *xs, int x0,
                                             const __nv_bfloat16 *ys) {
#pragma unroll
    for (int kb = 0; kb < HD / 16; kb++) {
        uint32_t a[4];
        flash_load_a<HD>(a, xs, x0, kb * 16);
#pragma unroll
        for (int np = 0; np < N / 16; np++) {
            uint32_t b[4];
            flash_load_b_rows<HD>(b, ys, np * 16, kb * 16);
            mma_bf16_16816(acc[2 * np], a, b[0], b[1]);
            mma_bf16_16816(acc[2 * np + 1], a, b[2], b[3]);
        }
    }
}

// acc[HD/8][4] += P Y where P (this warp's 16 rows x K) is held as C
// fragments p[K/8][4] (packed to bf16 here) and Y is K rows of a tile (from
// row 0) with HD columns.
template <int HD, int K>
__device__ __forceinline__ void flash_mm_pb(float (*acc)[4], const float (*p)[4], const __nv_bfloat16 *ys) {
#pragma unroll
    for (int kk = 0; kk < K / 16; kk++) {
        uint32_t a[4] = {flash_pack_bf16(p[2 * kk][0], p[2 * kk][1]), flash_pack_bf16(p[2 * kk][2], p[2 * kk][3]),
                         flash_pack_bf16(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                         flash_pack_bf16(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
        for (int dp = 0; dp < HD / 16; dp++) {
            uint32_t b[4];
            flash_load_b_cols<HD>(b, ys, kk * 16, dp * 16);
            mma_bf16_16816(acc[2 * dp], a, b[0], b[1]);
            mma_bf16_16816(acc[2 * dp + 1], a, b[2], b[3]);
        }
    }
}

// Stores this warp's 16 x HD accumulator (rows row_a = first + g and row_a + 8
// of a head slice `base` with row stride ld), times `mul`, as bf16; rows >= T
// are skipped.
template <int HD>
__device__ __forceinline__ void flash_store_rows(__nv_bfloat16 *base, size_t ld, int row_a, int T, const float (*acc)[4],
                                                 float mul_a, float mul_b) {
    int t = threadIdx.x % 4;
#pragma unroll
    for (int dn = 0; dn < HD / 8; dn++) {
        int col = dn * 8 + 2 * t;
        if (row_a < T)
            *reinterpret_cast<__nv_bfloat162 *>(base + (size_t)row_a * ld + col) =
                __floats2bfloat162_rn(acc[dn][0] * mul_a, acc[dn][1] * mul_a);
        if (row_a + 8 < T)
            *reinterpret_cast<__nv_bfloat162 *>(base + (size_t)(row_a + 8) * ld + col) =
                __floats2bfloat162_rn(acc[dn][2] * mul_b, acc[dn][3] * mul_b);
    }
}

// Reductions over the four lanes of a quad (the lanes sharing a row in the C
// layout). xor butterflies: every lane ends with the same bits.
__device__ __forceinline__ float flash_quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float flash_quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// ----------------------------------------------------------------------------
// Tile shapes. Every configuration fits 99 KB of shared memory (the sm_86 and
// sm_89 limit; sm_80 has 163, sm_90 227) and stays under 255 registers: the
// two accumulators of 16 x HD fp32 each in dK/dV cost HD registers per lane,
// so at HD = 128 the query step shrinks to 32.

template <int HD> struct FlashShape {
    static constexpr int LD = FlashTile<HD>::LD;
    // forward: BM queries per block (16 per warp), BN keys per step
    static constexpr int FWD_BM = 64, FWD_BN = 64;
    static constexpr size_t FWD_SMEM = (size_t)(FWD_BM + 4 * FWD_BN) * LD * sizeof(__nv_bfloat16);
    // dQ: BM queries per block, BN keys per step
    static constexpr int DQ_BM = 64, DQ_BN = HD == 128 ? 32 : 64;
    static constexpr size_t DQ_SMEM = (size_t)(2 * DQ_BM + 4 * DQ_BN) * LD * sizeof(__nv_bfloat16);
    // dK/dV: BN keys per block, BM queries per step
    static constexpr int KV_BN = 64, KV_BM = HD == 128 ? 32 : 64;
    static constexpr size_t KV_SMEM =
        (size_t)(2 * KV_BN + 4 * KV_BM) * LD * sizeof(__nv_bfloat16) + 4 * KV_BM * sizeof(float);
};

// ----------------------------------------------------------------------------
// Forward. Block (bh, tile): 64 query rows of one (batch, head), warp w rows
// 16w..16w+15. Key tiles 0..diagonal stream through two shared buffers (the
// next one loads while this one is used). Per key tile, per warp:
//   S = Q K^T (16 x 64, fp32 registers), scaled into the log2 domain,
//   masked above the diagonal (only the diagonal tile has such entries);
//   running max m, rescale of O and l by 2^(m_old - m_new), P = 2^(S - m);
//   l += row sums of P (per lane; the quad's four partial sums are added
//   once at the end); O += P V with P packed to bf16 straight from the
//   accumulators.
// Then y = O / l and lse = (m + log2 l) ln 2 for rows < T. The grid's y index
// runs over query tiles from the last (the heaviest: most key tiles) down,
// so the longest blocks start first.
// (The explicit minimum of one block per SM: without it ptxas 13.0 held the
// HD = 64 instance to 128 registers and spilled 8 bytes on sm_80.)
template <int HD>
__global__ void __launch_bounds__(FLASH_THREADS, 1)
flash_attention_forward_kernel(__nv_bfloat16 *y, float *lse, const __nv_bfloat16 *qkv, int T, int C, int H,
                               float scale_log2) {
    typedef FlashShape<HD> S;
    const int BM = S::FWD_BM, BN = S::FWD_BN, LD = S::LD;
    unsigned char *flash_smem = dynamic_smem();
    __nv_bfloat16 *qs = reinterpret_cast<__nv_bfloat16 *>(flash_smem);  // [BM][LD]
    __nv_bfloat16 *ks = qs + BM * LD;                                     // [2][BN][LD]
    __nv_bfloat16 *vs = ks + 2 * BN * LD;                                 // [2][BN][LD]

    const int bh = blockIdx.x, b = bh / H, h = bh % H;
    const int q0 = (gridDim.y - 1 - blockIdx.y) * BM;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int row_a = q0 + warp * 16 + g;  // this lane's two rows: row_a and row_a + 8
    const size_t ld = 3 * (size_t)C;
    const __nv_bfloat16 *qg = qkv + (size_t)b * T * ld + h * HD, *kg = qg + C, *vg = qg + 2 * C;
    const int n_tiles = (min(T, q0 + BM) - 1) / BN + 1;  // key tiles up to the last key any row here sees

    flash_load_tile<BM, HD>(qs, qg, ld, q0, T);
    flash_load_tile<BN, HD>(ks, kg, ld, 0, T);
    flash_load_tile<BN, HD>(vs, vg, ld, 0, T);
    cp_async_commit();

    float o[HD / 8][4];
#pragma unroll
    for (int dn = 0; dn < HD / 8; dn++) o[dn][0] = o[dn][1] = o[dn][2] = o[dn][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

    for (int j = 0; j < n_tiles; j++) {
        flash_next_kv<BN, HD>(ks, vs, kg, vg, ld, j, n_tiles, T);
        __syncthreads();
        const __nv_bfloat16 *kt = ks + (j & 1) * BN * LD, *vt = vs + (j & 1) * BN * LD;

        float s[BN / 8][4];
#pragma unroll
        for (int nt = 0; nt < BN / 8; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
        flash_mm_abt<HD, BN>(s, qs, warp * 16, kt);

        const bool diagonal = j * BN + BN - 1 > q0;  // some key of this tile lies above some row's diagonal
#pragma unroll
        for (int nt = 0; nt < BN / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int key = j * BN + nt * 8 + 2 * t + (e & 1), row = row_a + (e >= 2 ? 8 : 0);
                s[nt][e] = diagonal && key > row ? -INFINITY : s[nt][e] * scale_log2;
            }

        float base[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float mx = m[r];
#pragma unroll
            for (int nt = 0; nt < BN / 8; nt++) mx = fmaxf(mx, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
            mx = flash_quad_max(mx);
            // Every row has at least one unmasked key in every tile it visits
            // (key j*BN <= q0 <= row), so mx is finite; the guard keeps a
            // fully masked row at zero instead of NaN all the same.
            base[r] = mx == -INFINITY ? 0.0f : mx;
            float corr = exp2f(m[r] - base[r]);  // 0 on the first tile (m = -inf)
            m[r] = mx;
            l[r] *= corr;
#pragma unroll
            for (int dn = 0; dn < HD / 8; dn++) {
                o[dn][2 * r] *= corr;
                o[dn][2 * r + 1] *= corr;
            }
        }
#pragma unroll
        for (int nt = 0; nt < BN / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                s[nt][e] = exp2f(s[nt][e] - base[e >> 1]);
                l[e >> 1] += s[nt][e];
            }
        flash_mm_pb<HD, BN>(o, s, vt);
        __syncthreads();  // every warp is done with buffer j & 1 before iteration j + 1 refills it
    }

    l[0] = flash_quad_sum(l[0]);
    l[1] = flash_quad_sum(l[1]);
    flash_store_rows<HD>(y + (size_t)b * T * C + h * HD, (size_t)C, row_a, T, o, 1.0f / l[0], 1.0f / l[1]);
    if (t == 0) {
        if (row_a < T) lse[(size_t)bh * T + row_a] = (m[0] + log2f(l[0])) * FLASH_LN2;
        if (row_a + 8 < T) lse[(size_t)bh * T + row_a + 8] = (m[1] + log2f(l[1])) * FLASH_LN2;
    }
}

// ----------------------------------------------------------------------------
// Backward, step 1: D_i = dY_i . Y_i per (row, head), the term both gradient
// kernels subtract (sum_j P_ij dP_ij = dY_i . Y_i). A group of HD/8 lanes owns
// one (row, head), each lane 8 consecutive dims (one 16-byte load of each
// tensor), summed in dim order, then an xor butterfly over the group.
template <int HD>
__global__ void flash_attention_backward_preprocess_kernel(float *Dvec, const __nv_bfloat16 *dy,
                                                           const __nv_bfloat16 *y, int BT, int T, int C, int H) {
    const int G = HD / 8;  // 4, 8 or 16 lanes per (row, head): groups never straddle a warp
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t group = idx / G;  // = row * H + h
    int part = (int)(idx % G);
    bool valid = group < (size_t)BT * H;
    float acc = 0.0f;
    size_t row = 0;
    int h = 0;
    if (valid) {
        row = group / H;
        h = (int)(group % H);
        size_t at = row * C + h * HD + part * 8;
        uint4 a = *reinterpret_cast<const uint4 *>(dy + at), c = *reinterpret_cast<const uint4 *>(y + at);
        // The loaded words as bf16 pairs by memcpy: reading the uint4 through
        // a __nv_bfloat162 pointer breaks the aliasing rules (g++ -O2 then
        // computes D = 0); nvcc turns the copy into register moves.
        __nv_bfloat162 a2[4], c2[4];
        memcpy(a2, &a, sizeof a);
        memcpy(c2, &c, sizeof c);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float2 fa = __bfloat1622float2(a2[k]), fc = __bfloat1622float2(c2[k]);
            acc += fa.x * fc.x;
            acc += fa.y * fc.y;
        }
    }
#pragma unroll
    for (int off = G / 2; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (valid && part == 0) {
        size_t b = row / T, i = row % T;
        Dvec[(b * H + h) * T + i] = acc;
    }
}

// Backward, step 2: dK and dV. Block (bh, tile): 64 keys, warp w keys
// 16w..16w+15, kept in shared memory for the whole block. Query tiles from
// the diagonal to T stream through two buffers (Q, dY, and their lse and D).
// Per query tile, per warp, everything transposed so that the warp's keys
// are the rows:
//   S^T = K Q^T, P^T = 2^(S^T log2e - lse_q log2e), zero where key > query
//         or query >= T;
//   dP^T = V dY^T, dS^T = P^T (dP^T - D_q);
//   dV += P^T dY, dK += dS^T Q  (P^T and dS^T packed from the accumulators).
// dK is scaled once at the end. Each key row's sums run over query tiles in
// order, within a tile in the fixed mma order: deterministic. Grid y runs
// over key tiles from the first (the heaviest: most query tiles).
template <int HD>
__global__ void __launch_bounds__(FLASH_THREADS)
flash_attention_backward_dkv_kernel(__nv_bfloat16 *dqkv, const __nv_bfloat16 *dy, const __nv_bfloat16 *qkv,
                                    const float *lse, const float *Dvec, int T, int C, int H, float scale,
                                    float scale_log2) {
    typedef FlashShape<HD> S;
    const int BN = S::KV_BN, BM = S::KV_BM, LD = S::LD;
    unsigned char *flash_smem = dynamic_smem();
    __nv_bfloat16 *ks = reinterpret_cast<__nv_bfloat16 *>(flash_smem);  // [BN][LD]
    __nv_bfloat16 *vs = ks + BN * LD;                                     // [BN][LD]
    __nv_bfloat16 *qs = vs + BN * LD;                                     // [2][BM][LD]
    __nv_bfloat16 *gs = qs + 2 * BM * LD;                                 // [2][BM][LD] dY
    float *ls = reinterpret_cast<float *>(gs + 2 * BM * LD);              // [2][BM] lse
    float *dsv = ls + 2 * BM;                                             // [2][BM] D

    const int bh = blockIdx.x, b = bh / H, h = bh % H;
    const int k0 = blockIdx.y * BN;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int key_a = k0 + warp * 16 + g;  // this lane's two keys: key_a and key_a + 8
    const size_t ld = 3 * (size_t)C;
    const __nv_bfloat16 *qg = qkv + (size_t)b * T * ld + h * HD, *kg = qg + C, *vg = qg + 2 * C;
    const __nv_bfloat16 *gg = dy + (size_t)b * T * C + h * HD;
    const float *lse_bh = lse + (size_t)bh * T, *d_bh = Dvec + (size_t)bh * T;
    // Query tiles start at k0 (BM divides BN, so k0 is a tile boundary): the
    // first query any key here sees is k0 itself.
    const int n_tiles = (T - k0 + BM - 1) / BM;

    flash_load_tile<BN, HD>(ks, kg, ld, k0, T);
    flash_load_tile<BN, HD>(vs, vg, ld, k0, T);
    flash_load_tile<BM, HD>(qs, qg, ld, k0, T);
    flash_load_tile<BM, HD>(gs, gg, (size_t)C, k0, T);
    flash_load_vec<BM>(ls, lse_bh, k0, T);
    flash_load_vec<BM>(dsv, d_bh, k0, T);
    cp_async_commit();

    float dk[HD / 8][4], dv[HD / 8][4];
#pragma unroll
    for (int dn = 0; dn < HD / 8; dn++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[dn][e] = dv[dn][e] = 0.0f;

    for (int j = 0; j < n_tiles; j++) {
        const int i0 = k0 + j * BM;  // first query of this tile
        if (j + 1 < n_tiles) {
            int nb = (j + 1) & 1;
            flash_load_tile<BM, HD>(qs + nb * BM * LD, qg, ld, i0 + BM, T);
            flash_load_tile<BM, HD>(gs + nb * BM * LD, gg, (size_t)C, i0 + BM, T);
            flash_load_vec<BM>(ls + nb * BM, lse_bh, i0 + BM, T);
            flash_load_vec<BM>(dsv + nb * BM, d_bh, i0 + BM, T);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();  // also publishes the plain stores of lse and D
        const int cb = j & 1;
        const __nv_bfloat16 *qt = qs + cb * BM * LD, *gt = gs + cb * BM * LD;
        const float *lt = ls + cb * BM, *dt = dsv + cb * BM;

        float p[BM / 8][4], dp[BM / 8][4];
#pragma unroll
        for (int nt = 0; nt < BM / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) p[nt][e] = dp[nt][e] = 0.0f;
        flash_mm_abt<HD, BM>(p, ks, warp * 16, qt);   // S^T
        flash_mm_abt<HD, BM>(dp, vs, warp * 16, gt);  // dP^T

        const bool masked = i0 < k0 + BN - 1 || i0 + BM > T;
#pragma unroll
        for (int nt = 0; nt < BM / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int col = nt * 8 + 2 * t + (e & 1), query = i0 + col, key = key_a + (e >= 2 ? 8 : 0);
                float pv = exp2f(p[nt][e] * scale_log2 - lt[col] * FLASH_LOG2E);
                if (masked && (key > query || query >= T)) pv = 0.0f;
                p[nt][e] = pv;
                dp[nt][e] = pv * (dp[nt][e] - dt[col]);  // dS^T
            }
        flash_mm_pb<HD, BM>(dv, p, gt);
        flash_mm_pb<HD, BM>(dk, dp, qt);
        __syncthreads();  // buffer j & 1 is refilled in iteration j + 1
    }

    __nv_bfloat16 *out = dqkv + (size_t)b * T * ld + h * HD;
    flash_store_rows<HD>(out + C, ld, key_a, T, dk, scale, scale);
    flash_store_rows<HD>(out + 2 * C, ld, key_a, T, dv, 1.0f, 1.0f);
}

// Backward, step 3: dQ. Block (bh, tile): 64 queries (Q and dY in shared
// memory for the whole block; lse and D in registers), key tiles 0..diagonal
// through two buffers. Per key tile, per warp:
//   S = Q K^T, P = 2^(S log2e - lse log2e), zero above the diagonal;
//   dP = dY V^T, dS = P (dP - D); dQ += dS K.
// dQ is scaled once at the end. Independent of the dK/dV kernel (it writes
// the other third of dqkv), so their order does not matter.
template <int HD>
__global__ void __launch_bounds__(FLASH_THREADS)
flash_attention_backward_dq_kernel(__nv_bfloat16 *dqkv, const __nv_bfloat16 *dy, const __nv_bfloat16 *qkv,
                                   const float *lse, const float *Dvec, int T, int C, int H, float scale,
                                   float scale_log2) {
    typedef FlashShape<HD> S;
    const int BM = S::DQ_BM, BN = S::DQ_BN, LD = S::LD;
    unsigned char *flash_smem = dynamic_smem();
    __nv_bfloat16 *qs = reinterpret_cast<__nv_bfloat16 *>(flash_smem);  // [BM][LD]
    __nv_bfloat16 *gs = qs + BM * LD;                                     // [BM][LD] dY
    __nv_bfloat16 *ks = gs + BM * LD;                                     // [2][BN][LD]
    __nv_bfloat16 *vs = ks + 2 * BN * LD;                                 // [2][BN][LD]

    const int bh = blockIdx.x, b = bh / H, h = bh % H;
    const int q0 = (gridDim.y - 1 - blockIdx.y) * BM;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int row_a = q0 + warp * 16 + g;
    const size_t ld = 3 * (size_t)C;
    const __nv_bfloat16 *qg = qkv + (size_t)b * T * ld + h * HD, *kg = qg + C, *vg = qg + 2 * C;
    const __nv_bfloat16 *gg = dy + (size_t)b * T * C + h * HD;
    const int n_tiles = (min(T, q0 + BM) - 1) / BN + 1;

    flash_load_tile<BM, HD>(qs, qg, ld, q0, T);
    flash_load_tile<BM, HD>(gs, gg, (size_t)C, q0, T);
    flash_load_tile<BN, HD>(ks, kg, ld, 0, T);
    flash_load_tile<BN, HD>(vs, vg, ld, 0, T);
    cp_async_commit();

    float lse2[2], drow[2];  // rows row_a and row_a + 8; rows >= T get 0 (finite, never written)
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int row = row_a + 8 * r;
        lse2[r] = row < T ? lse[(size_t)bh * T + row] * FLASH_LOG2E : 0.0f;
        drow[r] = row < T ? Dvec[(size_t)bh * T + row] : 0.0f;
    }
    float dq[HD / 8][4];
#pragma unroll
    for (int dn = 0; dn < HD / 8; dn++) dq[dn][0] = dq[dn][1] = dq[dn][2] = dq[dn][3] = 0.0f;

    for (int j = 0; j < n_tiles; j++) {
        flash_next_kv<BN, HD>(ks, vs, kg, vg, ld, j, n_tiles, T);
        __syncthreads();
        const __nv_bfloat16 *kt = ks + (j & 1) * BN * LD, *vt = vs + (j & 1) * BN * LD;

        float p[BN / 8][4], dp[BN / 8][4];
#pragma unroll
        for (int nt = 0; nt < BN / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) p[nt][e] = dp[nt][e] = 0.0f;
        flash_mm_abt<HD, BN>(p, qs, warp * 16, kt);   // S
        flash_mm_abt<HD, BN>(dp, gs, warp * 16, vt);  // dP

        const bool diagonal = j * BN + BN - 1 > q0;
#pragma unroll
        for (int nt = 0; nt < BN / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int key = j * BN + nt * 8 + 2 * t + (e & 1), r = e >> 1, row = row_a + 8 * r;
                float pv = exp2f(p[nt][e] * scale_log2 - lse2[r]);
                if (diagonal && key > row) pv = 0.0f;
                dp[nt][e] = pv * (dp[nt][e] - drow[r]);  // dS
            }
        flash_mm_pb<HD, BN>(dq, dp, kt);
        __syncthreads();
    }

    flash_store_rows<HD>(dqkv + (size_t)b * T * ld + h * HD, ld, row_a, T, dq, scale, scale);
}

// ----------------------------------------------------------------------------
// Host side. flash_attention_supported says whether a run can take this path;
// flash_attention_setup raises the kernels' shared-memory limits (once, in
// init); the launchers return the first launch error (or cudaSuccess).

static inline int flash_attention_supported(int hd) { return hd == 32 || hd == 64 || hd == 128; }

// The most dynamic shared memory any of the three kernels of head dim hd
// needs (bytes).
static inline size_t flash_attention_smem(int hd) {
#define FLASH_MAX3(a, b, c) ((a) > (b) ? ((a) > (c) ? (a) : (c)) : ((b) > (c) ? (b) : (c)))
    switch (hd) {
    case 32: return FLASH_MAX3(FlashShape<32>::FWD_SMEM, FlashShape<32>::DQ_SMEM, FlashShape<32>::KV_SMEM);
    case 64: return FLASH_MAX3(FlashShape<64>::FWD_SMEM, FlashShape<64>::DQ_SMEM, FlashShape<64>::KV_SMEM);
    default: return FLASH_MAX3(FlashShape<128>::FWD_SMEM, FlashShape<128>::DQ_SMEM, FlashShape<128>::KV_SMEM);
    }
#undef FLASH_MAX3
}

template <int HD> static cudaError_t flash_attention_setup_hd(void) {
    typedef FlashShape<HD> S;
    cudaError_t err = cudaFuncSetAttribute(flash_attention_forward_kernel<HD>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, (int)S::FWD_SMEM);
    if (err == cudaSuccess)
        err = cudaFuncSetAttribute(flash_attention_backward_dq_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   (int)S::DQ_SMEM);
    if (err == cudaSuccess)
        err = cudaFuncSetAttribute(flash_attention_backward_dkv_kernel<HD>,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize, (int)S::KV_SMEM);
    return err;
}

static inline cudaError_t flash_attention_setup(int hd) {
    switch (hd) {
    case 32: return flash_attention_setup_hd<32>();
    case 64: return flash_attention_setup_hd<64>();
    default: return flash_attention_setup_hd<128>();
    }
}

template <int HD>
static cudaError_t flash_attention_forward_hd(cudaStream_t stream, __nv_bfloat16 *y, float *lse,
                                              const __nv_bfloat16 *qkv, int B, int T, int C, int H) {
    typedef FlashShape<HD> S;
    float scale_log2 = FLASH_LOG2E / sqrtf((float)HD);
    dim3 grid(B * H, (T + S::FWD_BM - 1) / S::FWD_BM);
    LAUNCH(grid, FLASH_THREADS, S::FWD_SMEM, stream, flash_attention_forward_kernel<HD>)(y, lse, qkv, T, C, H, scale_log2);
    return cudaGetLastError();
}

template <int HD>
static cudaError_t flash_attention_backward_hd(cudaStream_t stream, __nv_bfloat16 *dqkv, float *Dvec,
                                               const __nv_bfloat16 *dy, const __nv_bfloat16 *y,
                                               const __nv_bfloat16 *qkv, const float *lse, int B, int T, int C, int H) {
    typedef FlashShape<HD> S;
    float scale = 1.0f / sqrtf((float)HD), scale_log2 = scale * FLASH_LOG2E;
    size_t lanes = (size_t)B * T * H * (HD / 8);
    LAUNCH((unsigned)((lanes + 255) / 256), 256, 0, stream, flash_attention_backward_preprocess_kernel<HD>)(
        Dvec, dy, y, B * T, T, C, H);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    dim3 grid_kv(B * H, (T + S::KV_BN - 1) / S::KV_BN);
    LAUNCH(grid_kv, FLASH_THREADS, S::KV_SMEM, stream, flash_attention_backward_dkv_kernel<HD>)(
        dqkv, dy, qkv, lse, Dvec, T, C, H, scale, scale_log2);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    dim3 grid_q(B * H, (T + S::DQ_BM - 1) / S::DQ_BM);
    LAUNCH(grid_q, FLASH_THREADS, S::DQ_SMEM, stream, flash_attention_backward_dq_kernel<HD>)(
        dqkv, dy, qkv, lse, Dvec, T, C, H, scale, scale_log2);
    return cudaGetLastError();
}

static inline cudaError_t flash_attention_forward(cudaStream_t stream, __nv_bfloat16 *y, float *lse,
                                                  const __nv_bfloat16 *qkv, int B, int T, int C, int H, int hd) {
    switch (hd) {
    case 32: return flash_attention_forward_hd<32>(stream, y, lse, qkv, B, T, C, H);
    case 64: return flash_attention_forward_hd<64>(stream, y, lse, qkv, B, T, C, H);
    default: return flash_attention_forward_hd<128>(stream, y, lse, qkv, B, T, C, H);
    }
}

static inline cudaError_t flash_attention_backward(cudaStream_t stream, __nv_bfloat16 *dqkv, float *Dvec,
                                                   const __nv_bfloat16 *dy, const __nv_bfloat16 *y,
                                                   const __nv_bfloat16 *qkv, const float *lse, int B, int T, int C,
                                                   int H, int hd) {
    switch (hd) {
    case 32: return flash_attention_backward_hd<32>(stream, dqkv, Dvec, dy, y, qkv, lse, B, T, C, H);
    case 64: return flash_attention_backward_hd<64>(stream, dqkv, Dvec, dy, y, qkv, lse, B, T, C, H);
    default: return flash_attention_backward_hd<128>(stream, dqkv, Dvec, dy, y, qkv, lse, B, T, C, H);
    }
}

#endif  // MICROGPT_CUDA_ATTENTION_FLASH_CUH

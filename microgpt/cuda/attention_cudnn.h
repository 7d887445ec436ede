// cuda/attention_cudnn.h: causal self-attention through cuDNN's fused SDPA
// (`--attention cudnn`), forward and backward, bf16; the interface the
// engine sees. The implementation (attention_cudnn.cpp) is its own
// translation unit, compiled by the host compiler against cuDNN 9 and the
// header-only cudnn-frontend, and linked in only when microgpt/cuda.mk found
// both (it then defines MICROGPT_CUDNN); the engine builds without it.
//
// Same tensors and contract as the other attention paths (attention.cuh):
//   qkv  [B, T, 3C]  rows [q | k | v], head h at columns h*hd of each third
//   y    [B, T, C]
//   lse  [B*H, T]    cuDNN's softmax statistics (natural-log log-sum-exp of
//                    each query row's scaled scores), saved by the forward
//                    for the backward
//   dqkv [B, T, 3C]  written (not accumulated) by the backward
// cuDNN reads Q, K and V in place through strides (a [B, H, T, hd] view of
// qkv), so nothing is permuted or copied.
//
// Both graphs (forward with statistics, and backward with cuDNN's
// deterministic algorithm) are built once, for the one shape the engine
// runs, by cudnn_attention_create; their workspace is the engine's
// (cudnn_attention_workspace_bytes), allocated with everything else and
// counted in the memory it reports.
#ifndef MICROGPT_CUDA_ATTENTION_CUDNN_H
#define MICROGPT_CUDA_ATTENTION_CUDNN_H

#include <cuda_runtime.h>
#include <stddef.h>

typedef struct CudnnAttention CudnnAttention;

// The two graphs for B x T tokens of width C in H heads, on `stream`. NULL,
// with the reason in why[why_len], when cuDNN cannot run this shape on this
// GPU (a head dim it does not support, too old a library, no engine) or
// cannot be loaded at all (cudnn_loader.h).
CudnnAttention *cudnn_attention_create(int B, int T, int C, int H, cudaStream_t stream, char *why, size_t why_len);
// Device bytes of workspace the larger of the two graphs needs.
size_t cudnn_attention_workspace_bytes(const CudnnAttention *a);
// y and lse from qkv (bf16 tensors, passed untyped). 0, or -1 with the
// reason in err[err_len].
int cudnn_attention_forward(CudnnAttention *a, void *workspace, void *y, float *lse, const void *qkv, char *err,
                            size_t err_len);
// dqkv from dy and the forward's y, qkv and lse.
int cudnn_attention_backward(CudnnAttention *a, void *workspace, void *dqkv, const void *dy, const void *y,
                             const void *qkv, const float *lse, char *err, size_t err_len);
// "cuDNN 9.x.y (frontend 1.x.y)": the library this binary runs with.
const char *cudnn_attention_version(void);

#endif  // MICROGPT_CUDA_ATTENTION_CUDNN_H

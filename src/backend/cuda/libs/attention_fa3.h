// FlashAttention-3-class attention on Hopper: FlashInfer's sm_90a prefill kernel (the
// FlashAttention-3 design: a producer warp loading Q, K, V tiles by TMA, two consumer
// warpgroups running QKᵀ and PV on wgmma with the softmax of one tile overlapped with the GEMM
// of the next), used as a library: only the call is ours. Built when scripts/setup.sh fetched
// FlashInfer's headers and the CUDA code targets sm_90a (CMake defines ZIMAGE_WITH_FA3);
// otherwise every call answers kUnsupported and CudaBackend::attention takes cuDNN's fused
// attention or its own kernels.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "core/status.h"

namespace zimage::cuda {

// True when this build carries the kernel and `device` is an sm_90 GPU.
bool fa3_available(int device);

struct Fa3Request {
  const void* q;  // bf16 [B, Sq, Hq, D], row-major (the backend's attention layout)
  const void* k;  // bf16 [B, Sk, Hkv, D]
  const void* v;  // bf16 [B, Sk, Hkv, D]
  void* out;      // bf16 [B, Sq, Hq, D]
  int64_t batch, seq_q, seq_k, heads_q, heads_kv, head_dim;
  float scale;
  bool causal;
  // Per batch item, keys at or past key_len[b] are masked (empty: none).
  const std::vector<int32_t>* key_len = nullptr;
  // Elements from one token to the next in q (and out's layout stays [B, Sq, Hq, D]) and in k
  // and v; 0: the dense layouts above (Hq·D, Hkv·D). A packed projection [B, S, (Hq + 2·Hkv)·D]
  // passes its row width for all three, with k and v pointing at their first head in row 0.
  int64_t q_token_stride = 0;
  int64_t kv_token_stride = 0;
};

// softmax(scale · Q Kᵀ [masked]) V for each batch item and head (Hq a multiple of Hkv: grouped
// queries share a KV head), on the current device, which the caller has checked once with
// fa3_available (CudaBackend keeps the answer). kUnsupported (the caller falls back) when the
// build has no kernel, head_dim is not 64, 128 or 256, pointers are not 16-byte aligned, a
// key_len is outside [1, Sk] (a row with no key is the backend's zero row, which the caller's
// paths write), or the mask is causal with padding or Sq != Sk (the kernel aligns a causal mask
// to the bottom-right corner; the backend's is aligned to the top-left).
Status fa3_supported(const Fa3Request& r);
Status fa3_attention(const Fa3Request& r, cudaStream_t stream);

}  // namespace zimage::cuda

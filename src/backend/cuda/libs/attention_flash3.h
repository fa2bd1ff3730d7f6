// FlashAttention-3's own Hopper forward kernel (Dao-AILab/flash-attention, hopper/; BSD-3-Clause),
// used as a library for the DiT's attention. The design is FlashInfer's too (attention_fa3.h: a
// producer warp loading K and V tiles by TMA, two consumer warpgroups on wgmma, each overlapping
// the softmax of one tile with its GEMMs, P kept in registers for PV); what differs at the DiT's
// shapes is the tile (128 x 176 against FlashInfer's 128 x 192) and the grid: one persistent CTA
// per SM walking the tiles, against one CTA per tile. Measured 1.09-1.11x FlashInfer's kernel
// there (docs/BENCHMARKS.md, "Session 21"). Only the call is ours (the library's launcher exits
// the process on a CUDA error; this one returns a Status).
//
// Built when scripts/setup.sh fetched the headers (third_party/flash3) and the CUDA code targets
// sm_90a (CMake defines ZIMAGE_WITH_FLASH3); otherwise every call answers kUnsupported and
// CudaBackend::attention takes the next path. Two instantiations are built, both the DiT's
// (head_dim 128, non-causal, no padding mask: a batch with padded keys runs one launch per item
// with its own key count): bf16 operands, and e4m3 operands with bf16 output for the opt-in FP8
// attention (CudaBackend::attention_packed_fp8). Everything else answers kUnsupported.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/libs/attention_fa3.h"  // Fa3Request: the same request
#include "core/status.h"

namespace zimage::cuda {

// True when this build carries the kernel (it runs on sm_90 GPUs only: the caller checks).
bool flash3_built();

// Bytes of device scratch flash3_attention needs for `r` (the kernel writes each row's
// log-sum-exp, which the backend does not use: batch · heads_q · seq_q floats).
int64_t flash3_scratch_bytes(const Fa3Request& r);

// kUnsupported unless: bf16 operands (the caller's business), head_dim 128, heads_q == heads_kv,
// not causal, every key_len in [1, Sk], 16-byte aligned pointers and token strides that are
// multiples of 8 elements.
Status flash3_supported(const Fa3Request& r);

// kUnsupported unless as flash3_supported, with e4m3 operands: token strides multiples of 16.
Status flash3_supported_fp8(const Fa3Request& r);

// The FP8 kernel's scales, device pointers: q and k one float each, v one per head (heads_kv).
// The kernel computes softmax(scale · q_descale · k_descale · Q8 K8ᵀ) (V8 · v_descale[h]), with the
// probabilities rounded to e4m3 (times 256, the library's offset) before they meet V.
struct Flash3Fp8Scales {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
};

// softmax(scale · Q Kᵀ [keys past key_len[b] masked]) V, as fa3_attention. `scratch` holds at
// least flash3_scratch_bytes(r) bytes (device memory, 4-byte aligned); `num_sm` is the device's
// SM count (the persistent grid's width). `cluster_m`: 1, or 2 for clusters of two CTAs on
// neighbouring query tiles that share each K and V tile by TMA multicast (the same sums in the
// same order: the same bytes out).
Status flash3_attention(const Fa3Request& r, void* scratch, int num_sm, cudaStream_t stream,
                        int cluster_m = 1);

// The same with e4m3 q, k and v (r.q, r.k, r.v) and bf16 out; scratch as above.
Status flash3_attention_fp8(const Fa3Request& r, const Flash3Fp8Scales& descale, void* scratch,
                            int num_sm, cudaStream_t stream, int cluster_m = 1);

}  // namespace zimage::cuda

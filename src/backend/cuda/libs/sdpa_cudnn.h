// cuDNN's fused scaled-dot-product attention (flash attention on Hopper tensor cores) through
// cuDNN's graph API, built with NVIDIA's header-only cudnn-frontend. On the H200 it reaches about
// 620 TFLOP/s on the DiT's 30 heads x 4k tokens x 128, against ~260 for the project's own FA2-style
// kernel (docs/BENCHMARKS.md), so CudaBackend::attention prefers it and keeps the own kernel for
// what cuDNN refuses (and for builds without the frontend headers).
//
// One graph per shape (batch, lengths, heads, head_dim, causal, key mask, dtype, scale), built and
// checked once, then reused. Key-padding masks use cuDNN's padding mask with per-batch sequence
// lengths in a small device buffer owned by the plan; it is written by a kernel whose arguments
// carry the lengths, so a run can be recorded into a CUDA graph.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "backend/cuda/runtime/allocator.h"
#include "core/status.h"
#include "core/tensor.h"

namespace zimage::cuda {

struct SdpaRequest {
  const void* q;  // [B, Sq, Hq, D] contiguous
  const void* k;  // [B, Sk, Hkv, D]
  const void* v;  // [B, Sk, Hkv, D]
  void* out;      // [B, Sq, Hq, D]
  int64_t batch, seq_q, seq_k, heads_q, heads_kv, head_dim;
  float scale;
  bool causal;
  std::vector<int32_t> key_len;  // empty = every key valid
  DType dt;                      // kBF16 or kF16
};

class CudnnSdpa {
 public:
  // Never fails: without cuDNN or the frontend, available() is false and run() answers
  // kUnsupported.
  static std::unique_ptr<CudnnSdpa> create(cudaStream_t stream);
  ~CudnnSdpa();
  CudnnSdpa(const CudnnSdpa&) = delete;
  CudnnSdpa& operator=(const CudnnSdpa&) = delete;

  bool available() const;
  // out = softmax(scale * q kᵀ + mask) v. kUnsupported when cuDNN has no engine for the shape
  // (remembered, so the caller's fallback costs nothing the next time).
  Status run(const SdpaRequest& r, CachingAllocator& alloc);

 private:
  struct Impl;
  explicit CudnnSdpa(cudaStream_t stream);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zimage::cuda

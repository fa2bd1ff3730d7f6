// See attention_fa3.h. The kernel is FlashInfer's SinglePrefillWithKVCacheDispatched (hopper/
// prefill_sm90.cuh), instantiated here for bf16 with head_dim 64, 128 and 256, non-causal and
// causal: one launch per batch item (the DiT runs batch 1; a batch of padded captions passes
// each item's true key count as its kv_len, which is exactly the backend's key_len mask).
#include <string>

#include "backend/cuda/libs/attention_fa3.h"

#if defined(ZIMAGE_WITH_FA3)
#include <cuda_bf16.h>

#include <flashinfer/attention/hopper/default_params.cuh>
#include <flashinfer/attention/hopper/prefill_sm90.cuh>
#include <flashinfer/attention/hopper/variants.cuh>
#include <flashinfer/attention/mask.cuh>
#endif

namespace zimage::cuda {

#if defined(ZIMAGE_WITH_FA3)
namespace {

using Params = flashinfer::SinglePrefillParams<cutlass::bfloat16_t, cutlass::bfloat16_t,
                                               cutlass::bfloat16_t, int32_t>;

template <uint32_t D, flashinfer::MaskMode M>
cudaError_t dispatch(Params& p, cudaStream_t s) {
  return flashinfer::SinglePrefillWithKVCacheDispatched<D, D, M, /*LEFT_SLIDING_WINDOW=*/false,
                                                        flashinfer::StandardAttention>(p, s);
}

template <flashinfer::MaskMode M>
cudaError_t dispatch_dim(int64_t d, Params& p, cudaStream_t s) {
  switch (d) {
    case 64:
      return dispatch<64, M>(p, s);
    case 128:
      return dispatch<128, M>(p, s);
    default:
      return dispatch<256, M>(p, s);
  }
}

bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

}  // namespace

bool fa3_available(int device) {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return major == 9 && minor == 0;
}

Status fa3_supported(const Fa3Request& r) {
  if (r.head_dim != 64 && r.head_dim != 128 && r.head_dim != 256)
    return Unsupported("FA3 attention: head_dim " + std::to_string(r.head_dim));
  if (r.heads_kv <= 0 || r.heads_q % r.heads_kv != 0)
    return Unsupported("FA3 attention: query heads not a multiple of KV heads");
  if (r.seq_q > INT32_MAX || r.seq_k > INT32_MAX || r.heads_q > 65535)
    return Unsupported("FA3 attention: shape too large");
  if (!aligned16(r.q) || !aligned16(r.k) || !aligned16(r.v) || !aligned16(r.out))
    return Unsupported("FA3 attention: operands not 16-byte aligned");
  // TMA: every row of a tile starts on 16 bytes (8 bf16), and a head fits inside a token.
  for (int64_t st : {r.q_token_stride, r.kv_token_stride})
    if (st < 0 || st % 8 != 0 || (st > 0 && st < r.head_dim))
      return Unsupported("FA3 attention: token stride " + std::to_string(st));
  if ((r.q_token_stride > 0 && r.q_token_stride < r.heads_q * r.head_dim) ||
      (r.kv_token_stride > 0 && r.kv_token_stride < r.heads_kv * r.head_dim))
    return Unsupported("FA3 attention: token stride shorter than the heads");
  const bool padded = r.key_len != nullptr && !r.key_len->empty();
  if (padded) {
    if (static_cast<int64_t>(r.key_len->size()) != r.batch)
      return Unsupported("FA3 attention: key_len size");
    for (int32_t n : *r.key_len)
      if (n <= 0 || n > r.seq_k) return Unsupported("FA3 attention: empty or invalid key_len");
  }
  if (r.causal) {
    if (r.seq_q != r.seq_k) return Unsupported("FA3 attention: causal with Sq != Sk");
    if (padded)
      for (int32_t n : *r.key_len)
        if (n != r.seq_k) return Unsupported("FA3 attention: causal with padded keys");
  }
  return Status::Ok();
}

Status fa3_attention(const Fa3Request& r, cudaStream_t stream) {
  ZI_TRY(fa3_supported(r));
  const bool padded = r.key_len != nullptr && !r.key_len->empty();
  const int64_t q_stride = r.q_token_stride > 0 ? r.q_token_stride : r.heads_q * r.head_dim;
  const int64_t kv_stride = r.kv_token_stride > 0 ? r.kv_token_stride : r.heads_kv * r.head_dim;
  const int64_t q_item = r.seq_q * q_stride, kv_item = r.seq_k * kv_stride;
  const int64_t o_item = r.seq_q * r.heads_q * r.head_dim;
  using T = cutlass::bfloat16_t;
  for (int64_t b = 0; b < r.batch; ++b) {
    Params p{};
    p.q_ptr = const_cast<T*>(static_cast<const T*>(r.q)) + b * q_item;
    p.k_ptr = const_cast<T*>(static_cast<const T*>(r.k)) + b * kv_item;
    p.v_ptr = const_cast<T*>(static_cast<const T*>(r.v)) + b * kv_item;
    p.o_ptr = static_cast<T*>(r.out) + b * o_item;
    p.lse_ptr = nullptr;
    p.additional_params.logits_soft_cap = 0.f;
    p.additional_params.sm_scale = r.scale;
    p.q_stride_n = q_stride;
    p.o_stride_n = r.heads_q * r.head_dim;
    p.k_stride_n = p.v_stride_n = kv_stride;
    p.q_stride_h = p.o_stride_h = p.k_stride_h = p.v_stride_h = r.head_dim;
    p.qo_len = static_cast<int>(r.seq_q);
    p.kv_len = static_cast<int>(padded ? (*r.key_len)[static_cast<size_t>(b)] : r.seq_k);
    p.num_qo_heads = static_cast<int>(r.heads_q);
    p.num_kv_heads = static_cast<int>(r.heads_kv);
    p.group_size = static_cast<int>(r.heads_q / r.heads_kv);
    p.window_left = -1;
    p.causal = r.causal;
    const cudaError_t e = r.causal
                              ? dispatch_dim<flashinfer::MaskMode::kCausal>(r.head_dim, p, stream)
                              : dispatch_dim<flashinfer::MaskMode::kNone>(r.head_dim, p, stream);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return DeviceError(std::string("FA3 attention: launch failed: ") + cudaGetErrorString(e));
    }
  }
  return Status::Ok();
}

#else  // !ZIMAGE_WITH_FA3

bool fa3_available(int) {
  return false;
}
Status fa3_supported(const Fa3Request&) {
  return Unsupported("FA3 attention: not built (needs FlashInfer's headers and sm_90a)");
}
Status fa3_attention(const Fa3Request& r, cudaStream_t) {
  return fa3_supported(r);
}

#endif

}  // namespace zimage::cuda

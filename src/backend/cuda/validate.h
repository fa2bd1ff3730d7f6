// The CUDA backend's own argument checks: the residue left after the shared op contracts
// (backend/op_contract.h) — a tensor on the CUDA device inside its storage, the dtypes the
// kernels take — plus the OpEnv that plugs them into the contracts. The ops without a shared
// contract validate device, dtype and shape here before launching anything and answer a bad call
// with InvalidArgument naming the op.
#pragma once

#include <string>
#include <utility>

#include "backend/cuda/kernels/kernels.h"
#include "backend/op_contract.h"
#include "core/status.h"
#include "core/tensor.h"

namespace zimage::cuda {

inline Status check_cuda_tensor(const char* op, const char* what, const Tensor& t) {
  if (!t.defined()) return InvalidArgument(std::string(op) + ": " + what + " is undefined");
  if (t.device() != Device::kCUDA)
    return InvalidArgument(std::string(op) + ": " + what + " is not on the CUDA device (" +
                           t.describe() + ")");
  if (t.numel() < 0) return InvalidArgument(std::string(op) + ": " + what + " has a bad shape");
  if (t.storage()->bytes() < t.byte_offset() + t.nbytes())
    return InvalidArgument(std::string(op) + ": " + what + " " + t.describe() +
                           " is larger than its storage");
  return Status::Ok();
}

inline Status check_dtype(const char* op, const char* what, const Tensor& t, DType want) {
  if (t.dtype() != want)
    return InvalidArgument(std::string(op) + ": " + what + " must be " + dtype_name(want) +
                           ", got " + t.describe());
  return Status::Ok();
}

inline Status check_shape(const char* op, const char* what, const Tensor& t, const Shape& want) {
  if (t.shape() != want)
    return InvalidArgument(std::string(op) + ": " + what + " must be " + shape_string(want) +
                           ", got " + t.describe());
  return Status::Ok();
}

inline Status check_rank(const char* op, const char* what, const Tensor& t, int rank) {
  if (t.rank() != rank)
    return InvalidArgument(std::string(op) + ": " + what + " must have rank " +
                           std::to_string(rank) + ", got " + t.describe());
  return Status::Ok();
}

inline bool is_float_kernel_type(DType t) {
  return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16;
}

inline Result<KType> ktype_of(const char* op, DType t) {
  switch (t) {
    case DType::kF32:
      return KType::kF32;
    case DType::kBF16:
      return KType::kBF16;
    case DType::kF16:
      return KType::kF16;
    default:
      break;
  }
  return Unsupported(std::string(op) + ": dtype " + dtype_name(t) + " is not supported on CUDA");
}

// The kernels compute in f32, bf16 and f16; any other dtype is kUnsupported.
inline Status check_computes(const char* op, const char*, const Tensor& t) {
  return ktype_of(op, t.dtype()).status();
}

// The CUDA part of every op contract for a backend computing in `act`.
inline contract::OpEnv cuda_env(DType act) {
  return {Device::kCUDA, act, &check_cuda_tensor, &check_computes, &check_computes};
}

inline const void* ptr_or_null(const Tensor& t) {
  return t.defined() ? t.data() : nullptr;
}

// True when the byte ranges of a and b overlap.
inline bool overlaps(const Tensor& a, const Tensor& b) {
  const char* pa = static_cast<const char*>(a.data());
  const char* pb = static_cast<const char*>(b.data());
  return pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

// The attention prologue's tables: norm weights q and k [dh] in the act dtype (both or neither),
// (cos, sin) freqs [b or 1, s, dh / 2, 2] f32. Whether the freqs are shared over the batch.
inline Result<bool> check_prologue_tables(const char* op, const Tensor& norm_q,
                                          const Tensor& norm_k, const Tensor& freqs, int64_t b,
                                          int64_t s, int64_t dh, DType act) {
  if (norm_q.defined() != norm_k.defined())
    return InvalidArgument(std::string(op) + ": give both q and k norm weights or neither");
  if (norm_q.defined()) {
    for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"norm_q", &norm_q},
                                  std::pair<const char*, const Tensor*>{"norm_k", &norm_k}}) {
      ZI_TRY(check_cuda_tensor(op, name, *t));
      ZI_TRY(check_dtype(op, name, *t, act));
      ZI_TRY(check_shape(op, name, *t, {dh}));
    }
  }
  bool shared = false;
  if (freqs.defined()) {
    ZI_TRY(check_cuda_tensor(op, "freqs", freqs));
    ZI_TRY(check_dtype(op, "freqs", freqs, DType::kF32));
    shared = freqs.rank() == 4 && freqs.dim(0) == 1 && b != 1;
    ZI_TRY(check_shape(op, "freqs", freqs, {shared ? 1 : b, s, dh / 2, 2}));
  }
  return shared;
}

}  // namespace zimage::cuda

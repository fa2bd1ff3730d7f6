// Validation helpers for the CPU backend (see cpu_check.h).
#include "backend/cpu/cpu_check.h"

namespace zimage::cpu {

std::string desc(const Tensor& t) {
  if (!t.defined()) return "undefined";
  return std::string(dtype_name(t.dtype())) + shape_string(t.shape());
}

static std::string prefix(const char* op, const char* name, const Tensor& t) {
  return std::string(op) + ": " + name + " " + desc(t);
}

Status check_tensor(const char* op, const char* name, const Tensor& t) {
  if (!t.defined()) return InvalidArgument(std::string(op) + ": " + name + " is undefined");
  if (t.device() != Device::kCPU) {
    return InvalidArgument(prefix(op, name, t) + " is on " + device_name(t.device()) +
                           ", expected cpu");
  }
  if (t.numel() < 0) return InvalidArgument(prefix(op, name, t) + " has an invalid shape");
  const size_t end = t.byte_offset() + t.nbytes();
  if (end < t.byte_offset() || end > t.storage()->bytes() || t.storage()->data() == nullptr) {
    return InvalidArgument(prefix(op, name, t) + " exceeds its storage (" +
                           std::to_string(t.storage()->bytes()) + " bytes)");
  }
  return Status::Ok();
}

Status check_f32(const char* op, const char* name, const Tensor& t) {
  ZI_TRY(check_tensor(op, name, t));
  if (t.dtype() != DType::kF32) {
    return InvalidArgument(prefix(op, name, t) + ": dtype must be f32 on the cpu backend");
  }
  return Status::Ok();
}

Status check_float(const char* op, const char* name, const Tensor& t) {
  ZI_TRY(check_tensor(op, name, t));
  const DType d = t.dtype();
  if (d != DType::kF32 && d != DType::kBF16 && d != DType::kF16) {
    return InvalidArgument(prefix(op, name, t) + ": dtype must be f32, bf16 or f16");
  }
  return Status::Ok();
}

Status check_rank(const char* op, const char* name, const Tensor& t, int rank) {
  if (t.rank() != rank) {
    return InvalidArgument(prefix(op, name, t) + " must have rank " + std::to_string(rank));
  }
  return Status::Ok();
}

Status check_same_shape(const char* op, const char* a_name, const Tensor& a, const char* b_name,
                        const Tensor& b) {
  if (a.shape() != b.shape()) {
    return InvalidArgument(std::string(op) + ": " + a_name + " " + desc(a) + " and " + b_name +
                           " " + desc(b) + ": shapes differ");
  }
  return Status::Ok();
}

bool overlaps(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined() || a.nbytes() == 0 || b.nbytes() == 0) return false;
  const char* a0 = static_cast<const char*>(a.data());
  const char* b0 = static_cast<const char*>(b.data());
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

bool same_data(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.data() == b.data() && a.nbytes() == b.nbytes();
}

Status check_alias(const char* op, const char* in_name, const Tensor& in, const char* out_name,
                   const Tensor& out, bool in_place_ok) {
  if (!overlaps(in, out)) return Status::Ok();
  if (in_place_ok && same_data(in, out)) return Status::Ok();
  return InvalidArgument(std::string(op) + ": " + out_name + " " + desc(out) + " overlaps " +
                         in_name + " " + desc(in) +
                         (in_place_ok ? " without being the same memory" : " (not allowed)"));
}

}  // namespace zimage::cpu

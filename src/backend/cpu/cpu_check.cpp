// Validation helpers for the CPU backend (see cpu_check.h).
#include "backend/cpu/cpu_check.h"

namespace zimage::cpu {

static std::string prefix(const char* op, const char* name, const Tensor& t) {
  return std::string(op) + ": " + name + " " + desc(t);
}

Status check_tensor(const char* op, const char* name, const Tensor& t) {
  return contract::check_host(op, name, t);
}

namespace {

// The CPU computes in f32 only (the ops that read bf16 and f16 too check with any_float).
Status computes(const char* op, const char* name, const Tensor& t) {
  if (t.dtype() != DType::kF32) {
    return InvalidArgument(prefix(op, name, t) + ": dtype must be f32 on the cpu backend");
  }
  return Status::Ok();
}

// The elementwise ops and reductions read f32, bf16 and f16.
Status any_float(const char* op, const char* name, const Tensor& t) {
  const DType d = t.dtype();
  if (d != DType::kF32 && d != DType::kBF16 && d != DType::kF16) {
    return InvalidArgument(prefix(op, name, t) + ": dtype must be f32, bf16 or f16");
  }
  return Status::Ok();
}

}  // namespace

Status check_f32(const char* op, const char* name, const Tensor& t) {
  ZI_TRY(check_tensor(op, name, t));
  return computes(op, name, t);
}

contract::OpEnv cpu_env() {
  return {Device::kCPU, DType::kF32, &check_tensor, &computes, &any_float};
}

}  // namespace zimage::cpu

// Argument validation shared by the CPU ops. Every op checks device, dtype, shape and aliasing
// before touching memory, and reports the op and the offending tensor by name:
//   "matmul: x f32[3, 5] and w f32[4, 6]: K differs (5 vs 6)".
#pragma once

#include <string>

#include "core/status.h"
#include "core/tensor.h"

namespace zimage::cpu {

// "f32[3, 5]", or "undefined".
std::string desc(const Tensor& t);

// t is defined, lives on the CPU and its bytes lie inside its storage.
Status check_tensor(const char* op, const char* name, const Tensor& t);
// check_tensor + dtype is f32.
Status check_f32(const char* op, const char* name, const Tensor& t);
// check_tensor + dtype is f32, bf16 or f16 (ops that work on any float dtype).
Status check_float(const char* op, const char* name, const Tensor& t);
// Rank check: "rope_half: x f32[2, 3] must have rank 4".
Status check_rank(const char* op, const char* name, const Tensor& t, int rank);
// Same shape: "silu: x f32[2, 3] and y f32[3, 2]: shapes differ".
Status check_same_shape(const char* op, const char* a_name, const Tensor& a, const char* b_name,
                        const Tensor& b);

// Whether the byte ranges of a and b intersect / are exactly the same range.
bool overlaps(const Tensor& a, const Tensor& b);
bool same_data(const Tensor& a, const Tensor& b);
// out may be exactly `in` (when in_place_ok) or disjoint from it; partial overlap is an error.
Status check_alias(const char* op, const char* in_name, const Tensor& in, const char* out_name,
                   const Tensor& out, bool in_place_ok);

}  // namespace zimage::cpu

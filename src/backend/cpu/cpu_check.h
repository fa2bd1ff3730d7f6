// The CPU backend's own argument checks: the residue left after the shared op contracts
// (backend/op_contract.h) — a tensor lives on the CPU with its bytes inside its storage, the
// dtypes the CPU computes in — plus the OpEnv that plugs them into the contracts. Ops without a
// shared contract check here, naming the op and the offending tensor:
//   "matmul: x f32[3, 5] and w f32[4, 6]: K differs (5 vs 6)".
#pragma once

#include <string>

#include "backend/op_contract.h"
#include "core/status.h"
#include "core/tensor.h"

namespace zimage::cpu {

// The shape, rank and aliasing helpers are the contracts' own.
using contract::check_alias;
using contract::check_same_shape;
using contract::desc;
using contract::overlaps;
using contract::same_data;

// t is defined, lives on the CPU and its bytes lie inside its storage.
Status check_tensor(const char* op, const char* name, const Tensor& t);
// check_tensor + dtype is f32.
Status check_f32(const char* op, const char* name, const Tensor& t);
// The CPU's part of every op contract: tensors placed by check_tensor, f32 compute.
contract::OpEnv cpu_env();

}  // namespace zimage::cpu

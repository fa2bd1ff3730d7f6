// The drop-in transformer's argument checks and views (include/zimage/transformer.h): a caller's
// TensorView checked against what the DiT takes, and turned into an engine Tensor over the same
// bytes. Internal to src/api (transformer.cpp runs them).
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"
#include "zimage/status.h"
#include "zimage/transformer.h"

namespace zimage {

DType to_dtype(ElementType t);
// "cpu" or "cuda:N"
std::string memory_device_name(const MemoryDevice& d);

// A contiguous TensorView as an engine tensor over the caller's bytes (no copy).
Tensor wrap_view(const TensorView& v);

// Every check of TransformerCall against the model: errors are kInvalidArgument with field()
// naming the argument ("x[1]", "t", "cap_feats[0]", "out[2]").
Status check_call(const TransformerCall& call, const TransformerInfo& info);

}  // namespace zimage

// Debug dumps of float32 host buffers. Why a header of its own: the pipelines keep their
// reference arithmetic on the host (noise, init and control images, masks, latents), and
// text-to-image, image-to-image and ControlNet all hand such buffers to the debug sink the same
// way, next to model/common/debug.h's debug_tensor for backend tensors.
#pragma once

#include <string>

#include "backend/backend.h"
#include "core/tensor.h"
#include "model/common/debug.h"

namespace zimage {

// Hands `data` to the debug sink as an f32 tensor of `shape` when the sink wants `name`; `host`
// is a CPU backend (it copies the data).
inline void dump_host(DebugSink* dbg, Backend& host, const std::string& name, const float* data,
                      const Shape& shape) {
  if (dbg == nullptr || !dbg->wants(name)) return;
  Tensor t = Tensor::wrap(const_cast<float*>(data), DType::kF32, shape);
  dbg->tensor(name, host, t);
}

}  // namespace zimage

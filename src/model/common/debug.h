// Named intermediate tensors. Every model names its intermediates ("te.layer3",
// "dit.step0.layers.12", "vae.mid") and hands them to an optional DebugSink, so a divergence
// from the reference can be located by dumping both sides and finding the first tensor that
// differs (the llama.cpp eval-callback habit). With no sink the cost is one pointer test.
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"
#include "core/tensor.h"

namespace zimage {

class DebugSink {
 public:
  virtual ~DebugSink() = default;
  // Cheap filter: models only download / convert tensors whose name the sink wants.
  virtual bool wants(const std::string& name) const = 0;
  // Receives a tensor living on `be` (any dtype). A failure is kept and reported by status().
  virtual void tensor(const std::string& name, Backend& be, const Tensor& t) = 0;
  // The first failure of tensor(), if any (the caller turns it into the call's error).
  virtual Status status() const { return Status::Ok(); }
};

// Writes <dir>/<name>.npy (float32, same shape) for every name containing `filter`
// (empty filter = all). The directory is created if needed. Used by `zimage generate --dump DIR`.
std::unique_ptr<DebugSink> make_directory_dump_sink(const std::string& dir,
                                                    const std::string& filter);

// Writes a float32 host tensor as a NumPy .npy file (format 1.0, little endian, C order).
Status write_npy_f32(const std::string& path, const Tensor& host_f32);

// Model-side helper: forwards `t` to the sink when there is one and it wants `name`.
inline void debug_tensor(DebugSink* dbg, const std::string& name, Backend& be, const Tensor& t) {
  if (dbg != nullptr && dbg->wants(name)) dbg->tensor(name, be, t);
}

}  // namespace zimage

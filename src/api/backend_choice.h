// The device and compute precision of an Engine or a Transformer (include/zimage): one reading of
// the "device" and "precision" options for both, so they accept and refuse the same spellings.
// Internal to src/api.
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"
#include "zimage/status.h"

namespace zimage {

// "cuda" -> 0, "cuda:3" -> 3; -1 when `device` is not a CUDA spelling.
int cuda_index(const std::string& device);

// The backend for `device` ("auto", "cpu", "cuda", "cuda:N") computing in `precision_option`
// ("auto", "bf16", "f32", "fp8"; bf16 and fp8 need CUDA) with `threads` CPU threads; `precision`
// receives what it computes in ("bf16", "fp8" or "f32"). Errors name the option (field()).
Result<std::unique_ptr<Backend>> make_backend(const std::string& device,
                                              const std::string& precision_option, int threads,
                                              std::string& precision);

}  // namespace zimage

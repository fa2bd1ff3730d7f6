// Scalar formulas shared by several CPU op files, written exactly as the reference
// (PyTorch fp32) defines them, so every op that applies them rounds the same way.
#pragma once

#include <cmath>

namespace zimage::cpu {

// SiLU as torch.nn.functional.silu: x / (1 + exp(-x)), in float32.
inline float silu_f(float x) {
  return x / (1.0f + std::exp(-x));
}

}  // namespace zimage::cpu

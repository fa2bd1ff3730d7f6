// Shared by the LoRA parity tests (load-time merge and runtime LoRA, CPU and GPU): the v_turbo
// golden request they run (turbo_request, common/golden_harness.h) and the step-0 DiT output
// they compare.
#pragma once

#include "common/golden_harness.h"

namespace zimage::test {

inline constexpr const char* kDitStep0 = "dit_out.step0";

// Keeps the DiT output of step 0: get(kDitStep0).
inline CaptureSink step0_sink() {
  return CaptureSink({kDitStep0});
}

}  // namespace zimage::test

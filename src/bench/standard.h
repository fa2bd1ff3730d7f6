// The default `zimage bench` figures' shared state (standard.cpp, ablation.cpp): one loaded model,
// the prompt's ids and caption features, and the figures so far. Internal to src/bench.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench/common.h"

namespace zimage::bench {

struct StandardRun {
  const Options& o;
  const std::string& dir;
  json& R;
  Loaded L;
  double mem0 = 0;                      // device memory used before the load (GiB)
  std::vector<int32_t> ids;             // the prompt's tokens
  std::vector<Tensor> caps;             // its caption features (text encoder output)
  int fac = 8;                          // VAE factor
  int res0 = 0;                         // the first --sizes: whole images, profile, ablation
  std::unique_ptr<GpuSampler> sampler;  // the GPU's clock and power (inert without NVML)
};

// --profile: device time per op of one DiT forward (eager, then inside its recorded CUDA graph with
// the time between ops), one VAE decode and one text encoding, a
// table each and R["profile"].
void profile_ops(StandardRun& s);

// Runs `fn` with the backend's per-op timing on and prints the table (the 40 costliest ops);
// the rows go to prof[phase].
void profile_phase(Backend& be, const std::string& phase, const std::function<Status()>& fn,
                   json& prof);

// --ablation: the techniques switched off one by one (R["ablation"]); frees s.L's pipeline and
// backend on the way (the FP8 and fp32 rows load their own copies).
void run_ablation(StandardRun& s);

}  // namespace zimage::bench

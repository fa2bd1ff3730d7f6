#include "pipeline/memory_plan.h"

#include <algorithm>
#include <cstdio>

namespace zimage {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

std::string gib(uint64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(b) / (1024.0 * kMiB));
  return buf;
}

// `resident` of `n` units resident, the streamed ones spread evenly over the order (so that in
// a steady state each streamed unit's copy overlaps the compute of resident units around it).
std::vector<bool> spread(int n, int resident) {
  std::vector<bool> streamed(n, false);
  const int m = n - resident;  // streamed
  for (int j = 0; j < m; ++j) {
    const int idx = static_cast<int>((static_cast<int64_t>(2 * j + 1) * n) / (2 * m));
    streamed[std::min(idx, n - 1)] = true;
  }
  return streamed;
}

struct Choice {
  int dit_resident, te_resident;
  bool tiled;
};

uint64_t te_device_bytes(const MemoryPlanInput& in, int te_resident) {
  const bool streams = te_resident < in.te_layers;
  uint64_t b = in.te_other_bytes + static_cast<uint64_t>(te_resident) * in.te_layer_bytes;
  if (!streams) b += in.te_embed_bytes;
  if (streams)
    b += static_cast<uint64_t>(std::min(in.slots, in.te_layers - te_resident)) * in.te_layer_bytes;
  return b + in.fp8_scratch_bytes;
}

uint64_t dit_device_bytes(const MemoryPlanInput& in, int dit_resident) {
  uint64_t b = in.dit_other_bytes + static_cast<uint64_t>(dit_resident) * in.dit_block_bytes;
  if (dit_resident < in.dit_blocks)
    b += static_cast<uint64_t>(std::min(in.slots, in.dit_blocks - dit_resident)) *
         in.dit_block_bytes;
  return b + in.fp8_scratch_bytes;
}

uint64_t peak_of(const MemoryPlanInput& in, const Choice& c, uint64_t* resident_out) {
  uint64_t resident =
      te_device_bytes(in, c.te_resident) + dit_device_bytes(in, c.dit_resident) + in.vae_bytes;
  // A resident DiT replays a recorded forward (CUDA graph), whose activations stay reserved in
  // the graph's private pool through the other phases.
  const bool graphed = c.dit_resident == in.dit_blocks;
  if (graphed) resident += in.dit_activation_bytes;
  if (resident_out) *resident_out = resident;
  const uint64_t vae = c.tiled ? in.vae_tiled_activation_bytes : in.vae_activation_bytes;
  const uint64_t act =
      std::max({in.te_activation_bytes, graphed ? uint64_t{0} : in.dit_activation_bytes, vae});
  return in.fixed + resident + act;
}

}  // namespace

uint64_t memory_plan_margin(uint64_t budget) {
  return std::max<uint64_t>(256 * kMiB, budget / 25);  // 4 %, at least 256 MiB
}

int MemoryPlan::dit_resident_blocks() const {
  return static_cast<int>(std::count(dit_streamed.begin(), dit_streamed.end(), false));
}

int MemoryPlan::te_resident_layers() const {
  return static_cast<int>(std::count(te_streamed.begin(), te_streamed.end(), false));
}

std::string MemoryPlan::describe() const {
  std::string s = "memory plan";
  s += budget ? " for a budget of " + gib(budget) : std::string(" (no budget)");
  s += ": transformer " + std::to_string(dit_resident_blocks()) + "/" +
       std::to_string(dit_streamed.size()) + " blocks resident";
  s += ", text encoder " + std::to_string(te_resident_layers()) + "/" +
       std::to_string(te_streamed.size()) + " layers resident";
  s += std::string(", VAE ") + (vae_tiled ? "tiled" : "untiled");
  s += "; device weights " + gib(resident_bytes) + ", estimated peak " + gib(peak_bytes);
  s += "; streamed per DiT forward " + gib(dit_stream_bytes) + ", per text encoding " +
       gib(te_stream_bytes);
  if (host_pinned_bytes + host_pageable_bytes > 0) {
    s += "; host copies " + gib(host_pinned_bytes) + " pinned";
    if (host_pageable_bytes > 0)
      s += " + " + gib(host_pageable_bytes) +
           (pin_copies ? " pageable (over the host-memory limit of " + gib(host_pinned_limit) + ")"
                       : std::string(" pageable (copies not page-locked)"));
  }
  if (host_file_bytes > 0) {
    s += "; " + gib(host_file_bytes) + " streamed from the weight files";
    if (host_locked_bytes > 0) s += " (" + gib(host_locked_bytes) + " of their pages locked)";
    if (host_staging_bytes > 0) s += " through " + gib(host_staging_bytes) + " of pinned staging";
  }
  return s;
}

Result<MemoryPlan> plan_memory(const MemoryPlanInput& in) {
  if (in.dit_blocks < 0 || in.te_layers < 0 || in.slots < 1)
    return InvalidArgument("memory plan: bad model sizes");
  Choice c{in.dit_blocks, in.te_layers, false};
  if (in.budget != 0) {
    const uint64_t margin = memory_plan_margin(in.budget);
    const uint64_t avail = in.budget > margin ? in.budget - margin : 0;
    auto fits = [&](const Choice& ch) { return peak_of(in, ch, nullptr) <= avail; };
    // The VAE tiles (which changes the image slightly: blended seams) only when nothing else
    // makes room for the untiled decode.
    if (!fits(c)) {
      // Text encoder layers go first (it runs once per request), then DiT blocks.
      for (c.te_resident = in.te_layers; c.te_resident > 0 && !fits(c); --c.te_resident) {
      }
      for (c.dit_resident = in.dit_blocks; c.dit_resident > 0 && !fits(c); --c.dit_resident) {
      }
      if (!fits(c)) c.tiled = true;
      // With DiT blocks streaming, give text-encoder layers back what is left over.
      while (c.te_resident < in.te_layers &&
             fits(Choice{c.dit_resident, c.te_resident + 1, c.tiled}))
        ++c.te_resident;
    }
    if (!fits(c)) {
      const uint64_t need = peak_of(in, Choice{0, 0, true}, nullptr) + margin;
      return InvalidArgument("--vram-budget " + gib(in.budget) +
                             " is below the minimum for this model and size: " + gib(need) +
                             " (CUDA context and libraries " + gib(in.fixed) +
                             ", with every weight streamed and the VAE tiled)");
    }
  }
  MemoryPlan plan;
  plan.budget = in.budget;
  plan.dit_streamed = spread(in.dit_blocks, c.dit_resident);
  plan.te_streamed = spread(in.te_layers, c.te_resident);
  plan.vae_tiled = c.tiled;
  plan.peak_bytes = peak_of(in, c, &plan.resident_bytes);
  plan.dit_stream_bytes =
      static_cast<uint64_t>(in.dit_blocks - c.dit_resident) * in.dit_block_bytes;
  plan.te_stream_bytes = static_cast<uint64_t>(in.te_layers - c.te_resident) * in.te_layer_bytes;
  // Host copies of the streamed units: pinned while the limit allows, DiT blocks first.
  plan.host_pinned_limit = in.host_pinned_limit;
  plan.pin_copies = in.pin_copies;
  // Units streamed from the files count against the limit too, as the page-locked copies they
  // fall back to where a file does not hold a weight as it streams (FP8, LoRA-merged): the
  // pageable flag then says which fallback copies stay pageable, or which locked-files units are
  // staged instead of locked.
  uint64_t within = 0;  // bytes of the units placed within the limit so far
  auto place_host = [&](const std::vector<bool>& streamed, uint64_t unit_bytes,
                        std::vector<bool>& pageable, bool from_files) {
    pageable.assign(streamed.size(), false);
    int staged = 0;  // units streamed through the staging
    for (size_t i = 0; i < streamed.size(); ++i) {
      if (!streamed[i]) continue;
      // Page-locked memory within the limit, DiT blocks first.
      const bool fits = in.host_pinned_limit == 0 || within + unit_bytes <= in.host_pinned_limit;
      const bool locked = from_files && in.lock_files && fits;
      const bool pinned = fits && (locked || in.pin_copies);
      if (pinned) within += unit_bytes;
      if (from_files) {
        plan.host_file_bytes += unit_bytes;
        pageable[i] = !pinned;
        if (locked) {
          plan.host_locked_bytes += unit_bytes;
        } else {
          ++staged;
        }
        continue;
      }
      if (pinned) {
        plan.host_pinned_bytes += unit_bytes;
      } else {
        pageable[i] = true;
        plan.host_pageable_bytes += unit_bytes;
      }
    }
    if (from_files) plan.host_staging_bytes += std::min<uint64_t>(staged, in.slots) * unit_bytes;
  };
  place_host(plan.dit_streamed, in.dit_block_bytes, plan.dit_pageable, in.dit_from_files);
  place_host(plan.te_streamed, in.te_layer_bytes, plan.te_pageable, in.te_from_files);
  return plan;
}

}  // namespace zimage

// The memory planner: given a device-memory budget, decides what of the model lives on the GPU and
// what stays in host memory and streams in (model/common/weight_streamer.h), and whether the VAE
// decodes in tiles. Pure arithmetic on sizes (no device calls), so its decisions are unit tested as
// a table of budgets and shapes.
//
// The budget counts everything the process holds on the device: the CUDA context and library
// handles (`fixed`, measured from the driver's side at start), every weight kept on the device,
// the streaming slots, and the largest phase's activations. Policy, in order of what pays:
//   1. everything resident when it fits (no streaming, CUDA graphs);
//   2. else the text encoder streams (it runs once per request, the DiT once per step), layer by
//      layer, as many layers resident as fit;
//   3. else DiT blocks stream too, spread evenly over the forward so each copy overlaps the
//      compute of resident blocks; as many blocks resident as fit;
//   4. the VAE decodes in tiles only when its untiled activations do not fit even then.
// What streams is held in host memory: page-locked up to the host-memory limit (DiT blocks first:
// they stream every step), pageable beyond it, so a budgeted load never pins more than allowed;
// or, streamed from the files, it is read from the memory-mapped weight files each time through
// a slot-sized page-locked staging buffer (no copy at load).
// A budget below the smallest workable plan (everything streamed, tiled VAE) is an error that
// states that minimum.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace zimage {

struct MemoryPlanInput {
  uint64_t budget = 0;  // bytes the process may hold on the device; 0 = no limit
  uint64_t fixed = 0;   // context + library memory outside the allocator, measured
  // Weights on the device (act dtype, or FP8 rows for the big linears), per unit and the rest.
  int dit_blocks = 0;
  uint64_t dit_block_bytes = 0;
  uint64_t dit_other_bytes = 0;
  int te_layers = 0;
  uint64_t te_layer_bytes = 0;
  uint64_t te_embed_bytes = 0;  // device bytes of the embedding table (0: kept on the host)
  uint64_t te_other_bytes = 0;
  uint64_t vae_bytes = 0;
  uint64_t fp8_scratch_bytes = 0;  // per model using FP8 weights: the widest weight, act dtype
  // Peak activations of each phase for the largest request planned for.
  uint64_t te_activation_bytes = 0;
  uint64_t dit_activation_bytes = 0;
  uint64_t vae_activation_bytes = 0;        // untiled decode
  uint64_t vae_tiled_activation_bytes = 0;  // tiled decode
  int slots = 2;                            // streaming slots per model (double buffering)
  // Host memory the streamed units may pin (page-locked: the link's full rate, but not
  // swappable); 0 = no limit. Units beyond it are held in pageable memory and stream from there
  // (same bytes, a slower copy that holds the host thread).
  uint64_t host_pinned_limit = 0;
  // false: host copies are never page-locked (all pageable, whatever the limit): a one-shot
  // process (zimage generate) makes an image or two, and page-locking gigabytes costs more at
  // load (~0.3-0.6 s a GiB) and at exit than the slower copies cost its steps. Locked file
  // pages (lock_files) still count against the limit.
  bool pin_copies = true;
  // Streamed units read from the weight files each time (WeightPlacement::stream_from_files, and
  // the files hold them in the compute dtype): no host copy, only per-slot page-locked staging.
  bool dit_from_files = false;
  bool te_from_files = false;
  // Those units' file pages page-locked in place (no copy), within host_pinned_limit like copies
  // (DiT blocks first); units beyond it stream through the staging.
  bool lock_files = false;
};

struct MemoryPlan {
  uint64_t budget = 0;
  std::vector<bool> dit_streamed;  // per DiT block, execution order
  std::vector<bool> te_streamed;   // per text-encoder layer
  // Per unit (same indexing): a streamed unit held in pageable host memory, over the host-memory
  // limit. DiT blocks, which stream every step, are pinned first, then text-encoder layers.
  std::vector<bool> dit_pageable;
  std::vector<bool> te_pageable;
  uint64_t host_pinned_bytes = 0;    // streamed units' host copies, page-locked
  uint64_t host_pageable_bytes = 0;  // the rest of them, pageable
  uint64_t host_pinned_limit = 0;    // as planned with (0: none)
  bool pin_copies = true;            // as planned with
  // Units streamed from the weight files instead: bytes read from the files (the page cache) per
  // pass over them, and the page-locked staging they stream through (a slot's worth per slot).
  uint64_t host_file_bytes = 0;
  uint64_t host_staging_bytes = 0;
  uint64_t host_locked_bytes = 0;  // of host_file_bytes, page-locked in place (lock_files)
  bool vae_tiled = false;
  uint64_t resident_bytes = 0;    // weights + slots + scratch held on the device for good
  uint64_t peak_bytes = 0;        // estimated peak: fixed + resident + largest phase
  uint64_t dit_stream_bytes = 0;  // host -> device per DiT forward
  uint64_t te_stream_bytes = 0;   // host -> device per text-encoder run
  int dit_resident_blocks() const;
  int te_resident_layers() const;
  std::string describe() const;  // one paragraph for --verbose and bench
};

// Margin kept free inside the budget for allocator rounding and fragmentation.
uint64_t memory_plan_margin(uint64_t budget);

Result<MemoryPlan> plan_memory(const MemoryPlanInput& in);

}  // namespace zimage

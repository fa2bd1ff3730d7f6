// The memory planner (pipeline/memory_plan.h) on the full-size Z-Image-Turbo sizes: a table of
// budgets and the decisions they must give, the budget respected by the plan's own estimate, the
// order of what streams (text encoder first, then DiT blocks spread over the forward), the
// tiled VAE only as a last resort, and an impossible budget named with its minimum.
#include <gtest/gtest.h>

#include <string>

#include "io/model/model_folder.h"
#include "pipeline/memory_plan.h"
#include "pipeline/text_to_image.h"

using namespace zimage;

namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;
// The published VAE's parameter count (83.8 M; close enough for planning).
constexpr uint64_t kVaeParams = 83'800'000;
constexpr uint64_t kContext = 600ull << 20;  // a typical CUDA context + cuBLAS/cuDNN handles

MemoryPlanInput full_size(double budget_gib, bool fp8 = false, int side = 1024) {
  PipelineLoadOptions o;
  o.vram_budget = static_cast<uint64_t>(budget_gib * static_cast<double>(kGiB));
  o.fp8_weights = fp8;
  o.plan_width = o.plan_height = side;
  return TextToImage::plan_input(zimage_turbo_reference_configs(), DType::kBF16, o, kVaeParams,
                                 kContext);
}

// The host side of a plan (pinned, pageable, from the files) never changes the device side.
void expect_same_device_side(const MemoryPlan& a, const MemoryPlan& b) {
  EXPECT_EQ(a.dit_streamed, b.dit_streamed);
  EXPECT_EQ(a.te_streamed, b.te_streamed);
  EXPECT_EQ(a.peak_bytes, b.peak_bytes);
}

}  // namespace

TEST(MemoryPlan, FullSizeWeightSizesMatchThePublishedModel) {
  const MemoryPlanInput in = full_size(0);
  EXPECT_EQ(in.dit_blocks, 34);  // 2 + 2 refiners, 30 layers
  EXPECT_EQ(in.te_layers, 35);   // 36 layers, hidden_states[-2]
  const double dit_gib =
      static_cast<double>(in.dit_blocks * in.dit_block_bytes + in.dit_other_bytes) / kGiB;
  const double te_gib = static_cast<double>(in.te_layers * in.te_layer_bytes + in.te_embed_bytes) /
                        static_cast<double>(kGiB);
  // DiT 6.15 B parameters (12.3 GB = 11.5 GiB in bf16), text encoder 4.0 B without its last layer
  // and without its embedding table (0.39 B parameters, kept in host memory on a GPU)
  EXPECT_EQ(in.te_embed_bytes, 0u);
  EXPECT_NEAR(dit_gib, 11.4, 0.3);
  EXPECT_NEAR(te_gib, 6.5, 0.3);
  const MemoryPlanInput f8 = full_size(0, true);
  EXPECT_LT(f8.dit_block_bytes * 10, in.dit_block_bytes * 6);  // FP8 rows: about half
}

TEST(MemoryPlan, TableOfBudgets) {
  struct Row {
    double gib;
    bool fp8;
    int min_dit_resident, max_dit_resident;
    int min_te_resident, max_te_resident;
  };
  // What each budget must give at 1024², batch 1 (bf16 unless marked).
  const Row rows[] = {
      {0, false, 34, 34, 35, 35},   // no limit: everything resident
      {40, false, 34, 34, 35, 35},  // fits: everything resident
      {16, false, 34, 34, 0, 20},   // the text encoder streams first
      {12, false, 20, 33, 0, 4},    // then DiT blocks (text-encoder layers get leftovers)
      {8, false, 5, 25, 0, 4},      //
      {4, false, 0, 6, 0, 4},       // almost everything streams
      {12, true, 34, 34, 0, 35},    // FP8 weights: the DiT fits at 12 GiB
      {4, true, 0, 20, 0, 4},       //
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(std::to_string(r.gib) + " GiB" + (r.fp8 ? " fp8" : ""));
    const MemoryPlanInput in = full_size(r.gib, r.fp8);
    auto plan = plan_memory(in);
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    EXPECT_GE(plan->dit_resident_blocks(), r.min_dit_resident) << plan->describe();
    EXPECT_LE(plan->dit_resident_blocks(), r.max_dit_resident) << plan->describe();
    EXPECT_GE(plan->te_resident_layers(), r.min_te_resident) << plan->describe();
    EXPECT_LE(plan->te_resident_layers(), r.max_te_resident) << plan->describe();
    if (r.gib > 0) {  // the plan's own estimate stays inside the budget less the margin
      EXPECT_LE(plan->peak_bytes + memory_plan_margin(plan->budget), plan->budget)
          << plan->describe();
    }
    EXPECT_FALSE(plan->vae_tiled);
    // Streamed bytes are exactly the streamed units.
    EXPECT_EQ(plan->dit_stream_bytes,
              static_cast<uint64_t>(34 - plan->dit_resident_blocks()) * in.dit_block_bytes);
  }
}

TEST(MemoryPlan, TextEncoderStreamsBeforeAnyDitBlockAndBlocksAreSpread) {
  for (double gib = 4; gib <= 24; gib += 0.5) {
    auto plan = plan_memory(full_size(gib));
    ASSERT_TRUE(plan.ok()) << gib << ": " << plan.status().to_string();
    if (plan->dit_resident_blocks() < 34) {  // text-encoder layers only get leftovers
      EXPECT_LE(plan->te_resident_layers(), 4) << plan->describe();
    }
    // More budget never means fewer resident blocks.
    auto more = plan_memory(full_size(gib + 0.5));
    ASSERT_TRUE(more.ok());
    EXPECT_GE(more->dit_resident_blocks(), plan->dit_resident_blocks()) << gib;
    // Streamed blocks spread: never two streamed blocks in a row while half or more are resident.
    if (plan->dit_resident_blocks() * 2 >= 34) {
      for (size_t i = 1; i < plan->dit_streamed.size(); ++i)
        EXPECT_FALSE(plan->dit_streamed[i] && plan->dit_streamed[i - 1]) << gib << " block " << i;
    }
  }
}

TEST(MemoryPlan, LargeImagesTileTheVaeOnlyWhenNothingElseFits) {
  auto big = plan_memory(full_size(6, false, 2048));
  ASSERT_TRUE(big.ok()) << big.status().to_string();
  EXPECT_TRUE(big->vae_tiled) << big->describe();
  auto roomy = plan_memory(full_size(40, false, 2048));
  ASSERT_TRUE(roomy.ok());
  EXPECT_FALSE(roomy->vae_tiled);
}

TEST(MemoryPlan, ImpossibleBudgetNamesTheMinimum) {
  auto plan = plan_memory(full_size(1));
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), ErrorCode::kInvalidArgument);
  const std::string msg = plan.status().message();
  EXPECT_NE(msg.find("--vram-budget 1.00 GiB is below the minimum"), std::string::npos) << msg;
  EXPECT_NE(msg.find("every weight streamed"), std::string::npos) << msg;
  // The minimum it states is enough.
  const std::string key = "minimum for this model and size: ";
  const size_t at = msg.find(key);
  ASSERT_NE(at, std::string::npos);
  const double min_gib = std::stod(msg.substr(at + key.size()));
  EXPECT_GT(min_gib, 1.0);
  auto ok = plan_memory(full_size(min_gib + 0.01));
  EXPECT_TRUE(ok.ok()) << ok.status().to_string();
}

// The host-memory limit (MemoryPlanInput::host_pinned_limit): streamed units are page-locked
// while it allows, DiT blocks (streamed every step) before text-encoder layers, and the rest are
// pageable; the device-side plan does not change with it, and the table a user reads from
// --verbose states both amounts. Full size, bf16, 4 GiB budget: ~17 GiB stream.
TEST(MemoryPlan, HostMemoryLimitPinsDitBlocksFirstAndTheRestPageable) {
  const MemoryPlanInput unlimited_in = full_size(4);
  auto unlimited = plan_memory(unlimited_in);
  ASSERT_TRUE(unlimited.ok());
  const uint64_t streamed_total = unlimited->host_pinned_bytes;
  EXPECT_EQ(unlimited->host_pageable_bytes, 0u);
  EXPECT_EQ(streamed_total, unlimited->dit_stream_bytes + unlimited->te_stream_bytes);
  EXPECT_GT(streamed_total, 14 * kGiB) << unlimited->describe();
  EXPECT_EQ(unlimited->describe().find("pageable"), std::string::npos);

  for (double limit_gib : {12.0, 8.0, 4.0, 0.5}) {
    SCOPED_TRACE(std::to_string(limit_gib) + " GiB pinned at most");
    MemoryPlanInput in = unlimited_in;
    in.host_pinned_limit = static_cast<uint64_t>(limit_gib * static_cast<double>(kGiB));
    auto plan = plan_memory(in);
    ASSERT_TRUE(plan.ok());
    // The device side is the same plan.
    expect_same_device_side(*plan, *unlimited);
    // Every streamed byte is held somewhere, pinned within the limit.
    EXPECT_LE(plan->host_pinned_bytes, in.host_pinned_limit);
    EXPECT_EQ(plan->host_pinned_bytes + plan->host_pageable_bytes, streamed_total);
    EXPECT_GT(plan->host_pinned_bytes + std::max(in.dit_block_bytes, in.te_layer_bytes),
              in.host_pinned_limit)
        << "the limit is used up to the last unit that fits";
    // Only streamed units are pageable, and a DiT block is pageable only when no further one fit
    // in the limit (text-encoder layers, smaller, may fill what is left).
    uint64_t dit_pinned = 0;
    bool dit_pageable = false;
    for (size_t i = 0; i < plan->dit_streamed.size(); ++i) {
      if (plan->dit_pageable[i]) {
        EXPECT_TRUE(plan->dit_streamed[i]);
      }
      dit_pageable = dit_pageable || plan->dit_pageable[i];
      if (plan->dit_streamed[i] && !plan->dit_pageable[i]) dit_pinned += in.dit_block_bytes;
    }
    for (size_t i = 0; i < plan->te_streamed.size(); ++i) {
      if (plan->te_pageable[i]) {
        EXPECT_TRUE(plan->te_streamed[i]);
      }
    }
    if (dit_pageable) {
      EXPECT_GT(dit_pinned + in.dit_block_bytes, in.host_pinned_limit) << plan->describe();
    }
    EXPECT_NE(plan->describe().find("pageable (over the host-memory limit"), std::string::npos)
        << plan->describe();
  }
}

// Streamed from the weight files (MemoryPlanInput::dit_from_files / te_from_files): no host copy
// at all, whatever the host-memory limit; what is held is a slot's worth of page-locked staging
// per slot, and the files are read for every streamed byte. The device side is the same plan.
TEST(MemoryPlan, StreamingFromTheFilesHoldsOnlyStagingInHostMemory) {
  const MemoryPlanInput copy_in = full_size(4);
  auto copies = plan_memory(copy_in);
  ASSERT_TRUE(copies.ok());
  for (double limit_gib : {0.0, 4.0}) {
    MemoryPlanInput in = copy_in;
    in.host_pinned_limit = static_cast<uint64_t>(limit_gib * static_cast<double>(kGiB));
    in.dit_from_files = in.te_from_files = true;
    auto plan = plan_memory(in);
    ASSERT_TRUE(plan.ok());
    expect_same_device_side(*plan, *copies);
    EXPECT_EQ(plan->host_pinned_bytes, 0u);
    EXPECT_EQ(plan->host_pageable_bytes, 0u);
    EXPECT_EQ(plan->host_file_bytes, copies->host_pinned_bytes);  // everything a copy held
    EXPECT_EQ(plan->host_staging_bytes,
              static_cast<uint64_t>(in.slots) * (in.dit_block_bytes + in.te_layer_bytes));
    EXPECT_LT(plan->host_staging_bytes, 2 * kGiB) << plan->describe();
    EXPECT_NE(plan->describe().find("streamed from the weight files through"), std::string::npos)
        << plan->describe();
    EXPECT_EQ(plan->describe().find("host copies"), std::string::npos) << plan->describe();
    // The units beyond the limit are marked: a fallback copy of theirs (a weight the files do
    // not hold as it streams) stays pageable.
    int marked = 0;
    for (size_t i = 0; i < plan->dit_streamed.size(); ++i) marked += plan->dit_pageable[i];
    EXPECT_EQ(marked > 0, limit_gib > 0) << plan->describe();
  }
  // Only the DiT from the files (the text encoder's layers copied): each part as its mode says.
  MemoryPlanInput mixed = copy_in;
  mixed.dit_from_files = true;
  auto plan = plan_memory(mixed);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->host_file_bytes, plan->dit_stream_bytes);
  EXPECT_EQ(plan->host_pinned_bytes + plan->host_pageable_bytes, plan->te_stream_bytes);
  EXPECT_EQ(plan->host_staging_bytes, static_cast<uint64_t>(mixed.slots) * mixed.dit_block_bytes);
}

// A one-shot process's copies (MemoryPlanInput::pin_copies false: zimage generate with
// --streamed-weights files and no --host-memory): every streamed copy pageable whatever the
// limit, the device side unchanged; units streamed from the files are marked pageable too (their
// fallback copies, FP8 rows, stay pageable), while locked file pages still take the limit.
TEST(MemoryPlan, CopiesNotPinnedForAOneShotProcess) {
  for (bool fp8 : {false, true}) {
    SCOPED_TRACE(fp8 ? "fp8 weights" : "bf16 weights");
    const MemoryPlanInput pinned_in = full_size(4, fp8);
    auto pinned = plan_memory(pinned_in);
    ASSERT_TRUE(pinned.ok());
    ASSERT_GT(pinned->host_pinned_bytes, 0u);
    for (uint64_t limit : {uint64_t{0}, 6 * kGiB}) {
      MemoryPlanInput in = pinned_in;
      in.host_pinned_limit = limit;
      in.pin_copies = false;
      auto plan = plan_memory(in);
      ASSERT_TRUE(plan.ok());
      expect_same_device_side(*plan, *pinned);
      EXPECT_EQ(plan->host_pinned_bytes, 0u);
      EXPECT_EQ(plan->host_pageable_bytes, plan->dit_stream_bytes + plan->te_stream_bytes);
      for (size_t i = 0; i < plan->dit_streamed.size(); ++i)
        EXPECT_EQ(plan->dit_pageable[i], plan->dit_streamed[i]) << "block " << i;
      for (size_t i = 0; i < plan->te_streamed.size(); ++i)
        EXPECT_EQ(plan->te_pageable[i], plan->te_streamed[i]) << "layer " << i;
      EXPECT_NE(plan->describe().find("pageable (copies not page-locked)"), std::string::npos)
          << plan->describe();
      // From the files: every unit marked (its fallback copy pageable), all of them staged.
      MemoryPlanInput files = in;
      files.dit_from_files = files.te_from_files = true;
      auto fp = plan_memory(files);
      ASSERT_TRUE(fp.ok());
      for (size_t i = 0; i < fp->dit_streamed.size(); ++i)
        EXPECT_EQ(fp->dit_pageable[i], fp->dit_streamed[i]) << "block " << i;
      EXPECT_EQ(fp->host_locked_bytes, 0u);
      // Locked file pages are not copies: they still fill the limit (all of them without one).
      files.lock_files = true;
      auto lp = plan_memory(files);
      ASSERT_TRUE(lp.ok());
      if (limit == 0) {
        EXPECT_EQ(lp->host_locked_bytes, lp->host_file_bytes);
      } else {
        EXPECT_LE(lp->host_locked_bytes, limit);
        EXPECT_GT(lp->host_locked_bytes + in.dit_block_bytes, limit);
      }
    }
  }
}

// Locked file pages (MemoryPlanInput::lock_files) count against the host-memory limit like
// copies, DiT blocks first; the units beyond it stream through the staging (marked pageable),
// and only those need staging.
TEST(MemoryPlan, LockedFilePagesStayWithinTheHostMemoryLimit) {
  MemoryPlanInput in = full_size(4);
  in.dit_from_files = in.te_from_files = in.lock_files = true;
  auto all = plan_memory(in);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->host_locked_bytes, all->host_file_bytes);  // no limit: everything locked
  EXPECT_EQ(all->host_staging_bytes, 0u);
  EXPECT_EQ(all->host_pinned_bytes + all->host_pageable_bytes, 0u);
  EXPECT_NE(all->describe().find("of their pages locked"), std::string::npos) << all->describe();
  in.host_pinned_limit = 6 * kGiB;
  auto limited = plan_memory(in);
  ASSERT_TRUE(limited.ok());
  EXPECT_LE(limited->host_locked_bytes, in.host_pinned_limit);
  EXPECT_GT(limited->host_locked_bytes + in.dit_block_bytes, in.host_pinned_limit);
  EXPECT_EQ(limited->host_file_bytes, all->host_file_bytes);
  // The DiT blocks are locked first (a text-encoder layer, smaller, may take what is left): the
  // locked bytes are those of the units not marked pageable, and some of each part are staged.
  uint64_t locked = 0;
  int dit_staged = 0, te_staged = 0;
  for (size_t i = 0; i < limited->dit_streamed.size(); ++i) {
    if (!limited->dit_streamed[i]) continue;
    if (limited->dit_pageable[i])
      ++dit_staged;
    else
      locked += in.dit_block_bytes;
  }
  for (size_t i = 0; i < limited->te_streamed.size(); ++i) {
    if (!limited->te_streamed[i]) continue;
    if (limited->te_pageable[i])
      ++te_staged;
    else
      locked += in.te_layer_bytes;
  }
  EXPECT_EQ(locked, limited->host_locked_bytes);
  EXPECT_GT(dit_staged, 0);
  EXPECT_GT(te_staged, 0);
  EXPECT_EQ(limited->host_staging_bytes,
            static_cast<uint64_t>(in.slots) * (in.dit_block_bytes + in.te_layer_bytes));
}

// The warm-up's products (Backend::warm_up) are the ones the full-size model runs at 1024²: the
// profile's q|k|v, out, w1|w3 and w2 at 4160 rows (4096 image + 64 caption tokens), the
// refiners' 4096 and 64 rows, the adaLN projection, and the text encoder's four linears.
TEST(MemoryPlan, WarmUpHintsAreTheFullSizeModelsProducts) {
  PipelineLoadOptions o;
  o.plan_width = o.plan_height = 1024;
  const Backend::WarmUpHints h = TextToImage::warm_up_hints(zimage_turbo_reference_configs(), o);
  auto has = [&](int64_t m, int64_t n, int64_t k) {
    for (const auto& l : h.linears)
      if (l[0] == m && l[1] == n && l[2] == k) return true;
    return false;
  };
  for (const int64_t m : {4160, 4096, 64}) {
    EXPECT_TRUE(has(m, 11520, 3840)) << m;
    EXPECT_TRUE(has(m, 3840, 3840)) << m;
    EXPECT_TRUE(has(m, 20480, 3840)) << m;
    EXPECT_TRUE(has(m, 3840, 10240)) << m;
  }
  EXPECT_TRUE(has(1, 15360, 256));
  EXPECT_TRUE(has(32, 6144, 2560));   // q | k | v: 32 + 2 x 8 heads of 128
  EXPECT_TRUE(has(32, 2560, 4096));   // o
  EXPECT_TRUE(has(32, 19456, 2560));  // gate | up
  EXPECT_TRUE(has(32, 2560, 9728));   // down
  o.plan_width = 512;                 // 1024 x 512: 2048 image tokens
  const Backend::WarmUpHints wide = TextToImage::warm_up_hints(zimage_turbo_reference_configs(), o);
  bool found = false;
  for (const auto& l : wide.linears) found = found || (l[0] == 2048 + 64 && l[1] == 11520);
  EXPECT_TRUE(found);
  // The decode's convolution inputs: the latent's size and each upsampler's double, batch 1.
  using In = std::array<int64_t, 3>;
  EXPECT_EQ(h.conv_inputs,
            (std::vector<In>{{1, 128, 128}, {1, 256, 256}, {1, 512, 512}, {1, 1024, 1024}}));
  EXPECT_EQ(wide.conv_inputs,
            (std::vector<In>{{1, 128, 64}, {1, 256, 128}, {1, 512, 256}, {1, 1024, 512}}));
  o.plan_batch = 2;  // a batch's decode too
  const Backend::WarmUpHints two = TextToImage::warm_up_hints(zimage_turbo_reference_configs(), o);
  EXPECT_EQ(two.conv_inputs.size(), 8u);
  EXPECT_EQ(two.conv_inputs[1], (In{2, 128, 64}));
}

// Caption tokens refined once (ZImageDiT::refine_captions, forward_refined) on the CPU: the
// forward on them is forward's bit for bit on every golden case's batch (ragged CFG batches,
// several prompts, images per prompt), at two steps with one refinement; the pipeline's images
// are the same bits with the cache on and off, with one refinement per batch of captions instead
// of one per step; tokens used where they do not belong (another batch, another shape, weights
// changed by a runtime LoRA since) are refused with a message naming what is wrong.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "backend/comm.h"
#include "backend/cpu/cpu_backend.h"
#include "common/controlnet_model.h"
#include "common/golden_harness.h"
#include "common/npy.h"
#include "common/seqpar_case.h"
#include "golden_models_util.h"
#include "io/lora/lora.h"
#include "io/weights/weights.h"
#include "model/adapters/lora_runtime.h"
#include "pipeline/text_to_image.h"

namespace zimage {
namespace {

using golden::cat0;
using golden::cpu;
using golden::load_case;
using golden::npy;
using golden::t_model_at;
using golden::to_device;
using golden::to_host;

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

// A golden case's DiT batch as the pipeline builds it at a CFG step (check_dit_step's order:
// each prompt's embeddings images_per_prompt times, then the negatives), the latents twice.
struct DitBatch {
  std::vector<Tensor> caps;
  Tensor lat0, lat1;  // step 0's and the last step's latents, doubled under CFG
};

DitBatch dit_batch(const golden::Case& c) {
  DitBatch b;
  for (size_t i = 0; i < c.ids.size(); ++i) {
    const Tensor e = to_device(npy(c.dir + "/prompt_embeds_" + std::to_string(i) + ".npy"));
    for (int k = 0; k < c.images_per_prompt; ++k) b.caps.push_back(e);
  }
  Tensor l0 = npy(c.dir + "/init_noise.npy");
  Tensor l1 = npy(c.dir + "/debug/latents_after_step" + std::to_string(c.steps - 2) + ".npy");
  if (c.cfg) {
    auto te = golden::load_te(c);
    EXPECT_NE(te, nullptr);
    if (te == nullptr) return b;
    auto neg = te->encode(std::vector<std::vector<int32_t>>(c.ids.size(), c.neg_ids));
    EXPECT_TRUE(neg.ok()) << neg.status().to_string();
    if (!neg.ok()) return b;
    for (const Tensor& t : *neg)
      for (int k = 0; k < c.images_per_prompt; ++k) b.caps.push_back(t);
    l0 = cat0({l0, l0});
    l1 = cat0({l1, l1});
  }
  b.lat0 = l0;
  b.lat1 = l1;
  return b;
}

Tensor run_forward(ZImageDiT& dit, const Tensor& lat, float t, const std::vector<Tensor>* caps,
                   const ZImageDiT::RefinedCaptions* refined) {
  const std::vector<float> ts(static_cast<size_t>(lat.dim(0)), t);
  Tensor out;
  const Status st = refined != nullptr ? dit.forward_refined(to_device(lat), ts, *refined, out)
                                       : dit.forward(to_device(lat), ts, *caps, out);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return st.ok() ? to_host(out) : Tensor();
}

class RefinedCaptionsDit : public ::testing::TestWithParam<std::string> {};

TEST_P(RefinedCaptionsDit, ForwardRefinedIsForwardBitForBit) {
  const golden::Case c = load_case(GetParam());
  auto dit = golden::load_dit(c);
  ASSERT_NE(dit, nullptr);
  const DitBatch b = dit_batch(c);
  ASSERT_FALSE(b.caps.empty());
  ASSERT_EQ(static_cast<int64_t>(b.caps.size()), b.lat0.dim(0));
  const uint64_t n0 = dit->caption_refinements();
  auto refined = dit->refine_captions(b.caps);
  ASSERT_TRUE(refined.ok()) << refined.status().to_string();
  EXPECT_EQ(dit->caption_refinements(), n0 + 1);
  const float t0 = t_model_at(c.steps, 0), t1 = t_model_at(c.steps, c.steps - 1);
  const Tensor a0 = run_forward(*dit, b.lat0, t0, nullptr, &*refined);
  const Tensor a1 = run_forward(*dit, b.lat1, t1, nullptr, &*refined);
  EXPECT_EQ(dit->caption_refinements(), n0 + 1) << "forward_refined refined the captions again";
  const Tensor r0 = run_forward(*dit, b.lat0, t0, &b.caps, nullptr);
  const Tensor r1 = run_forward(*dit, b.lat1, t1, &b.caps, nullptr);
  EXPECT_EQ(dit->caption_refinements(), n0 + 3);
  EXPECT_TRUE(same_bits(a0, r0)) << "step 0 of " << b.caps.size() << " captions";
  EXPECT_TRUE(same_bits(a1, r1)) << "last step of " << b.caps.size() << " captions";
  // Against diffusers too (forward's golden tolerance, tests/parity/test_golden_models.cpp) at
  // step 0, where every case's rows are the CFG batch built here.
  const Tensor ref = npy(c.dir + "/debug/dit_out_step0.npy");
  ASSERT_EQ(ref.numel(), a0.numel());
  const double err = test::max_abs_diff(a0, ref);
  golden::report(GetParam() + " dit step 0 on refined captions", err);
  EXPECT_LE(err, 1.5e-5);
}

INSTANTIATE_TEST_SUITE_P(, RefinedCaptionsDit,
                         ::testing::Values("v_turbo", "v_cfg", "v_batch", "v_batch_cfg", "v_multi"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

TEST(RefinedCaptions, MisuseIsNamed) {
  const golden::Case c = load_case("v_turbo");
  auto dit = golden::load_dit(c);
  ASSERT_NE(dit, nullptr);
  const DitBatch b = dit_batch(c);
  ASSERT_EQ(b.caps.size(), 1u);
  auto refined = dit->refine_captions(b.caps);
  ASSERT_TRUE(refined.ok()) << refined.status().to_string();
  const float t = t_model_at(c.steps, 0);
  auto fails = [&](const Tensor& lat, const ZImageDiT::RefinedCaptions& r,
                   const std::string& what) {
    Tensor out;
    const std::vector<float> ts(static_cast<size_t>(lat.dim(0)), t);
    const Status st = dit->forward_refined(to_device(lat), ts, r, out);
    EXPECT_FALSE(st.ok()) << what;
    EXPECT_NE(st.message().find(what), std::string::npos) << st.to_string();
  };
  fails(cat0({b.lat0, b.lat0}), *refined, "batch 2 but refined captions for 1");
  fails(b.lat0, ZImageDiT::RefinedCaptions{}, "batch 1 but refined captions for 0");
  ZImageDiT::RefinedCaptions narrow = *refined;
  narrow.tokens = to_device(Tensor::host(DType::kF32, {1, refined->tokens.dim(1), 8}));
  fails(b.lat0, narrow, "refined caption tokens must be");
  ZImageDiT::RefinedCaptions stale = *refined;
  stale.weights_version += 1;
  fails(b.lat0, stale, "refine them again");

  EXPECT_FALSE(dit->refine_captions({}).ok());
  auto wrong = dit->refine_captions({to_device(Tensor::host(DType::kF32, {3, 5}))});
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("caption 0 must be"), std::string::npos)
      << wrong.status().to_string();

  // A runtime LoRA changes the weights: tokens refined before are refused, tokens refined after
  // give forward's output with the LoRA; taking it off refuses those again.
  auto lora = read_lora(std::string(ZIMAGE_LORA_DIR) + "/kohya.safetensors", 1.0f);
  ASSERT_TRUE(lora.ok()) << lora.status().to_string();
  const std::vector<RuntimeLora> set{{std::make_shared<const LoraFile>(std::move(*lora)), 0.8f}};
  const uint64_t v0 = dit->weights_version();
  ASSERT_TRUE(dit->set_loras(set, LoraMethod::kMerge, false).ok());
  EXPECT_NE(dit->weights_version(), v0);
  fails(b.lat0, *refined, "refine them again");
  auto with_lora = dit->refine_captions(b.caps);
  ASSERT_TRUE(with_lora.ok()) << with_lora.status().to_string();
  EXPECT_TRUE(same_bits(run_forward(*dit, b.lat0, t, nullptr, &*with_lora),
                        run_forward(*dit, b.lat0, t, &b.caps, nullptr)));
  ASSERT_TRUE(dit->set_loras({}, LoraMethod::kMerge, false).ok());
  fails(b.lat0, *with_lora, "refine them again");
  auto base = dit->refine_captions(b.caps);
  ASSERT_TRUE(base.ok());
  EXPECT_TRUE(same_bits(to_host(base->tokens), to_host(refined->tokens)))
      << "the base model's tokens after the LoRA came off";
}

// Copies a streamed pass makes in a steady state, every block streamed (unit = block) through
// `slots` slots (unit u in slot u % slots): in each slot, each block of the pass that uses it,
// unless it is the slot's only one (it then stays). `skip_ctx`: the context refiner's blocks
// (after the noise refiner's) are not used.
uint64_t copies_a_pass(int n, int slots, int n_noise, int n_ctx, bool skip_ctx) {
  uint64_t copies = 0;
  for (int k = 0; k < slots; ++k) {
    uint64_t used = 0;
    for (int u = k; u < n; u += slots)
      if (!(skip_ctx && u >= n_noise && u < n_noise + n_ctx)) ++used;
    if (used >= 2) copies += used;
  }
  return copies;
}

// Every one of n blocks streamed through `slots` slots.
WeightPlacement all_streamed(int n, int slots) {
  WeightPlacement p;
  p.streamed.assign(static_cast<size_t>(n), true);
  p.slots = slots;
  return p;
}

// Streamed blocks (the low-VRAM placements): a forward on refined captions skips the context
// refiner's blocks, and the streamer copies only the blocks that run (none of its copies is spent
// on them), with the resident model's output bit for bit; forwards from captions copy every block.
TEST(RefinedCaptions, StreamedForwardsCopyOnlyTheBlocksThatRun) {
  const golden::Case c = load_case("v_turbo");
  auto resident = golden::load_dit(c);
  ASSERT_NE(resident, nullptr);
  const DitBatch b = dit_batch(c);
  const int n = resident->num_blocks(), n_noise = c.dit.n_refiner_layers,
            n_ctx = c.dit.n_refiner_layers;
  ASSERT_GE(n_ctx, 1);
  auto ref_tokens = resident->refine_captions(b.caps);
  ASSERT_TRUE(ref_tokens.ok()) << ref_tokens.status().to_string();
  auto ws = WeightStore::open(c.dir + "/model/transformer");
  ASSERT_TRUE(ws.ok()) << ws.status().to_string();
  // One slot (every block copied at every pass): the context refiner's blocks are the copies
  // saved.
  EXPECT_EQ(copies_a_pass(n, 1, n_noise, n_ctx, true) + n_ctx,
            copies_a_pass(n, 1, n_noise, n_ctx, false));
  for (const int slots : {1, 2, 3}) {
    auto dit = ZImageDiT::load(c.dit, *ws, cpu(), all_streamed(n, slots));
    ASSERT_TRUE(dit.ok()) << dit.status().to_string();
    ZImageDiT& m = **dit;
    const uint64_t at_load = m.streamed_loads();
    auto tokens = m.refine_captions(b.caps);
    ASSERT_TRUE(tokens.ok()) << tokens.status().to_string();
    // The refinement copies the context refiner's blocks only (none queued after them).
    EXPECT_EQ(m.streamed_loads() - at_load, static_cast<uint64_t>(n_ctx)) << "slots " << slots;
    EXPECT_TRUE(same_bits(to_host(tokens->tokens), to_host(ref_tokens->tokens)));
    for (int step = 0; step < 3; ++step) {
      const float t = 0.2f + 0.3f * static_cast<float>(step);
      const uint64_t before = m.streamed_loads(), late_before = m.streamed_late_loads();
      const Tensor got = run_forward(m, b.lat0, t, nullptr, &*tokens);
      const uint64_t loads = m.streamed_loads() - before;
      const uint64_t late = m.streamed_late_loads() - late_before;
      EXPECT_TRUE(same_bits(got, run_forward(*resident, b.lat0, t, nullptr, &*ref_tokens)))
          << "slots " << slots << ", step " << step;
      // The first forward after the refinement may copy again what the refinement's copies
      // displaced; from then on, exactly the blocks that run and share their slot.
      if (step > 0) {
        EXPECT_EQ(loads, copies_a_pass(n, slots, n_noise, n_ctx, true)) << "slots " << slots;
        EXPECT_EQ(late, 0u) << "slots " << slots << ": copies not queued ahead of their block";
      }
    }
    EXPECT_TRUE(run_forward(m, b.lat0, t_model_at(c.steps, 0), &b.caps, nullptr).defined());
    const uint64_t before = m.streamed_loads();
    const Tensor plain1 = run_forward(m, b.lat0, t_model_at(c.steps, 1), &b.caps, nullptr);
    EXPECT_EQ(m.streamed_loads() - before, copies_a_pass(n, slots, n_noise, n_ctx, false))
        << "slots " << slots;
    EXPECT_TRUE(same_bits(
        plain1, run_forward(*resident, b.lat0, t_model_at(c.steps, 1), &b.caps, nullptr)));
  }
}

// A sequence-parallel forward (which refines its captions itself) after a refined one on the same
// streamed model: the streamer's skip flags are cleared again, so every block is copied ahead of
// its use, exactly as a forward from captions does (stale flags leave the context refiner's
// blocks out of the copies queued ahead: the forward then waits for their copies at the block).
TEST(RefinedCaptions, ParallelForwardAfterARefinedOneCopiesEveryBlock) {
  const golden::Case c = load_case("v_turbo");
  auto resident = golden::load_dit(c);
  ASSERT_NE(resident, nullptr);
  const DitBatch b = dit_batch(c);
  const int n = resident->num_blocks(), n_noise = c.dit.n_refiner_layers,
            n_ctx = c.dit.n_refiner_layers;
  const float t = t_model_at(c.steps, 1);
  const Tensor ref = run_forward(*resident, b.lat0, t, &b.caps, nullptr);
  ASSERT_TRUE(ref.defined());
  const double scale = test::max_abs(ref);
  ASSERT_GT(scale, 0.1);  // the output is not trivially small
  auto ws = WeightStore::open(c.dir + "/model/transformer");
  ASSERT_TRUE(ws.ok()) << ws.status().to_string();
  constexpr int kRanks = 2, kSlots = 2;
  ASSERT_NE(copies_a_pass(n, kSlots, n_noise, n_ctx, true) + n_ctx,
            copies_a_pass(n, kSlots, n_noise, n_ctx, false));
  LocalCommGroup group(kRanks);
  std::vector<std::unique_ptr<Backend>> backends;
  for (int r = 0; r < kRanks; ++r) {
    backends.push_back(make_cpu_backend(1));
    group.attach(r, backends.back().get());
  }
  std::vector<Status> status(kRanks, Status::Ok());
  std::vector<uint64_t> loads(kRanks, 0), late(kRanks, 0);
  std::vector<Tensor> outs(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      auto run = [&]() -> Status {
        Backend& be = *backends[r];
        ZI_TRY(be.bind_thread());
        auto dit = ZImageDiT::load(c.dit, *ws, be, all_streamed(n, kSlots));
        if (!dit.ok()) {
          group.comm(r).abort(dit.status());
          return dit.status();
        }
        ZImageDiT& m = **dit;
        const std::vector<float> ts(static_cast<size_t>(b.lat0.dim(0)), t);
        Tensor out;
        Status st = [&]() -> Status {
          ZI_ASSIGN_OR_RETURN(ZImageDiT::RefinedCaptions tokens, m.refine_captions(b.caps));
          ZI_TRY(m.forward_refined(b.lat0, ts, tokens, out));  // sets the skip flags
          // A first parallel pass may copy again what the refined one displaced; the second one
          // is counted.
          ZI_TRY(m.forward_parallel(group.comm(r), b.lat0, ts, b.caps, out));
          const uint64_t before = m.streamed_loads(), late_before = m.streamed_late_loads();
          ZI_TRY(m.forward_parallel(group.comm(r), b.lat0, ts, b.caps, out));
          loads[r] = m.streamed_loads() - before;
          late[r] = m.streamed_late_loads() - late_before;
          return Status::Ok();
        }();
        if (!st.ok()) group.comm(r).abort(st);
        ZI_TRY(st);
        outs[r] = out;
        return Status::Ok();
      };
      status[r] = run();
    });
  }
  for (std::thread& th : threads) th.join();
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r].to_string();
    EXPECT_EQ(loads[r], copies_a_pass(n, kSlots, n_noise, n_ctx, false)) << "rank " << r;
    EXPECT_EQ(late[r], 0u) << "rank " << r << ": copies not queued ahead of their block";
    const double err = test::max_abs_diff(outs[r], ref);
    golden::report("DiT seqpar after a refined forward, rank " + std::to_string(r), err);
    EXPECT_LT(err, 2e-5 * std::max(1.0, scale)) << "rank " << r;
  }
}

// `req` run with the caption cache on or off: its f32 image; `refinements`: how many times the
// DiT's caption tokens were computed for it.
Tensor run_request(TextToImage& pipe, const GenerateRequest& req, bool once,
                   uint64_t& refinements) {
  pipe.set_refine_captions_once(once);
  const uint64_t n0 = pipe.transformer().caption_refinements();
  auto out = pipe.run(req, {});
  EXPECT_TRUE(out.ok()) << out.status().to_string();
  refinements = pipe.transformer().caption_refinements() - n0;
  return out.ok() ? out->image : Tensor();
}

// The pipeline with the cache on (the default) and off: the same image bits; one refinement per
// batch of captions (two where cfg_truncation drops the negatives part-way) against one per step.
class RefinedCaptionsPipeline : public ::testing::TestWithParam<std::string> {};

TEST_P(RefinedCaptionsPipeline, SameImageBitsWithOneRefinementPerBatchOfCaptions) {
  const test::GoldenCase c = test::read_golden_case(test::GoldenFamily::kTextToImage, GetParam());
  std::unique_ptr<Backend> be = make_cpu_backend(0);
  auto pipe = TextToImage::load(c.model, *be);
  ASSERT_TRUE(pipe.ok()) << pipe.status().to_string();
  uint64_t every_step = 0, once = 0;
  const Tensor plain = run_request(**pipe, c.req, false, every_step);
  const Tensor cached = run_request(**pipe, c.req, true, once);
  EXPECT_TRUE(same_bits(plain, cached)) << GetParam();
  EXPECT_EQ(every_step, static_cast<uint64_t>(c.req.steps));
  const bool truncated = c.req.guidance > 0.0f && c.req.cfg_truncation < 1.0f;
  EXPECT_EQ(once, truncated ? 2u : 1u) << GetParam();
}

// ZIMAGE_CAPTION_CACHE reaches every pipeline (TextToImage::create reads it: load and the
// benchmarks' own assembly); a bad value is an error naming it.
TEST(RefinedCaptions, EnvSwitchReachesEveryPipeline) {
  const test::GoldenCase c = test::read_golden_case(test::GoldenFamily::kTextToImage, "v_turbo");
  std::unique_ptr<Backend> be = make_cpu_backend(0);
  ASSERT_EQ(::setenv("ZIMAGE_CAPTION_CACHE", "0", 1), 0);
  auto pipe = TextToImage::load(c.model, *be);
  ASSERT_TRUE(pipe.ok()) << pipe.status().to_string();
  const uint64_t n0 = (*pipe)->transformer().caption_refinements();
  auto out = (*pipe)->run(c.req, {});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ((*pipe)->transformer().caption_refinements() - n0, static_cast<uint64_t>(c.req.steps))
      << "ZIMAGE_CAPTION_CACHE=0: every step refines its captions";
  ASSERT_EQ(::setenv("ZIMAGE_CAPTION_CACHE", "2", 1), 0);
  auto bad = TextToImage::load(c.model, *be);
  ::unsetenv("ZIMAGE_CAPTION_CACHE");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("ZIMAGE_CAPTION_CACHE"), std::string::npos)
      << bad.status().to_string();
}

// ZIMAGE_DIT_GRAPHS is read by TextToImage::create too (before session 32 only by load, so the
// benchmarks' pipelines ignored it); a bad value is an error naming it.
TEST(RefinedCaptions, GraphsEnvSwitchReachesEveryPipeline) {
  const test::GoldenCase c = test::read_golden_case(test::GoldenFamily::kTextToImage, "v_turbo");
  std::unique_ptr<Backend> be = make_cpu_backend(0);
  for (const char* v : {"0", "1"}) {
    ASSERT_EQ(::setenv("ZIMAGE_DIT_GRAPHS", v, 1), 0);
    auto pipe = TextToImage::load(c.model, *be);
    ::unsetenv("ZIMAGE_DIT_GRAPHS");
    ASSERT_TRUE(pipe.ok()) << pipe.status().to_string();
    EXPECT_EQ((*pipe)->transformer().use_graphs(), std::string(v) == "1") << v;
  }
  ASSERT_EQ(::setenv("ZIMAGE_DIT_GRAPHS", "yes", 1), 0);
  auto bad = TextToImage::load(c.model, *be);
  ::unsetenv("ZIMAGE_DIT_GRAPHS");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("ZIMAGE_DIT_GRAPHS"), std::string::npos)
      << bad.status().to_string();
}

INSTANTIATE_TEST_SUITE_P(, RefinedCaptionsPipeline,
                         ::testing::Values("v_turbo", "v_cfg", "v_cfg_trunc", "v_batch_cfg",
                                           "v_multi"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

// ControlNet requests: the ControlNet reads the DiT's refined caption tokens too, so the images
// are the same with the cache on and off, and the captions are refined once per request instead of
// twice a step (the ControlNet's and the DiT's). Both arms take ZImageDiT::refine_captions (the
// DiT's fused pre-norm path; before session 31 the ControlNet ran its own unfused copy of it):
// that the hints stay within diffusers' is GoldenControlNet.* (tests/parity/
// test_golden_controlnet.cpp).
class RefinedCaptionsControlNet : public ::testing::TestWithParam<std::string> {};

TEST_P(RefinedCaptionsControlNet, SameImageBitsWithOneRefinementPerRequest) {
  const test::GoldenCase c = test::read_golden_case(test::GoldenFamily::kControlNet, GetParam());
  std::unique_ptr<Backend> be = make_cpu_backend(0);
  auto pipe = TextToImage::load(test::controlnet_model_dir(), *be);
  ASSERT_TRUE(pipe.ok()) << pipe.status().to_string();
  const Status ld = (*pipe)->load_controlnet(c.dir + "/controlnet");
  ASSERT_TRUE(ld.ok()) << ld.to_string();
  uint64_t every_step = 0, once = 0;
  const Tensor plain = run_request(**pipe, c.req, false, every_step);
  const Tensor cached = run_request(**pipe, c.req, true, once);
  EXPECT_TRUE(same_bits(plain, cached)) << GetParam();
  const uint64_t steps = c.spec.at("timesteps").size();
  EXPECT_EQ(every_step, 2 * steps) << "the ControlNet's refinement and the DiT's, each step";
  EXPECT_EQ(once, 1u);
}

INSTANTIATE_TEST_SUITE_P(
    , RefinedCaptionsControlNet,
    ::testing::ValuesIn(test::golden_case_names(test::GoldenFamily::kControlNet)),
    [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(RefinedCaptionsControlNet);

}  // namespace
}  // namespace zimage

// Sequence-parallel DiT (ZImageDiT::forward_parallel, docs/PARALLEL.md) on the CPU oracle: P = 2,
// 3, 4 in-process ranks, each with its own CPU backend and its own copy of the tiny golden model
// (4 heads: 2+1+1 over 3 ranks), against the ordinary one-backend forward. Sequences that do not
// divide by P, a batch of two captions of different lengths (key-length masks), the largest
// error reported; a failing rank ends the forward on every rank.
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <thread>

#include "common/npy.h"
#include "common/seqpar_case.h"
#include "common/tiny_engine.h"
#include "parity/golden_models_util.h"
#include "zimage/zimage.h"

using namespace zimage;
using namespace zimage::test;

namespace {

struct Shape2 {
  int64_t h, w;
  std::vector<int64_t> caps;
};

// forward_parallel over p local ranks vs forward; returns the largest error over all ranks.
double parallel_error(const TransformerConfig& cfg, const std::string& dir, int p,
                      const DitInputs& in, const Tensor& ref) {
  std::vector<std::unique_ptr<Backend>> owned;
  std::vector<Backend*> be;
  std::vector<Communicator*> comms;
  LocalCommGroup g(p);
  for (int r = 0; r < p; ++r) {
    owned.push_back(make_cpu_backend(1));
    be.push_back(owned.back().get());
    g.attach(r, be.back());
    comms.push_back(&g.comm(r));
  }
  auto outs = dit_forward_ranks(cfg, dir, be, comms, in);
  EXPECT_TRUE(outs.ok()) << outs.status().to_string();
  if (!outs.ok()) return INFINITY;
  double err = 0;
  for (const Tensor& o : *outs) err = std::max(err, max_abs_diff(o, ref));
  return err;
}

}  // namespace

TEST(DitParallel, MatchesOneRankOnCpu) {
  const golden::Case c = golden::load_case("v_turbo");
  // 8x8 latents: 16 image tokens (+16 pads) + 32 caption tokens = 64 (not a multiple of 3);
  // 12x20: 60 image tokens -> 64, caption 40 -> 64, S = 128; a batch of captions 7 and 40 tokens.
  const std::vector<Shape2> shapes{{8, 8, {12}}, {12, 20, {40}}, {8, 12, {7, 40}}};
  for (size_t k = 0; k < shapes.size(); ++k) {
    const DitInputs in = random_dit_inputs(c.dit, shapes[k].h, shapes[k].w, shapes[k].caps,
                                           static_cast<uint32_t>(11 + k));
    auto ref = dit_forward_single(c.dit, c.dir + "/model/transformer", golden::cpu(), in);
    ASSERT_TRUE(ref.ok()) << ref.status().to_string();
    const double scale = max_abs(*ref);
    ASSERT_GT(scale, 0.1);  // the output is not trivially small
    for (int p : {2, 3, 4}) {
      const double err = parallel_error(c.dit, c.dir + "/model/transformer", p, in, *ref);
      golden::report("DiT seqpar P=" + std::to_string(p) + " " + std::to_string(shapes[k].h) + "x" +
                         std::to_string(shapes[k].w) +
                         " B=" + std::to_string(shapes[k].caps.size()),
                     err);
      EXPECT_LT(err, 2e-5 * std::max(1.0, scale)) << "P=" << p << " shape " << k;
    }
  }
}

TEST(DitParallel, MoreRanksThanHeads) {
  // 5 ranks, 4 heads: one rank attends over no head but still holds tokens.
  const golden::Case c = golden::load_case("v_turbo");
  const DitInputs in = random_dit_inputs(c.dit, 8, 8, {20}, 5);
  auto ref = dit_forward_single(c.dit, c.dir + "/model/transformer", golden::cpu(), in);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  const double err = parallel_error(c.dit, c.dir + "/model/transformer", 5, in, *ref);
  golden::report("DiT seqpar P=5 (4 heads)", err);
  EXPECT_LT(err, 2e-5 * std::max(1.0, max_abs(*ref)));
}

TEST(DitParallel, BadInputOnOneRankFailsEveryRank) {
  const golden::Case c = golden::load_case("v_turbo");
  DitInputs in = random_dit_inputs(c.dit, 8, 8, {12}, 3);
  std::vector<std::unique_ptr<Backend>> owned;
  std::vector<Backend*> be;
  LocalCommGroup g(2);
  for (int r = 0; r < 2; ++r) {
    owned.push_back(make_cpu_backend(1));
    be.push_back(owned.back().get());
    g.attach(r, be.back());
  }
  // Rank 1 gets a model folder that does not exist: it aborts, rank 0 must not wait for it.
  std::vector<Result<Tensor>> outs(2, Result<Tensor>(InternalError("not run")));
  std::thread t1([&] {
    auto o = dit_forward_ranks(c.dit, c.dir + "/model/no-such-folder", {be[1]}, {&g.comm(1)}, in);
    outs[1] = o.ok() ? Result<Tensor>((*o)[0]) : Result<Tensor>(o.status());
  });
  auto o0 = dit_forward_ranks(c.dit, c.dir + "/model/transformer", {be[0]}, {&g.comm(0)}, in);
  t1.join();
  ASSERT_FALSE(o0.ok());
  EXPECT_FALSE(outs[1].ok());
  EXPECT_EQ(o0.status().message(), outs[1].status().message());
  EXPECT_NE(o0.status().message().find("no-such-folder"), std::string::npos)
      << o0.status().to_string();
}

TEST(DitParallel, ThirtyHeadsOverFourRanks) {
  // Z-Image's 30 heads: 8, 8, 7, 7 over 4 ranks (and 10 each over 3, 15 over 2).
  const golden::Case c = golden::load_case("v_turbo");
  auto dir = heads30_model_dir(c.dir + "/model");
  ASSERT_TRUE(dir.ok()) << dir.status().to_string();
  auto cfg = transformer_config(*dir);
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  ASSERT_EQ(cfg->n_heads, 30);
  const DitInputs in = random_dit_inputs(*cfg, 12, 20, {40}, 9);
  auto ref = dit_forward_single(*cfg, *dir + "/transformer", golden::cpu(), in);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  const double scale = max_abs(*ref);
  ASSERT_GT(scale, 0.1);
  for (int p : {2, 3, 4}) {
    const double err = parallel_error(*cfg, *dir + "/transformer", p, in, *ref);
    golden::report("DiT seqpar 30 heads P=" + std::to_string(p), err);
    EXPECT_LT(err, 2e-5 * std::max(1.0, scale)) << "P=" << p;
  }
}

namespace {

// One request through an engine on the tiny model: its images, or empty with a test failure.
std::vector<Image> generate_tiny(const std::vector<std::string>& sp_devices, int threads,
                                 const GenerateRequest& req) {
  EngineOptions eo;
  eo.model_dir = tiny_model_dir();
  eo.device = "cpu";
  eo.threads = threads;
  eo.sequence_parallel_devices = sp_devices;
  auto engine = Engine::load(eo);
  EXPECT_TRUE(engine.ok()) << engine.status().to_string();
  if (!engine.ok()) return {};
  auto r = (*engine)->generate(req);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? r->images : std::vector<Image>{};
}

int max_pixel_diff(const std::vector<Image>& a, const std::vector<Image>& b) {
  if (a.size() != b.size() || a.empty()) return 256;
  int m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].rgb.size() != b[i].rgb.size()) return 256;
    for (size_t k = 0; k < a[i].rgb.size(); ++k)
      m = std::max(m, std::abs(static_cast<int>(a[i].rgb[k]) - static_cast<int>(b[i].rgb[k])));
  }
  return m;
}

}  // namespace

TEST(DitParallel, GenerateMatchesOneDevice) {
  // CFG: the positive and negative captions (different lengths) run as one ragged batch of 2.
  GenerateRequest req;
  req.prompts = {"a red fox in the snow, evening light"};
  req.negative_prompt = "blurry";
  req.guidance = 2.0f;
  req.width = 64;
  req.height = 96;  // 8x12 latents: 24 image tokens, not a multiple of the rank counts
  req.steps = 3;
  req.seed = 42;
  const std::vector<Image> ref = generate_tiny({}, 2, req);
  ASSERT_FALSE(ref.empty());
  for (const std::vector<std::string>& devs :
       {std::vector<std::string>{"cpu", "cpu"}, std::vector<std::string>{"cpu", "cpu", "cpu"}}) {
    const std::vector<Image> got = generate_tiny(devs, 1, req);
    const int diff = max_pixel_diff(ref, got);
    golden::report("generate seqpar P=" + std::to_string(devs.size()) + " (levels of 255)", diff);
    EXPECT_LE(diff, 1) << devs.size() << " ranks";
  }
}

TEST(DitParallel, EngineRejectsMixedDevices) {
  EngineOptions eo;
  eo.model_dir = tiny_model_dir();
  eo.sequence_parallel_devices = {"cpu", "cuda:0"};
  auto engine = Engine::load(eo);
  ASSERT_FALSE(engine.ok());
  // Without CUDA the second device fails to open; with CUDA it differs in kind from the first.
  EXPECT_NE(engine.status().message().find("sequence_parallel_devices"), std::string::npos)
      << engine.status().to_string();
}

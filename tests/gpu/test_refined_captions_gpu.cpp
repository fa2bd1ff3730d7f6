// Caption tokens refined once (ZImageDiT::refine_captions, forward_refined) on the GPU, on the
// path that ships: the recorded forward on refined tokens equals the recorded forward that
// computes them (and the eager one) bit for bit at two timesteps and a ragged batch of two
// captions, in bf16 and with every linear and the attention in FP8 (`all,sdpa`); the profiler
// counts one attention call fewer per context refiner block in a refined forward.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "gpu/cuda_test_util.h"
#include "gpu/dit_test_util.h"
#include "model/common/linear.h"
#include "model/dit/zimage_dit.h"

namespace zimage {
namespace {

using namespace test;

struct Inputs {
  Tensor lat;                // [2, 16, 32, 32] f32 on the GPU
  std::vector<Tensor> caps;  // 20 and 45 tokens: ragged (pads 32 and 64)
};

Tensor run(ZImageDiT& dit, Backend& be, const Inputs& in, float t,
           const ZImageDiT::RefinedCaptions* refined) {
  Tensor out;
  const std::vector<float> ts(2, t);
  const Status st = refined != nullptr ? dit.forward_refined(in.lat, ts, *refined, out)
                                       : dit.forward(in.lat, ts, in.caps, out);
  EXPECT_TRUE(st.ok()) << st.to_string();
  if (!st.ok()) return Tensor();
  Tensor h = Tensor::host(DType::kF32, out.shape());
  EXPECT_TRUE(be.download(out, h).ok());
  return h;
}

void check(unsigned fp8_layers, const char* what) {
  cuda::CudaBackend* g = gpu(DType::kBF16);
  TransformerConfig cfg;
  const std::string dir = write_wide_dit(cfg, "zimage_refined_captions_dit");
  auto ws = WeightStore::open(dir);
  ASSERT_TRUE(ws.ok()) << ws.status().to_string();
  WeightPlacement p;
  p.fp8_compute = fp8_layers;
  auto dit = ZImageDiT::load(cfg, *ws, *g, p);
  if (!dit.ok() && dit.status().code() == ErrorCode::kUnsupported)
    GTEST_SKIP() << what << ": " << dit.status().message();
  ASSERT_TRUE(dit.ok()) << dit.status().to_string();
  if ((fp8_layers & kFp8Sdpa) != 0 && !g->fp8_attention_support().ok())
    GTEST_SKIP() << g->fp8_attention_support().message();
  Inputs in;
  in.lat = take(g->upload(rand_host({2, 16, 32, 32}, 71, DType::kF32), DType::kF32), "latents");
  in.caps = {take(g->upload(rand_host({20, cfg.cap_feat_dim}, 72, DType::kBF16), DType::kBF16),
                  "caption 0"),
             take(g->upload(rand_host({45, cfg.cap_feat_dim}, 73, DType::kBF16), DType::kBF16),
                  "caption 1")};
  ZImageDiT& m = **dit;
  auto refined = m.refine_captions(in.caps);
  ASSERT_TRUE(refined.ok()) << refined.status().to_string();
  for (const float t : {0.1f, 0.7f}) {
    // Recorded at the first t, replayed at the second; then the eager forwards.
    const Tensor rec_refined = run(m, *g, in, t, &*refined);
    const Tensor rec_plain = run(m, *g, in, t, nullptr);
    m.set_use_graphs(false);
    std::map<std::string, int64_t> calls_refined, calls_plain;
    Tensor eager_refined, eager_plain;
    calls_refined = calls_by_op(*g, [&] { eager_refined = run(m, *g, in, t, &*refined); });
    calls_plain = calls_by_op(*g, [&] { eager_plain = run(m, *g, in, t, nullptr); });
    m.set_use_graphs(true);
    ASSERT_TRUE(rec_refined.defined() && rec_plain.defined() && eager_refined.defined() &&
                eager_plain.defined());
    EXPECT_EQ(values(rec_refined), values(rec_plain)) << what << ", t " << t << ": recorded";
    EXPECT_EQ(values(eager_refined), values(rec_plain)) << what << ", t " << t << ": eager";
    EXPECT_EQ(values(eager_plain), values(rec_plain)) << what << ", t " << t;
    // One context refiner block (write_wide_dit): one attention call fewer (whichever attention
    // op this GPU runs).
    auto attention_calls = [](const std::map<std::string, int64_t>& calls) {
      int64_t n = 0;
      for (const auto& [op, k] : calls)
        if (op.rfind("attention", 0) == 0) n += k;
      return n;
    };
    EXPECT_EQ(attention_calls(calls_plain), attention_calls(calls_refined) + 1) << what;
    EXPECT_EQ(attention_calls(calls_refined), 3) << what << ": one noise refiner, two layers";
  }
  dit->reset();
  std::filesystem::remove_all(dir);
}

TEST(RefinedCaptionsGpu, RecordedForwardOnRefinedTokensIsForwardBf16) {
  ZI_REQUIRE_GPU();
  check(0, "bf16");
}

TEST(RefinedCaptionsGpu, RecordedForwardOnRefinedTokensIsForwardFp8) {
  ZI_REQUIRE_GPU();
  check(kFp8Default | kFp8Sdpa, "fp8 all,sdpa");
}

}  // namespace
}  // namespace zimage

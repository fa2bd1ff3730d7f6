// Quantised weights kept quantised on the device (model/common/quantized_linear.h) against the same
// files widened at load (PipelineLoadOptions::keep_quantized = false), on the CPU oracle: FP8 casts
// (e4m3, e5m2), ComfyUI's scaled FP8 (per tensor, per row), the fp8_mixed text encoder, and the
// GGUF DiT and text encoder (tools/make_gguf_cases.py: Q8_0, Q4_K, Q6_K, Q5_0, Q5_1, Q4_0, Q4_1).
// The kept path dequantises each weight right before its GEMM with the same float32 arithmetic
// the loader uses at load (W = float32(q) * scale; the gguf_quants oracle), so the outputs must
// be identical, not merely close; the kept weights must also be what the loader reports and take
// fewer bytes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "common/golden_harness.h"
#include "common/npy.h"
#include "common/single_files.h"
#include "golden_models_util.h"
#include "io/model/model_source.h"
#include "model/dit/zimage_dit.h"
#include "model/text_encoder/qwen3_encoder.h"
#include "pipeline/text_to_image.h"

namespace zimage {
namespace {

namespace fs = std::filesystem;

std::string model_dir() {
  return test::golden_dir("v_turbo") + "/model";
}

struct Run {
  std::map<std::string, Tensor> dumps;
  Tensor image;
};

Result<Run> run(const ModelPaths& paths, bool keep, uint64_t budget = 0) {
  std::unique_ptr<Backend> be = make_cpu_backend(2);
  PipelineLoadOptions o;
  o.keep_quantized = keep;
  o.vram_budget = budget;
  ZI_ASSIGN_OR_RETURN(auto pipe, TextToImage::load(paths, *be, o));
  test::CaptureSink sink({"dit_out.", "prompt_embeds."});
  TextToImageHooks hooks;
  hooks.debug = &sink;
  ZI_ASSIGN_OR_RETURN(TextToImageOutput out, pipe->run(test::turbo_request(), hooks));
  return Run{sink.all(), out.image};
}

class KeptQuantized : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = (fs::temp_directory_path() / ("zimage_kept_quant_" + std::to_string(getpid()))).string();
    auto files = test::write_single_file_cases(model_dir(), dir_);
    ASSERT_TRUE(files.ok()) << files.status().to_string();
    files_ = *files;
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  static std::string file(const std::string& name) {
    if (name == "dit_gguf") return std::string(ZIMAGE_GGUF_DIR) + "/models/dit.gguf";
    if (name == "te_gguf") return std::string(ZIMAGE_GGUF_DIR) + "/models/te.gguf";
    return files_.at(name);
  }
  static ModelPaths paths_for(const std::string& dit, const std::string& te) {
    ModelPaths p;
    p.model_dir = model_dir();
    if (!dit.empty()) p.transformer_file = file(dit);
    if (!te.empty()) p.text_encoder_file = file(te);
    return p;
  }
  static std::string dir_;
  static std::map<std::string, std::string> files_;
};
std::string KeptQuantized::dir_;
std::map<std::string, std::string> KeptQuantized::files_;

struct Case {
  const char* dit;
  const char* te;
  const char* kind;  // what the kept weights are
};

const Case kCases[] = {
    {"dit_fp8_e4m3", "", "f8_e4m3"},      {"dit_fp8_e5m2", "", "f8_e5m2"},
    {"dit_scaled", "", "f8_e4m3"},        {"dit_scaled_rows", "", "f8_e4m3"},
    {"dit_scaled_legacy", "", "f8_e4m3"}, {"", "te_fp8_mixed", "f8_e4m3"},
    {"dit_gguf", "te_gguf", ""},
};

// The kept and widened loads give identical outputs, step by step, and the same image.
TEST_F(KeptQuantized, SameOutputAsWidenedAtLoad) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(std::string(c.dit) + c.te);
    const ModelPaths p = paths_for(c.dit, c.te);
    auto kept = run(p, true);
    auto wide = run(p, false);
    ASSERT_TRUE(kept.ok()) << kept.status().to_string();
    ASSERT_TRUE(wide.ok()) << wide.status().to_string();
    ASSERT_EQ(kept->dumps.size(), wide->dumps.size());
    double worst = 0;
    for (const auto& [name, t] : wide->dumps) {
      ASSERT_TRUE(kept->dumps.count(name)) << name;
      worst = std::max(worst, test::max_abs_diff(kept->dumps.at(name), t));
    }
    const double img = test::max_abs_diff(kept->image, wide->image);
    std::printf("  kept vs widened %-16s %-13s: max|diff| dumps %.3g, image %.3g\n", c.dit, c.te,
                worst, img);
    EXPECT_EQ(worst, 0.0);
    EXPECT_EQ(img, 0.0);
  }
}

// The loaders really keep the weights quantised (else the test above compares a path with
// itself): every block linear of the DiT / text-encoder layer, of the expected kind, in fewer
// bytes; the planner's per-block size is the stored one.
TEST_F(KeptQuantized, LoadersKeepTheStoredForm) {
  std::unique_ptr<Backend> be = make_cpu_backend(2);
  for (const Case& c : kCases) {
    SCOPED_TRACE(std::string(c.dit) + c.te);
    auto src = ModelSource::open(paths_for(c.dit, c.te));
    ASSERT_TRUE(src.ok()) << src.status().to_string();
    const ZImageConfigs& cfg = src->configs();
    KeptQuantStats stats;
    WeightPlacement keep;
    if (*c.dit) {
      auto ws = src->open_weights(Component::kTransformer);
      ASSERT_TRUE(ws.ok());
      auto dit = ZImageDiT::load(cfg.transformer, *ws, *be, keep);
      ASSERT_TRUE(dit.ok()) << dit.status().to_string();
      stats = (*dit)->kept_quantized();
      EXPECT_EQ(stats.kept + stats.widened, 4 * (*dit)->num_blocks());
      const int64_t stored =
          ZImageDiT::stored_block_weight_bytes(cfg.transformer, *ws, be->act_dtype(), keep);
      const int64_t wide = ZImageDiT::block_weight_bytes(cfg.transformer, be->act_dtype(), false);
      std::printf("  %-16s DiT: %s; planner block bytes %lld (widened %lld)\n", c.dit,
                  stats.describe().c_str(), static_cast<long long>(stored),
                  static_cast<long long>(wide));
      EXPECT_LT(stored, wide);
    } else {
      auto ws = src->open_weights(Component::kTextEncoder);
      ASSERT_TRUE(ws.ok());
      auto te = Qwen3Encoder::load(cfg.text_encoder, *ws, *be, keep);
      ASSERT_TRUE(te.ok()) << te.status().to_string();
      stats = (*te)->kept_quantized();
      const int64_t stored =
          Qwen3Encoder::stored_layer_weight_bytes(cfg.text_encoder, *ws, be->act_dtype(), keep);
      const int64_t wide =
          Qwen3Encoder::layer_weight_bytes(cfg.text_encoder, be->act_dtype(), false);
      std::printf("  %-16s text encoder: %s; planner layer bytes %lld (widened %lld)\n", c.te,
                  stats.describe().c_str(), static_cast<long long>(stored),
                  static_cast<long long>(wide));
      EXPECT_LT(stored, wide);
    }
    EXPECT_GT(stats.kept, 0);
    EXPECT_LT(stats.kept_bytes, stats.kept_wide_bytes);
    if (*c.kind) {
      EXPECT_EQ(stats.kinds.size(), 1u);
      EXPECT_EQ(stats.kinds.count(c.kind), 1u);
    }
  }
}

// With every DiT block and text-encoder layer streamed from host memory, the kept weights (FP8
// bytes + scales, packed blocks) stream as they are and the outputs are unchanged.
TEST_F(KeptQuantized, StreamedKeptWeightsGiveTheSameOutput) {
  const golden::Case gc = golden::load_case("v_turbo");
  const Tensor lat = golden::to_device(golden::npy(gc.dir + "/init_noise.npy"));
  const std::vector<Tensor> caps{golden::to_device(golden::npy(gc.dir + "/prompt_embeds_0.npy"))};
  Backend& be = golden::cpu();
  for (const std::string dit_file : {"dit_fp8_e5m2", "dit_gguf"}) {
    SCOPED_TRACE(dit_file);
    auto src = ModelSource::open(paths_for(dit_file, ""));
    ASSERT_TRUE(src.ok()) << src.status().to_string();
    const TransformerConfig& tc = src->configs().transformer;
    auto ws = src->open_weights(Component::kTransformer);
    ASSERT_TRUE(ws.ok());
    WeightPlacement resident, streamed;
    streamed.streamed.assign(2 * tc.n_refiner_layers + tc.n_layers, true);
    auto a = ZImageDiT::load(tc, *ws, be, resident);
    auto b = ZImageDiT::load(tc, *ws, be, streamed);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_GT((*b)->kept_quantized().kept, 0);
    EXPECT_GT((*b)->streamed_bytes_per_forward(), 0u);
    Tensor ya, yb;
    ASSERT_TRUE((*a)->forward(lat, {0.5f}, caps, ya).ok());
    ASSERT_TRUE((*b)->forward(lat, {0.5f}, caps, yb).ok());
    const double err = test::max_abs_diff(golden::to_host(ya), golden::to_host(yb));
    std::printf("  %s streamed vs resident DiT: max|diff| %.3g\n", dit_file.c_str(), err);
    EXPECT_EQ(err, 0.0);
  }
  {
    auto src = ModelSource::open(paths_for("", "te_gguf"));
    ASSERT_TRUE(src.ok()) << src.status().to_string();
    const TextEncoderConfig& ec = src->configs().text_encoder;
    auto ws = src->open_weights(Component::kTextEncoder);
    ASSERT_TRUE(ws.ok());
    WeightPlacement resident, streamed;
    streamed.streamed.assign(ec.num_hidden_layers - 1, true);
    streamed.first_slot = 2;
    auto a = Qwen3Encoder::load(ec, *ws, be, resident);
    auto b = Qwen3Encoder::load(ec, *ws, be, streamed);
    ASSERT_TRUE(a.ok() && b.ok());
    auto ea = (*a)->encode(gc.ids);
    auto eb = (*b)->encode(gc.ids);
    ASSERT_TRUE(ea.ok() && eb.ok());
    const double err = test::max_abs_diff(golden::to_host((*ea)[0]), golden::to_host((*eb)[0]));
    std::printf("  te_gguf streamed vs resident text encoder: max|diff| %.3g\n", err);
    EXPECT_EQ(err, 0.0);
  }
}

}  // namespace
}  // namespace zimage

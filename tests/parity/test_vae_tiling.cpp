// The tiled VAE decode (model/vae/vae_tiling.h) against diffusers' AutoencoderKL with
// enable_tiling() (tests/data/vae_tiling, made by tools/make_vae_tiling_goldens.py: tiny random
// VAEs whose sample_size makes 2 x 3 tiles), the policy (--vae-tiling auto|on|off) through the
// pipeline, the engine option and the CLI flag, and the untiled decode's memory estimate.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "backend/backend.h"
#include "backend/check/check_backend.h"
#include "common/cli_run.h"
#include "common/npy.h"
#include "io/model/model_folder.h"
#include "io/writers/random_model.h"
#include "io/weights/weights.h"
#include "model/vae/vae.h"
#include "model/vae/vae_tiling.h"
#include "pipeline/memory_plan.h"
#include "pipeline/text_to_image.h"
#include "zimage/zimage.h"

namespace zimage {
namespace {

namespace fs = std::filesystem;

// Our CPU decode against diffusers' (fp32 both): the untiled golden VAE tests measure ~1.6e-6.
constexpr double kTol = 5e-6;

Backend& cpu() {
  static std::unique_ptr<Backend> be = make_cpu_backend(2);
  return *be;
}

std::string case_dir(const std::string& name) {
  return std::string(ZIMAGE_TEST_DATA_DIR) + "/vae_tiling/" + name;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << "cannot open " << path;
  return nlohmann::json::parse(f, nullptr, false);
}

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

Tensor npy(const std::string& path) {
  auto t = test::load_npy(path);
  EXPECT_TRUE(t.ok()) << path << ": " << t.status().to_string();
  return t.ok() ? *t : Tensor();
}

// One golden case's decoder on `be`.
std::unique_ptr<VaeDecoder> load_vae(const std::string& name, Backend& be = cpu()) {
  const std::string file = case_dir(name) + "/vae/config.json";
  auto cfg = parse_vae_config(read_text(file), file);
  EXPECT_TRUE(cfg.ok()) << cfg.status().to_string();
  if (!cfg.ok()) return nullptr;
  auto ws = WeightStore::open(case_dir(name) + "/vae");
  EXPECT_TRUE(ws.ok()) << ws.status().to_string();
  if (!ws.ok()) return nullptr;
  auto vae = VaeDecoder::load(*cfg, *ws, be);
  EXPECT_TRUE(vae.ok()) << vae.status().to_string();
  return vae.ok() ? std::move(vae).value() : nullptr;
}

Tensor on_cpu(const Tensor& host) {
  auto t = cpu().upload(host, DType::kF32);
  EXPECT_TRUE(t.ok());
  return t.ok() ? *t : Tensor();
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

void report(const std::string& what, double err) {
  std::printf("[ parity ] %-44s max |diff| = %.3e\n", what.c_str(), err);
  ::testing::Test::RecordProperty(what, std::to_string(err));
}

class VaeTilingGolden : public ::testing::TestWithParam<std::string> {};

// Our geometry is diffusers' (the attributes the golden script recorded from the model).
TEST_P(VaeTilingGolden, GeometryMatchesDiffusers) {
  auto vae = load_vae(GetParam());
  ASSERT_NE(vae, nullptr);
  const nlohmann::json c = read_json(case_dir(GetParam()) + "/case.json");
  const VaeTileGeometry g = vae_tile_geometry(vae->config());
  EXPECT_EQ(g.factor, c["factor"].get<int64_t>());
  EXPECT_EQ(g.sample, c["tile_sample_min_size"].get<int64_t>());
  EXPECT_EQ(g.latent, c["tile_latent_min_size"].get<int64_t>());
  EXPECT_EQ(g.stride, c["overlap_size"].get<int64_t>());
  EXPECT_EQ(g.blend, c["blend_extent"].get<int64_t>());
  EXPECT_EQ(g.row_limit, c["row_limit"].get<int64_t>());
  EXPECT_TRUE(vae_tiling_applies(g, c["h"].get<int64_t>(), c["w"].get<int64_t>()));
  EXPECT_TRUE(check_vae_tiling(g, c["h"].get<int64_t>(), c["w"].get<int64_t>()).ok());
}

// The tiled decode is diffusers' tiled decode; the untiled one is diffusers' untiled one; and
// the two differ (tiling really happened, in both goldens and here).
TEST_P(VaeTilingGolden, TiledDecodeMatchesDiffusers) {
  const std::string name = GetParam();
  auto vae = load_vae(name);
  ASSERT_NE(vae, nullptr);
  const Tensor lat = on_cpu(npy(case_dir(name) + "/latents.npy"));
  const Tensor ref_tiled = npy(case_dir(name) + "/image_tiled.npy");
  const Tensor ref_untiled = npy(case_dir(name) + "/image_untiled.npy");
  auto tiled = vae_decode_tiled(*vae, lat);
  ASSERT_TRUE(tiled.ok()) << tiled.status().to_string();
  ASSERT_EQ(tiled->shape(), ref_tiled.shape());
  const double err_tiled = test::max_abs_diff(*tiled, ref_tiled);
  report(name + " tiled vs diffusers tiled", err_tiled);
  EXPECT_LE(err_tiled, kTol);

  auto untiled = vae->decode(lat);
  ASSERT_TRUE(untiled.ok()) << untiled.status().to_string();
  const double err_untiled = test::max_abs_diff(*untiled, ref_untiled);
  report(name + " untiled vs diffusers untiled", err_untiled);
  EXPECT_LE(err_untiled, kTol);

  const double tiling_effect = test::max_abs_diff(ref_tiled, ref_untiled);
  const double ours_effect = test::max_abs_diff(*tiled, *untiled);
  report(name + " diffusers tiled vs untiled", tiling_effect);
  EXPECT_GT(tiling_effect, 1e-2) << "the golden case does not exercise tiling";
  EXPECT_GT(ours_effect, 1e-2);
  // Away from the blended seams the tiles see a cropped latent, so the whole image changes a
  // little; our tiled output must be diffusers' tiled one, not a mix of the two.
  EXPECT_LT(err_tiled * 1000, tiling_effect);
}

// The policy: "off" is the existing untiled decode bit for bit; "on" is the tiled decode bit for
// bit; "auto" tiles exactly when the estimate exceeds the budget, and never on the CPU when no
// budget is given.
TEST_P(VaeTilingGolden, PolicyPicksThePath) {
  const std::string name = GetParam();
  auto vae = load_vae(name);
  ASSERT_NE(vae, nullptr);
  const Tensor lat = on_cpu(npy(case_dir(name) + "/latents.npy"));
  auto untiled = vae->decode(lat);
  auto tiled = vae_decode_tiled(*vae, lat);
  ASSERT_TRUE(untiled.ok() && tiled.ok());
  const int64_t b = lat.dim(0), h = lat.dim(2), w = lat.dim(3);
  const uint64_t need = vae->estimate_decode_bytes(b, h, w);
  ASSERT_GT(need, 0u);
  struct Want {
    VaeTilingPolicy policy;
    bool tiles;
  };
  const Want wants[] = {
      {{VaeTiling::kOff, 0}, false},
      {{VaeTiling::kOff, 1}, false},
      {{VaeTiling::kOn, 0}, true},
      {{VaeTiling::kAuto, 0}, false},        // CPU: no device budget, never tiles
      {{VaeTiling::kAuto, need}, false},     // fits exactly
      {{VaeTiling::kAuto, need - 1}, true},  // one byte short
      {{VaeTiling::kAuto, uint64_t{1}}, true},
  };
  for (const Want& want : wants) {
    const std::string what = std::string(vae_tiling_name(want.policy.mode)) + " budget " +
                             std::to_string(want.policy.budget_bytes);
    std::string reason;
    EXPECT_EQ(vae_should_tile(*vae, want.policy, b, h, w, &reason), want.tiles) << what;
    EXPECT_FALSE(reason.empty()) << what;
    auto img = vae_decode_with_policy(*vae, lat, want.policy);
    ASSERT_TRUE(img.ok()) << what << ": " << img.status().to_string();
    EXPECT_TRUE(same_bits(*img, want.tiles ? *tiled : *untiled)) << what << " (" << reason << ")";
  }
}

INSTANTIATE_TEST_SUITE_P(, VaeTilingGolden, ::testing::Values("tile_f4", "tile_f8"));

// diffusers tiles only a latent larger than one tile: smaller ones decode untiled even with
// tiling on, and vae_decode_tiled refuses them.
TEST(VaeTiling, LatentWithinOneTileIsNotTiled) {
  auto vae = load_vae("tile_f4");  // tiles of 8 latent pixels
  ASSERT_NE(vae, nullptr);
  const Tensor full = npy(case_dir("tile_f4") + "/latents.npy");  // [2, 16, 12, 13]
  Tensor small = Tensor::host(DType::kF32, {1, 16, 8, 8});
  for (int64_t c = 0; c < 16; ++c)
    for (int64_t y = 0; y < 8; ++y)
      std::memcpy(small.data_as<float>() + (c * 8 + y) * 8,
                  full.data_as<const float>() + (c * 12 + y) * 13, 8 * sizeof(float));
  const Tensor lat = on_cpu(small);
  auto untiled = vae->decode(lat);
  auto on = vae_decode_with_policy(*vae, lat, {VaeTiling::kOn, 0});
  ASSERT_TRUE(untiled.ok() && on.ok());
  EXPECT_TRUE(same_bits(*untiled, *on));
  EXPECT_FALSE(vae_should_tile(*vae, {VaeTiling::kAuto, 1}, 1, 8, 8));
  auto refused = vae_decode_tiled(*vae, lat);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("fits one tile of 8"), std::string::npos)
      << refused.status().message();
}

// Z-Image's VAE (sample_size 1024, factor 8): 1024-pixel tiles every 768 pixels with a 256-pixel
// blend, so 1024² decodes untiled even with tiling on, 2048² and 1536x2560 in 3 x 3 / 2 x 4 tiles.
TEST(VaeTiling, ZImageGeometry) {
  const VaeTileGeometry g = vae_tile_geometry(zimage_turbo_reference_configs().vae);
  EXPECT_EQ(g.factor, 8);
  EXPECT_EQ(g.sample, 1024);
  EXPECT_EQ(g.latent, 128);
  EXPECT_EQ(g.stride, 96);
  EXPECT_EQ(g.blend, 256);
  EXPECT_EQ(g.row_limit, 768);
  EXPECT_FALSE(vae_tiling_applies(g, 128, 128));
  EXPECT_TRUE(vae_tiling_applies(g, 128, 129));
  for (auto [h, w] :
       {std::pair{256, 256}, std::pair{192, 320}, std::pair{512, 64}, std::pair{130, 200}}) {
    EXPECT_TRUE(check_vae_tiling(g, h, w).ok()) << h << "x" << w;
  }
}

// sample_size values diffusers cannot tile with: no step between tiles, or tiles whose kept
// parts do not add up to the image (diffusers would return an image of another size).
TEST(VaeTiling, UnusableSampleSizesAreRefused) {
  VaeConfig cfg = zimage_turbo_reference_configs().vae;  // factor 8
  cfg.sample_size = 8;                                   // 1-latent tiles, step int(0.75) = 0
  Status st = check_vae_tiling(vae_tile_geometry(cfg), 200, 200);
  EXPECT_EQ(st.code(), ErrorCode::kUnsupported);
  EXPECT_NE(st.message().find("sample_size 8"), std::string::npos) << st.message();
  cfg.sample_size = 40;  // 5-latent tiles every 3 (24 px) but 30 px kept of each
  st = check_vae_tiling(vae_tile_geometry(cfg), 20, 20);
  EXPECT_EQ(st.code(), ErrorCode::kUnsupported);
  EXPECT_NE(st.message().find("multiple of 32"), std::string::npos) << st.message();
  cfg.sample_size = 96;  // a multiple of 4 x 8: fine
  EXPECT_TRUE(check_vae_tiling(vae_tile_geometry(cfg), 20, 37).ok());
}

TEST(VaeTiling, ParseMode) {
  EXPECT_EQ(*parse_vae_tiling("auto"), VaeTiling::kAuto);
  EXPECT_EQ(*parse_vae_tiling("on"), VaeTiling::kOn);
  EXPECT_EQ(*parse_vae_tiling("off"), VaeTiling::kOff);
  auto bad = parse_vae_tiling("yes", "--vae-tiling");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "--vae-tiling: 'yes' is not one of auto, on, off");
}

// sample_size in config.json: an int, a list (diffusers uses its first entry), absent (the
// AutoencoderKL default 32), or bad.
TEST(VaeTiling, SampleSizeConfig) {
  const std::string base =
      R"({"_class_name": "AutoencoderKL", "in_channels": 3, "out_channels": 3,
          "latent_channels": 16, "block_out_channels": [32, 32], "layers_per_block": 1)";
  auto parse = [&](const std::string& extra) {
    return parse_vae_config(base + extra + "}", "vae/config.json");
  };
  EXPECT_EQ(parse("")->sample_size, 32);
  EXPECT_EQ(parse(R"(, "sample_size": 1024)")->sample_size, 1024);
  EXPECT_EQ(parse(R"(, "sample_size": [512, 768])")->sample_size, 512);
  for (const char* bad : {R"(, "sample_size": 0)", R"(, "sample_size": "big")",
                          R"(, "sample_size": [])", R"(, "sample_size": [0])"}) {
    auto r = parse(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("sample_size"), std::string::npos) << r.status().message();
  }
}

// The full-size decoder bound to the check-only backend (shapes, no memory; f32): the estimate
// follows the allocations of the decode. Z-Image's peak is the first resnet of the last stage at
// full resolution (256 -> 128 channels, with a shortcut): its input (256), then conv1's output
// and conv2's output and the shortcut's (3 x 128) = 640 channels of H x W in the act dtype.
// The upsampler before it holds 256 channels at H/2 x W/2 plus twice 256 at H x W = 576 channels.
TEST(VaeTiling, EstimateFollowsTheLargestStage) {
  const VaeConfig cfg = zimage_turbo_reference_configs().vae;
  WeightStore ws = WeightStore::empty("random vae");
  for (const TensorSpec& s : vae_tensor_specs(cfg)) {
    if (s.name.rfind("decoder.", 0) != 0) continue;
    ComputedWeight w;
    w.info = {DType::kF32, s.shape, "random vae"};
    w.stored_bytes = 4;
    const Shape shape = s.shape;
    w.make = [shape]() -> Result<Tensor> {
      Tensor t = Tensor::host(DType::kF32, shape);
      std::memset(t.data(), 0, t.nbytes());
      return t;
    };
    ASSERT_TRUE(ws.add_computed(s.name, std::move(w)).ok()) << s.name;
  }
  std::unique_ptr<Backend> be = make_check_backend();
  auto vae = VaeDecoder::load(cfg, ws, *be);
  ASSERT_TRUE(vae.ok()) << vae.status().to_string();
  const uint64_t f32 = 4, ch = 640;  // bytes per element; channels at the peak
  EXPECT_EQ((*vae)->estimate_decode_bytes(1, 256, 256), ch * 2048 * 2048 * f32);  // 10 GiB
  EXPECT_EQ((*vae)->estimate_decode_bytes(1, 192, 320), ch * 1536 * 2560 * f32);
  EXPECT_EQ((*vae)->estimate_decode_bytes(2, 128, 128), 2 * ch * 1024 * 1024 * f32);
  // One 1024² tile: what a tiled decode of any size needs per batch item.
  EXPECT_EQ((*vae)->estimate_decode_bytes(1, 128, 128), ch * 1024 * 1024 * f32);  // 2.5 GiB
  EXPECT_EQ((*vae)->estimate_decode_bytes(0, 128, 128), 0u);
}

// The memory planner's VAE inputs are this estimate: the untiled decode of the planned size, and
// one 1024² tile of one image where tiling applies (at 1024² it does not: no saving).
TEST(VaeTiling, PlannerUsesTheDecoderEstimate) {
  const uint64_t bf16 = 2, ch = 640;
  PipelineLoadOptions o;
  o.plan_width = o.plan_height = 2048;
  MemoryPlanInput in =
      TextToImage::plan_input(zimage_turbo_reference_configs(), DType::kBF16, o, 83'800'000, 0);
  EXPECT_EQ(in.vae_activation_bytes, ch * 2048 * 2048 * bf16);        // 5 GiB
  EXPECT_EQ(in.vae_tiled_activation_bytes, ch * 1024 * 1024 * bf16);  // 1.25 GiB
  o.plan_width = o.plan_height = 1024;
  in = TextToImage::plan_input(zimage_turbo_reference_configs(), DType::kBF16, o, 83'800'000, 0);
  EXPECT_EQ(in.vae_activation_bytes, ch * 1024 * 1024 * bf16);
  EXPECT_EQ(in.vae_tiled_activation_bytes, in.vae_activation_bytes);
}

// ---- the pipeline, the engine option and the CLI flag, on the golden case v_vae8 (a factor-8
// VAE with diffusers' default sample_size 32: 4-latent tiles, so its 8 x 8 latent tiles). ----

GenerateRequest vae8_request() {
  const nlohmann::json c = read_json(test::golden_dir("v_vae8") + "/case.json");
  GenerateRequest r;
  r.prompts = c["prompts"].get<std::vector<std::string>>();
  r.width = c["W"];
  r.height = c["H"];
  r.steps = c["steps"];
  r.guidance = c["guidance"];
  r.seed = c["seed"];
  return r;
}

TEST(VaeTiling, PipelineFollowsThePolicy) {
  auto pipe = TextToImage::load(test::golden_dir("v_vae8") + "/model", cpu());
  ASSERT_TRUE(pipe.ok()) << pipe.status().to_string();
  const GenerateRequest req = vae8_request();
  auto run = [&](VaeTilingPolicy p) {
    (*pipe)->set_vae_tiling(p);
    auto out = (*pipe)->run(req, {});
    EXPECT_TRUE(out.ok()) << out.status().to_string();
    return out.ok() ? out->image : Tensor();
  };
  const Tensor off = run({VaeTiling::kOff, 0});
  const Tensor auto_cpu = run({VaeTiling::kAuto, 0});
  const Tensor auto_small = run({VaeTiling::kAuto, 1024});
  const Tensor on = run({VaeTiling::kOn, 0});
  ASSERT_TRUE(off.defined() && on.defined());
  // Untiled: diffusers' image (the golden was made without tiling).
  const double err = test::max_abs_diff(off, npy(test::golden_dir("v_vae8") + "/image.npy"));
  report("v_vae8 pipeline, tiling off, vs diffusers", err);
  EXPECT_LE(err, 3e-5);
  EXPECT_TRUE(same_bits(off, auto_cpu)) << "auto must not tile on the CPU without a budget";
  EXPECT_TRUE(same_bits(on, auto_small)) << "auto must tile when the budget is small";
  const double effect = test::max_abs_diff(on, off);
  report("v_vae8 pipeline, tiling on vs off", effect);
  EXPECT_GT(effect, 1e-3);
}

TEST(VaeTiling, EngineOption) {
  EngineOptions o;
  o.model_dir = test::golden_dir("v_vae8") + "/model";
  o.device = "cpu";
  o.threads = 2;
  o.vae_tiling = "sometimes";
  auto bad = Engine::load(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "vae_tiling: 'sometimes' is not one of auto, on, off");
  std::vector<uint8_t> rgb[2];
  for (int i = 0; i < 2; ++i) {
    o.vae_tiling = i == 0 ? "off" : "on";
    auto e = Engine::load(o);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    auto r = (*e)->generate(vae8_request());
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    rgb[i] = r->images.at(0).rgb;
  }
  EXPECT_NE(rgb[0], rgb[1]) << "vae_tiling on must change the image of a latent over one tile";
}

// The built-in model (v_turbo: factor 2, sample_size 32, so 16-latent tiles) at its default
// 64 x 64: a 32 x 32 latent, tiled with --vae-tiling on.
TEST(VaeTiling, CliFlag) {
  const fs::path dir =
      fs::temp_directory_path() / ("zimage_vae_tiling_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto gen = [&](const std::string& mode, const std::string& file) {
    test::ProgramSpec s;
    s.exe = ZIMAGE_CLI_PATH;
    s.args = {"generate", "--prompt", "a lighthouse", "--steps", "1",        "--threads",
              "2",        "--quiet",  "--vae-tiling", mode,      "--output", (dir / file).string()};
    return test::run_program(s);
  };
  const test::ProgramRun bad = gen("maybe", "bad.png");
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  EXPECT_NE(bad.err.find("--vae-tiling"), std::string::npos) << bad.err;
  const test::ProgramRun off = gen("off", "off.png"), on = gen("on", "on.png");
  const test::ProgramRun deflt = gen("auto", "auto.png");
  ASSERT_EQ(off.exit_code, 0) << off.err;
  ASSERT_EQ(on.exit_code, 0) << on.err;
  ASSERT_EQ(deflt.exit_code, 0) << deflt.err;
  const std::string png_off = test::read_file_bytes((dir / "off.png").string());
  EXPECT_FALSE(png_off.empty());
  EXPECT_EQ(png_off, test::read_file_bytes((dir / "auto.png").string()));
  EXPECT_NE(png_off, test::read_file_bytes((dir / "on.png").string()));
  std::error_code ec;
  fs::remove_all(dir, ec);
}

}  // namespace
}  // namespace zimage

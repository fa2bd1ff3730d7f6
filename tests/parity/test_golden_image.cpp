// Image-to-image and inpainting parity with diffusers: every case of tests/data/golden/image
// (tools/make_image_goldens.py: ZImageImg2ImgPipeline / ZImageInpaintPipeline on the tiny random
// models of the text-to-image goldens) is run through the pipeline on the CPU backend with the
// input files the reference was given, and each stage is compared: the preprocessed image and
// mask, the encoder's posterior, the image latents (draw 1 of the generator), the noise (draw 2),
// the start latents, the start step and the timesteps run, the mask at latent size, the masked
// image latents (draw 3), the DiT output and the latents after every step (after the inpainting
// blend), and the image; then `zimage generate --init-image ... [--mask ...]` on the same files,
// whose PNG must be within 1/255 of diffusers' image.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "common/cli_run.h"
#include "common/golden_harness.h"
#include "io/image/png.h"
#include "io/model/model_folder.h"
#include "pipeline/image_to_image.h"
#include "pipeline/text_to_image.h"

namespace zimage {
namespace {

namespace fs = std::filesystem;

// Max |ours - diffusers| accepted per stage (fp32 CPU). Measured over the 7 cases (printed by the
// test): preprocessed image and mask 0 (exact), posterior mean / logvar <= 2.9e-6, image latents
// <= 1.5e-6, noise <= 4.8e-7, start latents <= 7.2e-7, DiT <= 9.8e-6, latents <= 8.4e-6, image
// <= 3.9e-6. The bounds leave room for summation order; a wrong formula, draw order or step
// shows up as 1e-2 and more.
constexpr double kTolExact = 0.0;
constexpr double kTolPosterior = 2e-5;
constexpr double kTolLatents = 1e-4;
constexpr double kTolNoise = 2e-6;
constexpr double kTolDit = 5e-5;
constexpr double kTolImage = 3e-5;

using test::CaptureSink;
using test::GoldenCase;
using test::GoldenFamily;
using test::load_reference;

std::vector<std::string> image_cases() {
  return test::golden_case_names(GoldenFamily::kImage);
}

GoldenCase read_case(const std::string& name) {
  return test::read_golden_case(GoldenFamily::kImage, name);
}

double compare(const std::string& what, const Tensor& ours, const Tensor& ref, double tol) {
  return test::expect_stage_close(what, ours, ref, tol, /*label_width=*/24);
}

class GoldenImage : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenImage, StagesMatchDiffusers) {
  const GoldenCase c = read_case(GetParam());
  ASSERT_TRUE(c.req.init_image.has_value());
  const bool inpaint = c.req.mask.has_value();
  std::unique_ptr<Backend> be = make_cpu_backend(0);
  auto pipe = TextToImage::load(c.model, *be);
  ASSERT_TRUE(pipe.ok()) << pipe.status().to_string();
  CaptureSink sink({"init_image", "vae_mean", "vae_logvar", "image_latents", "init_noise",
                    "init_latents", "mask_image", "mask_latent", "masked_image_latents", "dit_out.",
                    "latents."});
  TextToImageHooks hooks;
  hooks.debug = &sink;
  int steps_seen = 0, total = -1;
  bool encode_phase = false;
  hooks.on_progress = [&](const Progress& p) {
    if (p.phase == Phase::kVaeEncode) encode_phase = true;
    if (p.phase == Phase::kDenoise && p.step > 0) ++steps_seen, total = p.total;
  };
  auto out = (*pipe)->run(c.req, hooks);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  const auto& ts = c.spec.at("timesteps");
  const int t_start = c.spec.at("t_start").get<int>();
  std::printf("case %s: %s, %dx%d, %d steps from %d (strength %s), %zu prompt(s) x %d\n",
              GetParam().c_str(), inpaint ? "inpaint" : "img2img", c.req.width, c.req.height,
              c.req.steps, t_start, c.spec.at("strength").dump().c_str(), c.req.prompts.size(),
              c.req.images_per_prompt);

  // The start step (diffusers' int() of a double) and the timesteps the loop ran: exact.
  auto start = img2img_start_index(c.req.steps, effective_strength(c.req));
  ASSERT_TRUE(start.ok());
  EXPECT_EQ(*start, t_start);
  EXPECT_EQ(steps_seen, static_cast<int>(ts.size()));
  EXPECT_EQ(total, static_cast<int>(ts.size()));
  EXPECT_EQ(denoising_steps(c.req), static_cast<int>(ts.size()));
  EXPECT_TRUE(encode_phase);
  auto folder = ModelFolder::open(c.model);
  ASSERT_TRUE(folder.ok());
  const int m = (*pipe)->size_multiple();
  auto sched = FlowMatchEulerScheduler::create(folder->scheduler(), c.req.steps,
                                               (c.req.height / m) * (c.req.width / m));
  ASSERT_TRUE(sched.ok());
  for (size_t k = 0; k < ts.size(); ++k)
    EXPECT_EQ(sched->timesteps()[t_start + k], ts.at(k).get<float>()) << "timestep " << k;
  std::printf("  start step %d, %zu timesteps      exact\n", t_start, ts.size());

  compare("init_image", sink.get("init_image"), load_reference(c.dir + "/init_image.npy"),
          kTolExact);
  compare("vae_mean", sink.get("vae_mean"), load_reference(c.dir + "/vae_mean.npy"), kTolPosterior);
  compare("vae_logvar", sink.get("vae_logvar"), load_reference(c.dir + "/vae_logvar.npy"),
          kTolPosterior);
  compare("image_latents (draw 1)", sink.get("image_latents"),
          load_reference(c.dir + "/image_latents.npy"), kTolLatents);
  compare("init_noise (draw 2)", sink.get("init_noise"), load_reference(c.dir + "/init_noise.npy"),
          kTolNoise);
  compare("init_latents", sink.get("init_latents"), load_reference(c.dir + "/init_latents.npy"),
          kTolLatents);
  if (inpaint) {
    compare("mask_image", sink.get("mask_image"), load_reference(c.dir + "/mask_image.npy"),
            kTolExact);
    compare("mask_latent", sink.get("mask_latent"), load_reference(c.dir + "/mask_latent.npy"),
            kTolExact);
    compare("masked_image_latents (3)", sink.get("masked_image_latents"),
            load_reference(c.dir + "/masked_image_latents.npy"), kTolLatents);
  } else {
    EXPECT_FALSE(sink.has("mask_image"));
  }
  for (size_t s = 0; s < ts.size(); ++s) {
    const std::string k = std::to_string(s);
    compare("dit_out.step" + k, sink.get("dit_out.step" + k),
            load_reference(c.dir + "/debug/dit_out_step" + k + ".npy"), kTolDit);
    compare("latents.step" + k, sink.get("latents.step" + k),
            load_reference(c.dir + "/debug/latents_after_step" + k + ".npy"), kTolLatents);
  }
  const Tensor ref = load_reference(c.dir + "/image.npy");
  compare("image", out->image, ref, kTolImage);
  ASSERT_EQ(static_cast<int64_t>(out->images.size()), ref.dim(0));
  int worst = 0;
  for (size_t i = 0; i < out->images.size(); ++i)
    worst = std::max(worst, test::rgb8_max_diff(out->images[i].rgb, ref, static_cast<int64_t>(i)));
  std::printf("  rgb8 vs round(255*image)   max|diff| %d\n", worst);
  EXPECT_LE(worst, 1);
}

TEST_P(GoldenImage, CliPngMatchesDiffusers) {
  const GoldenCase c = read_case(GetParam());
  const fs::path dir = fs::temp_directory_path() /
                       ("zimage_image_cli_" + GetParam() + "_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string output = (dir / "out.png").string();
  const auto& s = c.spec;
  test::ProgramSpec p;
  p.exe = ZIMAGE_CLI_PATH;
  p.args = test::cli_generate_args(c, output);
  p.args.insert(p.args.end(),
                {"--init-image", c.dir + "/inputs/" + s.at("init").get<std::string>()});
  if (!s.at("mask").is_null())
    p.args.insert(p.args.end(), {"--mask", c.dir + "/inputs/" + s.at("mask").get<std::string>()});
  if (c.req.strength) p.args.insert(p.args.end(), {"--strength", s.at("strength").dump()});
  // Without --width / --height the CLI takes the image's size rounded down, as diffusers does.
  if (s.at("explicit_size").get<bool>())
    p.args.insert(p.args.end(), {"--width", std::to_string(c.req.width), "--height",
                                 std::to_string(c.req.height)});
  const test::ProgramRun run = test::run_program(p);
  ASSERT_EQ(run.exit_code, 0) << run.err;

  const Tensor ref = load_reference(c.dir + "/image.npy");
  const int64_t n = ref.dim(0);
  int worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    auto png = read_png(test::cli_png_path(output, i, n));
    ASSERT_TRUE(png.ok()) << png.status().to_string();
    ASSERT_EQ(png->width, c.req.width);
    ASSERT_EQ(png->height, c.req.height);
    worst = std::max(worst, test::rgb8_max_diff(png->rgb, ref, i));
    std::map<std::string, std::string> text(png->text.begin(), png->text.end());
    EXPECT_EQ(text["mode"], c.req.mask ? "inpaint" : "img2img");
    EXPECT_FALSE(text["strength"].empty());
    for (const auto& [key, value] : text) EXPECT_EQ(value.find(c.dir), std::string::npos) << key;
  }
  std::printf("case %s: CLI PNG(s) vs round(255*image): max|diff| %d over %lld image(s)\n",
              GetParam().c_str(), worst, static_cast<long long>(n));
  EXPECT_LE(worst, 1);
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(, GoldenImage, ::testing::ValuesIn(image_cases()),
                         [](const ::testing::TestParamInfo<std::string>& param) {
                           return param.param;
                         });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(GoldenImage);

TEST(GoldenImageSet, AllCasesFound) {
  const size_t archives = test::golden_archive_count("golden/image");
  EXPECT_GE(archives, 8u);
  EXPECT_EQ(image_cases().size() + 1, archives);  // + image_io, which is not a pipeline case
}

}  // namespace
}  // namespace zimage

// ControlNet parity with diffusers: every case of tests/data/golden/controlnet
// (tools/make_controlnet_goldens.py: ZImageControlNetPipeline / ZImageControlNetInpaintPipeline
// with tiny random ControlNets in the 1.0, 2.0, 2.1 and 2.1-lite layouts, on a tiny 30-layer DiT
// and v_turbo's text encoder and VAE) runs through the pipeline on the CPU backend with the
// reference's input files, and each stage is compared: the preprocessed control image, the control
// context (VAE mean latents, mask and masked-image latents), the noise, the ControlNet's hints of
// the first step (every controlled layer), the DiT output and latents of every step, the image.
// Then `zimage generate --controlnet FILE.safetensors --control-image ...` with the single file
// as published (2.0: its own file; 1.0, 2.1, lite: the folder's safetensors, the same tensors),
// whose PNG must be within 1/255 of diffusers' image; each single file must load to the same model
// as its folder (same config, bitwise the same hints); and bad inputs must fail with messages
// naming the file or flag.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
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
#include "common/controlnet_model.h"
#include "common/golden_harness.h"
#include "common/npy.h"
#include "io/image/png.h"
#include "io/weights/weights.h"
#include "model/adapters/zimage_controlnet.h"
#include "pipeline/text_to_image.h"

namespace zimage {
namespace {

namespace fs = std::filesystem;

// Max |ours - diffusers| per stage (fp32 CPU). Measured over the 4 cases (printed): control
// image 0 (exact), control context <= 9.7e-7, noise <= 4.8e-7, hints <= 7.6e-6 (values up to
// 14), DiT <= 1.1e-5, latents <= 1.3e-5, image <= 1.4e-6, RGB8 0. A wrong layer, scale, mode or
// channel order shows as 1e-2 and more.
constexpr double kTolExact = 0.0;
constexpr double kTolLatents = 1e-4;
constexpr double kTolNoise = 2e-6;
constexpr double kTolHint = 2e-4;
constexpr double kTolDit = 5e-5;
constexpr double kTolImage = 3e-5;

using test::CaptureSink;
using test::GoldenCase;
using test::GoldenFamily;
using test::load_reference;

std::string root() {
  return test::controlnet_golden_root();
}

std::vector<std::string> cases() {
  return test::golden_case_names(GoldenFamily::kControlNet);
}

std::string model_dir() {
  return test::controlnet_model_dir();
}

GoldenCase read_case(const std::string& name) {
  return test::read_golden_case(GoldenFamily::kControlNet, name);
}

double compare(const std::string& what, const Tensor& ours, const Tensor& ref, double tol) {
  return test::expect_stage_close(what, ours, ref, tol);
}

class GoldenControlNet : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenControlNet, StagesMatchDiffusers) {
  const GoldenCase c = read_case(GetParam());
  std::unique_ptr<Backend> be = make_cpu_backend(0);
  auto pipe = TextToImage::load(model_dir(), *be);
  ASSERT_TRUE(pipe.ok()) << pipe.status().to_string();
  const Status ld = (*pipe)->load_controlnet(c.dir + "/controlnet");
  ASSERT_TRUE(ld.ok()) << ld.to_string();
  CaptureSink sink({"control_image", "control_context", "init_noise", "controlnet.step0.hint.",
                    "dit_out.", "latents."});
  TextToImageHooks hooks;
  hooks.debug = &sink;
  auto out = (*pipe)->run(c.req, hooks);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  std::printf("case %s: ControlNet %s, %s, %dx%d, %d steps, scale %g\n", GetParam().c_str(),
              c.spec.at("version").get<std::string>().c_str(),
              c.spec.at("kind").get<std::string>().c_str(), c.req.width, c.req.height, c.req.steps,
              c.req.control_scale);
  compare("control_image", sink.get("control_image"), load_reference(c.dir + "/control_image.npy"),
          kTolExact);
  compare("control_context", sink.get("control_context"),
          load_reference(c.dir + "/control_context.npy"), kTolLatents);
  compare("init_noise", sink.get("init_noise"), load_reference(c.dir + "/init_noise.npy"),
          kTolNoise);
  const auto& places = c.spec.at("controlnet").at("control_layers_places");
  ASSERT_FALSE(places.empty());
  for (const auto& l : places) {
    const std::string k = std::to_string(l.get<int>());
    compare("hint step0 layer " + k, sink.get("controlnet.step0.hint." + k),
            load_reference(c.dir + "/debug/hint_step0_layer" + k + ".npy"), kTolHint);
  }
  const size_t steps = c.spec.at("timesteps").size();
  for (size_t s = 0; s < steps; ++s) {
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
  std::printf("  rgb8 vs round(255*image)     max|diff| %d\n", worst);
  EXPECT_LE(worst, 1);

  // The hints matter: without the ControlNet the same request gives another image.
  GenerateRequest plain = c.req;
  plain.control_image.reset();
  plain.init_image.reset();
  plain.mask.reset();
  auto no_cn = (*pipe)->run(plain, {});
  ASSERT_TRUE(no_cn.ok()) << no_cn.status().to_string();
  const double moved = test::max_abs_diff(no_cn->image, out->image);
  std::printf("  image without the ControlNet differs by %.3g\n", moved);
  EXPECT_GT(moved, 1e-3);
}

TEST_P(GoldenControlNet, SingleFileLoadsAsTheFolder) {
  const GoldenCase c = read_case(GetParam());
  std::unique_ptr<Backend> be = make_cpu_backend(0);
  auto pipe = TextToImage::load(model_dir(), *be);
  ASSERT_TRUE(pipe.ok()) << pipe.status().to_string();
  // The DiT the ControlNet hangs off (the pipeline's); both loads bind to it.
  auto folder_pipe = TextToImage::load(model_dir(), *be);
  ASSERT_TRUE(folder_pipe.ok());
  const std::string single = c.dir + "/" + c.spec.at("single_file").get<std::string>();
  ASSERT_TRUE((*pipe)->load_controlnet(single).ok());
  ASSERT_TRUE((*folder_pipe)->load_controlnet(c.dir + "/controlnet").ok());
  const ControlNetConfig& a = (*pipe)->controlnet()->config();
  const ControlNetConfig& b = (*folder_pipe)->controlnet()->config();
  const std::string version = c.spec.at("version").get<std::string>();
  std::printf("case %s: single file recognised as %s (published %s)\n", GetParam().c_str(),
              a.version.c_str(), version.c_str());
  EXPECT_EQ(a.version, version);
  EXPECT_EQ(a.control_layers_places, b.control_layers_places);
  EXPECT_EQ(a.refiner, b.refiner);
  EXPECT_EQ(a.control_in_dim, b.control_in_dim);
  if (a.refiner != ControlNetConfig::Refiner::kNone) {
    EXPECT_EQ(a.control_refiner_layers_places, b.control_refiner_layers_places);
  }
  // The same request through both: bitwise the same image.
  GenerateRequest r = c.req;
  r.steps = 1;
  auto x = (*pipe)->run(r, {});
  auto y = (*folder_pipe)->run(r, {});
  ASSERT_TRUE(x.ok() && y.ok());
  EXPECT_EQ(test::max_abs_diff(x->image, y->image), 0.0);
}

TEST_P(GoldenControlNet, CliPngMatchesDiffusers) {
  const GoldenCase c = read_case(GetParam());
  const fs::path dir =
      fs::temp_directory_path() / ("zimage_cn_cli_" + GetParam() + "_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string output = (dir / "out.png").string();
  const auto& s = c.spec;
  test::ProgramSpec p;
  p.exe = ZIMAGE_CLI_PATH;
  p.args = test::cli_generate_args(c, output);
  p.args.insert(p.args.end(),
                {"--width", std::to_string(c.req.width), "--height", std::to_string(c.req.height),
                 "--controlnet", c.dir + "/" + s.at("single_file").get<std::string>(),
                 "--control-image", c.dir + "/inputs/" + s.at("control").get<std::string>(),
                 "--control-scale", s.at("scale").dump()});
  if (!s.at("init").is_null())
    p.args.insert(p.args.end(),
                  {"--init-image", c.dir + "/inputs/" + s.at("init").get<std::string>(), "--mask",
                   c.dir + "/inputs/" + s.at("mask").get<std::string>()});
  const test::ProgramRun run = test::run_program(p);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const Tensor ref = load_reference(c.dir + "/image.npy");
  const int64_t n = ref.dim(0);
  int worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    auto png = read_png(test::cli_png_path(output, i, n));
    ASSERT_TRUE(png.ok()) << png.status().to_string();
    std::map<std::string, std::string> text(png->text.begin(), png->text.end());
    EXPECT_EQ(text["mode"], c.req.mask ? "controlnet_inpaint" : "controlnet");
    EXPECT_FALSE(text["control_scale"].empty());
    EXPECT_EQ(text.count("strength"), 0u);
    worst = std::max(worst, test::rgb8_max_diff(png->rgb, ref, i));
  }
  std::printf("case %s: CLI PNG(s) with the single file vs diffusers: max|diff| %d\n",
              GetParam().c_str(), worst);
  EXPECT_LE(worst, 1);
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(, GoldenControlNet, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<std::string>& param) {
                           return param.param;
                         });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(GoldenControlNet);

TEST(GoldenControlNetSet, AllCasesFound) {
  EXPECT_EQ(cases().size(), 4u);
  EXPECT_TRUE(fs::exists(root() + "/cn_model/transformer/config.json"));
}

// ---- bad inputs: clear errors naming the file or flag ----

class ControlNetErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    be_ = make_cpu_backend(0);
    auto p = TextToImage::load(model_dir(), *be_);
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    pipe_ = std::move(p).value();
  }
  std::unique_ptr<Backend> be_;
  std::unique_ptr<TextToImage> pipe_;
};

TEST_F(ControlNetErrors, MissingFile) {
  const Status st = pipe_->load_controlnet("/nonexistent/controlnet.safetensors");
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("--controlnet /nonexistent/controlnet.safetensors"),
            std::string::npos)
      << st.to_string();
}

TEST_F(ControlNetErrors, NotAControlNet) {
  // The DiT's own weights: no control keys.
  const std::string f = root() + "/cn_model/transformer/diffusion_pytorch_model.safetensors";
  const Status st = pipe_->load_controlnet(f);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("not a Z-Image ControlNet"), std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find(f), std::string::npos) << st.to_string();
}

TEST_F(ControlNetErrors, DoesNotMatchTheTransformer) {
  // v_turbo's DiT: dim 64, 2 layers; the ControlNets are made for dim 32, 30 layers.
  std::unique_ptr<Backend> be = make_cpu_backend(0);
  auto p = TextToImage::load(std::string(ZIMAGE_GOLDEN_DIR) + "/v_turbo/model", *be);
  ASSERT_TRUE(p.ok());
  for (const char* what : {"/cn_v1/controlnet", "/cn_v2_cfg/controlnet.safetensors"}) {
    const Status st = (*p)->load_controlnet(root() + what);
    ASSERT_FALSE(st.ok()) << what;
    EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.message().find("does not match the transformer"), std::string::npos)
        << st.to_string();
    EXPECT_NE(st.message().find(root() + what), std::string::npos) << st.to_string();
  }
}

TEST_F(ControlNetErrors, RequestChecks) {
  const GoldenCase c = read_case("cn_v1");
  GenerateRequest r = c.req;
  Status st = pipe_->check(r);  // no ControlNet loaded yet
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("control_image: no ControlNet loaded"), std::string::npos);
  ASSERT_TRUE(pipe_->load_controlnet(c.dir + "/controlnet").ok());
  EXPECT_TRUE(pipe_->check(r).ok());
  r.control_scale = std::nanf("");
  st = pipe_->check(r);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("control_scale"), std::string::npos) << st.to_string();
  // ControlNet inpainting needs the 2.x mask channels.
  const GoldenCase inp = read_case("cn_v21_inpaint");
  r = inp.req;
  st = pipe_->check(r);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("mask: ControlNet inpainting needs"), std::string::npos)
      << st.to_string();
  r.mask.reset();  // img2img with a ControlNet: not in diffusers
  st = pipe_->check(r);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("init_image"), std::string::npos) << st.to_string();
}

// A copy of the cn_v1 ControlNet file (bf16) with tensors left out or added: a safetensors file
// written here (8-byte header length, JSON header, data).
std::string rewrite_controlnet(const std::string& name, const std::string& drop,
                               const std::string& add_as) {
  auto ws = WeightStore::open(root() + "/cn_v1/controlnet/diffusion_pytorch_model.safetensors");
  EXPECT_TRUE(ws.ok());
  if (!ws.ok()) return "";
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  auto put = [&](const std::string& key, const Tensor& t) {
    std::vector<int64_t> shape(t.shape().begin(), t.shape().end());
    header[key] = {{"dtype", "BF16"},
                   {"shape", shape},
                   {"data_offsets", {data.size(), data.size() + t.nbytes()}}};
    data.append(static_cast<const char*>(t.data()), t.nbytes());
  };
  for (const std::string& n : ws->names()) {
    auto t = ws->get(n);
    EXPECT_TRUE(t.ok() && t->dtype() == DType::kBF16) << n;
    if (!t.ok()) return "";
    if (n != drop) put(n, *t);
    if (!add_as.empty() && n == "control_layers.0.after_proj.bias") put(add_as, *t);
  }
  const std::string h = header.dump();
  const fs::path path =
      fs::temp_directory_path() / (name + "_" + std::to_string(getpid()) + ".safetensors");
  std::ofstream f(path, std::ios::binary);
  const uint64_t len = h.size();
  for (int i = 0; i < 8; ++i) f.put(static_cast<char>((len >> (8 * i)) & 0xFF));
  f << h << data;
  return path.string();
}

TEST_F(ControlNetErrors, MissingOrUnexpectedTensors) {
  const std::string missing =
      rewrite_controlnet("cn_missing", "control_layers.3.after_proj.weight", "");
  Status st = pipe_->load_controlnet(missing);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("control_layers.3.after_proj.weight"), std::string::npos)
      << st.to_string();
  EXPECT_NE(st.message().find(missing), std::string::npos) << st.to_string();
  const std::string extra = rewrite_controlnet("cn_extra", "", "control_layers.0.extra.bias");
  st = pipe_->load_controlnet(extra);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("control_layers.0.extra.bias"), std::string::npos) << st.to_string();
  // The untouched copy loads (the writer is right).
  const std::string same = rewrite_controlnet("cn_same", "", "");
  st = pipe_->load_controlnet(same);
  EXPECT_TRUE(st.ok()) << st.to_string();
  for (const std::string& f : {missing, extra, same}) fs::remove(f);
}

TEST(ControlNetCli, BadFlags) {
  const GoldenCase c = read_case("cn_v1");
  auto run = [&](std::vector<std::string> extra) {
    test::ProgramSpec p;
    p.exe = ZIMAGE_CLI_PATH;
    p.args = {"generate",
              "--model",
              model_dir(),
              "--device",
              "cpu",
              "--steps",
              "1",
              "--width",
              "32",
              "--height",
              "32",
              "--prompt",
              "x",
              "--output",
              (fs::temp_directory_path() / ("zimage_cn_bad_" + std::to_string(getpid()) + ".png"))
                  .string()};
    p.args.insert(p.args.end(), extra.begin(), extra.end());
    return test::run_program(p);
  };
  const std::string cn = c.dir + "/controlnet/diffusion_pytorch_model.safetensors";
  auto r = run({"--controlnet", cn, "--control-image", "/nonexistent/pose.png"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--control-image"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("/nonexistent/pose.png"), std::string::npos) << r.err;
  r = run({"--controlnet", "/nonexistent/cn.safetensors", "--control-image",
           c.dir + "/inputs/control.png"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--controlnet /nonexistent/cn.safetensors: no such file"), std::string::npos)
      << r.err;
  r = run({"--control-image", c.dir + "/inputs/control.png"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("needs --controlnet"), std::string::npos) << r.err;
  r = run({"--controlnet", cn, "--control-image", c.dir + "/inputs/control.png", "--control-scale",
           "inf"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--control-scale"), std::string::npos) << r.err;
  // A ControlNet for another transformer: v_turbo (dim 64) with a dim-32 ControlNet.
  test::ProgramSpec p;
  p.exe = ZIMAGE_CLI_PATH;
  p.args = {"generate",
            "--model",
            std::string(ZIMAGE_GOLDEN_DIR) + "/v_turbo/model",
            "--device",
            "cpu",
            "--steps",
            "1",
            "--width",
            "32",
            "--height",
            "32",
            "--prompt",
            "x",
            "--controlnet",
            cn,
            "--control-image",
            c.dir + "/inputs/control.png",
            "--output",
            (fs::temp_directory_path() / ("zimage_cn_bad2_" + std::to_string(getpid()) + ".png"))
                .string()};
  r = test::run_program(p);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--controlnet " + cn + " does not match the transformer"), std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace zimage

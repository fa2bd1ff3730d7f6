// LoRA parity with diffusers (tools/make_lora_cases.py, tests/data/lora): random LoRAs for the tiny
// v_turbo model in every key layout, merged at load on the CPU backend, give diffusers' image
// (pipe.load_lora_weights + set_adapters) within 1/255, and its step-0 DiT output closely; scale 0
// gives the base image bit for bit; an unknown key fails (or is skipped with lenient); the same
// LoRAs on a ComfyUI-named copy of the model (fused attention.qkv, attention.out, x_embedder,
// final_layer, diffusion_model. prefix) give the same bits as on the diffusers-named one; and the
// CLI's --lora / --lora-lenient flags behave (usage errors exit 2).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "common/cli_run.h"
#include "common/lora_case.h"
#include "common/npy.h"
#include "common/tiny_engine.h"
#include "io/weights/safetensors.h"
#include "io/weights/weights.h"
#include "pipeline/text_to_image.h"

namespace zimage {
namespace {

namespace fs = std::filesystem;
using test::load_reference;
using test::turbo_request;

// Measured on the CPU backend against diffusers (fp32): image <= 4.5e-7 for LoRAs stored in f32,
// <= 3.4e-4 where diffusers folds alpha / rank into bf16 factors (kohya, comfy_peft: diffusers
// multiplies the bf16 tensors, rounding them; we scale in float32). The brief's bound is 1/255.
constexpr double kTolImage = 1.0 / 255.0;
constexpr double kTolDit = 1e-2;  // step-0 DiT output: measured <= 3.8e-3 (bf16 folding)

std::string lora_file(const std::string& name) {
  return std::string(ZIMAGE_LORA_DIR) + "/" + name;
}

struct LoraCase {
  std::string name;
  std::vector<LoraSpec> loras;
  bool diffusers_loads = false;
  std::string reference;
};

std::vector<LoraCase> lora_cases() {
  std::ifstream f(lora_file("cases.json"));
  std::vector<LoraCase> out;
  if (!f) return out;
  const nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
  if (j.is_discarded()) return out;
  for (const auto& c : j.at("cases")) {
    LoraCase lc;
    lc.name = c.at("name").get<std::string>();
    for (const auto& l : c.at("loras"))
      lc.loras.push_back({lora_file(l.at("file").get<std::string>()), l.at("scale").get<float>()});
    lc.diffusers_loads = c.at("diffusers_loads").get<bool>();
    lc.reference = c.at("reference").get<std::string>();
    out.push_back(lc);
  }
  return out;
}

std::vector<std::string> case_names() {
  std::vector<std::string> names;
  for (const LoraCase& c : lora_cases()) names.push_back(c.name);
  return names;
}

LoraCase find_case(const std::string& name) {
  for (const LoraCase& c : lora_cases())
    if (c.name == name) return c;
  ADD_FAILURE() << "no LoRA case " << name;
  return {};
}

// The v_turbo recipe the LoRA cases were made with.
struct RunOut {
  Tensor image;  // [1, H, W, 3] f32
  Tensor dit0;   // step-0 DiT output
};

Result<RunOut> run(const std::string& model_dir, const std::vector<LoraSpec>& loras,
                   bool lenient = false, bool fp8_weights = false) {
  std::unique_ptr<Backend> be = make_cpu_backend(2);
  PipelineLoadOptions opts;
  opts.loras = loras;
  opts.lora_lenient = lenient;
  opts.fp8_weights = fp8_weights;
  ZI_ASSIGN_OR_RETURN(auto pipe, TextToImage::load(model_dir, *be, opts));
  test::CaptureSink sink = test::step0_sink();
  TextToImageHooks hooks;
  hooks.debug = &sink;
  ZI_ASSIGN_OR_RETURN(TextToImageOutput out, pipe->run(turbo_request(), hooks));
  return RunOut{out.image, sink.get(test::kDitStep0)};
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

class LoraParity : public ::testing::TestWithParam<std::string> {};

TEST_P(LoraParity, ImageMatchesDiffusers) {
  const LoraCase c = find_case(GetParam());
  auto out = run(test::tiny_model_dir(), c.loras);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  const Tensor ref_image = load_reference(lora_file(c.name + ".image.npy"));
  const Tensor ref_dit = load_reference(lora_file(c.name + ".dit0.npy"));
  const Tensor base = load_reference(lora_file("base.image.npy"));
  ASSERT_EQ(out->image.numel(), ref_image.numel());
  ASSERT_EQ(out->dit0.numel(), ref_dit.numel());
  const double img = test::max_abs_diff(out->image, ref_image);
  const double dit = test::max_abs_diff(out->dit0, ref_dit);
  const double effect = test::max_abs_diff(ref_image, base);
  std::printf(
      "  %-13s image max|diff| %.3g (%.3f/255), dit0 %.3g; the LoRA moves the image by "
      "%.3f; reference: %s\n",
      c.name.c_str(), img, img * 255, dit, effect, c.reference.c_str());
  EXPECT_GE(img, 0.0);
  EXPECT_LE(img, kTolImage) << c.name;
  EXPECT_LE(dit, kTolDit) << c.name;
  EXPECT_GT(effect, 0.05) << "the LoRA of case " << c.name << " hardly changes the image";
}

INSTANTIATE_TEST_SUITE_P(, LoraParity, ::testing::ValuesIn(case_names()),
                         [](const auto& p) { return p.param; });

TEST(LoraParityData, EveryLayoutIsCovered) {
  const std::vector<std::string> names = case_names();
  for (const char* n :
       {"peft", "peft_scaled", "peft_alpha", "peft_meta", "aitoolkit", "kohya", "stack",
        "kohya_qkv", "peft_bare", "kohya_dunder", "comfy_peft", "loha", "lokr"})
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
}

TEST(LoraParityData, NoLoraGivesTheBaseImage) {
  auto out = run(test::tiny_model_dir(), {});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_LE(test::max_abs_diff(out->image, load_reference(lora_file("base.image.npy"))), 3e-5);
}

TEST(LoraParityData, ScaleZeroGivesTheBaseImageBitForBit) {
  auto base = run(test::tiny_model_dir(), {});
  auto zero = run(test::tiny_model_dir(), {{lora_file("kohya.safetensors"), 0.0f},
                                           {lora_file("lokr.safetensors"), 0.0f},
                                           {lora_file("comfy_peft.safetensors"), 0.0f}});
  ASSERT_TRUE(base.ok() && zero.ok());
  EXPECT_TRUE(same_bits(base->image, zero->image));
  EXPECT_TRUE(same_bits(base->dit0, zero->dit0));
}

// --weights fp8 stores the DiT's linear weights as FP8 rows: made from the merged weights, so the
// LoRA still shows (the image lands near diffusers' LoRA image, far from the base image).
TEST(LoraParityData, AppliedUnderFp8Weights) {
  auto out = run(test::tiny_model_dir(), {{lora_file("peft.safetensors"), 1.0f}}, false, true);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  const double to_lora =
      test::max_abs_diff(out->image, load_reference(lora_file("peft.image.npy")));
  const double to_base =
      test::max_abs_diff(out->image, load_reference(lora_file("base.image.npy")));
  std::printf(
      "  fp8 weights + peft LoRA: max|diff| to diffusers' LoRA image %.3g, to the base %.3g\n",
      to_lora, to_base);
  EXPECT_LT(to_lora, 0.25 * to_base);
}

TEST(LoraParityData, UnknownKeyFailsOrIsSkippedWhenLenient) {
  const std::string file = lora_file("unknown_key.safetensors");
  auto strict = run(test::tiny_model_dir(), {{file, 1.0f}});
  ASSERT_FALSE(strict.ok());
  const std::string msg = strict.status().message();
  for (const std::string& part :
       {std::string("loading transformer"), file,
        std::string("'transformer.layers.0.attention.to_x.lora_A.weight'"),
        std::string("--lora-lenient")})
    EXPECT_NE(msg.find(part), std::string::npos) << "expected " << part << " in: " << msg;
  auto lenient = run(test::tiny_model_dir(), {{file, 1.0f}}, true);
  auto peft = run(test::tiny_model_dir(), {{lora_file("peft.safetensors"), 1.0f}});
  ASSERT_TRUE(lenient.ok()) << lenient.status().to_string();
  ASSERT_TRUE(peft.ok());
  EXPECT_TRUE(same_bits(lenient->image, peft->image));
}

TEST(LoraParityData, ShapeMismatchNamesKeyAndShapes) {
  const std::string dir =
      fs::temp_directory_path() / ("zimage_lora_shape_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = dir + "/wide.safetensors";
  Tensor a = Tensor::host(DType::kF32, {2, 48}), b = Tensor::host(DType::kF32, {64, 2});
  ASSERT_TRUE(write_safetensors(path, {{"transformer.layers.1.attention.to_v.lora_A.weight", a},
                                       {"transformer.layers.1.attention.to_v.lora_B.weight", b}})
                  .ok());
  auto r = run(test::tiny_model_dir(), {{path, 1.0f}}, true);
  ASSERT_FALSE(r.ok());
  const std::string msg = r.status().message();
  for (const char* part : {"transformer.layers.1.attention.to_v.lora_A.weight' [2, 48]",
                           "layers.1.attention.to_v.weight [64, 64]"})
    EXPECT_NE(msg.find(part), std::string::npos) << "expected " << part << " in: " << msg;
  fs::remove_all(dir);
}

// A copy of the tiny model whose transformer is named as ComfyUI's single files name it.
std::string make_comfy_model(const std::string& dir) {
  const std::string src = test::tiny_model_dir();
  fs::create_directories(dir + "/transformer");
  for (const char* part : {"text_encoder", "vae", "tokenizer", "scheduler", "model_index.json"})
    fs::create_symlink(fs::absolute(src + "/" + part), dir + "/" + part);
  fs::copy_file(src + "/transformer/config.json", dir + "/transformer/config.json");
  auto ws = WeightStore::open(src + "/transformer");
  EXPECT_TRUE(ws.ok());
  if (!ws.ok()) return dir;
  std::vector<std::pair<std::string, Tensor>> out;
  auto rename = [](std::string n) {
    auto swap = [&](const std::string& from, const std::string& to) {
      const size_t p = n.find(from);
      if (p != std::string::npos) n.replace(p, from.size(), to);
    };
    swap("attention.to_out.0.", "attention.out.");
    swap("attention.norm_q.", "attention.q_norm.");
    swap("attention.norm_k.", "attention.k_norm.");
    swap("all_x_embedder.2-1.", "x_embedder.");
    swap("all_final_layer.2-1.", "final_layer.");
    return "diffusion_model." + n;
  };
  for (const std::string& n : ws->names()) {
    const std::string q = ".attention.to_q.weight";
    if (n.find(".attention.to_k.") != std::string::npos ||
        n.find(".attention.to_v.") != std::string::npos)
      continue;
    if (n.size() > q.size() && n.compare(n.size() - q.size(), q.size(), q) == 0) {
      const std::string block = n.substr(0, n.size() - q.size());
      Tensor parts[3];
      int i = 0;
      for (const char* p : {"to_q", "to_k", "to_v"})
        parts[i++] = *ws->get(block + ".attention." + p + ".weight");
      Tensor fused = Tensor::host(parts[0].dtype(), {3 * parts[0].dim(0), parts[0].dim(1)});
      for (int k = 0; k < 3; ++k)
        std::memcpy(static_cast<char*>(fused.data()) + k * parts[0].nbytes(), parts[k].data(),
                    parts[k].nbytes());
      out.emplace_back("diffusion_model." + block + ".attention.qkv.weight", fused);
      continue;
    }
    out.emplace_back(rename(n), *ws->get(n));
  }
  EXPECT_TRUE(
      write_safetensors(dir + "/transformer/diffusion_pytorch_model.safetensors", out).ok());
  return dir;
}

TEST(LoraParityData, ComfyNamedBaseGivesTheSameBits) {
  const std::string dir =
      fs::temp_directory_path() / ("zimage_lora_comfy_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  make_comfy_model(dir);
  ASSERT_TRUE(WeightStore::open(dir + "/transformer")
                  ->contains("diffusion_model.layers.0.attention.qkv.weight"));
  const std::vector<std::vector<LoraSpec>> sets = {
      {},
      {{lora_file("kohya_qkv.safetensors"), 1.0f}},
      {{lora_file("peft.safetensors"), 0.7f}, {lora_file("kohya.safetensors"), -0.5f}},
      {{lora_file("comfy_peft.safetensors"), 1.0f}, {lora_file("lokr.safetensors"), 1.0f}},
  };
  for (size_t i = 0; i < sets.size(); ++i) {
    auto d = run(test::tiny_model_dir(), sets[i]);
    auto c = run(dir, sets[i]);
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    EXPECT_TRUE(same_bits(d->image, c->image)) << "LoRA set " << i;
    EXPECT_TRUE(same_bits(d->dit0, c->dit0)) << "LoRA set " << i;
  }
  fs::remove_all(dir);
}

// ---- the CLI ------------------------------------------------------------------------------------

test::ProgramRun generate(const std::vector<std::string>& extra, const std::string& out_png) {
  test::ProgramSpec spec;
  spec.exe = ZIMAGE_CLI_PATH;
  spec.args = {"generate",
               "--model",
               test::tiny_model_dir(),
               "--prompt",
               "a cat sitting on a red sofa, photo",
               "--width",
               "32",
               "--height",
               "32",
               "--steps",
               "2",
               "--device",
               "cpu",
               "--threads",
               "2",
               "--output",
               out_png};
  spec.args.insert(spec.args.end(), extra.begin(), extra.end());
  return test::run_program(spec);
}

TEST(LoraCli, FlagsApplyReportAndRejectBadValues) {
  const std::string dir =
      fs::temp_directory_path() / ("zimage_lora_cli_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string png = dir + "/out.png";
  const std::string peft = lora_file("peft.safetensors");

  auto ok = generate({"--lora", peft + ":0.6", "--verbose"}, png);
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_NE(ok.err.find("diffusers/PEFT (transformer.; lora_A/lora_B); 74 keys -> 37 patches"),
            std::string::npos)
      << ok.err;
  EXPECT_NE(ok.err.find("layers.1: "), std::string::npos) << ok.err;
  auto img = png_load(png);
  ASSERT_TRUE(img.ok()) << img.status().to_string();
  const Tensor ref = load_reference(lora_file("peft_scaled.image.npy"));  // peft at 0.6
  int worst = 0;
  for (size_t i = 0; i < img->rgb.size(); ++i) {
    const float x = ref.data_as<float>()[i];
    worst = std::max(worst, std::abs(int{img->rgb[i]} - int(std::nearbyint(255.0f * x))));
  }
  std::printf("  zimage generate --lora peft:0.6: PNG vs round(255 * diffusers) max|diff| %d\n",
              worst);
  EXPECT_LE(worst, 1);

  struct Bad {
    std::vector<std::string> args;
    int code;
    std::string says;
  };
  const std::vector<Bad> bad = {
      {{"--lora", peft + ":0.6x"}, 2, "'" + peft + "' does, but '0.6x' is not a number"},
      {{"--lora", peft + ":"}, 2, "does not exist"},
      {{"--lora", peft + ":nan"}, 2, "not a finite number"},
      {{"--lora", peft + ":inf"}, 2, "not a finite number"},
      {{"--lora", ":0.5"}, 2, "no file before the scale"},
      {{"--lora", dir}, 2, "is not a file"},
      {{"--lora", dir + "/missing.safetensors"}, 2, "does not exist"},
      {{"--lora", lora_file("unknown_key.safetensors")},
       1,
       "'transformer.layers.0.attention.to_x.lora_A.weight'"},
      {{"--lora", lora_file("base.image.npy")}, 1, "base.image.npy"},
  };
  for (const Bad& b : bad) {
    auto r = generate(b.args, png);
    EXPECT_EQ(r.exit_code, b.code) << b.args.back() << ": " << r.err;
    EXPECT_NE(r.err.find(b.says), std::string::npos) << b.args.back() << ": " << r.err;
  }
  auto lenient = generate({"--lora", lora_file("unknown_key.safetensors"), "--lora-lenient"}, png);
  EXPECT_EQ(lenient.exit_code, 0) << lenient.err;
  EXPECT_NE(lenient.err.find("skipped (lenient)"), std::string::npos) << lenient.err;

  test::ProgramSpec serve;
  serve.exe = ZIMAGE_CLI_PATH;
  serve.args = {"serve", "--port", "0", "--lora", peft + ":x"};
  auto s = test::run_program(serve);
  EXPECT_EQ(s.exit_code, 2) << s.err;
  EXPECT_NE(s.err.find("--lora"), std::string::npos) << s.err;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace zimage

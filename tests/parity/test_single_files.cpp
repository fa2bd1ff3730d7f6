// Single files and FP8 checkpoints end to end against upstream (tools/make_single_file_cases.py):
// the files are written from the tiny golden model at test time and first checked byte for byte
// against the script's manifest; then each is loaded the way `zimage generate --dit/--text-encoder
// /--vae` loads it and the whole pipeline runs on the CPU. References: diffusers'
// from_single_file (and transformers on the text-encoder file) for what diffusers reads; for the
// scaled FP8 formats diffusers cannot read, diffusers on the folder model with the weights
// dequantised in numpy. Also: the all-in-one checkpoint, files without a model folder (configs
// inferred, built-in tokenizer), the CLI and `zimage info` on a single file, and the errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "common/cli_run.h"
#include "common/golden_harness.h"
#include "common/npy.h"
#include "common/single_files.h"
#include "io/fs/json_util.h"
#include "io/image/png.h"
#include "io/weights/safetensors.h"
#include "io/weights/single_file.h"
#include "model/dit/zimage_dit.h"
#include "pipeline/text_to_image.h"

namespace zimage {
namespace {

namespace fs = std::filesystem;
using test::turbo_request;

// Same bounds as the folder goldens (test_golden_pipeline.cpp): fp32 on the CPU against fp32
// diffusers; a wrong scale or a misplaced row shows up as 1e-2 and more.
constexpr double kTolDit = 5e-5;
constexpr double kTolImage = 3e-5;

std::string model_dir() {
  return test::golden_dir("v_turbo") + "/model";
}

nlohmann::json manifest() {
  std::ifstream f(test::single_file_data_dir() + "/manifest.json");
  return nlohmann::json::parse(f);
}

struct Run {
  Tensor image;
  std::vector<Image> images;
  std::map<std::string, Tensor> dumps;
};

Result<Run> run(const ModelPaths& paths) {
  std::unique_ptr<Backend> be = make_cpu_backend(2);
  ZI_ASSIGN_OR_RETURN(auto pipe, TextToImage::load(paths, *be));
  test::CaptureSink sink({"dit_out.", "prompt_embeds."});
  TextToImageHooks hooks;
  hooks.debug = &sink;
  ZI_ASSIGN_OR_RETURN(TextToImageOutput out, pipe->run(turbo_request(), hooks));
  return Run{out.image, out.images, sink.all()};
}

class SingleFiles : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ =
        (fs::temp_directory_path() / ("zimage_single_files_" + std::to_string(getpid()))).string();
    auto files = test::write_single_file_cases(model_dir(), dir_);
    ASSERT_TRUE(files.ok()) << files.status().to_string();
    files_ = *files;
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  static std::string file(const std::string& name) { return files_.at(name); }

  static std::string dir_;
  static std::map<std::string, std::string> files_;
};
std::string SingleFiles::dir_;
std::map<std::string, std::string> SingleFiles::files_;

TEST_F(SingleFiles, FilesEqualThoseTheReferencesWereMadeFrom) {
  const nlohmann::json m = manifest();
  ASSERT_EQ(m.at("files").size(), files_.size());
  for (const auto& [name, entry] : m.at("files").items()) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(files_.count(name));
    const std::vector<std::string> diffs = test::compare_with_manifest(files_.at(name), entry);
    for (const std::string& d : diffs) ADD_FAILURE() << d;
    std::printf("  %-18s %3zu tensors identical to the script's\n", name.c_str(),
                entry.at("tensors").size());
  }
}

struct Variant {
  const char* name;
  const char* dit;  // file names ("" = the folder's component)
  const char* te;
  const char* vae;
  const char* reference;
};

void PrintTo(const Variant& v, std::ostream* os) {
  *os << v.name;
}

const Variant kVariants[] = {
    {"comfy_bf16", "dit_bf16", "te_bf16", "vae_ldm", "bf16"},
    {"all_in_one", "all_in_one", "all_in_one", "all_in_one", "bf16"},
    {"fp8_e4m3", "dit_fp8_e4m3", "", "", "fp8_e4m3"},
    {"fp8_e5m2", "dit_fp8_e5m2", "", "", "fp8_e5m2"},
    {"scaled_legacy", "dit_scaled_legacy", "", "", "scaled_tensor"},
    {"scaled_comfy_quant", "dit_scaled", "", "", "scaled_tensor"},
    {"scaled_rows_metadata", "dit_scaled_rows", "", "", "scaled_rows"},
    {"te_fp8_mixed", "", "te_fp8_mixed", "", "te_fp8_mixed"},
};

class SingleFileParity : public SingleFiles, public ::testing::WithParamInterface<Variant> {};

TEST_P(SingleFileParity, PipelineMatchesReference) {
  const Variant& v = GetParam();
  ModelPaths paths;
  paths.model_dir = model_dir();
  auto pick = [](const char* n) { return *n ? file(n) : std::string(); };
  paths.transformer_file = pick(v.dit);
  paths.text_encoder_file = pick(v.te);
  paths.vae_file = pick(v.vae);
  auto r = run(paths);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const std::string ref = test::single_file_data_dir() + "/" + v.reference;
  std::printf("variant %s (reference %s)\n", v.name, v.reference);
  for (int s = 0; s < turbo_request().steps; ++s) {
    const std::string k = std::to_string(s);
    auto want = test::load_npy(ref + "/dit_out_step" + k + ".npy");
    ASSERT_TRUE(want.ok());
    const double err = test::max_abs_diff(r->dumps["dit_out.step" + k], *want);
    std::printf("  dit_out.step%s max|diff| %.3g\n", k.c_str(), err);
    EXPECT_GE(err, 0.0);
    EXPECT_LE(err, kTolDit);
  }
  if (std::string(v.reference) == "te_fp8_mixed") {
    auto want = test::load_npy(ref + "/prompt_embeds_0.npy");
    ASSERT_TRUE(want.ok());
    const double err = test::max_abs_diff(r->dumps["prompt_embeds.0"], *want);
    std::printf("  prompt_embeds.0 max|diff| %.3g\n", err);
    EXPECT_LE(err, 2e-7);
  }
  auto img = test::load_npy(ref + "/image.npy");
  ASSERT_TRUE(img.ok());
  const double err = test::max_abs_diff(r->image, *img);
  const int worst = test::rgb8_max_diff(r->images[0].rgb, *img);
  std::printf("  image max|diff| %.3g, rgb8 max|diff| %d\n", err, worst);
  EXPECT_GE(err, 0.0);
  EXPECT_LE(err, kTolImage);
  EXPECT_LE(worst, 1);
}

INSTANTIATE_TEST_SUITE_P(, SingleFileParity, ::testing::ValuesIn(kVariants),
                         [](const ::testing::TestParamInfo<Variant>& p) {
                           return std::string(p.param.name);
                         });

// The scaled formats really are different models from the bf16 one (a test that cannot fail
// otherwise): their references differ from the bf16 reference by far more than the tolerance.
TEST_F(SingleFiles, FormatReferencesDiffer) {
  auto base = test::load_npy(test::single_file_data_dir() + "/bf16/image.npy");
  ASSERT_TRUE(base.ok());
  for (const char* r : {"fp8_e4m3", "fp8_e5m2", "scaled_tensor", "scaled_rows"}) {
    auto img = test::load_npy(test::single_file_data_dir() + "/" + r + "/image.npy");
    ASSERT_TRUE(img.ok());
    const double d = test::max_abs_diff(*img, *base);
    std::printf("  reference %-14s vs bf16: max|diff| %.3g\n", r, d);
    EXPECT_GT(d, 10 * kTolImage) << r;
  }
  // The FP8 text encoder barely moves the tiny model's image; its embeddings move clearly.
  auto e0 = test::load_npy(test::golden_dir("v_turbo") + "/prompt_embeds_0.npy");
  auto e1 = test::load_npy(test::single_file_data_dir() + "/te_fp8_mixed/prompt_embeds_0.npy");
  ASSERT_TRUE(e0.ok() && e1.ok());
  const double d = test::max_abs_diff(*e0, *e1);
  std::printf("  reference te_fp8_mixed embeddings vs bf16: max|diff| %.3g\n", d);
  EXPECT_GT(d, 1e-4);  // 500x the embedding tolerance of the parity test
}

// Each component of the all-in-one checkpoint is exactly the split file's.
TEST_F(SingleFiles, AllInOneComponentsEqualTheSplitFiles) {
  const std::pair<Component, const char*> parts[] = {{Component::kTransformer, "dit_bf16"},
                                                     {Component::kTextEncoder, "te_bf16"},
                                                     {Component::kVae, "vae_ldm"}};
  for (const auto& [c, split] : parts) {
    auto a = open_component_file(file("all_in_one"), c);
    auto b = open_component_file(file(split), c);
    ASSERT_TRUE(a.ok() && b.ok());
    std::vector<std::string> names = a->store.names();
    if (c == Component::kTransformer)  // the Lumina-2 leftover the DiT loader ignores
      names.erase(std::find(names.begin(), names.end(), "norm_final.weight"));
    EXPECT_EQ(names, b->store.names()) << component_name(c);
    for (const std::string& n : names) {
      auto x = a->store.get(n);
      auto y = b->store.get(n);
      ASSERT_TRUE(x.ok() && y.ok());
      ASSERT_EQ(x->nbytes(), y->nbytes());
      EXPECT_EQ(std::memcmp(x->data(), y->data(), x->nbytes()), 0) << n;
    }
  }
}

// The FP8 bytes behind each dequantised weight stay reachable for an FP8 weight path.
TEST_F(SingleFiles, ScaledWeightsKeepTheirFp8Bytes) {
  ModelPaths paths;
  paths.model_dir = model_dir();
  paths.transformer_file = file("dit_scaled");
  auto src = ModelSource::open(paths);
  ASSERT_TRUE(src.ok()) << src.status().to_string();
  auto folder_te = src->open_component(Component::kTextEncoder);
  ASSERT_TRUE(folder_te.ok());
  EXPECT_TRUE(folder_te->fp8_index->names().empty());
  EXPECT_FALSE(folder_te->fp8.any());
  auto cw = src->open_component(Component::kTransformer);
  ASSERT_TRUE(cw.ok()) << cw.status().to_string();
  EXPECT_EQ(cw->fp8.format, "comfy quant");
  EXPECT_EQ(cw->fp8.input_scales, 2);
  auto raw = SafetensorsFile::open(file("dit_scaled"));
  ASSERT_TRUE(raw.ok());
  const std::vector<std::string> names = cw->fp8_index->names();
  EXPECT_EQ(static_cast<int>(names.size()), cw->fp8.scaled_weights);
  EXPECT_GE(names.size(), 20u);
  for (const std::string& n : names) {
    auto sw = cw->fp8_index->get(n);
    ASSERT_TRUE(sw.ok());
    auto file_bytes = (*raw)->tensor(n);
    ASSERT_TRUE(file_bytes.ok());
    EXPECT_EQ(sw->data.dtype(), DType::kF8E4M3);
    EXPECT_EQ(std::memcmp(sw->data.data(), file_bytes->data(), file_bytes->nbytes()), 0) << n;
    auto deq = dequantize_f32(*sw, n);
    auto stored = cw->store.get(n);
    ASSERT_TRUE(deq.ok() && stored.ok());
    EXPECT_EQ(test::max_abs_diff(*deq, *stored), 0.0) << n;
  }
}

// Without a model folder: configs inferred from the shapes (the tiny model's head_dim 16 gets
// axes_dims [4, 6, 6], the published proportions, where its config.json says [8, 4, 4]), the
// published scheduler, the tokenizer given apart. The result equals the folder model with those
// configs written into its config.json files, exactly.
TEST_F(SingleFiles, StandaloneFilesEqualTheFolderWithTheInferredConfigs) {
  ModelPaths alone;
  alone.transformer_file = file("dit_bf16");
  alone.text_encoder_file = file("te_bf16");
  alone.vae_file = file("vae_ldm");
  alone.tokenizer_dir = model_dir() + "/tokenizer";
  auto src = ModelSource::open(alone);
  ASSERT_TRUE(src.ok()) << src.status().to_string();
  EXPECT_EQ(src->config_origin(Component::kTransformer), "inferred from the tensor shapes");
  EXPECT_EQ(src->configs().transformer.axes_dims, (std::vector<int>{4, 6, 6}));
  EXPECT_EQ(src->configs().transformer.axes_lens, (std::vector<int>{1536, 512, 512}));
  EXPECT_EQ(src->configs().scheduler.shift, 3.0f);
  auto a = run(alone);
  ASSERT_TRUE(a.ok()) << a.status().to_string();

  const fs::path copy = fs::path(dir_) / "inferred_model";
  fs::copy(model_dir(), copy, fs::copy_options::recursive);
  const std::string tf = (copy / "transformer" / "config.json").string();
  auto cfg = json_util::read_file(tf);
  ASSERT_TRUE(cfg.ok());
  (*cfg)["axes_dims"] = {4, 6, 6};
  (*cfg)["axes_lens"] = {1536, 512, 512};
  std::ofstream(tf) << cfg->dump();
  ModelPaths folder;
  folder.model_dir = copy.string();
  auto b = run(folder);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ(test::max_abs_diff(a->image, b->image), 0.0);
  // ... and it is not the golden model (whose axes_dims differ): the inference mattered.
  auto golden = test::load_npy(test::golden_dir("v_turbo") + "/image.npy");
  ASSERT_TRUE(golden.ok());
  EXPECT_GT(test::max_abs_diff(a->image, *golden), 1e-3);
}

TEST_F(SingleFiles, MismatchedOrWrongFilesAreNamed) {
  ModelPaths p;
  p.model_dir = model_dir();
  p.vae_file = file("dit_bf16");  // a transformer given as the VAE
  auto r = ModelSource::open(p);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(
      r.status().message().find(file("dit_bf16") + ": holds no vae tensors (it holds transformer)"),
      std::string::npos)
      << r.status().message();

  // A text encoder of another model (v_cfg: hidden 48) with v_turbo's transformer.
  const std::string other = dir_ + "/other_te.safetensors";
  {
    auto ws = WeightStore::open(test::golden_dir("v_cfg") + "/model/text_encoder");
    ASSERT_TRUE(ws.ok());
    std::vector<std::pair<std::string, Tensor>> t;
    for (const std::string& n : ws->names()) t.emplace_back("model." + n, *ws->get(n));
    ASSERT_TRUE(write_safetensors(other, t).ok());
  }
  p = ModelPaths{};
  p.model_dir = model_dir();
  p.text_encoder_file = other;
  r = ModelSource::open(p);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("has hidden size 48"), std::string::npos)
      << r.status().message();

  // A transformer file missing one block tensor: the loader names it.
  const std::string cut = dir_ + "/cut.safetensors";
  {
    auto f = SafetensorsFile::open(file("dit_bf16"));
    ASSERT_TRUE(f.ok());
    std::vector<std::pair<std::string, Tensor>> t;
    for (const auto& info : (*f)->tensors())
      if (info.name != "layers.1.feed_forward.w2.weight")
        t.emplace_back(info.name, *(*f)->tensor(info.name));
    ASSERT_TRUE(write_safetensors(cut, t).ok());
  }
  p = ModelPaths{};
  p.model_dir = model_dir();
  p.transformer_file = cut;
  const std::vector<Status> errors = TextToImage::check(p);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].message().find("'layers.1.feed_forward.w2.weight'"), std::string::npos)
      << errors[0].message();

  // Files without a folder need all three and a tokenizer.
  p = ModelPaths{};
  p.transformer_file = file("dit_bf16");
  p.tokenizer_dir = model_dir() + "/tokenizer";
  r = ModelSource::open(p);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("missing: text-encoder file, vae file"), std::string::npos)
      << r.status().message();
}

// The library takes the same through EngineOptions (the CLI fills them from its flags).
TEST_F(SingleFiles, EngineOptionsTakeSingleFiles) {
  EngineOptions o;
  o.dit_file = file("dit_bf16");
  o.text_encoder_file = file("te_bf16");
  o.vae_file = file("vae_ldm");
  o.device = "cpu";
  o.threads = 2;
  auto bad = Engine::load(o);  // no folder and no tokenizer
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("tokenizer_dir"), std::string::npos);
  o.tokenizer_dir = model_dir() + "/tokenizer";
  auto engine = Engine::load(o);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  auto got = (*engine)->generate(turbo_request());
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  ModelPaths alone;
  alone.transformer_file = o.dit_file;
  alone.text_encoder_file = o.text_encoder_file;
  alone.vae_file = o.vae_file;
  alone.tokenizer_dir = o.tokenizer_dir;
  auto want = run(alone);
  ASSERT_TRUE(want.ok());
  EXPECT_EQ(got->images[0].rgb, want->images[0].rgb);
  o = EngineOptions{};
  o.dit_file = file("dit_bf16");
  o.device = "cpu";
  bad = Engine::load(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("model_dir: no model folder given"), std::string::npos);
}

// `--weights fp8` (the FP8 weight rows of model/common/linear.h) on a scaled FP8 file with per-row
// scales: the rows are requantised from the dequantised weights with the same recipe, so they
// come back to the file's FP8 codes and scales; the DiT's output then equals the dequantised
// model's to float32 rounding. The same option on the bf16 file loses precision (the control:
// a difference this test would see if the FP8 rows did not keep the file's codes).
TEST_F(SingleFiles, Fp8WeightRowsOfAScaledFileKeepItsCodes) {
  std::unique_ptr<Backend> be = make_cpu_backend(2);
  auto cfg = ModelSource::open({model_dir(), file("dit_scaled_rows")});
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  const TransformerConfig& tc = cfg->configs().transformer;
  Tensor lat = Tensor::host(DType::kF32, {1, 16, 8, 8});
  Tensor cap = Tensor::host(DType::kF32, {7, tc.cap_feat_dim});
  for (int64_t i = 0; i < lat.numel(); ++i) lat.data_as<float>()[i] = std::sin(0.37f * i);
  for (int64_t i = 0; i < cap.numel(); ++i) cap.data_as<float>()[i] = std::cos(0.11f * i);
  auto forward = [&](const std::string& f, bool fp8) {
    auto cw = open_component_file(f, Component::kTransformer);
    EXPECT_TRUE(cw.ok());
    WeightPlacement place;
    place.fp8_weights = fp8;
    auto dit = ZImageDiT::load(tc, cw->store, *be, place);
    EXPECT_TRUE(dit.ok()) << dit.status().to_string();
    Tensor out;
    auto l = be->upload(lat, DType::kF32);
    auto c = be->upload(cap, be->act_dtype());
    EXPECT_TRUE(l.ok() && c.ok());
    EXPECT_TRUE((*dit)->forward(*l, {0.4f}, {*c}, out).ok());
    Tensor host = Tensor::host(DType::kF32, out.shape());
    EXPECT_TRUE(be->download(out, host).ok());
    return host;
  };
  const double scaled = test::max_abs_diff(forward(file("dit_scaled_rows"), true),
                                           forward(file("dit_scaled_rows"), false));
  const double plain =
      test::max_abs_diff(forward(file("dit_bf16"), true), forward(file("dit_bf16"), false));
  std::printf("  DiT output, FP8 rows vs dequantised: scaled-rows file %.3g, bf16 file %.3g\n",
              scaled, plain);
  EXPECT_GE(scaled, 0.0);
  EXPECT_LT(scaled, 1e-5);
  EXPECT_GT(plain, 100 * std::max(scaled, 1e-7));
}

// GGUF files (tests/data/gguf, made by the gguf package) given as single files: the same image
// as a folder whose transformer/ and text_encoder/ hold them (GgufModels tests that folder
// against the safetensors weights).
TEST_F(SingleFiles, GgufFilesWorkAsSingleFiles) {
  const std::string gguf = std::string(ZIMAGE_GGUF_DIR) + "/models";
  const fs::path folder = fs::path(dir_) / "gguf_folder";
  fs::copy(model_dir(), folder, fs::copy_options::recursive);
  for (const auto& [component, f] :
       {std::pair{"transformer", "dit.gguf"}, std::pair{"text_encoder", "te.gguf"}}) {
    for (const auto& e : fs::directory_iterator(folder / component))
      if (e.path().extension() == ".safetensors") fs::remove(e.path());
    fs::copy_file(gguf + "/" + f, folder / component / f);
  }
  ModelPaths files;
  files.model_dir = model_dir();
  files.transformer_file = gguf + "/dit.gguf";
  files.text_encoder_file = gguf + "/te.gguf";
  auto a = run(files);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  ModelPaths in_folder;
  in_folder.model_dir = folder.string();
  auto b = run(in_folder);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ(test::max_abs_diff(a->image, b->image), 0.0);
  EXPECT_TRUE(TextToImage::check_file(gguf + "/dit.gguf").empty());
}

// Single files with the other load-time features: a LoRA merged into a ComfyUI-named (and a
// scaled FP8) transformer file, and image-to-image whose VAE encoder comes from the LDM-named VAE
// file. Each equals the same request on the folder model.
TEST_F(SingleFiles, LoraAndImageToImageWorkOnSingleFiles) {
  auto engine = [&](const std::string& dit, const std::string& vae, bool lora) {
    EngineOptions o;
    o.model_dir = model_dir();
    o.dit_file = dit;
    o.vae_file = vae;
    o.device = "cpu";
    o.threads = 2;
    if (lora) o.loras = {{std::string(ZIMAGE_LORA_DIR) + "/kohya_qkv.safetensors", 1.0f}};
    auto e = Engine::load(o);
    EXPECT_TRUE(e.ok()) << e.status().to_string();
    return e.ok() ? std::move(e).value() : nullptr;
  };
  auto image = [](Engine* e, const GenerateRequest& r) {
    auto g = e->generate(r);
    EXPECT_TRUE(g.ok()) << g.status().to_string();
    return g.ok() ? g->images[0].rgb : std::vector<uint8_t>();
  };
  const GenerateRequest req = turbo_request();
  auto folder_lora = engine("", "", true);
  auto file_lora = engine(file("dit_bf16"), "", true);
  ASSERT_TRUE(folder_lora && file_lora);
  const std::vector<uint8_t> a = image(folder_lora.get(), req);
  EXPECT_EQ(a, image(file_lora.get(), req));
  auto scaled_lora = engine(file("dit_scaled"), "", true);
  ASSERT_TRUE(scaled_lora);
  EXPECT_NE(a, image(scaled_lora.get(), req));  // the FP8 weights under the same LoRA

  GenerateRequest i2i = req;
  Image init;
  init.width = req.width;
  init.height = req.height;
  for (int i = 0; i < init.width * init.height * 3; ++i)
    init.rgb.push_back(static_cast<uint8_t>((i * 7) % 251));
  i2i.init_image = init;
  i2i.strength = 0.6;
  auto folder = engine("", "", false);
  auto file_vae = engine("", file("vae_ldm"), false);
  ASSERT_TRUE(folder && file_vae);
  const std::vector<uint8_t> b = image(folder.get(), i2i);
  ASSERT_FALSE(b.empty());
  EXPECT_EQ(b, image(file_vae.get(), i2i));
}

test::ProgramRun zimage(std::vector<std::string> args) {
  test::ProgramSpec spec;
  spec.exe = ZIMAGE_CLI_PATH;
  spec.args = std::move(args);
  return test::run_program(spec);
}

// `zimage generate --model DIR --dit F --text-encoder F --vae F` writes diffusers' image (within
// 1/255), and the three files alone (built-in tokenizer) write the standalone pipeline's image.
TEST_F(SingleFiles, CliGeneratesFromSingleFiles) {
  const GenerateRequest req = turbo_request();
  const std::vector<std::string> common = {"--prompt",  req.prompts[0],
                                           "--width",   std::to_string(req.width),
                                           "--height",  std::to_string(req.height),
                                           "--steps",   std::to_string(req.steps),
                                           "--seed",    std::to_string(req.seed),
                                           "--device",  "cpu",
                                           "--threads", "2"};
  auto with = [&](std::vector<std::string> a) {
    a.insert(a.begin(), "generate");
    a.insert(a.end(), common.begin(), common.end());
    return a;
  };
  const std::string out1 = dir_ + "/cli_folder.png", out2 = dir_ + "/cli_alone.png";
  test::ProgramRun r =
      zimage(with({"--model", model_dir(), "--dit", file("dit_scaled"), "--text-encoder",
                   file("te_bf16"), "--vae", file("vae_ldm"), "-o", out1}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto png = read_png(out1);
  ASSERT_TRUE(png.ok()) << png.status().to_string();
  auto ref = test::load_npy(test::single_file_data_dir() + "/scaled_tensor/image.npy");
  ASSERT_TRUE(ref.ok());
  const int worst = test::rgb8_max_diff(png->rgb, *ref);
  std::printf("  CLI --model + scaled FP8 --dit: PNG vs diffusers max|diff| %d/255\n", worst);
  EXPECT_LE(worst, 1);

  r = zimage(with({"--dit", file("dit_bf16"), "--text-encoder", file("te_bf16"), "--vae",
                   file("vae_ldm"), "-o", out2}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ModelPaths alone;
  alone.transformer_file = file("dit_bf16");
  alone.text_encoder_file = file("te_bf16");
  alone.vae_file = file("vae_ldm");
  alone.tokenizer_dir = model_dir() + "/tokenizer";
  auto a = run(alone);
  ASSERT_TRUE(a.ok());
  auto png2 = read_png(out2);
  ASSERT_TRUE(png2.ok());
  EXPECT_EQ(png2->rgb, a->images[0].rgb);

  // Usage errors: exit 2, the flag named.
  r = zimage(with({"--dit", file("dit_bf16"), "-o", out2}));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("give all three"), std::string::npos) << r.err;
  r = zimage(with({"--model", model_dir(), "--vae", dir_ + "/nope.safetensors", "-o", out2}));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--vae: '" + dir_ + "/nope.safetensors' does not exist"), std::string::npos)
      << r.err;
  r = zimage(with({"--model", model_dir(), "--vae", file("dit_bf16"), "-o", out2}));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("holds no vae tensors"), std::string::npos) << r.err;
}

TEST_F(SingleFiles, InfoDescribesASingleFile) {
  test::ProgramRun r = zimage({"info", "--json", file("all_in_one")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("kind"), "weights");
  EXPECT_EQ(j.at("valid"), true);
  const auto& c = j.at("single_file").at("components");
  EXPECT_EQ(c.at("transformer").at("prefix"), "model.diffusion_model.");
  EXPECT_EQ(c.at("transformer").at("config").at("dim"), 64);
  EXPECT_EQ(c.at("text_encoder").at("config").at("hidden_size"), 32);
  EXPECT_EQ(c.at("vae").at("config").at("block_out_channels"), nlohmann::json({32, 64}));
  r = zimage({"info", file("dit_scaled_legacy")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("comfy scaled_fp8 (legacy)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("check: ok"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace zimage

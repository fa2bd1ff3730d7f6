// `zimage convert` (io/writers/convert.h) on the tiny golden model (bf16 weights):
//   bf16   the three ComfyUI single files load and give exactly the folder's image;
//   fp8    the DiT file holds byte for byte what tools/make_single_file_cases.py writes for
//          ComfyUI's current scaled format (the test helper that mirrors it), so the pipeline on
//          it matches diffusers on the dequantised weights (the single-file reference) within
//          the folder tolerance; fp8-rows likewise against the per-row file;
//   GGUF   every DiT type loads (kept packed), each quantised weight is within its type's stated
//          round-trip error of the source, and the DiT output stays close to the folder's;
//   an output that is an input is refused; progress reaches the total.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "common/npy.h"
#include "common/single_files.h"
#include "golden_models_util.h"
#include "io/writers/convert.h"
#include "io/gguf/gguf_quants.h"
#include "io/model/model_source.h"
#include "io/writers/random_model.h"
#include "io/weights/safetensors.h"
#include "io/weights/weights.h"
#include "pipeline/text_to_image.h"

namespace zimage {
namespace {

namespace fs = std::filesystem;

std::string model_dir() {
  return test::golden_dir("v_turbo") + "/model";
}

GenerateRequest case_request() {
  std::ifstream f(test::golden_dir("v_turbo") + "/case.json");
  const nlohmann::json s = nlohmann::json::parse(f);
  GenerateRequest r;
  for (const auto& p : s.at("prompts")) r.prompts.push_back(p.get<std::string>());
  r.width = s.at("W").get<int>();
  r.height = s.at("H").get<int>();
  r.steps = s.at("steps").get<int>();
  r.guidance = s.at("guidance").get<float>();
  r.seed = s.at("seed").get<uint64_t>();
  return r;
}

Result<Tensor> image_of(const ModelPaths& paths) {
  std::unique_ptr<Backend> be = make_cpu_backend(2);
  ZI_ASSIGN_OR_RETURN(auto pipe, TextToImage::load(paths, *be));
  ZI_ASSIGN_OR_RETURN(TextToImageOutput out, pipe->run(case_request(), {}));
  return out.image;
}

class Convert : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = (fs::temp_directory_path() / ("zimage_convert_" + std::to_string(getpid()))).string();
    fs::create_directories(dir_);
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  static std::vector<ConvertedFile> convert(const ModelPaths& in, const std::string& format,
                                            const std::string& out, bool dit_only = false) {
    auto src = ModelSource::open(in);
    EXPECT_TRUE(src.ok()) << src.status().to_string();
    if (!src.ok()) return {};
    ConvertOptions o;
    o.format = format;
    o.out_dir = out;
    o.threads = 2;
    o.text_encoder = o.vae = !dit_only;
    uint64_t last_done = 0, last_total = 1;
    o.progress = [&](const std::string&, uint64_t done, uint64_t total) {
      last_done = done;
      last_total = total;
    };
    auto files = convert_model(*src, o);
    EXPECT_TRUE(files.ok()) << files.status().to_string();
    EXPECT_EQ(last_done, last_total);
    return files.ok() ? *files : std::vector<ConvertedFile>{};
  }
  static ModelPaths folder() {
    ModelPaths p;
    p.model_dir = model_dir();
    return p;
  }
  static std::string dir_;
};
std::string Convert::dir_;

std::string path_of(const std::vector<ConvertedFile>& files, const std::string& component) {
  for (const ConvertedFile& f : files)
    if (f.component == component) return f.path;
  return "";
}

TEST_F(Convert, Bf16SingleFilesGiveTheFolderImageExactly) {
  const auto files = convert(folder(), "bf16", dir_ + "/bf16");
  ASSERT_EQ(files.size(), 3u);
  ModelPaths p = folder();
  p.transformer_file = path_of(files, "transformer");
  p.text_encoder_file = path_of(files, "text_encoder");
  p.vae_file = path_of(files, "vae");
  // The files stand alone too (configs inferred from the shapes) and are what the loader expects.
  auto a = image_of(p);
  auto b = image_of(folder());
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  const double err = test::max_abs_diff(*a, *b);
  std::printf("  bf16 single files vs folder: image max|diff| %.3g\n", err);
  EXPECT_EQ(err, 0.0);
  for (const ConvertedFile& f : files) EXPECT_EQ(f.quantized, 0) << f.path;
}

// Byte-for-byte against the files the single-file tests write as ComfyUI does.
TEST_F(Convert, Fp8FilesEqualComfyUIsScaledFormat) {
  auto cases = test::write_single_file_cases(model_dir(), dir_ + "/cases");
  ASSERT_TRUE(cases.ok()) << cases.status().to_string();
  for (const auto& [format, ref_name, reference] :
       {std::tuple{"fp8", "dit_scaled", "scaled_tensor"},
        std::tuple{"fp8-rows", "dit_scaled_rows", "scaled_rows"}}) {
    SCOPED_TRACE(format);
    const auto files = convert(folder(), format, dir_ + "/" + format, true);
    ASSERT_EQ(files.size(), 1u);
    auto got = SafetensorsFile::open(files[0].path);
    auto want = SafetensorsFile::open(cases->at(ref_name));
    ASSERT_TRUE(got.ok() && want.ok());
    int same = 0, quantised = 0;
    for (const auto& t : (*got)->tensors()) {
      auto g = (*got)->tensor(t.name);
      auto w = (*want)->tensor(t.name);
      ASSERT_TRUE(g.ok()) << t.name;
      ASSERT_TRUE(w.ok()) << "the reference has no " << t.name;
      ASSERT_EQ(g->dtype(), w->dtype()) << t.name;
      ASSERT_EQ(g->numel(), w->numel()) << t.name;
      EXPECT_EQ(std::memcmp(g->data(), w->data(), g->nbytes()), 0) << t.name;
      same += std::memcmp(g->data(), w->data(), g->nbytes()) == 0;
      quantised += g->dtype() == DType::kF8E4M3;
    }
    std::printf("  %s: %d tensors (%d FP8) equal the ComfyUI-format reference file\n", format, same,
                quantised);
    EXPECT_EQ(quantised, files[0].quantized);
    EXPECT_GT(quantised, 0);
    // Hence the pipeline on it matches diffusers on the dequantised weights.
    ModelPaths p = folder();
    p.transformer_file = files[0].path;
    auto img = image_of(p);
    ASSERT_TRUE(img.ok()) << img.status().to_string();
    auto ref = test::load_npy(test::single_file_data_dir() + "/" + reference + "/image.npy");
    ASSERT_TRUE(ref.ok());
    const double err = test::max_abs_diff(*img, *ref);
    std::printf("  %s pipeline vs diffusers on the dequantised weights: image max|diff| %.3g\n",
                format, err);
    EXPECT_LE(err, 3e-5);
  }
}

TEST_F(Convert, GgufDiTsLoadAndStayWithinTheirQuantisationError) {
  const golden::Case c = golden::load_case("v_turbo");
  auto folder_ws = WeightStore::open(model_dir() + "/transformer");
  ASSERT_TRUE(folder_ws.ok());
  auto base = golden::load_dit(c);
  ASSERT_NE(base, nullptr);
  const Tensor lat = golden::to_device(golden::npy(c.dir + "/init_noise.npy"));
  const std::vector<Tensor> caps{golden::to_device(golden::npy(c.dir + "/prompt_embeds_0.npy"))};
  Tensor ref;
  ASSERT_TRUE(base->forward(lat, {0.5f}, caps, ref).ok());
  const Tensor href = golden::to_host(ref);
  // Relative RMS error of the quantised block weights, and the DiT output's cosine, per type.
  const std::tuple<const char*, double, double> types[] = {{"q8_0", 0.01, 0.9999},
                                                           {"q6_k", 0.03, 0.999},
                                                           {"q5_k", 0.06, 0.99},
                                                           {"q4_k", 0.12, 0.98},
                                                           {"q4_0", 0.15, 0.98}};
  for (const auto& [type, rms_bound, cos_bound] : types) {
    SCOPED_TRACE(type);
    const auto files = convert(folder(), type, dir_ + "/gguf", true);
    ASSERT_EQ(files.size(), 1u);
    auto ws = WeightStore::open(files[0].path);
    ASSERT_TRUE(ws.ok()) << ws.status().to_string();
    // The fused qkv against the folder's q|k|v rows, the feed-forward weights by name.
    double se = 0, sx = 0;
    int packed = 0;
    for (const std::string& n : ws->names()) {
      if (!ws->is_packed(n)) continue;
      auto pw = ws->peek_packed(n);
      ASSERT_TRUE(pw.ok());
      if (!ggml_type_is_quantized(static_cast<GgmlType>(pw->ggml_type))) continue;
      ++packed;
      auto q = ws->get(n);
      ASSERT_TRUE(q.ok());
      std::vector<std::string> src;
      std::string dn = n;
      if (dn.find(".attention.qkv.weight") != std::string::npos) {
        const std::string b = dn.substr(0, dn.size() - std::string("qkv.weight").size());
        src = {b + "to_q.weight", b + "to_k.weight", b + "to_v.weight"};
      } else {
        const size_t at = dn.find(".attention.out.");
        if (at != std::string::npos) dn.replace(at, 15, ".attention.to_out.0.");
        src = {dn};
      }
      int64_t off = 0;
      for (const std::string& s : src) {
        auto w = folder_ws->get(s);
        ASSERT_TRUE(w.ok()) << s;
        std::vector<float> f(static_cast<size_t>(w->numel()));
        ASSERT_TRUE(convert_to_f32(w->dtype(), w->data(), f.data(), f.size()));
        for (size_t i = 0; i < f.size(); ++i) {
          const double e = double{q->data_as<float>()[off + static_cast<int64_t>(i)]} - f[i];
          se += e * e;
          sx += double{f[i]} * f[i];
        }
        off += w->numel();
      }
      ASSERT_EQ(off, q->numel()) << n;
    }
    const double rms = std::sqrt(se / sx);
    // The DiT from the GGUF file (its linears kept packed).
    ModelPaths p = folder();
    p.transformer_file = files[0].path;
    auto src = ModelSource::open(p);
    ASSERT_TRUE(src.ok()) << src.status().to_string();
    auto gws = src->open_weights(Component::kTransformer);
    ASSERT_TRUE(gws.ok());
    auto dit = ZImageDiT::load(src->configs().transformer, *gws, golden::cpu());
    ASSERT_TRUE(dit.ok()) << dit.status().to_string();
    Tensor y;
    ASSERT_TRUE((*dit)->forward(lat, {0.5f}, caps, y).ok());
    const Tensor hy = golden::to_host(y);
    double dot = 0, na = 0, nb = 0;
    for (int64_t i = 0; i < hy.numel(); ++i) {
      const double a = hy.data_as<float>()[i], b = href.data_as<float>()[i];
      dot += a * b, na += a * a, nb += b * b;
    }
    const double cos = dot / std::sqrt(na * nb);
    std::printf(
        "  %-5s %d packed tensors, weight relative RMS error %.4f, DiT output cosine %.6f, "
        "%d linears kept packed\n",
        type, packed, rms, cos, (*dit)->kept_quantized().kept);
    EXPECT_EQ(packed, files[0].quantized);
    EXPECT_GT(packed, 0);
    EXPECT_GT(rms, 0.0);
    EXPECT_LE(rms, rms_bound);
    EXPECT_GE(cos, cos_bound);
    // w2's rows are ffn_hidden() = 170 wide in the tiny model: no block type fits them (BF16).
    const int per_block = c.dit.ffn_hidden() % 32 == 0 ? 4 : 3;
    EXPECT_EQ((*dit)->kept_quantized().kept, per_block * (*dit)->num_blocks());
  }
}

// The tiny model's rows (64 wide) are too short for the K-quants (256-element super-blocks): a
// random DiT 768 wide (feed-forward 2048) is converted too, so Q4_K / Q5_K / Q6_K really appear.
TEST_F(Convert, KQuantGgufOnAWiderDiT) {
  const golden::Case c = golden::load_case("v_turbo");
  RandomModelOptions ro;
  ro.dit = c.dit;
  ro.dit.dim = 768;
  ro.dit.n_heads = ro.dit.n_kv_heads = 6;
  ro.dit.axes_dims = {32, 48, 48};
  ro.dit.n_layers = 1;
  ro.dit.n_refiner_layers = 1;
  ro.text_encoder = c.te;
  ro.vae = c.vae;
  ro.tokenizer_dir = model_dir() + "/tokenizer";
  ro.seed = 5;
  ro.threads = 2;
  const std::string wide = dir_ + "/wide";
  ASSERT_TRUE(write_random_model(wide, ro).ok());
  ModelPaths fp;
  fp.model_dir = wide;
  auto fsrc = ModelSource::open(fp);
  ASSERT_TRUE(fsrc.ok()) << fsrc.status().to_string();
  auto fws = fsrc->open_weights(Component::kTransformer);
  ASSERT_TRUE(fws.ok());
  auto base = ZImageDiT::load(fsrc->configs().transformer, *fws, golden::cpu());
  ASSERT_TRUE(base.ok()) << base.status().to_string();
  Tensor lat_h = Tensor::host(DType::kF32, {1, 16, 8, 8});
  Tensor cap_h = Tensor::host(DType::kF32, {8, c.dit.cap_feat_dim});
  for (int64_t i = 0; i < lat_h.numel(); ++i)
    lat_h.data_as<float>()[i] = std::sin(0.37f * static_cast<float>(i));
  for (int64_t i = 0; i < cap_h.numel(); ++i)
    cap_h.data_as<float>()[i] = std::cos(0.11f * static_cast<float>(i));
  const Tensor lat = golden::to_device(lat_h);
  const std::vector<Tensor> caps{golden::to_device(cap_h)};
  Tensor ref;
  ASSERT_TRUE((*base)->forward(lat, {0.5f}, caps, ref).ok());
  const Tensor href = golden::to_host(ref);
  for (const auto& [type, name, cos_bound] :
       {std::tuple{"q4_k", "Q4_K", 0.98}, std::tuple{"q5_k", "Q5_K", 0.99},
        std::tuple{"q6_k", "Q6_K", 0.995}}) {
    SCOPED_TRACE(type);
    const auto files = convert(fp, type, dir_ + "/wide_gguf", true);
    ASSERT_EQ(files.size(), 1u);
    ModelPaths p = fp;
    p.transformer_file = files[0].path;
    auto src = ModelSource::open(p);
    ASSERT_TRUE(src.ok()) << src.status().to_string();
    auto ws = src->open_weights(Component::kTransformer);
    ASSERT_TRUE(ws.ok());
    auto dit = ZImageDiT::load(src->configs().transformer, *ws, golden::cpu());
    ASSERT_TRUE(dit.ok()) << dit.status().to_string();
    const KeptQuantStats& k = (*dit)->kept_quantized();
    Tensor y;
    ASSERT_TRUE((*dit)->forward(lat, {0.5f}, caps, y).ok());
    const Tensor hy = golden::to_host(y);
    double dot = 0, na = 0, nb = 0;
    for (int64_t i = 0; i < hy.numel(); ++i) {
      const double a = hy.data_as<float>()[i], b = href.data_as<float>()[i];
      dot += a * b, na += a * a, nb += b * b;
    }
    const double cos = dot / std::sqrt(na * nb);
    std::printf("  %s: %s; DiT output cosine to the bf16 folder %.6f\n", type, k.describe().c_str(),
                cos);
    EXPECT_EQ(k.kinds.count(name), 1u) << k.describe();
    EXPECT_GE(k.kinds.count(name) ? k.kinds.at(name) : 0, 3 * (*dit)->num_blocks());
    EXPECT_GE(cos, cos_bound);
    EXPECT_LT(cos, 1.0);
  }
}

TEST_F(Convert, RefusesToOverwriteAnInput) {
  const auto files = convert(folder(), "bf16", dir_ + "/again", true);
  ASSERT_EQ(files.size(), 1u);
  ModelPaths p = folder();
  p.transformer_file = files[0].path;
  auto src = ModelSource::open(p);
  ASSERT_TRUE(src.ok());
  ConvertOptions o;
  o.format = "bf16";
  o.out_dir = dir_ + "/again";
  o.text_encoder = o.vae = false;
  auto r = convert_model(*src, o);
  ASSERT_FALSE(r.ok());
  std::printf("  %s\n", r.status().to_string().c_str());
  EXPECT_NE(r.status().to_string().find("is an input file"), std::string::npos);
  o.format = "q3_k";
  r = convert_model(*src, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().to_string().find("--format 'q3_k'"), std::string::npos);
}

}  // namespace
}  // namespace zimage

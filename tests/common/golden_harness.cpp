// The golden-test harness: see golden_harness.h.
#include "common/golden_harness.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/controlnet_model.h"
#include "common/npy.h"
#include "pipeline/text_to_image.h"

namespace zimage::test {
namespace {

namespace fs = std::filesystem;

// The fields every family shares: prompts, negative prompt, steps, guidance, seed.
void read_common(const nlohmann::json& s, GenerateRequest& r) {
  for (const auto& p : s.at("prompts")) r.prompts.push_back(p.get<std::string>());
  if (s.contains("neg") && !s.at("neg").is_null())
    r.negative_prompt = s.at("neg").get<std::string>();
  r.steps = s.at("steps").get<int>();
  r.guidance = s.at("guidance").get<float>();
  r.seed = s.at("seed").get<uint64_t>();
}

void read_text_to_image(const nlohmann::json& s, GenerateRequest& r) {
  r.width = s.at("W").get<int>();
  r.height = s.at("H").get<int>();
  r.images_per_prompt = s.value("images_per_prompt", 1);
  r.cfg_truncation = s.value("cfg_truncation", 1.0f);
  if (s.contains("cfg_normalization")) {  // diffusers takes a bool or a float
    const auto& v = s.at("cfg_normalization");
    r.cfg_normalization = v.is_boolean() ? (v.get<bool>() ? 1.0f : 0.0f) : v.get<float>();
  }
  r.max_sequence_length = s.value("max_sequence_length", 512);
}

// An input image (or mask) of the case's inputs/ folder; false (and a failure) when unreadable.
bool load_input(const GoldenCase& c, const std::string& file,
                Result<Image> (*load)(const std::string&), std::optional<Image>& into) {
  auto r = load(c.dir + "/inputs/" + file);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  if (!r.ok()) return false;
  into = std::move(r).value();
  return true;
}

}  // namespace

std::string golden_root(GoldenFamily family) {
  switch (family) {
    case GoldenFamily::kTextToImage:
      return ZIMAGE_GOLDEN_DIR;
    case GoldenFamily::kImage:
      return std::string(ZIMAGE_GOLDEN_DIR) + "/image";
    case GoldenFamily::kControlNet:
      return controlnet_golden_root();
  }
  return ZIMAGE_GOLDEN_DIR;
}

std::vector<std::string> golden_case_names(GoldenFamily family) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(golden_root(family), ec)) {
    if (!e.is_directory() || !fs::exists(e.path() / "case.json")) continue;
    if (family == GoldenFamily::kTextToImage && !fs::exists(e.path() / "model")) continue;
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

size_t golden_archive_count(const std::string& subdir) {
  size_t archives = 0;
  for (const auto& e : fs::directory_iterator(std::string(ZIMAGE_TEST_DATA_DIR) + "/" + subdir)) {
    const std::string p = e.path().string();
    if (p.size() > 7 && p.compare(p.size() - 7, 7, ".tar.gz") == 0) ++archives;
  }
  return archives;
}

GoldenCase read_golden_case(GoldenFamily family, const std::string& name) {
  GoldenCase c;
  c.name = name;
  c.dir = golden_root(family) + "/" + name;
  std::ifstream f(c.dir + "/case.json");
  c.spec = nlohmann::json::parse(f);
  const nlohmann::json& s = c.spec;
  GenerateRequest& r = c.req;
  read_common(s, r);
  switch (family) {
    case GoldenFamily::kTextToImage:
      c.model = c.dir + "/model";
      read_text_to_image(s, r);
      break;
    case GoldenFamily::kImage:
      c.model = std::string(ZIMAGE_GOLDEN_DIR) + "/" + s.at("model").get<std::string>() + "/model";
      r.width = s.at("width").get<int>();
      r.height = s.at("height").get<int>();
      r.images_per_prompt = s.at("images_per_prompt").get<int>();
      if (!s.at("strength").is_null()) r.strength = s.at("strength").get<double>();
      c.inputs_ok = load_input(c, s.at("init").get<std::string>(), image_load, r.init_image);
      if (!s.at("mask").is_null())
        c.inputs_ok &= load_input(c, s.at("mask").get<std::string>(), mask_load, r.mask);
      break;
    case GoldenFamily::kControlNet:
      c.model = controlnet_model_dir();
      r.width = s.at("width").get<int>();
      r.height = s.at("height").get<int>();
      r.images_per_prompt = s.at("images_per_prompt").get<int>();
      r.control_scale = s.at("scale").get<float>();
      c.inputs_ok = load_input(c, s.at("control").get<std::string>(), image_load, r.control_image);
      if (!s.at("init").is_null()) {  // ControlNet inpainting: an image and its mask
        c.inputs_ok &= load_input(c, s.at("init").get<std::string>(), image_load, r.init_image);
        c.inputs_ok &= load_input(c, s.at("mask").get<std::string>(), mask_load, r.mask);
      }
      break;
  }
  return c;
}

GenerateRequest turbo_request() {
  return read_golden_case(GoldenFamily::kTextToImage, "v_turbo").req;
}

Tensor load_reference(const std::string& path) {
  auto t = load_npy(path);
  EXPECT_TRUE(t.ok()) << path << ": " << t.status().to_string();
  return t.ok() ? std::move(t).value() : Tensor();
}

// ---- capture ----

bool CaptureSink::wants(const std::string& name) const {
  for (const std::string& p : prefixes_)
    if (name.rfind(p, 0) == 0) return true;
  return false;
}

void CaptureSink::tensor(const std::string& name, Backend& be, const Tensor& t) {
  Tensor host = Tensor::host(DType::kF32, t.shape());
  if (!host.defined()) {
    ADD_FAILURE() << name << ": no host tensor for " << t.describe();
    return;
  }
  if (t.device() == Device::kCPU && t.dtype() == DType::kF32) {  // a host tensor on any backend
    std::memcpy(host.data(), t.data(), t.nbytes());
  } else if (const Status st = be.download(t, host); !st.ok()) {
    ADD_FAILURE() << name << ": " << st.to_string();
    return;
  }
  got_[name] = host;
}

Tensor CaptureSink::get(const std::string& name) const {
  auto it = got_.find(name);
  return it == got_.end() ? Tensor() : it->second;
}

// ---- comparison ----

std::string Diff::describe() const {
  std::ostringstream os;
  os << "max|diff| " << max_abs;
  if (worst >= 0) {
    os << " at [";
    int64_t rest = worst;
    std::vector<int64_t> index(shape.size());
    for (size_t d = shape.size(); d-- > 0;) {
      index[d] = shape[d] > 0 ? rest % shape[d] : 0;
      rest = shape[d] > 0 ? rest / shape[d] : 0;
    }
    for (size_t d = 0; d < index.size(); ++d) os << (d ? ", " : "") << index[d];
    os << "] (ours " << worst_ours << " vs " << worst_ref << ")";
  }
  os << ", rel " << rel << ", cosine " << cosine;
  return os.str();
}

Diff diff(const Tensor& ours, const Tensor& ref) {
  Diff d;
  d.shape = ref.shape();
  if (!ours.defined() || !ref.defined() || ours.numel() != ref.numel()) return d;
  std::vector<float> x(ours.numel()), y(ref.numel());
  convert_to_f32(ours.dtype(), ours.data(), x.data(), x.size());
  convert_to_f32(ref.dtype(), ref.data(), y.data(), y.size());
  double m = 0, dot = 0, xx = 0, yy = 0;
  bool nan = false;
  for (size_t i = 0; i < x.size(); ++i) {
    const double e = std::fabs(static_cast<double>(x[i]) - y[i]);  // as max_abs_diff
    if (std::isnan(e) && !nan) {
      nan = true;
      d.worst = static_cast<int64_t>(i);
    } else if (!nan && (d.worst < 0 || e > m)) {
      m = e;
      d.worst = static_cast<int64_t>(i);
    }
    d.ref_max_abs = std::max(d.ref_max_abs, static_cast<double>(std::fabs(y[i])));
    dot += static_cast<double>(x[i]) * y[i];
    xx += static_cast<double>(x[i]) * x[i];
    yy += static_cast<double>(y[i]) * y[i];
  }
  d.max_abs = nan ? INFINITY : m;
  d.rel = d.max_abs / std::max(d.ref_max_abs, 1e-12);
  d.cosine = xx > 0 && yy > 0 ? dot / std::sqrt(xx * yy) : 0.0;
  if (d.worst >= 0) {
    d.worst_ours = x[static_cast<size_t>(d.worst)];
    d.worst_ref = y[static_cast<size_t>(d.worst)];
  }
  return d;
}

double expect_stage_close(const std::string& what, const Tensor& ours, const Tensor& ref,
                          double tol, int label_width) {
  EXPECT_TRUE(ours.defined()) << what << ": not produced by the pipeline";
  EXPECT_TRUE(ref.defined()) << what << ": no reference";
  if (!ours.defined() || !ref.defined()) return INFINITY;
  // Same element count (diffusers' DiT output has a frame axis of 1: [B, C, 1, h, w]).
  EXPECT_EQ(ours.numel(), ref.numel())
      << what << ": ours " << ours.describe() << " vs " << ref.describe();
  const Diff d = diff(ours, ref);
  std::printf("  %-*s max|diff| %.3g  (tolerance %.0e)\n", label_width, what.c_str(), d.max_abs,
              tol);
  EXPECT_GE(d.max_abs, 0.0) << what;
  EXPECT_LE(d.max_abs, tol) << what << ": max |ours - diffusers| too large: " << d.describe();
  return d.max_abs;
}

Diff diff_captured(const CaptureSink& sink, const std::string& name, const std::string& ref_path,
                   const std::string& label) {
  auto ref = load_npy(ref_path);
  const Tensor ours = sink.get(name);
  if (!ref.ok() || !ours.defined() || ours.numel() != ref->numel()) {
    ADD_FAILURE() << label << ": no " << name
                  << (ref.ok() ? "" : " reference (" + ref.status().to_string() + ")");
    return Diff{};
  }
  return diff(ours, *ref);
}

int rgb8_max_diff(const std::vector<uint8_t>& rgb, const Tensor& ref, int64_t i) {
  const int64_t n = ref.defined() && ref.rank() > 0 ? ref.dim(0) : 0;
  const size_t per = n > 0 ? static_cast<size_t>(ref.numel() / n) : 0;
  if (i < 0 || i >= n || rgb.size() != per) {
    ADD_FAILURE() << "RGB8 image " << i << " of " << rgb.size() << " values against "
                  << ref.describe();
    return 256;
  }
  const float* r = ref.data_as<float>() + static_cast<size_t>(i) * per;
  int worst = 0;
  for (size_t k = 0; k < per; ++k)
    worst = std::max(worst, std::abs(int{rgb[k]} - int{to_u8(r[k])}));
  return worst;
}

// ---- the CLI on a case ----

std::vector<std::string> cli_generate_args(const GoldenCase& c, const std::string& output) {
  std::vector<std::string> a = {"generate",
                                "--model",
                                c.model,
                                "--device",
                                "cpu",
                                "--steps",
                                std::to_string(c.req.steps),
                                "--guidance",
                                std::to_string(c.req.guidance),
                                "--seed",
                                std::to_string(c.req.seed),
                                "--images-per-prompt",
                                std::to_string(c.req.images_per_prompt),
                                "--output",
                                output,
                                "--quiet"};
  for (const auto& p : c.req.prompts) a.insert(a.end(), {"--prompt", p});
  if (c.req.negative_prompt) a.insert(a.end(), {"--negative-prompt", *c.req.negative_prompt});
  return a;
}

std::string cli_png_path(const std::string& output, int64_t i, int64_t n) {
  if (n == 1) return output;
  return (fs::path(output).parent_path() / ("out_" + std::to_string(i) + ".png")).string();
}

// ---- running a case ----

std::optional<TextToImageOutput> run_captured(TextToImage& pipe, const GenerateRequest& req,
                                              CaptureSink& sink) {
  TextToImageHooks hooks;
  hooks.debug = &sink;
  auto out = pipe.run(req, hooks);
  EXPECT_TRUE(out.ok()) << out.status().to_string();
  if (!out.ok()) return std::nullopt;
  return std::move(out).value();
}

// ---- GPU ----

bool have_cuda_device() {
  auto be = make_cuda_backend(0, DType::kF32);
  if (!be.ok() && be.status().code() != ErrorCode::kUnsupported)
    ADD_FAILURE() << "a CUDA device is present but the backend failed: " << be.status().to_string();
  return be.ok();
}

CudaPipeline load_on_cuda(const GoldenCase& c, DType act) {
  CudaPipeline p;
  auto be = make_cuda_backend(0, act);
  EXPECT_TRUE(be.ok()) << be.status().to_string();
  if (!be.ok()) return p;
  p.be = std::move(be).value();
  auto pipe = TextToImage::load(c.model, *p.be);
  EXPECT_TRUE(pipe.ok()) << pipe.status().to_string();
  if (pipe.ok()) p.pipe = std::move(pipe).value();
  return p;
}

}  // namespace zimage::test

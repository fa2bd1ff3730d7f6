// Shared helpers of the golden model tests: see golden_models_util.h.
#include "golden_models_util.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <fstream>

#include "common/golden_harness.h"
#include "common/npy.h"
#include "io/model/model_folder.h"
#include "io/weights/weights.h"

namespace zimage::golden {

using nlohmann::json;
using test::golden_dir;

Backend& cpu() {
  static std::unique_ptr<Backend> be = make_cpu_backend(2);
  return *be;
}

json read_json(const std::string& path) {
  std::ifstream f(path);
  if (!f) {
    ADD_FAILURE() << "cannot open " << path;
    return json::object();
  }
  return json::parse(f, nullptr, /*allow_exceptions=*/false);
}

Case load_case(const std::string& name) {
  Case c;
  c.name = name;
  c.dir = golden_dir(name);
  const json cj = read_json(c.dir + "/case.json");
  c.steps = cj.value("steps", 0);
  c.cfg = cj.value("guidance", 0.0) > 0.0;
  c.cfg_truncation = cj.value("cfg_truncation", 1.0);
  c.images_per_prompt = cj.value("images_per_prompt", 1);
  const json tj = read_json(c.dir + "/debug/token_ids.json");
  c.ids = tj["ids"].get<std::vector<std::vector<int32_t>>>();
  if (c.cfg) {
    // The empty negative prompt's chat template (spec §3.1) when the case names none.
    c.neg_ids = tj.contains("negative_ids")
                    ? tj["negative_ids"].get<std::vector<int32_t>>()
                    : std::vector<int32_t>{151644, 872, 198, 151645, 198, 151644, 77091, 198};
  }
  auto folder = ModelFolder::open(c.dir + "/model");  // the configs, parsed and validated
  EXPECT_TRUE(folder.ok()) << folder.status().to_string();
  if (folder.ok()) {
    c.te = folder->text_encoder();
    c.dit = folder->transformer();
    c.vae = folder->vae();
  }
  return c;
}

Tensor npy(const std::string& path) {
  return test::load_reference(path);
}

Tensor to_host(const Tensor& t) {
  Tensor h = Tensor::host(DType::kF32, t.shape());
  const Status st = cpu().download(t, h);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return h;
}

Tensor to_device(const Tensor& host) {
  auto r = cpu().upload(host, DType::kF32);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? std::move(r).value() : Tensor();
}

// Concatenates host f32 tensors along dim 0.
Tensor cat0(const std::vector<Tensor>& parts) {
  Shape s = parts[0].shape();
  s[0] = 0;
  for (const Tensor& p : parts) s[0] += p.dim(0);
  Tensor out = Tensor::host(DType::kF32, s);
  char* dst = static_cast<char*>(out.data());
  for (const Tensor& p : parts) {
    std::memcpy(dst, p.data(), p.nbytes());
    dst += p.nbytes();
  }
  return out;
}

// t_model of step i (spec §6.1): torch fp32 linspace(1, 1/N, N), static shift 3,
// T = 1000 sigma, t_model = (1000 - T) / 1000, all in float32.
float t_model_at(int n, int i) {
  const float start = 1.0f, end = 1.0f / static_cast<float>(n);
  float sb = start;
  if (n > 1) {
    const float step = (end - start) / static_cast<float>(n - 1);
    sb = i < n / 2 ? start + static_cast<float>(i) * step
                   : end - static_cast<float>(n - 1 - i) * step;
  }
  const float shift = 3.0f;
  const float sigma = shift * sb / (1.0f + (shift - 1.0f) * sb);
  const float t = sigma * 1000.0f;
  return (1000.0f - t) / 1000.0f;
}

std::unique_ptr<Qwen3Encoder> load_te(const Case& c, const std::string& folder) {
  auto ws = WeightStore::open(folder.empty() ? c.dir + "/model/text_encoder" : folder);
  EXPECT_TRUE(ws.ok()) << ws.status().to_string();
  if (!ws.ok()) return nullptr;
  auto te = Qwen3Encoder::load(c.te, *ws, cpu());
  EXPECT_TRUE(te.ok()) << te.status().to_string();
  return te.ok() ? std::move(te).value() : nullptr;
}

std::unique_ptr<ZImageDiT> load_dit(const Case& c, const std::string& folder) {
  auto ws = WeightStore::open(folder.empty() ? c.dir + "/model/transformer" : folder);
  EXPECT_TRUE(ws.ok()) << ws.status().to_string();
  if (!ws.ok()) return nullptr;
  auto dit = ZImageDiT::load(c.dit, *ws, cpu());
  EXPECT_TRUE(dit.ok()) << dit.status().to_string();
  return dit.ok() ? std::move(dit).value() : nullptr;
}

std::unique_ptr<VaeDecoder> load_vae(const Case& c, const std::string& folder) {
  auto ws = WeightStore::open(folder.empty() ? c.dir + "/model/vae" : folder);
  EXPECT_TRUE(ws.ok()) << ws.status().to_string();
  if (!ws.ok()) return nullptr;
  auto vae = VaeDecoder::load(c.vae, *ws, cpu());
  EXPECT_TRUE(vae.ok()) << vae.status().to_string();
  return vae.ok() ? std::move(vae).value() : nullptr;
}

void report(const std::string& what, double err) {
  std::printf("[ parity ] %-36s max |diff| = %.3g\n", what.c_str(), err);
  ::testing::Test::RecordProperty(what, std::to_string(err));
}

}  // namespace zimage::golden

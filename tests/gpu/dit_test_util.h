// A small DiT with the model's head_dim (128) for GPU tests of whole forwards: random weights
// written as a diffusers transformer folder, a forward's output brought to the host.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "gpu/cuda_test_util.h"
#include "io/writers/random_model.h"
#include "model/dit/zimage_dit.h"

namespace zimage::test {

// dim 384 (3 heads of 128: F = 1024, a multiple of the fused SwiGLU's block), 2 layers and one
// refiner of each kind; written under the temporary directory as `name`.
inline std::string write_wide_dit(TransformerConfig& cfg, const std::string& name) {
  cfg.dim = 384;
  cfg.n_heads = cfg.n_kv_heads = 3;
  cfg.n_layers = 2;
  cfg.n_refiner_layers = 1;
  cfg.cap_feat_dim = 64;
  cfg.axes_dims = {32, 48, 48};
  cfg.axes_lens = {256, 64, 64};
  const std::string dir = (std::filesystem::temp_directory_path() / name).string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  RandomModelOptions o;
  o.dit = cfg;
  o.seed = 17;
  const Status s = write_random_tensors(dir, "diffusion_pytorch_model",
                                        "diffusion_pytorch_model.safetensors.index.json",
                                        dit_tensor_specs(cfg), o);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return dir;
}

// One forward at t = 0.4 with one caption; the output as f32 on the host (undefined on error).
inline Tensor forward(ZImageDiT& dit, Backend& be, const Tensor& lat, const Tensor& cap) {
  Tensor l = take(be.upload(lat, DType::kF32), "upload latents");
  Tensor c = take(be.upload(cap, be.act_dtype()), "upload caption");
  Tensor out;
  const Status st = dit.forward(l, {0.4f}, {c}, out);
  EXPECT_TRUE(st.ok()) << st.to_string();
  if (!st.ok()) return Tensor();
  Tensor h = Tensor::host(DType::kF32, out.shape());
  EXPECT_TRUE(be.download(out, h).ok());
  return h;
}

// One eager forward (the model's graphs off, then on again) with the op profiler on: its output,
// and in `calls` how many calls each op made (calls_by_op).
inline Tensor profiled_forward(ZImageDiT& dit, cuda::CudaBackend& g, const Tensor& lat,
                               const Tensor& cap, std::map<std::string, int64_t>& calls) {
  dit.set_use_graphs(false);
  Tensor out;
  calls = calls_by_op(g, [&] { out = forward(dit, g, lat, cap); });
  dit.set_use_graphs(true);
  return out;
}

inline std::vector<float> values(const Tensor& t) {
  return t.defined() ? std::vector<float>(t.data_as<float>(), t.data_as<float>() + t.numel())
                     : std::vector<float>();
}

}  // namespace zimage::test

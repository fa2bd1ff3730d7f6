// write_random_lora (random_lora.h).
#include "io/writers/random_lora.h"

#include <cmath>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "io/weights/safetensors.h"

namespace zimage {

namespace {

// splitmix64: fast, and the same numbers everywhere.
struct Rng {
  uint64_t s;
  float uniform() {  // [-1, 1)
    uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return static_cast<float>(z >> 40) / static_cast<float>(1 << 23) - 1.0f;
  }
};

Result<Tensor> random_bf16(Rng& rng, int64_t rows, int64_t cols, float scale) {
  Tensor t = Tensor::host(DType::kBF16, {rows, cols});
  if (!t.defined()) return OutOfMemory("random LoRA factor " + shape_string({rows, cols}));
  auto* p = t.data_as<uint16_t>();
  for (int64_t i = 0; i < rows * cols; ++i) p[i] = f32_to_bf16(scale * rng.uniform());
  return t;
}

}  // namespace

Result<int64_t> write_random_lora(const std::string& path, const TransformerConfig& cfg,
                                  const RandomLoraOptions& o) {
  if (o.rank < 1 || o.rank > 4096)
    return InvalidArgument("rank: " + std::to_string(o.rank) + " is outside 1..4096");
  const int64_t d = cfg.dim, f = cfg.ffn_hidden(), r = o.rank;
  struct Target {
    const char* name;
    int64_t n, k;
  };
  std::vector<Target> targets;
  if (o.attention)
    targets.insert(targets.end(), {{"attention.to_q", d, d},
                                   {"attention.to_k", d, d},
                                   {"attention.to_v", d, d},
                                   {"attention.to_out.0", d, d}});
  if (o.feed_forward)
    targets.insert(
        targets.end(),
        {{"feed_forward.w1", f, d}, {"feed_forward.w2", d, f}, {"feed_forward.w3", f, d}});
  if (targets.empty()) return InvalidArgument("random LoRA: no targets");
  std::vector<std::string> blocks;
  for (int i = 0; i < cfg.n_refiner_layers; ++i)
    blocks.push_back("noise_refiner." + std::to_string(i));
  for (int i = 0; i < cfg.n_refiner_layers; ++i)
    blocks.push_back("context_refiner." + std::to_string(i));
  for (int i = 0; i < cfg.n_layers; ++i) blocks.push_back("layers." + std::to_string(i));
  Rng rng{o.seed};
  std::vector<std::pair<std::string, Tensor>> tensors;
  int64_t params = 0;
  for (const std::string& b : blocks)
    for (const Target& t : targets) {
      const std::string key = "transformer." + b + "." + t.name;
      ZI_ASSIGN_OR_RETURN(Tensor down, random_bf16(rng, r, t.k, 1.0f / std::sqrt(float(t.k))));
      ZI_ASSIGN_OR_RETURN(Tensor up, random_bf16(rng, t.n, r, 0.02f / std::sqrt(float(r))));
      tensors.emplace_back(key + ".lora_A.weight", std::move(down));
      tensors.emplace_back(key + ".lora_B.weight", std::move(up));
      params += r * (t.k + t.n);
    }
  ZI_TRY(write_safetensors(path, tensors, {{"zimage", "random LoRA, rank " + std::to_string(r)}}));
  return params;
}

}  // namespace zimage

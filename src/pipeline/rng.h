// PyTorch's CPU random stream, reproduced: `torch.randn(shape, generator=g)` with
// `g = torch.Generator('cpu').manual_seed(seed)`, float32, contiguous. Users expect the same seed
// to give the same image as diffusers / ComfyUI with a CPU generator (model spec §7), so the
// initial latents must follow PyTorch's MT19937 stream and its two normal-sampling paths exactly:
//
//   n >= 16  fill n float uniforms u = (r & 0xFFFFFF)·2^-24, Box-Muller on blocks of 16 (slot j
//            pairs with slot j+8); a ragged tail redraws 16 fresh uniforms into the last 16 slots.
//            x86 PyTorch evaluates log/sin/cos with AVX2 approximations: we match within ~1e-6.
//   n < 16   per value, the scalar double normal_distribution: two 53-bit double uniforms (each
//            from two 32-bit outputs), Box-Muller, the sine half cached in the generator and
//            returned by the next small draw (the cache survives n >= 16 draws in between).
//
// One generator can draw several times; its state carries over exactly as in PyTorch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <random>

#include "core/status.h"
#include "core/tensor.h"

namespace zimage {

class ThreadPool;

class TorchCpuGenerator {
 public:
  // Like torch.Generator('cpu').manual_seed(seed): only the low 32 bits seed the MT19937 engine
  // (a seed >= 2^32 behaves like seed & 0xFFFFFFFF).
  explicit TorchCpuGenerator(uint64_t seed);

  // torch.randn(shape, generator=this, dtype=float32) as a new host tensor. Errors: a negative
  // or overflowing dimension (InvalidArgument), allocation failure (OutOfMemory).
  // With a pool, the Box-Muller blocks (independent of one another once their uniforms are
  // drawn, in order) are spread over its threads: the same values.
  Result<Tensor> randn(const Shape& shape, ThreadPool* pool = nullptr);

  // Fills out[0..n) as torch.randn of a contiguous tensor of n elements would.
  void fill_randn(float* out, size_t n, ThreadPool* pool = nullptr);

  // Skips what one randn of a whole batch draws for its first `images` images (`per_image`
  // values each) before the rows a part of the batch needs (GenerateRequest::first_image): a
  // randn after it gives exactly that batch draw's later rows. That holds when per_image is a
  // multiple of 16 (the vectorised path's Box-Muller block: each value then depends on its own
  // block's uniforms only); other sizes, or a skip beyond 2^40 values, are refused.
  Status skip_images(int64_t images, int64_t per_image);

  uint64_t seed() const { return seed_; }
  // Next raw 32-bit output of the engine (torch's generator->random()).
  uint32_t next_u32() { return engine_(); }

 private:
  float next_uniform_f32();   // (r & 0xFFFFFF) * 2^-24
  double next_uniform_f64();  // (r64 & (2^53 - 1)) * 2^-53, r64 = first << 32 | second
  double next_normal_f64();   // at::normal_distribution<double>, with the cached second value
  void fill_randn_vectorised(float* out, size_t n, ThreadPool* pool);

  uint64_t seed_;
  // The standard MT19937 (init_genrand seeding, standard tempering) is bit-identical to ATen's.
  std::mt19937 engine_;
  std::optional<double> cached_normal_;
};

}  // namespace zimage

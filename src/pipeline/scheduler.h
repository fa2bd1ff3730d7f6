// The FlowMatch Euler sampler of Z-Image (model spec §6, diffusers ZImagePipeline with
// FlowMatchEulerDiscreteScheduler), reproduced in float32 exactly as diffusers rounds it, so that
// the latents track the reference step by step:
//   σ_base = torch.linspace(1, 1/N, N) (fp32 rule) -> static shift or dynamic (Flux μ) shift
//   -> T = σ·1000 -> σ_N = 0 appended; t_model = (1000 − T)/1000; x ← x + (σ_{i+1} − σ_i)·v.
// Also the pipeline's classifier-free-guidance arithmetic (combination, truncation,
// renormalisation) and the img2img start index, which depend only on these numbers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/status.h"
#include "io/model/model_config.h"

namespace zimage {

// torch.linspace(start, end, steps) for a float32 CPU tensor: step = (end − start)/(steps − 1) in
// float; element i = start + i·step for i < steps/2, else end − (steps − 1 − i)·step, each a
// single fused multiply-add. steps == 1 gives {start}; steps <= 0 gives {}.
std::vector<float> torch_linspace_f32(float start, float end, int64_t steps);

// Flux's calculate_shift (pipeline_z_image.py), in double as Python computes it.
double calculate_shift(int64_t image_seq_len, int64_t base_seq_len, int64_t max_seq_len,
                       double base_shift, double max_shift);

class FlowMatchEulerScheduler {
 public:
  // `image_seq_len` = (latent_h/2)·(latent_w/2); it sets μ and matters only with
  // use_dynamic_shifting (exponential time shift, diffusers' default time_shift_type).
  // Errors: num_steps < 1 or > 10000, unsupported config options (karras / exponential / beta
  // sigmas, invert_sigmas, shift_terminal, stochastic sampling), a non-positive or non-finite
  // shift, num_train_timesteps < 1.
  static Result<FlowMatchEulerScheduler> create(const SchedulerConfig& config, int num_steps,
                                                int64_t image_seq_len = 0);

  int num_steps() const { return static_cast<int>(timesteps_.size()); }
  // N + 1 values, σ_N = 0.
  const std::vector<float>& sigmas() const { return sigmas_; }
  // N values T_i = σ_i · num_train_timesteps (float32), the scheduler's "timesteps".
  const std::vector<float>& timesteps() const { return timesteps_; }
  // μ used (0 when dynamic shifting is off).
  double mu() const { return mu_; }

  // DiT time input of step i: (1000 − T_i)/1000 in float32 (≈ 1 − σ_i). i must be < num_steps().
  float model_time(int i) const { return t_model_[static_cast<size_t>(i)]; }
  // σ_{i+1} − σ_i in float32 (negative).
  float dt(int i) const;

  // Euler step i on n floats: x ← x + dt(i)·v (v is the velocity, i.e. −DiT output).
  // Errors: i outside [0, num_steps()), null pointers with n > 0.
  Status step(int i, const float* velocity, float* latents, size_t n) const;

  // The guidance actually applied at step i (pipeline cfg_truncation rule): `guidance` when
  // CFG is on (guidance > 0) unless cfg_truncation <= 1 and t_norm_i > cfg_truncation, where
  // t_norm_i = model_time(i); else 0, meaning a single positive DiT pass at this step.
  float guidance_at(int i, float guidance, double cfg_truncation) const;

 private:
  FlowMatchEulerScheduler() = default;
  std::vector<float> sigmas_;
  std::vector<float> timesteps_;
  std::vector<float> t_model_;
  double mu_ = 0.0;
};

// x ← x + dt·v, float32, multiply then add (each rounded, as PyTorch does).
void euler_step(float* x, const float* v, float dt, size_t n);

// out = pos + g·(pos − neg) in float32 (the Z-Image pipeline's CFG form; `out` may alias pos or
// neg).
void cfg_combine(const float* pos, const float* neg, float g, float* out, size_t n);

// cfg_normalization (spec §6.3) on one sample: with c > 0, if ‖pred‖ > c·‖pos‖ then
// pred ← pred · (c‖pos‖/‖pred‖). Norms over all n values. c <= 0 leaves pred unchanged.
void cfg_renormalize(const float* pos, float* pred, size_t n, double c);

// img2img / inpaint start (spec §9): init = min(N·strength, N), t_start = int(max(N − init, 0)),
// computed in double as Python does. Errors: strength outside [0, 1] or NaN, num_steps < 1, or
// fewer than one step left (N − t_start < 1).
Result<int> img2img_start_index(int num_steps, double strength);

}  // namespace zimage

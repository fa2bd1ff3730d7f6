// FlowMatch Euler schedule and sampling arithmetic (see scheduler.h). Every float operation
// below corresponds to one rounded torch/numpy float32 operation of the reference, in the same
// order, so sigmas, timesteps and t_model are bit-identical to diffusers on the CPU.
#include "pipeline/scheduler.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <string>
#include <system_error>

namespace zimage {
namespace {

constexpr int kMaxSteps = 10000;

// scheduler_config.json holds short decimals ("shift": 3.0, "max_shift": 1.15) that Python keeps
// as doubles, while SchedulerConfig stores floats. The shortest decimal that round-trips a float
// is that JSON text again, so parsing it as a double recovers Python's value (1.15, not
// 1.14999998) and μ / shift − 1 come out as in diffusers.
double config_double(float f) {
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), f);
  if (res.ec != std::errc()) return static_cast<double>(f);
  double d = static_cast<double>(f);
  const auto back = std::from_chars(buf, res.ptr, d);
  return back.ec == std::errc() ? d : static_cast<double>(f);
}

}  // namespace

std::vector<float> torch_linspace_f32(float start, float end, int64_t steps) {
  std::vector<float> out;
  if (steps <= 0) return out;
  out.resize(static_cast<size_t>(steps));
  if (steps == 1) {
    out[0] = start;  // torch fills with start when steps == 1
    return out;
  }
  const float step = (end - start) / static_cast<float>(steps - 1);
  const int64_t halfway = steps / 2;
  for (int64_t i = 0; i < steps; ++i) {
    // PyTorch's kernel computes start + step*i / end - step*(steps-1-i); its compiled build
    // contracts each into one fused multiply-add.
    out[static_cast<size_t>(i)] = i < halfway
                                      ? std::fma(step, static_cast<float>(i), start)
                                      : std::fma(-step, static_cast<float>(steps - 1 - i), end);
  }
  return out;
}

double calculate_shift(int64_t image_seq_len, int64_t base_seq_len, int64_t max_seq_len,
                       double base_shift, double max_shift) {
  const double m = (max_shift - base_shift) / static_cast<double>(max_seq_len - base_seq_len);
  const double b = base_shift - m * static_cast<double>(base_seq_len);
  return static_cast<double>(image_seq_len) * m + b;
}

Result<FlowMatchEulerScheduler> FlowMatchEulerScheduler::create(const SchedulerConfig& config,
                                                                int num_steps,
                                                                int64_t image_seq_len) {
  if (num_steps < 1 || num_steps > kMaxSteps) {
    return InvalidArgument("scheduler: number of steps must be in [1, " +
                           std::to_string(kMaxSteps) + "], got " + std::to_string(num_steps));
  }
  if (config.num_train_timesteps < 1) {
    return InvalidArgument("scheduler: num_train_timesteps must be >= 1, got " +
                           std::to_string(config.num_train_timesteps));
  }
  if (config.use_karras_sigmas || config.use_exponential_sigmas || config.use_beta_sigmas) {
    return Unsupported("scheduler: karras / exponential / beta sigmas are not supported");
  }
  if (config.invert_sigmas) return Unsupported("scheduler: invert_sigmas is not supported");
  if (config.shift_terminal_set) return Unsupported("scheduler: shift_terminal is not supported");
  if (config.stochastic_sampling) {
    return Unsupported("scheduler: stochastic_sampling is not supported");
  }
  if (!config.use_dynamic_shifting && !(std::isfinite(config.shift) && config.shift > 0.0f)) {
    return InvalidArgument("scheduler: shift must be a positive finite number, got " +
                           std::to_string(config.shift));
  }

  FlowMatchEulerScheduler s;
  // ZImagePipeline: sigmas = torch.linspace(1.0, 1/N, N).tolist() -> np.float32 array.
  const float end = static_cast<float>(1.0 / static_cast<double>(num_steps));
  std::vector<float> sigma = torch_linspace_f32(1.0f, end, num_steps);

  if (config.use_dynamic_shifting) {
    if (config.max_image_seq_len == config.base_image_seq_len) {
      return InvalidArgument("scheduler: max_image_seq_len equals base_image_seq_len (" +
                             std::to_string(config.base_image_seq_len) + "): mu is undefined");
    }
    s.mu_ = calculate_shift(image_seq_len, config.base_image_seq_len, config.max_image_seq_len,
                            config_double(config.base_shift), config_double(config.max_shift));
    const double e_mu = std::exp(s.mu_);
    if (!std::isfinite(e_mu)) {
      return InvalidArgument("scheduler: exp(mu) overflows for image_seq_len " +
                             std::to_string(image_seq_len));
    }
    // exp(mu) / (exp(mu) + (1/t - 1) ** 1.0): numpy float32, the Python float cast to float32.
    const float e = static_cast<float>(e_mu);
    for (float& v : sigma) {
      const float inv = 1.0f / v;
      const float r = inv - 1.0f;
      const float den = e + r;
      v = e / den;
    }
  } else {
    // shift * s / (1 + (shift - 1) * s): float32 throughout.
    const float shift = config.shift;
    const float shift_m1 = static_cast<float>(config_double(config.shift) - 1.0);
    for (float& v : sigma) {
      const float num = shift * v;
      const float b = shift_m1 * v;
      const float den = 1.0f + b;
      v = num / den;
    }
  }

  const float ntt = static_cast<float>(config.num_train_timesteps);
  s.timesteps_.resize(sigma.size());
  s.t_model_.resize(sigma.size());
  for (size_t i = 0; i < sigma.size(); ++i) {
    s.timesteps_[i] = sigma[i] * ntt;
    const float diff = 1000.0f - s.timesteps_[i];
    s.t_model_[i] = diff / 1000.0f;
  }
  s.sigmas_ = std::move(sigma);
  s.sigmas_.push_back(0.0f);
  return s;
}

float FlowMatchEulerScheduler::dt(int i) const {
  const size_t k = static_cast<size_t>(i);
  return sigmas_[k + 1] - sigmas_[k];
}

Status FlowMatchEulerScheduler::step(int i, const float* velocity, float* latents, size_t n) const {
  if (i < 0 || i >= num_steps()) {
    return InvalidArgument("scheduler step: index " + std::to_string(i) + " outside [0, " +
                           std::to_string(num_steps()) + ")");
  }
  if (n > 0 && (velocity == nullptr || latents == nullptr)) {
    return InvalidArgument("scheduler step: null velocity or latents buffer");
  }
  euler_step(latents, velocity, dt(i), n);
  return Status::Ok();
}

float FlowMatchEulerScheduler::guidance_at(int i, float guidance, double cfg_truncation) const {
  if (!(guidance > 0.0f)) return 0.0f;
  if (i < 0 || i >= num_steps()) return guidance;
  if (cfg_truncation <= 1.0 &&
      static_cast<double>(t_model_[static_cast<size_t>(i)]) > cfg_truncation) {
    return 0.0f;
  }
  return guidance;
}

void euler_step(float* x, const float* v, float dt, size_t n) {
  for (size_t k = 0; k < n; ++k) {
    const float dv = dt * v[k];
    x[k] = x[k] + dv;
  }
}

void cfg_combine(const float* pos, const float* neg, float g, float* out, size_t n) {
  for (size_t k = 0; k < n; ++k) {
    const float p = pos[k];
    const float d = p - neg[k];
    const float gd = g * d;
    out[k] = p + gd;
  }
}

void cfg_renormalize(const float* pos, float* pred, size_t n, double c) {
  if (!(c > 0.0)) return;
  double pos_sq = 0.0;
  double pred_sq = 0.0;
  for (size_t k = 0; k < n; ++k) {
    pos_sq += static_cast<double>(pos[k]) * pos[k];
    pred_sq += static_cast<double>(pred[k]) * pred[k];
  }
  // torch.linalg.vector_norm gives float32 scalars; the ratio is one float32 division.
  const float pos_norm = static_cast<float>(std::sqrt(pos_sq));
  const float pred_norm = static_cast<float>(std::sqrt(pred_sq));
  const float max_norm = pos_norm * static_cast<float>(c);
  if (pred_norm > max_norm) {
    const float scale = max_norm / pred_norm;
    for (size_t k = 0; k < n; ++k) pred[k] = pred[k] * scale;
  }
}

Result<int> img2img_start_index(int num_steps, double strength) {
  if (num_steps < 1) {
    return InvalidArgument("img2img: number of steps must be >= 1, got " +
                           std::to_string(num_steps));
  }
  if (!(strength >= 0.0 && strength <= 1.0)) {
    return InvalidArgument("img2img: strength must be in [0, 1], got " + std::to_string(strength));
  }
  const double n = static_cast<double>(num_steps);
  const double init = std::min(n * strength, n);
  const double rest = std::max(n - init, 0.0);
  const int t_start = static_cast<int>(rest);  // Python int(): truncation
  if (num_steps - t_start < 1) {
    return InvalidArgument("img2img: strength " + std::to_string(strength) + " with " +
                           std::to_string(num_steps) + " steps leaves " +
                           std::to_string(num_steps - t_start) + " denoising steps (need >= 1)");
  }
  return t_start;
}

}  // namespace zimage

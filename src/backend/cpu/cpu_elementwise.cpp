// CPU element-wise ops and position encodings: SiLU, tanh, SwiGLU, axpby, broadcast add,
// per-row sum of squares, and the two RoPE variants (rotate-half for Qwen3, interleaved complex
// for the DiT). All parallel over contiguous ranges of the flat tensor or over rows.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_check.h"
#include "backend/cpu/cpu_math.h"

namespace zimage::cpu {

namespace {

constexpr int64_t kElemGrain = 16384;

// Reads element i of a f32/bf16/f16 buffer as float.
inline float load(DType dt, const void* p, int64_t i) {
  switch (dt) {
    case DType::kBF16:
      return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::kF16:
      return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    default:
      return static_cast<const float*>(p)[i];
  }
}

inline void store(DType dt, void* p, int64_t i, float v) {
  switch (dt) {
    case DType::kBF16:
      static_cast<uint16_t*>(p)[i] = f32_to_bf16(v);
      break;
    case DType::kF16:
      static_cast<uint16_t*>(p)[i] = f32_to_f16(v);
      break;
    default:
      static_cast<float*>(p)[i] = v;
      break;
  }
}

// y = f(x) element by element, arguments checked.
template <typename F>
Status map(ThreadPool& pool, const Tensor& x, Tensor& y, F f) {
  const float* xp = x.data_as<const float>();
  float* yp = y.data_as<float>();
  pool.parallel_for(x.numel(), kElemGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) yp[i] = f(xp[i]);
  });
  return Status::Ok();
}

// Shared shape of the unary ops: y = f(x), same shape, f32, in place allowed.
template <typename F>
Status unary(ThreadPool& pool, const char* op, const Tensor& x, Tensor& y, F f) {
  ZI_TRY(contract::unary(cpu_env(), op, x, y));
  return map(pool, x, y, f);
}

}  // namespace

Status CpuBackend::silu(const Tensor& x, Tensor& y) {
  return unary(pool_, "silu", x, y, [](float v) { return silu_f(v); });
}

Status CpuBackend::tanh(const Tensor& x, Tensor& y) {
  return unary(pool_, "tanh", x, y, [](float v) { return std::tanh(v); });
}

Status CpuBackend::clamp(const Tensor& x, float lo, float hi, Tensor& y) {
  ZI_TRY(contract::clamp(cpu_env(), x, lo, hi, y));
  return map(pool_, x, y, [lo, hi](float v) { return std::min(std::max(v, lo), hi); });
}

Status CpuBackend::swiglu(const Tensor& x, Tensor& y) {
  ZI_TRY(contract::swiglu(cpu_env(), x, y));
  const bool in_place = overlaps(x, y);  // then y starts at x's address
  const int64_t f = x.dim(-1) / 2;
  const int64_t m = f > 0 ? y.numel() / f : 0;
  const float* xp = x.data_as<const float>();
  float* yp = y.data_as<float>();
  auto rows = [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* g = xp + r * 2 * f;
      const float* u = g + f;
      float* o = yp + r * f;
      for (int64_t j = 0; j < f; ++j) o[j] = silu_f(g[j]) * u[j];
    }
  };
  if (in_place) {
    rows(0, m);
  } else {
    pool_.parallel_for(m, std::max<int64_t>(1, kElemGrain / std::max<int64_t>(f, 1)), rows);
  }
  return Status::Ok();
}

Status CpuBackend::matmul_swiglu(const Tensor& x, const Tensor& w13, int64_t block, Tensor& y) {
  ZI_TRY(contract::matmul_swiglu(cpu_env(), x, w13, block, y));
  return Backend::matmul_swiglu(x, w13, block, y);
}

Status CpuBackend::axpby(float a, const Tensor& x, float b, const Tensor& y, Tensor& out) {
  ZI_TRY(contract::axpby(cpu_env(), x, y, out));
  const DType dt = x.dtype();
  const void* xp = x.data();
  const void* yp = y.data();
  void* op_ = out.data();
  pool_.parallel_for(x.numel(), kElemGrain, [&](int64_t i0, int64_t i1) {
    if (dt == DType::kF32) {
      const float* xf = static_cast<const float*>(xp);
      const float* yf = static_cast<const float*>(yp);
      float* of = static_cast<float*>(op_);
      for (int64_t i = i0; i < i1; ++i) of[i] = a * xf[i] + b * yf[i];
      return;
    }
    for (int64_t i = i0; i < i1; ++i) store(dt, op_, i, a * load(dt, xp, i) + b * load(dt, yp, i));
  });
  return Status::Ok();
}

Status CpuBackend::add(const Tensor& x, const Tensor& y, Tensor& out) {
  ZI_TRY(contract::add(cpu_env(), x, y, out));
  const int64_t n = x.numel(), yn = y.numel();
  if (n == 0) return Status::Ok();
  const float* xp = x.data_as<const float>();
  const float* yp = y.data_as<const float>();
  float* o = out.data_as<float>();
  pool_.parallel_for(n, kElemGrain, [&](int64_t i0, int64_t i1) {
    int64_t j = i0 % yn;
    for (int64_t i = i0; i < i1; ++i) {
      o[i] = xp[i] + yp[j];
      if (++j == yn) j = 0;
    }
  });
  return Status::Ok();
}

Status CpuBackend::guided_euler_step(const Tensor& pos, const Tensor& neg, float g, float dt,
                                     Tensor& latents) {
  ZI_TRY(contract::guided_euler_step(cpu_env(), pos, neg, latents));
  const bool cfg = neg.defined();
  const float* p = pos.data_as<float>();
  const float* n = cfg ? neg.data_as<float>() : nullptr;
  float* x = latents.data_as<float>();
  // The reference's arithmetic, one rounding per operation (this file is built without FMA
  // contraction: ISO C++ mode).
  pool_.parallel_for(latents.numel(), 4096, [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k) {
      float pred = p[k];
      if (n != nullptr) {
        const float d = pred - n[k];
        const float gd = g * d;
        pred = pred + gd;
      }
      const float v = -pred;
      const float dv = dt * v;
      x[k] = x[k] + dv;
    }
  });
  return Status::Ok();
}

Status CpuBackend::latent_to_rgb(const Tensor& latents, const LatentRgbMap& map, Tensor& rgb) {
  ZI_TRY(contract::latent_to_rgb(cpu_env(), latents, map.channels, rgb));
  const int64_t n = latents.dim(0), c = map.channels, hw = latents.dim(2) * latents.dim(3);
  const float* x = latents.data_as<float>();
  uint8_t* out = static_cast<uint8_t*>(rgb.data());
  pool_.parallel_for(n * hw, 1024, [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p) {
      const int64_t img = p / hw, px = p % hw;
      const float* xp = x + img * c * hw + px;
      for (int k = 0; k < 3; ++k) {
        float v = map.bias[k];
        for (int64_t ch = 0; ch < c; ++ch) {
          const float t = map.weight[ch][k] * xp[ch * hw];
          v = v + t;
        }
        float u = (v + 1.0f) / 2.0f;
        if (!(u > 0.0f)) u = 0.0f;  // NaN too
        if (u > 1.0f) u = 1.0f;
        out[p * 3 + k] = static_cast<uint8_t>(u * 255.0f);
      }
    }
  });
  return Status::Ok();
}

namespace {

// Element k of a f32, bf16 or f16 buffer as a float.
float any_float_at(DType dt, const void* p, int64_t k) {
  if (dt == DType::kF32) return static_cast<const float*>(p)[k];
  const uint16_t h = static_cast<const uint16_t*>(p)[k];
  return dt == DType::kBF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

// A float rounded to dt (f32: unchanged).
float round_to_dtype(DType dt, float v) {
  if (dt == DType::kBF16) return round_bf16(v);
  if (dt == DType::kF16) return f16_to_f32(f32_to_f16(v));
  return v;
}

}  // namespace

Result<int64_t> CpuBackend::count_nonfinite(const Tensor& x) {
  ZI_TRY(contract::count_nonfinite(cpu_env(), x));
  const DType dt = x.dtype();
  const void* p = x.data();
  std::atomic<int64_t> bad{0};
  pool_.parallel_for(x.numel(), 1 << 14, [&](int64_t b, int64_t e) {
    int64_t local = 0;
    for (int64_t k = b; k < e; ++k) local += std::isfinite(any_float_at(dt, p, k)) ? 0 : 1;
    bad += local;
  });
  return bad.load();
}

Status CpuBackend::image_to_rgb8(const Tensor& x, Tensor& rgb) {
  ZI_TRY(contract::image_to_rgb8(cpu_env(), x, rgb));
  const DType dt = x.dtype();
  const void* p = x.data();
  uint8_t* out = static_cast<uint8_t*>(rgb.data());
  pool_.parallel_for(x.numel(), 1 << 14, [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k) {
      const float v = any_float_at(dt, p, k);
      if (!std::isfinite(v)) {
        out[k] = 0;
        continue;
      }
      // postprocess's ops: 0.5·x (axpby), + 0.5 (add), each rounded to x's dtype, then clamp.
      const float u = round_to_dtype(dt, round_to_dtype(dt, 0.5f * v) + 0.5f);
      const float c = std::min(std::max(u, 0.0f), 1.0f);
      // to_u8: nearbyint in the default rounding mode (ties to even); c is in [0, 1].
      out[k] = static_cast<uint8_t>(std::nearbyint(c * 255.0f));
    }
  });
  return Status::Ok();
}

Result<std::vector<double>> CpuBackend::sum_squares(const Tensor& x) {
  ZI_TRY(contract::sum_squares(cpu_env(), x));
  const int64_t b = x.dim(0);
  const int64_t per = b > 0 ? x.numel() / b : 0;
  std::vector<double> out(static_cast<size_t>(b), 0.0);
  const DType dt = x.dtype();
  const void* p = x.data();
  pool_.parallel_for(b, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t i = b0; i < b1; ++i) {
      double s = 0.0;
      for (int64_t j = i * per; j < (i + 1) * per; ++j) {
        const double v = load(dt, p, j);
        s += v * v;
      }
      out[static_cast<size_t>(i)] = s;
    }
  });
  return out;
}

Status CpuBackend::rope_half(Tensor& x, const Tensor& cos, const Tensor& sin) {
  ZI_TRY(contract::rope_half(cpu_env(), x, cos, sin));
  const int64_t b = x.dim(0), s = x.dim(1), h = x.dim(2), dh = x.dim(3);
  const int64_t half = dh / 2;
  float* xp = x.data_as<float>();
  const float* cp = cos.data_as<const float>();
  const float* sp = sin.data_as<const float>();
  pool_.parallel_for(b * s, std::max<int64_t>(1, kElemGrain / std::max<int64_t>(h * dh, 1)),
                     [&](int64_t r0, int64_t r1) {
                       for (int64_t r = r0; r < r1; ++r) {
                         const float* c = cp + (r % s) * dh;
                         const float* sn = sp + (r % s) * dh;
                         for (int64_t hh = 0; hh < h; ++hh) {
                           float* v = xp + (r * h + hh) * dh;
                           for (int64_t j = 0; j < half; ++j) {
                             const float lo = v[j], hi = v[j + half];
                             v[j] = lo * c[j] - hi * sn[j];
                             v[j + half] = hi * c[j + half] + lo * sn[j + half];
                           }
                         }
                       }
                     });
  return Status::Ok();
}

Status CpuBackend::rope_interleaved(Tensor& x, const Tensor& freqs) {
  ZI_TRY(contract::rope_interleaved(cpu_env(), x, freqs));
  const int64_t b = x.dim(0), s = x.dim(1), h = x.dim(2), dh = x.dim(3);
  const bool shared = freqs.dim(0) == 1;
  float* xp = x.data_as<float>();
  const float* fp = freqs.data_as<const float>();
  pool_.parallel_for(b * s, std::max<int64_t>(1, kElemGrain / std::max<int64_t>(h * dh, 1)),
                     [&](int64_t r0, int64_t r1) {
                       for (int64_t r = r0; r < r1; ++r) {
                         const float* f = fp + (shared ? r % s : r) * dh;  // dh/2 (cos, sin)
                         for (int64_t hh = 0; hh < h; ++hh) {
                           float* v = xp + (r * h + hh) * dh;
                           for (int64_t j = 0; j < dh / 2; ++j) {
                             const float x0 = v[2 * j], x1 = v[2 * j + 1];
                             const float c = f[2 * j], sn = f[2 * j + 1];
                             v[2 * j] = x0 * c - x1 * sn;
                             v[2 * j + 1] = x0 * sn + x1 * c;
                           }
                         }
                       }
                     });
  return Status::Ok();
}

}  // namespace zimage::cpu

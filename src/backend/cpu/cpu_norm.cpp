// CPU normalisations: RMSNorm, LayerNorm (biased variance), the DiT's gated residual RMSNorm,
// and NHWC GroupNorm. Statistics are accumulated in double and the per-row factor is rounded to
// float once, so results sit within float rounding of PyTorch's fp32 CPU kernels; the element
// formulas keep PyTorch's multiplication order ((x * r) * w, then * scale).
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_check.h"
#include "backend/cpu/cpu_math.h"

namespace zimage::cpu {

namespace {

// x viewed as [R, D] rows over its last dimension.
struct Rows {
  int64_t r = 0;
  int64_t d = 0;
};

Result<Rows> row_view(const char* op, const char* name, const Tensor& x) {
  ZI_TRY(check_f32(op, name, x));
  if (x.rank() < 1 || x.dim(-1) <= 0) {
    return InvalidArgument(std::string(op) + ": " + name + " " + desc(x) +
                           " must have rank >= 1 and a non-empty last dimension");
  }
  return Rows{x.numel() / x.dim(-1), x.dim(-1)};
}

// An optional per-feature vector [D] (norm weight / bias / affine).
Status check_vector(const char* op, const char* name, const Tensor& t, int64_t d,
                    const char* x_name, const Tensor& x) {
  if (!t.defined()) return Status::Ok();
  ZI_TRY(check_f32(op, name, t));
  if (t.rank() != 1 || t.dim(0) != d) {
    return InvalidArgument(std::string(op) + ": " + name + " " + desc(t) + " must be [" +
                           std::to_string(d) + "] for " + x_name + " " + desc(x));
  }
  return Status::Ok();
}

// An optional per-group modulation [B, D]: rows of x split evenly into B groups. Returns the
// number of rows per group (0 when the tensor is undefined).
Result<int64_t> check_modulation(const char* op, const char* name, const Tensor& t, Rows rows,
                                 const Tensor& x) {
  if (!t.defined()) return int64_t{0};
  ZI_TRY(check_f32(op, name, t));
  if (t.rank() != 2 || t.dim(1) != rows.d || t.dim(0) <= 0 || rows.r % t.dim(0) != 0) {
    return InvalidArgument(std::string(op) + ": " + name + " " + desc(t) + " must be [B, " +
                           std::to_string(rows.d) + "] with B dividing the " +
                           std::to_string(rows.r) + " rows of x " + desc(x));
  }
  return rows.r / t.dim(0);
}

int64_t row_grain(int64_t d) {
  return std::max<int64_t>(1, 8192 / std::max<int64_t>(d, 1));
}

// 1 / sqrt(mean of squares + eps) of one row, accumulated in double.
float rms_factor(const float* x, int64_t d, float eps) {
  double ss = 0.0;
  for (int64_t j = 0; j < d; ++j) ss += static_cast<double>(x[j]) * x[j];
  return static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(d) + eps));
}

}  // namespace

Status CpuBackend::rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& scale,
                            Tensor& y) {
  const char* op = "rms_norm";
  ZI_ASSIGN_OR_RETURN(Rows rows, row_view(op, "x", x));
  ZI_TRY(check_f32(op, "y", y));
  ZI_TRY(check_same_shape(op, "x", x, "y", y));
  ZI_TRY(check_alias(op, "x", x, "y", y, true));
  ZI_TRY(check_vector(op, "w", w, rows.d, "x", x));
  ZI_ASSIGN_OR_RETURN(int64_t group, check_modulation(op, "scale", scale, rows, x));
  const float* xp = x.data_as<const float>();
  float* yp = y.data_as<float>();
  const float* wp = w.defined() ? w.data_as<const float>() : nullptr;
  const float* sp = scale.defined() ? scale.data_as<const float>() : nullptr;
  const int64_t d = rows.d;
  pool_.parallel_for(rows.r, row_grain(d), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = xp + r * d;
      float* yr = yp + r * d;
      const float inv = rms_factor(xr, d, eps);
      const float* sr = sp ? sp + (r / group) * d : nullptr;
      for (int64_t j = 0; j < d; ++j) {
        float v = xr[j] * inv;
        if (wp) v *= wp[j];
        if (sr) v *= sr[j];
        yr[j] = v;
      }
    }
  });
  return Status::Ok();
}

Status CpuBackend::layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, float eps,
                              const Tensor& scale, Tensor& y) {
  const char* op = "layer_norm";
  ZI_ASSIGN_OR_RETURN(Rows rows, row_view(op, "x", x));
  ZI_TRY(check_f32(op, "y", y));
  ZI_TRY(check_same_shape(op, "x", x, "y", y));
  ZI_TRY(check_alias(op, "x", x, "y", y, true));
  ZI_TRY(check_vector(op, "w", w, rows.d, "x", x));
  ZI_TRY(check_vector(op, "b", b, rows.d, "x", x));
  ZI_ASSIGN_OR_RETURN(int64_t group, check_modulation(op, "scale", scale, rows, x));
  const float* xp = x.data_as<const float>();
  float* yp = y.data_as<float>();
  const float* wp = w.defined() ? w.data_as<const float>() : nullptr;
  const float* bp = b.defined() ? b.data_as<const float>() : nullptr;
  const float* sp = scale.defined() ? scale.data_as<const float>() : nullptr;
  const int64_t d = rows.d;
  pool_.parallel_for(rows.r, row_grain(d), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = xp + r * d;
      float* yr = yp + r * d;
      double sum = 0.0;
      for (int64_t j = 0; j < d; ++j) sum += xr[j];
      const double mean = sum / static_cast<double>(d);
      double var = 0.0;
      for (int64_t j = 0; j < d; ++j) {
        const double c = xr[j] - mean;
        var += c * c;
      }
      var /= static_cast<double>(d);  // biased, as torch.nn.LayerNorm
      const float meanf = static_cast<float>(mean);
      const float rstd = static_cast<float>(1.0 / std::sqrt(var + eps));
      const float* sr = sp ? sp + (r / group) * d : nullptr;
      for (int64_t j = 0; j < d; ++j) {
        float v = (xr[j] - meanf) * rstd;
        if (wp) v *= wp[j];
        if (bp) v += bp[j];
        if (sr) v *= sr[j];
        yr[j] = v;
      }
    }
  });
  return Status::Ok();
}

Status CpuBackend::residual_rms_norm_gate(Tensor& x, const Tensor& y, const Tensor& w, float eps,
                                          const Tensor& gate) {
  const char* op = "residual_rms_norm_gate";
  ZI_ASSIGN_OR_RETURN(Rows rows, row_view(op, "x", x));
  ZI_TRY(check_f32(op, "y", y));
  ZI_TRY(check_same_shape(op, "x", x, "y", y));
  ZI_TRY(check_alias(op, "y", y, "x", x, true));
  ZI_TRY(check_vector(op, "w", w, rows.d, "x", x));
  ZI_ASSIGN_OR_RETURN(int64_t group, check_modulation(op, "gate", gate, rows, x));
  float* xp = x.data_as<float>();
  const float* yp = y.data_as<const float>();
  const float* wp = w.defined() ? w.data_as<const float>() : nullptr;
  const float* gp = gate.defined() ? gate.data_as<const float>() : nullptr;
  const int64_t d = rows.d;
  pool_.parallel_for(rows.r, row_grain(d), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* yr = yp + r * d;
      float* xr = xp + r * d;
      const float inv = rms_factor(yr, d, eps);
      const float* gr = gp ? gp + (r / group) * d : nullptr;
      for (int64_t j = 0; j < d; ++j) {
        float v = yr[j] * inv;
        if (wp) v *= wp[j];
        if (gr) v = gr[j] * v;
        xr[j] += v;
      }
    }
  });
  return Status::Ok();
}

Status CpuBackend::group_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, int groups,
                              float eps, bool silu, Tensor& y) {
  const char* op = "group_norm";
  ZI_TRY(check_f32(op, "x", x));
  ZI_TRY(check_rank(op, "x", x, 4));
  ZI_TRY(check_f32(op, "y", y));
  ZI_TRY(check_same_shape(op, "x", x, "y", y));
  ZI_TRY(check_alias(op, "x", x, "y", y, true));
  const int64_t b = x.dim(0), hw = x.dim(1) * x.dim(2), c = x.dim(3);
  if (groups <= 0 || c % groups != 0) {
    return InvalidArgument("group_norm: x " + desc(x) + ": " + std::to_string(groups) +
                           " groups do not divide " + std::to_string(c) + " channels");
  }
  ZI_TRY(check_vector(op, "gamma", gamma, c, "x", x));
  ZI_TRY(check_vector(op, "beta", beta, c, "x", x));
  if (x.numel() == 0) return Status::Ok();
  const int64_t cg = c / groups;
  const float* xp = x.data_as<const float>();
  float* yp = y.data_as<float>();
  // Per (batch, group): mean and 1/sqrt(biased var + eps), two passes in double.
  std::vector<float> mean(static_cast<size_t>(b * groups));
  std::vector<float> rstd(mean.size());
  pool_.parallel_for(b * groups, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const float* base = xp + (i / groups) * hw * c + (i % groups) * cg;
      double sum = 0.0;
      for (int64_t p = 0; p < hw; ++p) {
        for (int64_t j = 0; j < cg; ++j) sum += base[p * c + j];
      }
      const double count = static_cast<double>(hw * cg);
      const double m = sum / count;
      double var = 0.0;
      for (int64_t p = 0; p < hw; ++p) {
        for (int64_t j = 0; j < cg; ++j) {
          const double dv = base[p * c + j] - m;
          var += dv * dv;
        }
      }
      mean[static_cast<size_t>(i)] = static_cast<float>(m);
      rstd[static_cast<size_t>(i)] = static_cast<float>(1.0 / std::sqrt(var / count + eps));
    }
  });
  const float* gp = gamma.defined() ? gamma.data_as<const float>() : nullptr;
  const float* bp = beta.defined() ? beta.data_as<const float>() : nullptr;
  pool_.parallel_for(b * hw, row_grain(c), [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t stat = (p / hw) * groups;
      const float* xr = xp + p * c;
      float* yr = yp + p * c;
      for (int64_t ch = 0; ch < c; ++ch) {
        const size_t g = static_cast<size_t>(stat + ch / cg);
        float v = (xr[ch] - mean[g]) * rstd[g];
        if (gp) v *= gp[ch];
        if (bp) v += bp[ch];
        yr[ch] = silu ? silu_f(v) : v;
      }
    }
  });
  return Status::Ok();
}

}  // namespace zimage::cpu

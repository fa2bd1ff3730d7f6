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

int64_t row_grain(int64_t d) {
  return std::max<int64_t>(1, 8192 / std::max<int64_t>(d, 1));
}

// 1 / sqrt(mean of squares + eps) of one row, accumulated in double.
float rms_factor(const float* x, int64_t d, float eps) {
  double ss = 0.0;
  for (int64_t j = 0; j < d; ++j) ss += static_cast<double>(x[j]) * x[j];
  return static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(d) + eps));
}

// Runs row(r, mod) for every row r of a row norm, in parallel; mod points at the row's scale or
// gate row (null without one).
template <typename F>
void for_rows(ThreadPool& pool, const contract::RowNorm& rows, const Tensor& mod, F row) {
  const float* mp = mod.defined() ? mod.data_as<const float>() : nullptr;
  pool.parallel_for(rows.rows, row_grain(rows.d), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) row(r, mp ? mp + (r / rows.group) * rows.d : nullptr);
  });
}

// The RMS norms of src's rows into dst: dst = rms_norm(src) * w * mod, or for the residual norm
// dst += mod * (rms_norm(src) * w); mod is the row's scale or gate, w and mod optional.
template <bool kResidual>
void rms_rows(ThreadPool& pool, const contract::RowNorm& rows, const float* src, const Tensor& w,
              const Tensor& mod, float eps, float* dst) {
  const float* wp = w.defined() ? w.data_as<const float>() : nullptr;
  const int64_t d = rows.d;
  for_rows(pool, rows, mod, [&](int64_t r, const float* mr) {
    const float* sr = src + r * d;
    float* dr = dst + r * d;
    const float inv = rms_factor(sr, d, eps);
    for (int64_t j = 0; j < d; ++j) {
      float v = sr[j] * inv;
      if (wp) v *= wp[j];
      if constexpr (kResidual) {
        if (mr) v = mr[j] * v;
        dr[j] += v;
      } else {
        if (mr) v *= mr[j];
        dr[j] = v;
      }
    }
  });
}

}  // namespace

Status CpuBackend::rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& scale,
                            Tensor& y) {
  ZI_ASSIGN_OR_RETURN(contract::RowNorm rows, contract::rms_norm(cpu_env(), x, w, scale, y));
  rms_rows<false>(pool_, rows, x.data_as<const float>(), w, scale, eps, y.data_as<float>());
  return Status::Ok();
}

Status CpuBackend::layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, float eps,
                              const Tensor& scale, Tensor& y) {
  ZI_ASSIGN_OR_RETURN(contract::RowNorm rows, contract::layer_norm(cpu_env(), x, w, b, scale, y));
  const float* xp = x.data_as<const float>();
  float* yp = y.data_as<float>();
  const float* wp = w.defined() ? w.data_as<const float>() : nullptr;
  const float* bp = b.defined() ? b.data_as<const float>() : nullptr;
  const int64_t d = rows.d;
  for_rows(pool_, rows, scale, [&](int64_t r, const float* sr) {
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
    for (int64_t j = 0; j < d; ++j) {
      float v = (xr[j] - meanf) * rstd;
      if (wp) v *= wp[j];
      if (bp) v += bp[j];
      if (sr) v *= sr[j];
      yr[j] = v;
    }
  });
  return Status::Ok();
}

Status CpuBackend::residual_rms_norm_gate(Tensor& x, const Tensor& y, const Tensor& w, float eps,
                                          const Tensor& gate) {
  ZI_ASSIGN_OR_RETURN(contract::RowNorm rows,
                      contract::residual_rms_norm_gate(cpu_env(), x, y, w, gate));
  rms_rows<true>(pool_, rows, y.data_as<const float>(), w, gate, eps, x.data_as<float>());
  return Status::Ok();
}

Status CpuBackend::group_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, int groups,
                              float eps, bool silu, Tensor& y) {
  ZI_TRY(contract::group_norm(cpu_env(), x, gamma, beta, groups, y));
  const int64_t b = x.dim(0), hw = x.dim(1) * x.dim(2), c = x.dim(3);
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

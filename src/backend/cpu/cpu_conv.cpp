// CPU NHWC convolution and nearest upsampling for the VAE. conv2d is im2col + sgemm: each output
// pixel's receptive field is unrolled into a row ordered (ky, kx, ci), which is exactly the OHWI
// weight layout, so y[P, Cout] = col[P, kh*kw*Cin] · w[Cout, kh*kw*Cin]ᵀ with no weight reshuffle.
// The unrolled matrix is built in blocks of output pixels to bound memory (a 1024² VAE decode
// would otherwise need gigabytes); a 1x1 stride-1 unpadded conv skips im2col entirely.
#include <algorithm>
#include <climits>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_check.h"
#include "backend/cpu/cpu_gemm.h"

namespace zimage::cpu {

namespace {
constexpr int64_t kMaxColFloats = int64_t{1} << 23;  // 32 MiB im2col block
}

Status CpuBackend::conv2d(const Tensor& x, const Tensor& w, const Tensor& bias,
                          const Conv2dParams& p, Tensor& y) {
  ZI_TRY(contract::conv2d(cpu_env(), x, w, bias, p, y));
  const int64_t b = x.dim(0), h = x.dim(1), wd = x.dim(2), cin = x.dim(3);
  const int64_t cout = w.dim(0), kh = w.dim(1), kw = w.dim(2);
  const int64_t hp = h + p.pad_top + p.pad_bottom, wp = wd + p.pad_left + p.pad_right;
  const int64_t ho = (hp - kh) / p.stride + 1, wo = (wp - kw) / p.stride + 1;
  const int64_t kdim = kh * kw * cin;
  if (kdim >= INT_MAX || cout >= INT_MAX) {
    return Unsupported("conv2d: w " + desc(w) + ": Cout and kh*kw*Cin must be below 2^31");
  }
  const int64_t pixels = b * ho * wo;
  if (pixels == 0 || cout == 0) return Status::Ok();
  set_blas_threads(threads_);

  const float* xp = x.data_as<const float>();
  const float* wp_ = w.data_as<const float>();
  float* yp = y.data_as<float>();
  const bool direct = kh == 1 && kw == 1 && p.stride == 1 && hp == h && wp == wd;
  if (kdim == 0) {
    std::fill(yp, yp + pixels * cout, 0.0f);
  } else if (direct) {
    sgemm_nt(pixels, cout, cin, 1.0f, xp, cin, wp_, cin, 0.0f, yp, cout);
  } else {
    const int64_t block = std::clamp<int64_t>(kMaxColFloats / kdim, 1, pixels);
    auto scratch = HostStorage::allocate(static_cast<size_t>(block * kdim) * 4);
    if (!scratch) return OutOfMemory("conv2d: im2col buffer for x " + desc(x));
    float* col = static_cast<float*>(scratch->data());
    const size_t cin_bytes = static_cast<size_t>(cin) * 4;
    for (int64_t p0 = 0; p0 < pixels; p0 += block) {
      const int64_t np = std::min(block, pixels - p0);
      pool_.parallel_for(np, std::max<int64_t>(1, 4096 / kdim), [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
          const int64_t pix = p0 + i;
          const int64_t bi = pix / (ho * wo), oy = (pix / wo) % ho, ox = pix % wo;
          float* row = col + i * kdim;
          for (int64_t ky = 0; ky < kh; ++ky) {
            const int64_t iy = oy * p.stride - p.pad_top + ky;
            for (int64_t kx = 0; kx < kw; ++kx) {
              const int64_t ix = ox * p.stride - p.pad_left + kx;
              float* dst = row + (ky * kw + kx) * cin;
              if (iy < 0 || iy >= h || ix < 0 || ix >= wd) {
                std::memset(dst, 0, cin_bytes);
              } else {
                std::memcpy(dst, xp + ((bi * h + iy) * wd + ix) * cin, cin_bytes);
              }
            }
          }
        }
      });
      sgemm_nt(np, cout, kdim, 1.0f, col, kdim, wp_, kdim, 0.0f, yp + p0 * cout, cout);
    }
  }
  if (bias.defined()) {
    const float* bp = bias.data_as<const float>();
    pool_.parallel_for(pixels, std::max<int64_t>(1, 65536 / cout), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        float* row = yp + r * cout;
        for (int64_t j = 0; j < cout; ++j) row[j] += bp[j];
      }
    });
  }
  return Status::Ok();
}

Status CpuBackend::upsample_nearest2x(const Tensor& x, Tensor& y) {
  ZI_TRY(contract::upsample_nearest2x(cpu_env(), x, y));
  const int64_t b = x.dim(0), h = x.dim(1), w = x.dim(2), c = x.dim(3);
  const float* xp = x.data_as<const float>();
  float* yp = y.data_as<float>();
  const size_t c_bytes = static_cast<size_t>(c) * 4;
  pool_.parallel_for(b * 2 * h, std::max<int64_t>(1, 8192 / std::max<int64_t>(w * c, 1)),
                     [&](int64_t r0, int64_t r1) {
                       for (int64_t r = r0; r < r1; ++r) {  // r = bi * 2h + oy
                         const float* src = xp + ((r / (2 * h)) * h + (r % (2 * h)) / 2) * w * c;
                         float* dst = yp + r * 2 * w * c;
                         for (int64_t ox = 0; ox < 2 * w; ++ox) {
                           std::memcpy(dst + ox * c, src + (ox / 2) * c, c_bytes);
                         }
                       }
                     });
  return Status::Ok();
}

}  // namespace zimage::cpu

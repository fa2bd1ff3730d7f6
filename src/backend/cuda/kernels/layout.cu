// Data-movement kernels: DiT patchify/unpatchify (f32 latents <-> act-dtype tokens), embedding
// gather, NHWC nearest upsampling and zero padding, and the direct convolution used where cuDNN
// offers no algorithm. Writes are coalesced and 16-byte wide along channels where shapes allow.
#include <algorithm>
#include <climits>
#include <type_traits>

#include "backend/cuda/kernels/device_utils.cuh"

namespace zimage::cuda {
namespace {

constexpr int kThreads = 256;

#define ZI_GRID_LOOP(i, n)                                                  \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n); \
       i += int64_t{gridDim.x} * blockDim.x)

// tokens[b, n, f], n = r*(W/p) + s, f = (ph*p + pw)*C + c  <-  latents[b, c, r*p+ph, s*p+pw].
template <typename T>
__global__ void patchify_kernel(const float* lat, T* tokens, int64_t batch, int64_t c, int64_t h,
                                int64_t w, int p) {
  const int64_t wt = w / p, n_tok = (h / p) * wt, f_dim = int64_t{p} * p * c;
  const int64_t total = batch * n_tok * f_dim;
  ZI_GRID_LOOP(i, total) {
    const int64_t f = i % f_dim, n = (i / f_dim) % n_tok, b = i / (f_dim * n_tok);
    const int64_t ph = f / (p * c), pw = (f / c) % p, ch = f % c;
    const int64_t r = n / wt, s = n % wt;
    tokens[i] = from_f32<T>(lat[((b * c + ch) * h + r * p + ph) * w + s * p + pw]);
  }
}

template <typename T>
__global__ void unpatchify_kernel(const T* tokens, int64_t tokens_per_item, float* out,
                                  int64_t batch, int64_t c, int64_t h, int64_t w, int p,
                                  float alpha) {
  const int64_t wt = w / p, f_dim = int64_t{p} * p * c;
  const int64_t total = batch * c * h * w;
  ZI_GRID_LOOP(i, total) {
    const int64_t x = i % w, y = (i / w) % h, ch = (i / (w * h)) % c, b = i / (w * h * c);
    const int64_t n = (y / p) * wt + x / p;
    const int64_t f = ((y % p) * p + x % p) * c + ch;
    out[i] = alpha * to_f32<T>(tokens[(b * tokens_per_item + n) * f_dim + f]);
  }
}

template <typename T, int VEC>
__global__ void embedding_kernel(const T* table, const int32_t* ids, T* out, int64_t n, int64_t d) {
  const int64_t ppr = d / VEC;
  ZI_GRID_LOOP(p, n * ppr) {
    const int64_t row = p / ppr, c = (p % ppr) * VEC;
    const T* src = table + static_cast<int64_t>(ids[row]) * d + c;
    *reinterpret_cast<Pack<T, VEC>*>(out + row * d + c) =
        *reinterpret_cast<const Pack<T, VEC>*>(src);
  }
}

template <typename T, int VEC>
__global__ void upsample2x_kernel(const T* x, T* y, int64_t batch, int64_t h, int64_t w,
                                  int64_t c) {
  const int64_t ppr = c / VEC, ho = 2 * h, wo = 2 * w;
  ZI_GRID_LOOP(p, batch * ho * wo * ppr) {
    const int64_t cc = (p % ppr) * VEC;
    const int64_t pix = p / ppr;
    const int64_t ox = pix % wo, oy = (pix / wo) % ho, b = pix / (wo * ho);
    const T* src = x + ((b * h + oy / 2) * w + ox / 2) * c + cc;
    *reinterpret_cast<Pack<T, VEC>*>(y + pix * c + cc) =
        *reinterpret_cast<const Pack<T, VEC>*>(src);
  }
}

// The same, walking input rows: grid.x over the packs of one input row (w · c / VEC), grid.y
// over the batch's input rows; each thread reads one input pack and writes it to its 2 × 2 output
// pixels. One 32-bit division per input pack instead of five 64-bit ones per output pack, which
// left the flat kernel at ~1.7 TB/s (session 12's VAE profile).
template <typename T, int VEC>
__global__ void upsample2x_rows_kernel(const T* x, T* y, int64_t rows, int w, int ppr) {
  const int p =
      static_cast<int>(blockIdx.x) * static_cast<int>(blockDim.x) + static_cast<int>(threadIdx.x);
  if (p >= w * ppr) return;
  const int ix = p / ppr, pk = p - ix * ppr;
  const int64_t c = int64_t{ppr} * VEC, wo = 2 * int64_t{w};
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {  // r = b * h + iy
    const Pack<T, VEC> v =
        *reinterpret_cast<const Pack<T, VEC>*>(x + (r * w + ix) * c + int64_t{pk} * VEC);
    T* out = y + (2 * r * wo + 2 * int64_t{ix}) * c + int64_t{pk} * VEC;  // row 2 iy, column 2 ix
    *reinterpret_cast<Pack<T, VEC>*>(out) = v;
    *reinterpret_cast<Pack<T, VEC>*>(out + c) = v;
    *reinterpret_cast<Pack<T, VEC>*>(out + wo * c) = v;
    *reinterpret_cast<Pack<T, VEC>*>(out + wo * c + c) = v;
  }
}

template <typename T, int VEC>
__global__ void pad_kernel(const T* x, T* y, int64_t batch, int64_t h, int64_t w, int64_t c,
                           int top, int left, int64_t hp, int64_t wp) {
  const int64_t ppr = c / VEC;
  ZI_GRID_LOOP(p, batch * hp * wp * ppr) {
    const int64_t cc = (p % ppr) * VEC;
    const int64_t pix = p / ppr;
    const int64_t ox = pix % wp, oy = (pix / wp) % hp, b = pix / (wp * hp);
    const int64_t ix = ox - left, iy = oy - top;
    Pack<T, VEC> v;
    if (ix >= 0 && ix < w && iy >= 0 && iy < h) {
      v = *reinterpret_cast<const Pack<T, VEC>*>(x + ((b * h + iy) * w + ix) * c + cc);
    } else {
#pragma unroll
      for (int k = 0; k < VEC; ++k) v.v[k] = from_f32<T>(0.f);
    }
    *reinterpret_cast<Pack<T, VEC>*>(y + pix * c + cc) = v;
  }
}

// One thread per output element (co fastest), fp32 accumulation.
template <typename T>
__global__ void conv_direct_kernel(const T* x, const T* wt, const T* bias, T* y, ConvShape sh) {
  const int64_t total = sh.batch * sh.ho * sh.wo * sh.cout;
  ZI_GRID_LOOP(i, total) {
    const int64_t co = i % sh.cout, ox = (i / sh.cout) % sh.wo;
    const int64_t oy = (i / (sh.cout * sh.wo)) % sh.ho, b = i / (sh.cout * sh.wo * sh.ho);
    float acc = bias ? to_f32<T>(bias[co]) : 0.f;
    for (int64_t ky = 0; ky < sh.kh; ++ky) {
      const int64_t iy = oy * sh.stride - sh.pad_top + ky;
      if (iy < 0 || iy >= sh.h) continue;
      for (int64_t kx = 0; kx < sh.kw; ++kx) {
        const int64_t ix = ox * sh.stride - sh.pad_left + kx;
        if (ix < 0 || ix >= sh.w) continue;
        const T* xp = x + ((b * sh.h + iy) * sh.w + ix) * sh.cin;
        const T* wp = wt + ((co * sh.kh + ky) * sh.kw + kx) * sh.cin;
        for (int64_t ci = 0; ci < sh.cin; ++ci) acc += to_f32<T>(xp[ci]) * to_f32<T>(wp[ci]);
      }
    }
    y[i] = from_f32<T>(acc);
  }
}

// The two forms of a channel-wise kernel: launch(vec, grid) with vec = V over total / V packs when
// `vec_ok` (channels a multiple of V, 16-byte aligned pointers), else vec = 1 over total elements.
template <int V, typename Launch>
cudaError_t launch_vec_or_scalar(bool vec_ok, int64_t total, Launch&& launch) {
  if (vec_ok)
    launch(std::integral_constant<int, V>{}, grid_for(total / V, kThreads));
  else
    launch(std::integral_constant<int, 1>{}, grid_for(total, kThreads));
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_patchify(KType out_t, const float* latents, void* tokens, int64_t batch,
                            int64_t c, int64_t h, int64_t w, int p, cudaStream_t s) {
  const int64_t total = batch * c * h * w;
  if (total <= 0) return cudaSuccess;
  if (p <= 0 || h % p || w % p) return cudaErrorInvalidValue;
  return dispatch_ktype(out_t, [&](auto tag) {
    using T = decltype(tag);
    patchify_kernel<T><<<grid_for(total, kThreads), kThreads, 0, s>>>(
        latents, static_cast<T*>(tokens), batch, c, h, w, p);
    return cudaGetLastError();
  });
}

cudaError_t launch_unpatchify(KType in_t, const void* tokens, int64_t tokens_per_item, float* out,
                              int64_t batch, int64_t c, int64_t h, int64_t w, int p, float alpha,
                              cudaStream_t s) {
  const int64_t total = batch * c * h * w;
  if (total <= 0) return cudaSuccess;
  if (p <= 0 || h % p || w % p) return cudaErrorInvalidValue;
  return dispatch_ktype(in_t, [&](auto tag) {
    using T = decltype(tag);
    unpatchify_kernel<T><<<grid_for(total, kThreads), kThreads, 0, s>>>(
        static_cast<const T*>(tokens), tokens_per_item, out, batch, c, h, w, p, alpha);
    return cudaGetLastError();
  });
}

cudaError_t launch_embedding(KType t, const void* table, const int32_t* ids, void* out, int64_t n,
                             int64_t d, cudaStream_t s) {
  if (n <= 0 || d <= 0) return cudaSuccess;
  return dispatch_ktype(t, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = kVec16<T>;
    auto tp = static_cast<const T*>(table);
    auto op = static_cast<T*>(out);
    return launch_vec_or_scalar<V>(
        d % V == 0 && aligned16(table) && aligned16(out), n * d, [&](auto vec, unsigned grid) {
          embedding_kernel<T, decltype(vec)::value><<<grid, kThreads, 0, s>>>(tp, ids, op, n, d);
        });
  });
}

cudaError_t launch_upsample_nearest2x(KType t, const void* x, void* y, int64_t batch, int64_t h,
                                      int64_t w, int64_t c, cudaStream_t s) {
  const int64_t total = batch * 4 * h * w * c;
  if (total <= 0) return cudaSuccess;
  return dispatch_ktype(t, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = kVec16<T>;
    auto xp = static_cast<const T*>(x);
    auto yp = static_cast<T*>(y);
    const bool vec = c % V == 0 && aligned16(x) && aligned16(y);
    const int walk = row_kernel_tuning().row_walk;
    const int64_t packs = w * (c / V);  // of one input row
    if (vec && (walk != 0 ? walk : row_kernel_defaults().row_walk) == 2 && packs <= INT32_MAX) {
      const int64_t rows = batch * h;
      const dim3 grid(static_cast<unsigned>((packs + kThreads - 1) / kThreads),
                      static_cast<unsigned>(std::min<int64_t>(rows, 65535)));
      upsample2x_rows_kernel<T, V>
          <<<grid, kThreads, 0, s>>>(xp, yp, rows, static_cast<int>(w), static_cast<int>(c / V));
      return cudaGetLastError();
    }
    return launch_vec_or_scalar<V>(vec, total, [&](auto vec_t, unsigned grid) {
      upsample2x_kernel<T, decltype(vec_t)::value>
          <<<grid, kThreads, 0, s>>>(xp, yp, batch, h, w, c);
    });
  });
}

cudaError_t launch_pad_nhwc(KType t, const void* x, void* y, int64_t batch, int64_t h, int64_t w,
                            int64_t c, int top, int bottom, int left, int right, cudaStream_t s) {
  const int64_t hp = h + top + bottom, wp = w + left + right;
  const int64_t total = batch * hp * wp * c;
  if (total <= 0) return cudaSuccess;
  return dispatch_ktype(t, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = kVec16<T>;
    auto xp = static_cast<const T*>(x);
    auto yp = static_cast<T*>(y);
    return launch_vec_or_scalar<V>(
        c % V == 0 && aligned16(x) && aligned16(y), total, [&](auto vec, unsigned grid) {
          pad_kernel<T, decltype(vec)::value>
              <<<grid, kThreads, 0, s>>>(xp, yp, batch, h, w, c, top, left, hp, wp);
        });
  });
}

cudaError_t launch_conv2d_direct(KType t, const void* x, const void* w, const void* bias, void* y,
                                 const ConvShape& shape, cudaStream_t s) {
  const int64_t total = shape.batch * shape.ho * shape.wo * shape.cout;
  if (total <= 0) return cudaSuccess;
  return dispatch_ktype(t, [&](auto tag) {
    using T = decltype(tag);
    conv_direct_kernel<T><<<grid_for(total, kThreads), kThreads, 0, s>>>(
        static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const T*>(bias),
        static_cast<T*>(y), shape);
    return cudaGetLastError();
  });
}

}  // namespace zimage::cuda

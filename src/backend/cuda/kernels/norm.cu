// Row normalisations: RMSNorm, LayerNorm and the DiT's gated post-norm residual, over the last
// dimension of [R, D]. Statistics are fp32. Intermediate results are rounded to the storage type
// exactly where a framework running the same math as separate ops in that type would round
// (normalise -> * weight -> * scale), so bf16 results track the reference; in f32 the roundings
// are no-ops. Fast path (D a multiple of the 16-byte pack, aligned pointers, D up to 4096 packs):
// a row is read once into registers by a group of threads (a power-of-two slice of a warp for
// narrow rows such as the 128-wide q/k norms, a whole block for wide rows such as the DiT's
// 3840), reduced with shuffles or shared memory, and written from the registers: one read and one
// write of the row. Other shapes use a warp-per-row loop kernel that reads the row twice.
#include <type_traits>

#include "backend/cuda/kernels/device_utils.cuh"

namespace zimage::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

template <typename T, int VEC>
__global__ void rms_norm_kernel(const T* x, const T* w, const T* scale, T* y, int64_t rows,
                                int64_t d, int64_t rows_per_group, float eps) {
  const int lane = threadIdx.x & 31;
  for (int64_t row = blockIdx.x * int64_t{kWarps} + (threadIdx.x >> 5); row < rows;
       row += int64_t{gridDim.x} * kWarps) {
    const T* xr = x + row * d;
    T* yr = y + row * d;
    const T* sr = scale ? scale + (row / rows_per_group) * d : nullptr;
    float ss = 0.f;
    for (int64_t c = lane * VEC; c < d; c += 32 * VEC) {
      float v[VEC];
      load_f32<T, VEC>(xr + c, v);
#pragma unroll
      for (int k = 0; k < VEC; ++k) ss += v[k] * v[k];
    }
    ss = warp_sum(ss);
    const float r = rsqrtf(ss / static_cast<float>(d) + eps);
    for (int64_t c = lane * VEC; c < d; c += 32 * VEC) {
      float v[VEC];
      load_f32<T, VEC>(xr + c, v);
#pragma unroll
      for (int k = 0; k < VEC; ++k) v[k] = round_to<T>(v[k] * r);
      if (w) {
        float wv[VEC];
        load_f32<T, VEC>(w + c, wv);
#pragma unroll
        for (int k = 0; k < VEC; ++k) v[k] = round_to<T>(v[k] * wv[k]);
      }
      if (sr) {
        float sv[VEC];
        load_f32<T, VEC>(sr + c, sv);
#pragma unroll
        for (int k = 0; k < VEC; ++k) v[k] *= sv[k];
      }
      store_f32<T, VEC>(yr + c, v);
    }
  }
}

template <typename T, int VEC>
__global__ void layer_norm_kernel(const T* x, const T* w, const T* b, const T* scale, T* y,
                                  int64_t rows, int64_t d, int64_t rows_per_group, float eps) {
  const int lane = threadIdx.x & 31;
  for (int64_t row = blockIdx.x * int64_t{kWarps} + (threadIdx.x >> 5); row < rows;
       row += int64_t{gridDim.x} * kWarps) {
    const T* xr = x + row * d;
    T* yr = y + row * d;
    const T* sr = scale ? scale + (row / rows_per_group) * d : nullptr;
    float sum = 0.f;
    for (int64_t c = lane * VEC; c < d; c += 32 * VEC) {
      float v[VEC];
      load_f32<T, VEC>(xr + c, v);
#pragma unroll
      for (int k = 0; k < VEC; ++k) sum += v[k];
    }
    const float mean = warp_sum(sum) / static_cast<float>(d);
    float var = 0.f;
    for (int64_t c = lane * VEC; c < d; c += 32 * VEC) {
      float v[VEC];
      load_f32<T, VEC>(xr + c, v);
#pragma unroll
      for (int k = 0; k < VEC; ++k) var += (v[k] - mean) * (v[k] - mean);
    }
    const float rstd = rsqrtf(warp_sum(var) / static_cast<float>(d) + eps);
    for (int64_t c = lane * VEC; c < d; c += 32 * VEC) {
      float v[VEC];
      load_f32<T, VEC>(xr + c, v);
#pragma unroll
      for (int k = 0; k < VEC; ++k) v[k] = (v[k] - mean) * rstd;
      if (w) {
        float wv[VEC];
        load_f32<T, VEC>(w + c, wv);
#pragma unroll
        for (int k = 0; k < VEC; ++k) v[k] *= wv[k];
      }
      if (b) {
        float bv[VEC];
        load_f32<T, VEC>(b + c, bv);
#pragma unroll
        for (int k = 0; k < VEC; ++k) v[k] += bv[k];
      }
      if (sr) {
        float sv[VEC];
        load_f32<T, VEC>(sr + c, sv);
#pragma unroll
        for (int k = 0; k < VEC; ++k) v[k] = round_to<T>(v[k]) * sv[k];
      }
      store_f32<T, VEC>(yr + c, v);
    }
  }
}

template <typename T, int VEC>
__global__ void residual_rms_gate_kernel(T* x, const T* y, const T* w, const T* gate, int64_t rows,
                                         int64_t d, int64_t rows_per_group, float eps) {
  const int lane = threadIdx.x & 31;
  for (int64_t row = blockIdx.x * int64_t{kWarps} + (threadIdx.x >> 5); row < rows;
       row += int64_t{gridDim.x} * kWarps) {
    T* xr = x + row * d;
    const T* yr = y + row * d;
    const T* gr = gate ? gate + (row / rows_per_group) * d : nullptr;
    float ss = 0.f;
    for (int64_t c = lane * VEC; c < d; c += 32 * VEC) {
      float v[VEC];
      load_f32<T, VEC>(yr + c, v);
#pragma unroll
      for (int k = 0; k < VEC; ++k) ss += v[k] * v[k];
    }
    const float r = rsqrtf(warp_sum(ss) / static_cast<float>(d) + eps);
    for (int64_t c = lane * VEC; c < d; c += 32 * VEC) {
      float v[VEC], xv[VEC];
      load_f32<T, VEC>(yr + c, v);
      load_f32<T, VEC>(xr + c, xv);
#pragma unroll
      for (int k = 0; k < VEC; ++k) v[k] = round_to<T>(v[k] * r);
      if (w) {
        float wv[VEC];
        load_f32<T, VEC>(w + c, wv);
#pragma unroll
        for (int k = 0; k < VEC; ++k) v[k] = round_to<T>(v[k] * wv[k]);
      }
      if (gr) {
        float gv[VEC];
        load_f32<T, VEC>(gr + c, gv);
#pragma unroll
        for (int k = 0; k < VEC; ++k) v[k] = round_to<T>(v[k] * gv[k]);
      }
#pragma unroll
      for (int k = 0; k < VEC; ++k) xv[k] += v[k];
      store_f32<T, VEC>(xr + c, xv);
    }
  }
}

// ---- register-cached fast path ----

// Sum over the threads sharing a row: a power-of-two group `tpr` within a warp, or the block.
template <bool kBlock>
__device__ __forceinline__ float row_sum(float v, int tpr, float* scratch) {
  if constexpr (kBlock) {
    return block_sum(v, scratch);
  } else {
    for (int o = tpr / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
  }
}

// Which row this thread works on and its index within the row's thread group.
template <bool kBlock>
__device__ __forceinline__ void row_slot(int tpr, int64_t* row, int* t) {
  if constexpr (kBlock) {
    *row = blockIdx.x;
    *t = threadIdx.x;
  } else {
    *row = blockIdx.x * int64_t{blockDim.x / tpr} + threadIdx.x / tpr;
    *t = threadIdx.x % tpr;
  }
}

// Loads this thread's packs of row `row` of src [rows, d] into registers (fp32) and returns the
// row's sum of squares (reduced over the row's threads). Shared by the register-cached RMS norms.
template <typename T, int VEC, int PPT, bool kBlock>
__device__ __forceinline__ float load_row_sumsq(const T* src, int64_t row, int d, int t, int tpr,
                                                bool valid, float (&v)[PPT][VEC], float* scratch) {
  const int packs = d / VEC;
  float ss = 0.f;
#pragma unroll
  for (int p = 0; p < PPT; ++p) {
    const int pk = t + p * tpr;
    if (valid && pk < packs) {
      load_f32<T, VEC>(src + row * d + pk * VEC, v[p]);
#pragma unroll
      for (int k = 0; k < VEC; ++k) ss += v[p][k] * v[p][k];
    }
  }
  return row_sum<kBlock>(ss, tpr, scratch);
}

template <typename T, int VEC, int PPT, bool kBlock>
__global__ void __launch_bounds__(1024)
    rms_norm_reg_kernel(const T* x, const T* w, const T* scale, T* y, int64_t rows, int d,
                        int64_t rows_per_group, float eps, int tpr) {
  __shared__ float scratch[32];
  int64_t row;
  int t;
  row_slot<kBlock>(tpr, &row, &t);
  const int packs = d / VEC;
  const bool valid = row < rows;
  float v[PPT][VEC];
  const float ss = load_row_sumsq<T, VEC, PPT, kBlock>(x, row, d, t, tpr, valid, v, scratch);
  if (!valid) return;
  const float r = rsqrtf(ss / static_cast<float>(d) + eps);
  const T* sr = scale ? scale + (row / rows_per_group) * d : nullptr;
#pragma unroll
  for (int p = 0; p < PPT; ++p) {
    const int pk = t + p * tpr;
    if (pk >= packs) continue;
    float o[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) o[k] = round_to<T>(v[p][k] * r);
    if (w) {
      float wv[VEC];
      load_f32<T, VEC>(w + pk * VEC, wv);
#pragma unroll
      for (int k = 0; k < VEC; ++k) o[k] = round_to<T>(o[k] * wv[k]);
    }
    if (sr) {
      float sv[VEC];
      load_f32<T, VEC>(sr + pk * VEC, sv);
#pragma unroll
      for (int k = 0; k < VEC; ++k) o[k] *= sv[k];
    }
    store_f32<T, VEC>(y + row * d + pk * VEC, o);
  }
}

template <typename T, int VEC, int PPT, bool kBlock>
__global__ void __launch_bounds__(1024)
    layer_norm_reg_kernel(const T* x, const T* w, const T* b, const T* scale, T* y, int64_t rows,
                          int d, int64_t rows_per_group, float eps, int tpr) {
  __shared__ float scratch[32];
  int64_t row;
  int t;
  row_slot<kBlock>(tpr, &row, &t);
  const int packs = d / VEC;
  const bool valid = row < rows;
  float v[PPT][VEC];
  float sum = 0.f;
#pragma unroll
  for (int p = 0; p < PPT; ++p) {
    const int pk = t + p * tpr;
    if (valid && pk < packs) {
      load_f32<T, VEC>(x + row * d + pk * VEC, v[p]);
#pragma unroll
      for (int k = 0; k < VEC; ++k) sum += v[p][k];
    }
  }
  const float mean = row_sum<kBlock>(sum, tpr, scratch) / static_cast<float>(d);
  float var = 0.f;
#pragma unroll
  for (int p = 0; p < PPT; ++p) {
    const int pk = t + p * tpr;
    if (valid && pk < packs) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) var += (v[p][k] - mean) * (v[p][k] - mean);
    }
  }
  var = row_sum<kBlock>(var, tpr, scratch);
  if (!valid) return;
  const float rstd = rsqrtf(var / static_cast<float>(d) + eps);
  const T* sr = scale ? scale + (row / rows_per_group) * d : nullptr;
#pragma unroll
  for (int p = 0; p < PPT; ++p) {
    const int pk = t + p * tpr;
    if (pk >= packs) continue;
    float o[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) o[k] = (v[p][k] - mean) * rstd;
    if (w) {
      float wv[VEC];
      load_f32<T, VEC>(w + pk * VEC, wv);
#pragma unroll
      for (int k = 0; k < VEC; ++k) o[k] *= wv[k];
    }
    if (b) {
      float bv[VEC];
      load_f32<T, VEC>(b + pk * VEC, bv);
#pragma unroll
      for (int k = 0; k < VEC; ++k) o[k] += bv[k];
    }
    if (sr) {
      float sv[VEC];
      load_f32<T, VEC>(sr + pk * VEC, sv);
#pragma unroll
      for (int k = 0; k < VEC; ++k) o[k] = round_to<T>(o[k]) * sv[k];
    }
    store_f32<T, VEC>(y + row * d + pk * VEC, o);
  }
}

template <typename T, int VEC, int PPT, bool kBlock>
__global__ void __launch_bounds__(1024)
    residual_rms_gate_reg_kernel(T* x, const T* y, const T* w, const T* gate, int64_t rows, int d,
                                 int64_t rows_per_group, float eps, int tpr) {
  __shared__ float scratch[32];
  int64_t row;
  int t;
  row_slot<kBlock>(tpr, &row, &t);
  const int packs = d / VEC;
  const bool valid = row < rows;
  float v[PPT][VEC];
  const float ss = load_row_sumsq<T, VEC, PPT, kBlock>(y, row, d, t, tpr, valid, v, scratch);
  if (!valid) return;
  const float r = rsqrtf(ss / static_cast<float>(d) + eps);
  const T* gr = gate ? gate + (row / rows_per_group) * d : nullptr;
#pragma unroll
  for (int p = 0; p < PPT; ++p) {
    const int pk = t + p * tpr;
    if (pk >= packs) continue;
    float o[VEC], xv[VEC];
    load_f32<T, VEC>(x + row * d + pk * VEC, xv);
#pragma unroll
    for (int k = 0; k < VEC; ++k) o[k] = round_to<T>(v[p][k] * r);
    if (w) {
      float wv[VEC];
      load_f32<T, VEC>(w + pk * VEC, wv);
#pragma unroll
      for (int k = 0; k < VEC; ++k) o[k] = round_to<T>(o[k] * wv[k]);
    }
    if (gr) {
      float gv[VEC];
      load_f32<T, VEC>(gr + pk * VEC, gv);
#pragma unroll
      for (int k = 0; k < VEC; ++k) o[k] = round_to<T>(o[k] * gv[k]);
    }
#pragma unroll
    for (int k = 0; k < VEC; ++k) xv[k] += o[k];
    store_f32<T, VEC>(x + row * d + pk * VEC, xv);
  }
}

// Thread layout of the fast path for a row of `packs` 16-byte packs.
struct RowCfg {
  bool block;  // one row per block of `tpr` threads (else groups of `tpr` <= 32 in 128)
  int ppt;     // packs per thread: 1, 2 or 4
  int tpr;     // threads per row
};

bool pick_row_cfg(int64_t packs, RowCfg* c) {
  auto round32 = [](int64_t n) { return static_cast<int>((n + 31) / 32 * 32); };
  if (packs <= 0) return false;
  if (packs <= 32) {
    int t = 1;
    while (t < packs) t *= 2;
    *c = {false, 1, t};
  } else if (packs <= 64) {
    *c = {false, 2, 32};
  } else if (packs <= 128) {
    *c = {false, 4, 32};
  } else if (packs <= 1024) {
    *c = {true, 1, round32(packs)};
  } else if (packs <= 2048) {
    *c = {true, 2, round32((packs + 1) / 2)};
  } else if (packs <= 4096) {
    *c = {true, 4, round32((packs + 3) / 4)};
  } else {
    return false;
  }
  return true;
}

// Calls f(ppt, block) with both as compile-time constants, and launches on the returned shape.
template <typename F>
cudaError_t with_row_cfg(const RowCfg& c, F&& f) {
  using I1 = std::integral_constant<int, 1>;
  using I2 = std::integral_constant<int, 2>;
  using I4 = std::integral_constant<int, 4>;
  if (c.block) {
    if (c.ppt == 1) return f(I1{}, std::true_type{});
    if (c.ppt == 2) return f(I2{}, std::true_type{});
    return f(I4{}, std::true_type{});
  }
  if (c.ppt == 1) return f(I1{}, std::false_type{});
  if (c.ppt == 2) return f(I2{}, std::false_type{});
  return f(I4{}, std::false_type{});
}

dim3 row_cfg_grid(const RowCfg& c, int64_t rows) {
  if (c.block) return dim3(static_cast<unsigned>(rows));
  const int64_t per_block = kThreads / c.tpr;
  return dim3(static_cast<unsigned>((rows + per_block - 1) / per_block));
}
unsigned row_cfg_block(const RowCfg& c) {
  return c.block ? c.tpr : kThreads;
}

bool all_aligned(std::initializer_list<const void*> ps) {
  for (const void* p : ps)
    if (p && !aligned16(p)) return false;
  return true;
}

unsigned row_grid(int64_t rows) {
  return grid_for(rows, kWarps);
}

}  // namespace

cudaError_t launch_rms_norm(KType t, const void* x, const void* w, const void* scale, void* y,
                            int64_t rows, int64_t d, int64_t rows_per_group, float eps,
                            cudaStream_t s) {
  if (rows <= 0 || d <= 0) return cudaSuccess;
  return dispatch_ktype(t, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = kVec16<T>;
    auto xp = static_cast<const T*>(x);
    auto wp = static_cast<const T*>(w);
    auto sp = static_cast<const T*>(scale);
    auto yp = static_cast<T*>(y);
    RowCfg cfg;
    if (d % V == 0 && all_aligned({x, w, scale, y}) && rows < 0x7fffffff &&
        pick_row_cfg(d / V, &cfg)) {
      return with_row_cfg(cfg, [&](auto ppt, auto blk) {
        rms_norm_reg_kernel<T, V, decltype(ppt)::value, decltype(blk)::value>
            <<<row_cfg_grid(cfg, rows), row_cfg_block(cfg), 0, s>>>(
                xp, wp, sp, yp, rows, static_cast<int>(d), rows_per_group, eps, cfg.tpr);
        return cudaGetLastError();
      });
    }
    if (d % V == 0 && all_aligned({x, w, scale, y}))
      rms_norm_kernel<T, V>
          <<<row_grid(rows), kThreads, 0, s>>>(xp, wp, sp, yp, rows, d, rows_per_group, eps);
    else
      rms_norm_kernel<T, 1>
          <<<row_grid(rows), kThreads, 0, s>>>(xp, wp, sp, yp, rows, d, rows_per_group, eps);
    return cudaGetLastError();
  });
}

cudaError_t launch_layer_norm(KType t, const void* x, const void* w, const void* b,
                              const void* scale, void* y, int64_t rows, int64_t d,
                              int64_t rows_per_group, float eps, cudaStream_t s) {
  if (rows <= 0 || d <= 0) return cudaSuccess;
  return dispatch_ktype(t, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = kVec16<T>;
    auto xp = static_cast<const T*>(x);
    auto wp = static_cast<const T*>(w);
    auto bp = static_cast<const T*>(b);
    auto sp = static_cast<const T*>(scale);
    auto yp = static_cast<T*>(y);
    RowCfg cfg;
    if (d % V == 0 && all_aligned({x, w, b, scale, y}) && rows < 0x7fffffff &&
        pick_row_cfg(d / V, &cfg)) {
      return with_row_cfg(cfg, [&](auto ppt, auto blk) {
        layer_norm_reg_kernel<T, V, decltype(ppt)::value, decltype(blk)::value>
            <<<row_cfg_grid(cfg, rows), row_cfg_block(cfg), 0, s>>>(
                xp, wp, bp, sp, yp, rows, static_cast<int>(d), rows_per_group, eps, cfg.tpr);
        return cudaGetLastError();
      });
    }
    if (d % V == 0 && all_aligned({x, w, b, scale, y}))
      layer_norm_kernel<T, V>
          <<<row_grid(rows), kThreads, 0, s>>>(xp, wp, bp, sp, yp, rows, d, rows_per_group, eps);
    else
      layer_norm_kernel<T, 1>
          <<<row_grid(rows), kThreads, 0, s>>>(xp, wp, bp, sp, yp, rows, d, rows_per_group, eps);
    return cudaGetLastError();
  });
}

cudaError_t launch_residual_rms_norm_gate(KType t, void* x, const void* y, const void* w,
                                          const void* gate, int64_t rows, int64_t d,
                                          int64_t rows_per_group, float eps, cudaStream_t s) {
  if (rows <= 0 || d <= 0) return cudaSuccess;
  return dispatch_ktype(t, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = kVec16<T>;
    auto xp = static_cast<T*>(x);
    auto yp = static_cast<const T*>(y);
    auto wp = static_cast<const T*>(w);
    auto gp = static_cast<const T*>(gate);
    RowCfg cfg;
    if (d % V == 0 && all_aligned({x, y, w, gate}) && rows < 0x7fffffff &&
        pick_row_cfg(d / V, &cfg)) {
      return with_row_cfg(cfg, [&](auto ppt, auto blk) {
        residual_rms_gate_reg_kernel<T, V, decltype(ppt)::value, decltype(blk)::value>
            <<<row_cfg_grid(cfg, rows), row_cfg_block(cfg), 0, s>>>(
                xp, yp, wp, gp, rows, static_cast<int>(d), rows_per_group, eps, cfg.tpr);
        return cudaGetLastError();
      });
    }
    if (d % V == 0 && all_aligned({x, y, w, gate}))
      residual_rms_gate_kernel<T, V>
          <<<row_grid(rows), kThreads, 0, s>>>(xp, yp, wp, gp, rows, d, rows_per_group, eps);
    else
      residual_rms_gate_kernel<T, 1>
          <<<row_grid(rows), kThreads, 0, s>>>(xp, yp, wp, gp, rows, d, rows_per_group, eps);
    return cudaGetLastError();
  });
}

}  // namespace zimage::cuda

// Row normalisations: RMSNorm, LayerNorm and the DiT's gated post-norm residual, over the last
// dimension of [R, D]. Statistics are fp32. Intermediate results are rounded to the storage type
// exactly where a framework running the same math as separate ops in that type would round
// (normalise -> * weight -> * scale), so bf16 results track the reference; in f32 the roundings
// are no-ops. Fast path (D a multiple of the 16-byte pack, aligned pointers, D up to 4096 packs):
// a row is read once into registers by a group of threads (a power-of-two slice of a warp for
// narrow rows such as the 128-wide q/k norms, a whole block for wide rows such as the DiT's
// 3840), reduced with shuffles or shared memory, and written from the registers: one read and one
// write of the row. Other shapes use a warp-per-row loop kernel that reads the row twice.
#include <atomic>
#include <type_traits>

#include "backend/cuda/kernels/bf16x2.cuh"
#include "backend/cuda/kernels/device_utils.cuh"
#include "backend/cuda/kernels/fp8_rows.cuh"
#include "backend/cuda/kernels/kernels.h"

namespace zimage::cuda {

namespace {
std::atomic<int> g_norm_ppt{0}, g_prologue_items{0}, g_row_walk{0};
// The attention prologue as a block per token row (prologue.cu qk_norm_rope_row_kernel): 24-35 %
// faster than the warp-item kernel per op on an H100 (in place at 4160 / 9280 rows 0.054 / 0.108
// ms against 0.071 / 0.155; to e4m3 0.051 / 0.110 against 0.079 / 0.170; a 2048² forward's 30
// calls 5.5 ms against 8.6), docs/BENCHMARKS.md "Session 26". ZIMAGE_STAGED_ROWS=0: the warp
// kernel.
std::atomic<bool> g_staged_rows{true};
// The gated residual + next norm and the FP8 SwiGLU of bf16 rows on bf16x2 pairs (bf16x2.cuh,
// norm_bf16x2.cu): the same bits in fewer instructions. ZIMAGE_PACKED_ROWS=0: the fp32 forms.
std::atomic<bool> g_packed_rows{true};
}  // namespace

void set_staged_row_kernels(bool on) {
  g_staged_rows.store(on);
}
bool staged_row_kernels() {
  return g_staged_rows.load();
}
void set_packed_row_kernels(bool on) {
  g_packed_rows.store(on);
}
bool packed_row_kernels() {
  return g_packed_rows.load();
}

void set_row_kernel_tuning(const RowKernelTuning& t) {
  auto pick = [](int v) { return v == 1 || v == 2 || v == 4 ? v : 0; };
  g_norm_ppt.store(pick(t.norm_ppt));
  g_prologue_items.store(pick(t.prologue_items));
  g_row_walk.store(t.row_walk == 1 || t.row_walk == 2 ? t.row_walk : 0);
}
RowKernelTuning row_kernel_tuning() {
  return {g_norm_ppt.load(), g_prologue_items.load(), g_row_walk.load()};
}
// Measured in session 14 (docs/BENCHMARKS.md, one H100, `scripts/gpu_run.sh variants`): the
// row-walking kernels took the VAE decode from 33.8 to 30.5 ms at 1024² and from 198 to 191 ms at
// 2048², the DiT forward unchanged within the run-to-run spread; 2 packs per thread and 2 items
// per warp (2,2,2) gained nothing more. Session 16 (one H100, CudaOpsPerf.RowKernelTuning, with
// one (cos, sin) load per token row): the prologue at 2 items per warp 0.102 / 0.386 ms at 4160 /
// 16448 rows against 0.124 / 0.476 at 1 item (4 items: 0.109 / 0.409), so 2 is the default of the
// warp-item kernel. Under staged_row_kernels() (the default since session 26) the packed prologue
// of 2-byte types takes a block per row when the setting is 0 (prologue.cu
// qk_norm_rope_row_kernel).
RowKernelTuning row_kernel_defaults() {
  return {1, 2, 2};
}

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// The per-feature steps of every norm on one pack of VEC values at `off` of a row: o *= p (the
// weight, scale or gate), rounded to T when kRound as a separate multiply in T would round it, and
// o += p (a bias). A null p skips the step.
template <typename T, int VEC, bool kRound>
__device__ __forceinline__ void mul_pack(const T* p, int64_t off, float (&o)[VEC]) {
  if (!p) return;
  float pv[VEC];
  load_f32<T, VEC>(p + off, pv);
#pragma unroll
  for (int k = 0; k < VEC; ++k) o[k] = kRound ? round_to<T>(o[k] * pv[k]) : o[k] * pv[k];
}
template <typename T, int VEC>
__device__ __forceinline__ void add_pack(const T* p, int64_t off, float (&o)[VEC]) {
  if (!p) return;
  float pv[VEC];
  load_f32<T, VEC>(p + off, pv);
#pragma unroll
  for (int k = 0; k < VEC; ++k) o[k] += pv[k];
}

// Sum of f(v) over the elements v of row xr [d], for the warp-per-row kernels (one row a warp).
template <typename T, int VEC, typename F>
__device__ __forceinline__ float warp_row_sum(const T* xr, int64_t d, F f) {
  float s = 0.f;
  for (int64_t c = (threadIdx.x & 31) * VEC; c < d; c += 32 * VEC) {
    float v[VEC];
    load_f32<T, VEC>(xr + c, v);
#pragma unroll
    for (int k = 0; k < VEC; ++k) s += f(v[k]);
  }
  return warp_sum(s);
}

// Writes a row norm's pack: dst = o, or dst += o for the residual norm.
template <typename T, int VEC, bool kResidual>
__device__ __forceinline__ void store_norm_pack(T* dst, float (&o)[VEC]) {
  if constexpr (kResidual) {
    float xv[VEC];
    load_f32<T, VEC>(dst, xv);
#pragma unroll
    for (int k = 0; k < VEC; ++k) xv[k] += o[k];
    store_f32<T, VEC>(dst, xv);
  } else {
    store_f32<T, VEC>(dst, o);
  }
}

// RMS norm of src's rows: y = rms_norm(x) * w * scale (kResidual false: src x, dst y, mod the
// scale), or the DiT's post-norm residual x += gate * rms_norm(y) * w (kResidual true: src y,
// dst x, mod the gate, rounded like the weight).
template <typename T, int VEC, bool kResidual>
__global__ void rms_norm_kernel(const T* src, const T* w, const T* mod, T* dst, int64_t rows,
                                int64_t d, int64_t rows_per_group, float eps) {
  const int lane = threadIdx.x & 31;
  for (int64_t row = blockIdx.x * int64_t{kWarps} + (threadIdx.x >> 5); row < rows;
       row += int64_t{gridDim.x} * kWarps) {
    const T* sr = src + row * d;
    T* dr = dst + row * d;
    const T* mr = mod ? mod + (row / rows_per_group) * d : nullptr;
    const float ss = warp_row_sum<T, VEC>(sr, d, [](float v) { return v * v; });
    const float r = rsqrtf(ss / static_cast<float>(d) + eps);
    for (int64_t c = lane * VEC; c < d; c += 32 * VEC) {
      float v[VEC];
      load_f32<T, VEC>(sr + c, v);
#pragma unroll
      for (int k = 0; k < VEC; ++k) v[k] = round_to<T>(v[k] * r);
      mul_pack<T, VEC, true>(w, c, v);
      mul_pack<T, VEC, kResidual>(mr, c, v);
      store_norm_pack<T, VEC, kResidual>(dr + c, v);
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
    const float mean =
        warp_row_sum<T, VEC>(xr, d, [](float v) { return v; }) / static_cast<float>(d);
    const float var =
        warp_row_sum<T, VEC>(xr, d, [mean](float v) { return (v - mean) * (v - mean); });
    const float rstd = rsqrtf(var / static_cast<float>(d) + eps);
    for (int64_t c = lane * VEC; c < d; c += 32 * VEC) {
      float v[VEC];
      load_f32<T, VEC>(xr + c, v);
#pragma unroll
      for (int k = 0; k < VEC; ++k) v[k] = (v[k] - mean) * rstd;
      mul_pack<T, VEC, false>(w, c, v);
      add_pack<T, VEC>(b, c, v);
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

// Max over the threads sharing a row (as row_sum).
template <bool kBlock>
__device__ __forceinline__ float row_max(float v, int tpr, float* scratch) {
  if constexpr (kBlock) {
    return block_max(v, scratch);
  } else {
    for (int o = tpr / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
  }
}

// This thread's place in the fast path: its row, its index t within the row's group of tpr
// threads, and whether the row exists (threads past the last row still join the reductions).
struct RowSlot {
  int64_t row;
  int t;
  bool valid;
};
template <bool kBlock>
__device__ __forceinline__ RowSlot row_slot(int tpr, int64_t rows) {
  RowSlot s;
  if constexpr (kBlock) {
    s.row = blockIdx.x;
    s.t = threadIdx.x;
  } else {
    s.row = blockIdx.x * int64_t{blockDim.x / tpr} + threadIdx.x / tpr;
    s.t = threadIdx.x % tpr;
  }
  s.valid = s.row < rows;
  return s;
}

// Calls f(p, pk) for each of this thread's packs p that lies inside the row (pk: the pack's index
// in the row).
template <int PPT, typename F>
__device__ __forceinline__ void for_row_packs(const RowSlot& rs, int tpr, int packs, F&& f) {
#pragma unroll
  for (int p = 0; p < PPT; ++p) {
    const int pk = rs.t + p * tpr;
    if (pk < packs) f(p, pk);
  }
}

// Loads this thread's packs of its row of src [rows, d] into registers (fp32).
template <typename T, int VEC, int PPT>
__device__ __forceinline__ void load_row(const T* src, int d, const RowSlot& rs, int tpr,
                                         float (&v)[PPT][VEC]) {
  if (!rs.valid) return;
  for_row_packs<PPT>(rs, tpr, d / VEC,
                     [&](int p, int pk) { load_f32<T, VEC>(src + rs.row * d + pk * VEC, v[p]); });
}

// The row's sum of f(value) over the values loaded by load_row, reduced over the row's threads.
template <int VEC, int PPT, bool kBlock, typename F>
__device__ __forceinline__ float row_sum_of(const float (&v)[PPT][VEC], const RowSlot& rs, int tpr,
                                            int packs, float* scratch, F f) {
  float s = 0.f;
  if (rs.valid) {
    for_row_packs<PPT>(rs, tpr, packs, [&](int p, int) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) s += f(v[p][k]);
    });
  }
  return row_sum<kBlock>(s, tpr, scratch);
}

// The register-cached rms_norm_kernel (same kResidual roles of src, dst and mod).
template <typename T, int VEC, int PPT, bool kBlock, bool kResidual>
__global__ void __launch_bounds__(1024)
    rms_norm_reg_kernel(const T* src, const T* w, const T* mod, T* dst, int64_t rows, int d,
                        int64_t rows_per_group, float eps, int tpr) {
  __shared__ float scratch[32];
  const RowSlot rs = row_slot<kBlock>(tpr, rows);
  const int packs = d / VEC;
  float v[PPT][VEC];
  load_row<T, VEC, PPT>(src, d, rs, tpr, v);
  // The residual x is read before the reduction, so its loads are in flight with src's; not at 4
  // packs per thread, where the second row copy would spill registers (launch bounds of 1024).
  constexpr bool kEarly = kResidual && PPT <= 2;
  float res[kEarly ? PPT : 1][VEC];
  if constexpr (kEarly) load_row<T, VEC, PPT>(dst, d, rs, tpr, res);
  const float ss =
      row_sum_of<VEC, PPT, kBlock>(v, rs, tpr, packs, scratch, [](float x) { return x * x; });
  if (!rs.valid) return;
  const float r = rsqrtf(ss / static_cast<float>(d) + eps);
  const T* mr = mod ? mod + (rs.row / rows_per_group) * d : nullptr;
  for_row_packs<PPT>(rs, tpr, packs, [&](int p, int pk) {
    float o[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) o[k] = round_to<T>(v[p][k] * r);
    mul_pack<T, VEC, true>(w, pk * VEC, o);
    mul_pack<T, VEC, kResidual>(mr, pk * VEC, o);
    if constexpr (kEarly) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) o[k] += res[p][k];
      store_f32<T, VEC>(dst + rs.row * d + pk * VEC, o);
    } else {
      store_norm_pack<T, VEC, kResidual>(dst + rs.row * d + pk * VEC, o);
    }
  });
}

// residual_rms_norm_gate and the next rms_norm in one pass over x: x += gate * rms_norm(y) * w
// (rms_norm_reg_kernel<kResidual>'s roundings, x rounded to T as it is stored), then out =
// rms_norm(x) * w_next * scale from the x just stored, held in registers (the rms_norm's
// roundings, the same thread layout and reduction order, so the same bits as the two kernels).
//
// kFp8: `out` is not written; its row, as it would be stored in T, is quantised as
// quantize_fp8_rows quantises a row (fp8.cu: the same amax, scale, reciprocal and rounding) into
// out8 [rows, d] e4m3 and out_scale [rows]: the W8A8 GEMM's input without a pass of its own.
template <typename T, int VEC, int PPT, bool kBlock, bool kFp8>
__global__ void __launch_bounds__(1024)
    residual_norm_then_norm_reg_kernel(const T* y, const T* w, const T* gate, T* x, const T* w_next,
                                       const T* scale, T* out, __nv_fp8_storage_t* out8,
                                       float* out_scale, int64_t rows, int d,
                                       int64_t rows_per_group, float eps, int tpr) {
  __shared__ float scratch[32];
  const RowSlot rs = row_slot<kBlock>(tpr, rows);
  const int packs = d / VEC;
  float v[PPT][VEC];
  load_row<T, VEC, PPT>(y, d, rs, tpr, v);
  // x, read before the reduction so its loads are in flight with y's; at 4 packs per thread after
  // it (a second row copy would spill registers under the launch bounds of 1024).
  constexpr bool kEarly = PPT <= 2;
  float xs[PPT][VEC];
  if constexpr (kEarly) load_row<T, VEC, PPT>(x, d, rs, tpr, xs);
  const float ss =
      row_sum_of<VEC, PPT, kBlock>(v, rs, tpr, packs, scratch, [](float e) { return e * e; });
  if (rs.valid) {  // every thread still joins the second reduction
    const float r = rsqrtf(ss / static_cast<float>(d) + eps);
    const T* gr = gate ? gate + (rs.row / rows_per_group) * d : nullptr;
    for_row_packs<PPT>(rs, tpr, packs, [&](int p, int pk) {
      float o[VEC];
#pragma unroll
      for (int k = 0; k < VEC; ++k) o[k] = round_to<T>(v[p][k] * r);
      mul_pack<T, VEC, true>(w, pk * VEC, o);
      mul_pack<T, VEC, true>(gr, pk * VEC, o);
      T* xr = x + rs.row * d + pk * VEC;
      if constexpr (!kEarly) load_f32<T, VEC>(xr, xs[p]);
      float* xv = xs[p];
#pragma unroll
      for (int k = 0; k < VEC; ++k) xv[k] = round_to<T>(xv[k] + o[k]);
      store_f32<T, VEC>(xr, xs[p]);
#pragma unroll
      for (int k = 0; k < VEC; ++k) v[p][k] = xv[k];
    });
  }
  const float ss2 =
      row_sum_of<VEC, PPT, kBlock>(v, rs, tpr, packs, scratch, [](float e) { return e * e; });
  const float r2 = rsqrtf(ss2 / static_cast<float>(d) + eps);
  const T* sr = scale && rs.valid ? scale + (rs.row / rows_per_group) * d : nullptr;
  float amax = 0.f;
  if (rs.valid) {
    for_row_packs<PPT>(rs, tpr, packs, [&](int p, int pk) {
      float o[VEC];
#pragma unroll
      for (int k = 0; k < VEC; ++k) o[k] = round_to<T>(v[p][k] * r2);
      mul_pack<T, VEC, true>(w_next, pk * VEC, o);
      mul_pack<T, VEC, false>(sr, pk * VEC, o);
      if constexpr (kFp8) {
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          v[p][k] = round_to<T>(o[k]);  // the value out would hold
          amax = fmaxf(amax, fabsf(v[p][k]));
        }
      } else {
        store_f32<T, VEC>(out + rs.row * d + pk * VEC, o);
      }
    });
  }
  if constexpr (kFp8) {
    amax = row_max<kBlock>(amax, tpr, scratch);  // every thread joins, as in the sums
    if (!rs.valid) return;
    const float inv = fp8_row_finish(amax, rs.t == 0, out_scale + rs.row);
    for_row_packs<PPT>(rs, tpr, packs, [&](int p, int pk) {
      store_fp8_codes<VEC>(out8 + rs.row * d + pk * VEC, v[p], inv);
    });
  }
}

template <typename T, int VEC, int PPT, bool kBlock>
__global__ void __launch_bounds__(1024)
    layer_norm_reg_kernel(const T* x, const T* w, const T* b, const T* scale, T* y, int64_t rows,
                          int d, int64_t rows_per_group, float eps, int tpr) {
  __shared__ float scratch[32];
  const RowSlot rs = row_slot<kBlock>(tpr, rows);
  const int packs = d / VEC;
  float v[PPT][VEC];
  load_row<T, VEC, PPT>(x, d, rs, tpr, v);
  const float mean =
      row_sum_of<VEC, PPT, kBlock>(v, rs, tpr, packs, scratch, [](float e) { return e; }) /
      static_cast<float>(d);
  const float var = row_sum_of<VEC, PPT, kBlock>(
      v, rs, tpr, packs, scratch, [mean](float e) { return (e - mean) * (e - mean); });
  if (!rs.valid) return;
  const float rstd = rsqrtf(var / static_cast<float>(d) + eps);
  const T* sr = scale ? scale + (rs.row / rows_per_group) * d : nullptr;
  for_row_packs<PPT>(rs, tpr, packs, [&](int p, int pk) {
    float o[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) o[k] = (v[p][k] - mean) * rstd;
    mul_pack<T, VEC, false>(w, pk * VEC, o);
    add_pack<T, VEC>(b, pk * VEC, o);
    if (sr) {
      float sv[VEC];
      load_f32<T, VEC>(sr + pk * VEC, sv);
#pragma unroll
      for (int k = 0; k < VEC; ++k) o[k] = round_to<T>(o[k]) * sv[k];
    }
    store_f32<T, VEC>(y + rs.row * d + pk * VEC, o);
  });
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
    const int t = g_norm_ppt.load();
    const int ppt = t != 0 ? t : row_kernel_defaults().norm_ppt;
    *c = {true, ppt, round32((packs + ppt - 1) / ppt)};
  } else if (packs <= 2048) {
    const int ppt = g_norm_ppt.load() == 4 ? 4 : 2;
    *c = {true, ppt, round32((packs + ppt - 1) / ppt)};
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

// The three forms every row norm launches in, fastest first: the row held in registers
// (`reg(ppt, block, grid, threads, tpr)`, 16-byte packs, rows that fit a RowCfg), the vectorised
// loop (`loop(vec, grid)` with vec = V) when d is a multiple of V and every pointer is aligned,
// else the scalar loop (vec = 1). `reg` and `loop` only launch; this returns the launch error.
template <int V, typename Reg, typename Loop>
cudaError_t launch_row_norm(int64_t rows, int64_t d, bool aligned, Reg&& reg, Loop&& loop) {
  const bool vec = d % V == 0 && aligned;
  RowCfg cfg;
  if (vec && rows < 0x7fffffff && pick_row_cfg(d / V, &cfg)) {
    return with_row_cfg(cfg, [&](auto ppt, auto blk) {
      reg(ppt, blk, row_cfg_grid(cfg, rows), row_cfg_block(cfg), cfg.tpr);
      return cudaGetLastError();
    });
  }
  if (vec)
    loop(std::integral_constant<int, V>{}, row_grid(rows));
  else
    loop(std::integral_constant<int, 1>{}, row_grid(rows));
  return cudaGetLastError();
}

// launch_rms_norm (y = rms_norm(x) * scale) and launch_residual_rms_norm_gate (x += gate *
// rms_norm(y)): src's rows normalised into dst, see rms_norm_kernel.
template <bool kResidual>
cudaError_t launch_rms(KType t, const void* src, const void* w, const void* mod, void* dst,
                       int64_t rows, int64_t d, int64_t rows_per_group, float eps, cudaStream_t s) {
  if (rows <= 0 || d <= 0) return cudaSuccess;
  return dispatch_ktype(t, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = kVec16<T>;
    auto sp = static_cast<const T*>(src);
    auto wp = static_cast<const T*>(w);
    auto mp = static_cast<const T*>(mod);
    auto dp = static_cast<T*>(dst);
    return launch_row_norm<V>(
        rows, d, all_aligned({src, w, mod, dst}),
        [&](auto ppt, auto blk, dim3 grid, unsigned threads, int tpr) {
          rms_norm_reg_kernel<T, V, decltype(ppt)::value, decltype(blk)::value, kResidual>
              <<<grid, threads, 0, s>>>(sp, wp, mp, dp, rows, static_cast<int>(d), rows_per_group,
                                        eps, tpr);
        },
        [&](auto vec, unsigned grid) {
          rms_norm_kernel<T, decltype(vec)::value, kResidual>
              <<<grid, kThreads, 0, s>>>(sp, wp, mp, dp, rows, d, rows_per_group, eps);
        });
  });
}

}  // namespace

cudaError_t launch_rms_norm(KType t, const void* x, const void* w, const void* scale, void* y,
                            int64_t rows, int64_t d, int64_t rows_per_group, float eps,
                            cudaStream_t s) {
  return launch_rms<false>(t, x, w, scale, y, rows, d, rows_per_group, eps, s);
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
    return launch_row_norm<V>(
        rows, d, all_aligned({x, w, b, scale, y}),
        [&](auto ppt, auto blk, dim3 grid, unsigned threads, int tpr) {
          layer_norm_reg_kernel<T, V, decltype(ppt)::value, decltype(blk)::value>
              <<<grid, threads, 0, s>>>(xp, wp, bp, sp, yp, rows, static_cast<int>(d),
                                        rows_per_group, eps, tpr);
        },
        [&](auto vec, unsigned grid) {
          layer_norm_kernel<T, decltype(vec)::value>
              <<<grid, kThreads, 0, s>>>(xp, wp, bp, sp, yp, rows, d, rows_per_group, eps);
        });
  });
}

cudaError_t launch_residual_rms_norm_gate(KType t, void* x, const void* y, const void* w,
                                          const void* gate, int64_t rows, int64_t d,
                                          int64_t rows_per_group, float eps, cudaStream_t s) {
  return launch_rms<true>(t, y, w, gate, x, rows, d, rows_per_group, eps, s);
}

namespace {

// launch_residual_norm_then_norm and its FP8 form (out8 and out_scale set, out unused).
cudaError_t launch_norm_then_norm(KType t, void* x, const void* y, const void* w, const void* gate,
                                  const void* w_next, const void* scale, void* out, void* out8,
                                  float* out_scale, int64_t rows, int64_t d, int64_t rows_per_group,
                                  float eps, cudaStream_t s) {
  if (rows <= 0 || d <= 0) return cudaSuccess;
  return dispatch_ktype(t, [&](auto tag) -> cudaError_t {
    using T = decltype(tag);
    constexpr int V = kVec16<T>;
    RowCfg cfg;
    if (d % V != 0 || !all_aligned({x, y, w, gate, w_next, scale, out, out8}) ||
        rows >= 0x7fffffff || !pick_row_cfg(d / V, &cfg))
      return cudaErrorNotSupported;
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      if (cfg.block && packed_row_kernels())
        return launch_residual_norm_then_norm_bf16x2(cfg.ppt, row_cfg_block(cfg), x, y, w, gate,
                                                     w_next, scale, out, out8, out_scale, rows,
                                                     static_cast<int>(d), rows_per_group, eps, s);
    }
    auto* q = static_cast<__nv_fp8_storage_t*>(out8);
    return with_row_cfg(cfg, [&](auto ppt, auto blk) {
      auto launch = [&](auto fp8) {
        residual_norm_then_norm_reg_kernel<T, V, decltype(ppt)::value, decltype(blk)::value,
                                           decltype(fp8)::value>
            <<<row_cfg_grid(cfg, rows), row_cfg_block(cfg), 0, s>>>(
                static_cast<const T*>(y), static_cast<const T*>(w), static_cast<const T*>(gate),
                static_cast<T*>(x), static_cast<const T*>(w_next), static_cast<const T*>(scale),
                static_cast<T*>(out), q, out_scale, rows, static_cast<int>(d), rows_per_group, eps,
                cfg.tpr);
      };
      if (out8 != nullptr)
        launch(std::true_type{});
      else
        launch(std::false_type{});
      return cudaGetLastError();
    });
  });
}

}  // namespace

cudaError_t launch_residual_norm_then_norm(KType t, void* x, const void* y, const void* w,
                                           const void* gate, const void* w_next, const void* scale,
                                           void* out, int64_t rows, int64_t d,
                                           int64_t rows_per_group, float eps, cudaStream_t s) {
  return launch_norm_then_norm(t, x, y, w, gate, w_next, scale, out, nullptr, nullptr, rows, d,
                               rows_per_group, eps, s);
}

cudaError_t launch_residual_norm_then_norm_fp8(KType t, void* x, const void* y, const void* w,
                                               const void* gate, const void* w_next,
                                               const void* scale, void* out8, float* out_scale,
                                               int64_t rows, int64_t d, int64_t rows_per_group,
                                               float eps, cudaStream_t s) {
  if (out8 == nullptr || out_scale == nullptr) return cudaErrorInvalidValue;
  return launch_norm_then_norm(t, x, y, w, gate, w_next, scale, nullptr, out8, out_scale, rows, d,
                               rows_per_group, eps, s);
}

}  // namespace zimage::cuda

// The DiT's gated residual + next norm (norm.cu residual_norm_then_norm_reg_kernel) for bf16 rows
// wide enough for a block a row, computed on bf16x2 pairs (bf16x2.cuh). Same results bit for bit,
// same thread layout and reduction order; what changes is the instruction count. Nsight Compute
// found the fp32 form issue-bound inside a 1024² FP8 forward on an H100 (SM throughput 72 %, DRAM
// 38 %, docs/BENCHMARKS.md "Session 27"): each of a thread's 8 values went through 7 roundings to
// bf16 of two instructions each (F2F, then a shift back to fp32); here a pair takes one
// instruction per rounding, and the row-group index is a 32-bit division.
#include "backend/cuda/kernels/bf16x2.cuh"
#include "backend/cuda/kernels/device_utils.cuh"

namespace zimage::cuda {

namespace {

using bf16 = __nv_bfloat16;

// x += gate * rms_norm(y) * w, then out = rms_norm(x) * w_next * scale (kFp8: out8 / out_scale,
// the rows out would hold as e4m3 codes and their scales), as residual_norm_then_norm_reg_kernel
// with kBlock: row blockIdx.x, this thread's packs threadIdx.x + p * blockDim.x. A null w, gate,
// w_next or scale is 1.
template <int PPT, bool kFp8>
__global__ void __launch_bounds__(1024)
    residual_norm_then_norm_bf16x2_kernel(const bf16* y, const bf16* w, const bf16* gate, bf16* x,
                                          const bf16* w_next, const bf16* scale, bf16* out,
                                          __nv_fp8_storage_t* out8, float* out_scale, int d,
                                          unsigned rows_per_group, float eps) {
  __shared__ float scratch[32];
  const unsigned row = blockIdx.x;
  const int packs = d / 8;
  const size_t base = size_t{row} * static_cast<size_t>(d);
  const size_t mod_base = size_t{row / rows_per_group} * static_cast<size_t>(d);
  auto pack_at = [&](int p) { return static_cast<int>(threadIdx.x + p * blockDim.x); };

  Bf16x8 v[PPT], xs[PPT];
#pragma unroll
  for (int p = 0; p < PPT; ++p) {  // every load issued before the reduction
    const int pk = pack_at(p);
    if (pk >= packs) continue;
    v[p] = load_bf16x8(y + base + pk * 8);
    xs[p] = load_bf16x8(x + base + pk * 8);
  }
  float ss = 0.f;
#pragma unroll
  for (int p = 0; p < PPT; ++p)
    if (pack_at(p) < packs) ss = add_squares(v[p], ss);
  ss = block_sum(ss, scratch);
  const float r = rsqrtf(ss / static_cast<float>(d) + eps);
#pragma unroll
  for (int p = 0; p < PPT; ++p) {
    const int pk = pack_at(p);
    if (pk >= packs) continue;
    Bf16x8 o = scale_to_bf16(v[p], r);
    if (w) o = mul_bf16x8(o, load_bf16x8(w + pk * 8));
    if (gate) o = mul_bf16x8(o, load_bf16x8(gate + mod_base + pk * 8));
    xs[p] = add_bf16x8(xs[p], o);
    store_bf16x8(x + base + pk * 8, xs[p]);
  }

  float ss2 = 0.f;
#pragma unroll
  for (int p = 0; p < PPT; ++p)
    if (pack_at(p) < packs) ss2 = add_squares(xs[p], ss2);
  ss2 = block_sum(ss2, scratch);
  const float r2 = rsqrtf(ss2 / static_cast<float>(d) + eps);
  __nv_bfloat162 amax2 = __float2bfloat162_rn(0.f);
#pragma unroll
  for (int p = 0; p < PPT; ++p) {
    const int pk = pack_at(p);
    if (pk >= packs) continue;
    Bf16x8 o = scale_to_bf16(xs[p], r2);
    if (w_next) o = mul_bf16x8(o, load_bf16x8(w_next + pk * 8));
    if (scale) o = mul_bf16x8(o, load_bf16x8(scale + mod_base + pk * 8));
    if constexpr (kFp8) {
      v[p] = o;  // the values out would hold
      amax2 = max_abs_bf16x8(o, amax2);
    } else {
      store_bf16x8(out + base + pk * 8, o);
    }
  }
  if constexpr (kFp8) {
    const float amax = block_max(fmaxf(__low2float(amax2), __high2float(amax2)), scratch);
    const float inv = fp8_row_finish(amax, threadIdx.x == 0, out_scale + row);
#pragma unroll
    for (int p = 0; p < PPT; ++p) {
      const int pk = pack_at(p);
      if (pk < packs) store_fp8_codes_bf16x8(out8 + base + pk * 8, v[p], inv);
    }
  }
}

}  // namespace

cudaError_t launch_residual_norm_then_norm_bf16x2(int ppt, unsigned threads, void* x, const void* y,
                                                  const void* w, const void* gate,
                                                  const void* w_next, const void* scale, void* out,
                                                  void* out8, float* out_scale, int64_t rows, int d,
                                                  int64_t rows_per_group, float eps,
                                                  cudaStream_t s) {
  if (rows <= 0) return cudaSuccess;
  if (d % 8 != 0 || rows > 0x7fffffff || rows_per_group <= 0 || threads == 0 || threads > 1024 ||
      int64_t{threads} * ppt * 8 < d)
    return cudaErrorInvalidValue;
  // A group longer than the rows is one group (its index is 0 for every row either way).
  const auto rpg = static_cast<unsigned>(rows_per_group < rows ? rows_per_group : rows);
  auto launch = [&](auto ppt_c, auto fp8) {
    residual_norm_then_norm_bf16x2_kernel<decltype(ppt_c)::value, decltype(fp8)::value>
        <<<static_cast<unsigned>(rows), threads, 0, s>>>(
            static_cast<const bf16*>(y), static_cast<const bf16*>(w),
            static_cast<const bf16*>(gate), static_cast<bf16*>(x), static_cast<const bf16*>(w_next),
            static_cast<const bf16*>(scale), static_cast<bf16*>(out),
            static_cast<__nv_fp8_storage_t*>(out8), out_scale, d, rpg, eps);
  };
  auto with_fp8 = [&](auto ppt_c) {
    if (out8 != nullptr)
      launch(ppt_c, std::true_type{});
    else
      launch(ppt_c, std::false_type{});
  };
  switch (ppt) {
    case 1:
      with_fp8(std::integral_constant<int, 1>{});
      break;
    case 2:
      with_fp8(std::integral_constant<int, 2>{});
      break;
    case 4:
      with_fp8(std::integral_constant<int, 4>{});
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace zimage::cuda

// See attention_flash3.h. The kernel types are put together as FlashAttention-3's launcher
// (hopper/flash_fwd_launch_template.h, run_flash_fwd) puts them together for sm_90, bf16,
// head_dim 128, non-causal, no varlen/paging/split/softcap/GQA packing, one-CTA clusters; the
// launch returns errors instead of exiting. The library's tile choice (tile_size_fwd_sm90) and
// scheduler choice (a static persistent grid for non-causal) are kept as they are.
#include <algorithm>
#include <string>

#include "backend/cuda/libs/attention_flash3.h"

#if defined(ZIMAGE_WITH_FLASH3)
#include <cutlass/cutlass.h>
#include <cutlass/device_kernel.h>
#include <cutlass/kernel_hardware_info.h>
#include <cutlass/kernel_launch.h>

#include <cute/tensor.hpp>

// The library's headers (third_party/flash3/include), included by their own names.
// In the launcher's order (flash_fwd_kernel_sm90.h needs the scheduler's declarations first).
// clang-format off
#include "tile_size.h"
#include "tile_scheduler.hpp"
#include "flash_fwd_kernel_sm90.h"
#include "mainloop_fwd_sm90_tma_gmma_ws.hpp"
#include "epilogue_fwd.hpp"
// clang-format on
#endif

namespace zimage::cuda {

namespace {

bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

}  // namespace

Status flash3_supported(const Fa3Request& r) {
  if (r.head_dim != 128)
    return Unsupported("FlashAttention-3: head_dim " + std::to_string(r.head_dim) +
                       " (built for 128)");
  if (r.heads_q != r.heads_kv) return Unsupported("FlashAttention-3: grouped KV heads");
  if (r.causal) return Unsupported("FlashAttention-3: causal (built non-causal)");
  if (r.batch <= 0 || r.seq_q <= 0 || r.seq_k <= 0) return Unsupported("FlashAttention-3: empty");
  if (r.seq_q > INT32_MAX / 2 || r.seq_k > INT32_MAX / 2 || r.heads_q > 65535 || r.batch > 65535)
    return Unsupported("FlashAttention-3: shape too large");
  if (!aligned16(r.q) || !aligned16(r.k) || !aligned16(r.v) || !aligned16(r.out))
    return Unsupported("FlashAttention-3: operands not 16-byte aligned");
  // TMA: every row of a tile starts on 16 bytes (8 bf16); a token holds all its heads.
  for (int64_t st : {r.q_token_stride, r.kv_token_stride})
    if (st < 0 || st % 8 != 0) return Unsupported("FlashAttention-3: token stride");
  if ((r.q_token_stride > 0 && r.q_token_stride < r.heads_q * r.head_dim) ||
      (r.kv_token_stride > 0 && r.kv_token_stride < r.heads_kv * r.head_dim))
    return Unsupported("FlashAttention-3: token stride shorter than the heads");
  if (r.key_len != nullptr && !r.key_len->empty()) {
    if (static_cast<int64_t>(r.key_len->size()) != r.batch)
      return Unsupported("FlashAttention-3: key_len size");
    for (int32_t n : *r.key_len)
      if (n <= 0 || n > r.seq_k) return Unsupported("FlashAttention-3: empty or invalid key_len");
  }
  return Status::Ok();
}

int64_t flash3_scratch_bytes(const Fa3Request& r) {
  return r.batch * r.heads_q * r.seq_q * static_cast<int64_t>(sizeof(float));
}

#if defined(ZIMAGE_WITH_FLASH3)
namespace {

using namespace cute;

using Element = cutlass::bfloat16_t;
constexpr int kHeadDim = 128;
constexpr bool kCausal = false;
// {kBlockM, kBlockN, MmaPV_is_RS, IntraWGOverlap}: the library's choice for these flags.
constexpr auto kTile = tile_size_fwd_sm90(kHeadDim, kHeadDim, kCausal, /*is_local=*/false,
                                          sizeof(Element), /*v_colmajor=*/false,
                                          /*paged_kv_non_TMA=*/false, /*softcap=*/false);
constexpr int kBlockM = std::get<0>(kTile);
constexpr int kBlockN = std::get<1>(kTile);
using TileShape_MNK = Shape<Int<kBlockM>, Int<kBlockN>, Int<kHeadDim>>;
using TileShape_MNK_PV = Shape<Int<kBlockM>, Int<kHeadDim>, Int<kBlockN>>;
using ClusterShape = Shape<_1, _1, _1>;
using Mainloop = flash::CollectiveMainloopFwdSm90<
    /*Stages=*/2, ClusterShape, TileShape_MNK, kHeadDim, Element, float, cutlass::arch::Sm90,
    kCausal, /*Is_local=*/false, /*Has_softcap=*/false, /*Varlen=*/false,
    /*PagedKVNonTMA=*/false, /*AppendKV=*/false, /*HasQv=*/false,
    /*MmaPV_is_RS=*/std::get<2>(kTile), /*IntraWGOverlap=*/std::get<3>(kTile),
    /*PackGQA=*/false, /*Split=*/false, /*V_colmajor=*/false>;
using Epilogue = flash::CollectiveEpilogueFwd<TileShape_MNK_PV, ClusterShape, Element,
                                              cutlass::arch::Sm90, Mainloop::NumMmaThreads,
                                              /*Varlen=*/false, /*PackGQA=*/false,
                                              /*Split=*/false, /*FP8PermuteCol=*/false>;
using Scheduler = flash::StaticPersistentTileScheduler</*Split=*/false>;
using Kernel = flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<Mainloop, Epilogue, Scheduler>>;

// One launch: `b` items of seq_q queries against seq_k keys each, every item `*_item` elements
// after the previous one.
Status launch(const Fa3Request& r, const Element* q, const Element* k, const Element* v, Element* o,
              float* lse, int b, int seq_k, int64_t q_item, int64_t kv_item, int64_t o_item,
              int num_sm, int device, cudaStream_t stream) {
  const int64_t qs = r.q_token_stride > 0 ? r.q_token_stride : r.heads_q * r.head_dim;
  const int64_t kvs = r.kv_token_stride > 0 ? r.kv_token_stride : r.heads_kv * r.head_dim;
  const int64_t os = r.heads_q * r.head_dim;
  const int sq = static_cast<int>(r.seq_q), h = static_cast<int>(r.heads_q);
  const int hk = static_cast<int>(r.heads_kv), d = static_cast<int>(r.head_dim);
  typename Mainloop::Arguments mainloop{
      q,
      {sq, d, h, b},                   // shape_Q
      {qs, _1{}, int64_t{d}, q_item},  // stride_Q
      const_cast<Element*>(k),
      {seq_k, d, hk, b},                 // shape_K
      {kvs, _1{}, int64_t{d}, kv_item},  // stride_K
      const_cast<Element*>(v),
      d,                                 // headdim_v
      {kvs, _1{}, int64_t{d}, kv_item},  // stride_V
      nullptr,                           // K_new
      {0, d, hk, 1},
      {0, _1{}, 0, 0},
      nullptr,  // V_new
      {0, _1{}, 0, 0},
      nullptr,  // Qv
      {0, _1{}, 0, 0},
      nullptr,  // rotary cos
      {seq_k, 0},
      {0, _1{}},
      nullptr,  // rotary sin
      {0, _1{}},
      false,
      nullptr,  // page table
      {b, 0},
      {0, _1{}},
      r.scale,
      nullptr,  // descales (FP8 only)
      nullptr,
      nullptr,
      {0, 0},
      {0, 0},
      {0, 0},
      seq_k - 1,  // window left/right: the whole sequence (not local)
      sq - 1,
      0,    // attention_chunk
      0.f,  // softcap
      1,    // num_splits
  };
  typename Epilogue::Arguments epilogue{
      o,
      {sq, d, h, b, 1},                   // shape_O
      {os, _1{}, int64_t{d}, o_item, 0},  // stride_O
      nullptr,                            // O partial (split only)
      {0, _1{}, 0, 0, 0},
      lse,
      {_1{}, int64_t{sq}, int64_t{h} * sq, 0},  // stride_LSE
      nullptr,
      {_1{}, 0, 0, 0},
      hk,
  };
  const int num_blocks_m = (sq + kBlockM - 1) / kBlockM;
  flash::TileSchedulerArguments scheduler{
      num_blocks_m, h, b, 1, h / hk, sq, seq_k, d, d, static_cast<int>(sizeof(Element))};
  const typename Kernel::Params params =
      Kernel::to_underlying_arguments({mainloop, epilogue, {device, num_sm}, scheduler});
  const dim3 grid = Kernel::get_grid_shape(params), block = Kernel::get_block_shape();
  const int smem = Kernel::SharedStorageSize;
  auto* fn = cutlass::device_kernel<Kernel>;
  cudaError_t e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e == cudaSuccess) {
    fn<<<grid, block, smem, stream>>>(params);
    e = cudaGetLastError();
  }
  if (e != cudaSuccess) {
    cudaGetLastError();
    return DeviceError(std::string("FlashAttention-3: launch failed: ") + cudaGetErrorString(e));
  }
  return Status::Ok();
}

}  // namespace

bool flash3_built() {
  return true;
}

Status flash3_attention(const Fa3Request& r, void* scratch, int num_sm, cudaStream_t stream) {
  ZI_TRY(flash3_supported(r));
  if (scratch == nullptr || num_sm <= 0)
    return InvalidArgument("FlashAttention-3: no scratch or SM count");
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return DeviceError("FlashAttention-3: no current device");
  }
  const int64_t qs = r.q_token_stride > 0 ? r.q_token_stride : r.heads_q * r.head_dim;
  const int64_t kvs = r.kv_token_stride > 0 ? r.kv_token_stride : r.heads_kv * r.head_dim;
  const int64_t q_item = r.seq_q * qs, kv_item = r.seq_k * kvs;
  const int64_t o_item = r.seq_q * r.heads_q * r.head_dim;
  const auto* q = static_cast<const Element*>(r.q);
  const auto* k = static_cast<const Element*>(r.k);
  const auto* v = static_cast<const Element*>(r.v);
  auto* o = static_cast<Element*>(r.out);
  auto* lse = static_cast<float*>(scratch);
  const bool padded =
      r.key_len != nullptr && !r.key_len->empty() &&
      std::any_of(r.key_len->begin(), r.key_len->end(), [&](int32_t n) { return n != r.seq_k; });
  if (!padded)
    return launch(r, q, k, v, o, lse, static_cast<int>(r.batch), static_cast<int>(r.seq_k), q_item,
                  kv_item, o_item, num_sm, device, stream);
  // Padded keys: each item on its own with its key count (the mask the backend means).
  for (int64_t b = 0; b < r.batch; ++b)
    ZI_TRY(launch(r, q + b * q_item, k + b * kv_item, v + b * kv_item, o + b * o_item, lse, 1,
                  (*r.key_len)[static_cast<size_t>(b)], q_item, kv_item, o_item, num_sm, device,
                  stream));
  return Status::Ok();
}

#else  // !ZIMAGE_WITH_FLASH3

bool flash3_built() {
  return false;
}
Status flash3_attention(const Fa3Request& r, void*, int, cudaStream_t) {
  ZI_TRY(flash3_supported(r));
  return Unsupported("FlashAttention-3: not built (needs scripts/setup.sh's headers and sm_90a)");
}

#endif

}  // namespace zimage::cuda

// See attention_flash3.h. The kernel types are put together as FlashAttention-3's launcher
// (hopper/flash_fwd_launch_template.h, run_flash_fwd) puts them together for sm_90, bf16,
// head_dim 128, non-causal, no varlen/paging/split/softcap/GQA packing; the launch returns errors
// instead of exiting. The library's tile choice (tile_size_fwd_sm90) and scheduler choice (a
// static persistent grid for non-causal) are kept as they are. Clusters: one CTA, or two along
// the query tiles (`cluster_m` 2), which share each K and V tile by TMA multicast. The library's
// launcher takes two for bf16 at head_dim 128 when the query tiles are even in number; the DiT's
// never are (4096·k image tokens + the caption's), so here the count is rounded up to even, as the
// library's own launcher rounds it, and the extra tile's rows are out of range (TMA zero-fills
// their Q, clips their O; their log-sum-exp is not written).
#include <algorithm>
#include <atomic>
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

namespace {

// The checks both kernels share; `elem` is the operands' size in bytes (2: bf16, 1: e4m3).
Status supported(const Fa3Request& r, int elem) {
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
  // TMA: every row of a tile starts on 16 bytes; a token holds all its heads.
  const int64_t per16 = 16 / elem;
  for (int64_t st : {r.q_token_stride, r.kv_token_stride})
    if (st < 0 || st % per16 != 0) return Unsupported("FlashAttention-3: token stride");
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

}  // namespace

Status flash3_supported(const Fa3Request& r) {
  return supported(r, 2);
}

Status flash3_supported_fp8(const Fa3Request& r) {
  return supported(r, 1);
}

int64_t flash3_scratch_bytes(const Fa3Request& r) {
  return r.batch * r.heads_q * r.seq_q * static_cast<int64_t>(sizeof(float));
}

#if defined(ZIMAGE_WITH_FLASH3)
namespace {

using namespace cute;

constexpr int kHeadDim = 128;
constexpr bool kCausal = false;

// The kernel for one operand type: bf16 in and out, or e4m3 in and bf16 out (the FP8 kernel
// transposes V in shared memory, so V stays row-major as the projection writes it, and its
// output's columns come back permuted, which the epilogue undoes: FP8PermuteCol).
template <typename Element, int ClusterM>
struct Flash3 {
  static constexpr bool kFp8 = sizeof(Element) == 1;
  using Out = cutlass::bfloat16_t;
  // {kBlockM, kBlockN, MmaPV_is_RS, IntraWGOverlap}: the library's choice for these flags
  // (128 x 176 for bf16, 128 x 224 for e4m3).
  static constexpr auto kTile = tile_size_fwd_sm90(kHeadDim, kHeadDim, kCausal, /*is_local=*/false,
                                                   sizeof(Element), /*v_colmajor=*/false,
                                                   /*paged_kv_non_TMA=*/false, /*softcap=*/false);
  static constexpr int kBlockM = std::get<0>(kTile);
  static constexpr int kBlockN = std::get<1>(kTile);
  using TileShape_MNK = Shape<Int<kBlockM>, Int<kBlockN>, Int<kHeadDim>>;
  using TileShape_MNK_PV = Shape<Int<kBlockM>, Int<kHeadDim>, Int<kBlockN>>;
  using ClusterShape = Shape<Int<ClusterM>, _1, _1>;
  using Mainloop = flash::CollectiveMainloopFwdSm90<
      /*Stages=*/2, ClusterShape, TileShape_MNK, kHeadDim, Element, float, cutlass::arch::Sm90,
      kCausal, /*Is_local=*/false, /*Has_softcap=*/false, /*Varlen=*/false,
      /*PagedKVNonTMA=*/false, /*AppendKV=*/false, /*HasQv=*/false,
      /*MmaPV_is_RS=*/std::get<2>(kTile), /*IntraWGOverlap=*/std::get<3>(kTile),
      /*PackGQA=*/false, /*Split=*/false, /*V_colmajor=*/false>;
  using Epilogue = flash::CollectiveEpilogueFwd<TileShape_MNK_PV, ClusterShape, Out,
                                                cutlass::arch::Sm90, Mainloop::NumMmaThreads,
                                                /*Varlen=*/false, /*PackGQA=*/false,
                                                /*Split=*/false, /*FP8PermuteCol=*/kFp8>;
  using Scheduler = flash::StaticPersistentTileScheduler</*Split=*/false>;
  using Kernel =
      flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<Mainloop, Epilogue, Scheduler>>;
};

// A launch of `cluster_m`-CTA clusters along x: the configuration cudaLaunchKernelEx and
// cudaOccupancyMaxActiveClusters take (`attr` holds the cluster shape it points at).
cudaLaunchConfig_t cluster_launch(dim3 grid, dim3 block, int smem, cudaStream_t stream,
                                  int cluster_m, cudaLaunchAttribute& attr) {
  attr = {};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = static_cast<unsigned>(cluster_m);
  attr.val.clusterDim.y = attr.val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = static_cast<size_t>(smem);
  cfg.stream = stream;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  return cfg;
}

// The persistent grid's width for clusters of `cluster_m`: the SM count, or for two-CTA clusters
// twice the clusters that fit at once (an SM left over in a GPC of odd size takes none), asked
// once per device and kernel.
template <typename Kernel>
int grid_width(int num_sm, int cluster_m, int device, int smem) {
  if (cluster_m == 1) return num_sm;
  static std::atomic<int> known[64] = {};
  std::atomic<int>* slot = device >= 0 && device < 64 ? &known[device] : nullptr;
  if (slot != nullptr && slot->load() > 0) return slot->load();
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg =
      cluster_launch(dim3(static_cast<unsigned>(num_sm / cluster_m * cluster_m)),
                     Kernel::get_block_shape(), smem, nullptr, cluster_m, attr);
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, cutlass::device_kernel<Kernel>, &cfg) !=
          cudaSuccess ||
      clusters <= 0) {
    cudaGetLastError();
    clusters = num_sm / cluster_m;  // unknown: as many as the SMs hold
  }
  const int width = std::min(num_sm / cluster_m, clusters) * cluster_m;
  if (slot != nullptr) slot->store(width);
  return width;
}

// One launch: `b` items of seq_q queries against seq_k keys each, every item `*_item` elements
// after the previous one. `descale`: the FP8 kernel's q, k and per-head v scales (null: bf16).
template <typename Element, int ClusterM>
Status launch(const Fa3Request& r, const Element* q, const Element* k, const Element* v,
              cutlass::bfloat16_t* o, float* lse, int b, int seq_k, int64_t q_item, int64_t kv_item,
              int64_t o_item, const Flash3Fp8Scales* descale, int num_sm, int device,
              cudaStream_t stream) {
  using F = Flash3<Element, ClusterM>;
  using Mainloop = typename F::Mainloop;
  using Epilogue = typename F::Epilogue;
  using Kernel = typename F::Kernel;
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
      descale ? descale->q : nullptr,  // descales (FP8 only): one q and one k scale,
      descale ? descale->k : nullptr,  // one v scale per head
      descale ? descale->v : nullptr,
      {0, 0},
      {0, 0},
      {0, 1},
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
  // Whole clusters of query tiles: the scheduler hands the tiles out in order, so the two CTAs
  // of a cluster take two neighbouring tiles of one head (the grid's width is even).
  const int tiles_m = (sq + F::kBlockM - 1) / F::kBlockM;
  const int num_blocks_m = (tiles_m + ClusterM - 1) / ClusterM * ClusterM;
  const int smem = Kernel::SharedStorageSize;
  auto* fn = cutlass::device_kernel<Kernel>;
  cudaError_t e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e == cudaSuccess) {
    const int width = grid_width<Kernel>(num_sm, ClusterM, device, smem);
    flash::TileSchedulerArguments scheduler{
        num_blocks_m, h, b, 1, h / hk, sq, seq_k, d, d, static_cast<int>(sizeof(Element))};
    const typename Kernel::Params params =
        Kernel::to_underlying_arguments({mainloop, epilogue, {device, width}, scheduler});
    const dim3 grid = Kernel::get_grid_shape(params), block = Kernel::get_block_shape();
    if constexpr (ClusterM == 1) {
      fn<<<grid, block, smem, stream>>>(params);
    } else {
      cudaLaunchAttribute attr;
      const cudaLaunchConfig_t cfg = cluster_launch(grid, block, smem, stream, ClusterM, attr);
      e = cudaLaunchKernelEx(&cfg, fn, params);
    }
    if (e == cudaSuccess) e = cudaGetLastError();
  }
  if (e != cudaSuccess) {
    cudaGetLastError();
    return DeviceError(std::string("FlashAttention-3: launch failed: ") + cudaGetErrorString(e));
  }
  return Status::Ok();
}

// Both kernels' calls: the checks, then one launch, or one per item where keys are padded.
template <typename Element>
Status run(const Fa3Request& r, const Flash3Fp8Scales* descale, void* scratch, int num_sm,
           int cluster_m, cudaStream_t stream) {
  if (cluster_m != 1 && cluster_m != 2)
    return InvalidArgument("FlashAttention-3: clusters of " + std::to_string(cluster_m) +
                           " CTAs (built for 1 and 2)");
  auto go = [&](auto&&... a) {
    return cluster_m == 1 ? launch<Element, 1>(a...) : launch<Element, 2>(a...);
  };
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
  auto* o = static_cast<cutlass::bfloat16_t*>(r.out);
  auto* lse = static_cast<float*>(scratch);
  const bool padded =
      r.key_len != nullptr && !r.key_len->empty() &&
      std::any_of(r.key_len->begin(), r.key_len->end(), [&](int32_t n) { return n != r.seq_k; });
  if (!padded)
    return go(r, q, k, v, o, lse, static_cast<int>(r.batch), static_cast<int>(r.seq_k), q_item,
              kv_item, o_item, descale, num_sm, device, stream);
  // Padded keys: each item on its own with its key count (the mask the backend means).
  for (int64_t b = 0; b < r.batch; ++b)
    ZI_TRY(go(r, q + b * q_item, k + b * kv_item, v + b * kv_item, o + b * o_item, lse, 1,
              (*r.key_len)[static_cast<size_t>(b)], q_item, kv_item, o_item, descale, num_sm,
              device, stream));
  return Status::Ok();
}

}  // namespace

bool flash3_built() {
  return true;
}

Status flash3_attention(const Fa3Request& r, void* scratch, int num_sm, cudaStream_t stream,
                        int cluster_m) {
  ZI_TRY(flash3_supported(r));
  return run<cutlass::bfloat16_t>(r, nullptr, scratch, num_sm, cluster_m, stream);
}

Status flash3_attention_fp8(const Fa3Request& r, const Flash3Fp8Scales& descale, void* scratch,
                            int num_sm, cudaStream_t stream, int cluster_m) {
  ZI_TRY(flash3_supported_fp8(r));
  if (descale.q == nullptr || descale.k == nullptr || descale.v == nullptr)
    return InvalidArgument("FlashAttention-3 FP8: missing scales");
  return run<cutlass::float_e4m3_t>(r, &descale, scratch, num_sm, cluster_m, stream);
}

#else  // !ZIMAGE_WITH_FLASH3

bool flash3_built() {
  return false;
}
Status flash3_attention(const Fa3Request& r, void*, int, cudaStream_t, int) {
  ZI_TRY(flash3_supported(r));
  return Unsupported("FlashAttention-3: not built (needs scripts/setup.sh's headers and sm_90a)");
}
Status flash3_attention_fp8(const Fa3Request& r, const Flash3Fp8Scales&, void*, int, cudaStream_t,
                            int) {
  ZI_TRY(flash3_supported_fp8(r));
  return Unsupported("FlashAttention-3: not built (needs scripts/setup.sh's headers and sm_90a)");
}

#endif

}  // namespace zimage::cuda

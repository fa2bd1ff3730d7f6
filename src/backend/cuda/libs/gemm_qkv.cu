// The bf16 q|k|v GEMM with the attention prologue in its epilogue (gemm_cutlass.h
// cutlass_bf16_qkv_norm_rope).
//
// A 128-wide output tile is one head of q, k or v. In the wgmma accumulator layout the 128 values
// of a tile row are held by the four threads of a quad (32 each), so the per-head RMS norm of q
// and k is a sum over a thread's values and two shuffles; the interleaved RoPE pairs (2j, 2j + 1)
// are adjacent accumulators of one thread. The tile is then written straight into q, k or v
// [rows, heads, 128]: the [rows, 3·D] projection and the prologue's pass over it (read and write,
// 2.6 ms of a 1024² forward on the H200) are gone. Why not cuBLASLt: its epilogues are elementwise.
#include "backend/cuda/libs/gemm_cutlass.h"

#if defined(ZIMAGE_WITH_CUTLASS)

#include <cuda_bf16.h>

#include <algorithm>

#include "backend/cuda/libs/cutlass_register_epilogue.cuh"

namespace zimage::cuda {
namespace {

using namespace cute;
using register_epilogue::Bf16;
using register_epilogue::round_bf16;

constexpr int kHead = kQkvHeadDim;

struct QkvArgs {
  Bf16* q = nullptr;
  Bf16* k = nullptr;
  Bf16* v = nullptr;
  const Bf16* norm_q = nullptr;  // [128] each, or both null: no norm
  const Bf16* norm_k = nullptr;
  const float* freqs = nullptr;  // per token row: 64 (cos, sin) pairs; null: no RoPE
  int64_t seq_if_shared = 0;     // > 0: row r takes the freqs of row r % seq_if_shared
  int hq = 0, hkv = 0;
  float eps = 0.f;
};

// Roundings as the two-kernel path (GEMM, then Backend::qkv_split_norm_rope) makes them: the sums
// rounded to bf16, normalised and rounded, times the weight and rounded, RoPE in f32 and rounded
// once. The sum of squares adds the same values in another order (an ulp at most after rounding).
template <int kTileM>
class QkvEpilogue : public register_epilogue::Base<QkvArgs> {
 public:
  using register_epilogue::Base<QkvArgs>::Base;

  template <class ProblemShape>
  static bool can_implement(ProblemShape const& problem_shape, QkvArgs const& a) {
    const auto n = cute::get<1>(problem_shape);
    return a.q != nullptr && a.k != nullptr && a.v != nullptr && a.hq > 0 && a.hkv > 0 &&
           n == (a.hq + 2 * a.hkv) * kHead && (a.norm_q == nullptr) == (a.norm_k == nullptr);
  }

  template <class ProblemShapeMNKL, class BlockShapeMNK, class BlockCoordMNKL, class FrgEngine,
            class FrgLayout, class TiledMma, class ResidueMNK>
  CUTLASS_DEVICE void operator()(ProblemShapeMNKL problem_shape_mnkl, BlockShapeMNK,
                                 BlockCoordMNKL blk_coord_mnkl,
                                 cute::Tensor<FrgEngine, FrgLayout> const& acc, TiledMma tiled_mma,
                                 ResidueMNK, int thread_idx, char*) {
    using Acc = register_epilogue::AccLayout<FrgLayout, BlockShapeMNK, kTileM, kHead>;
    constexpr int V = Acc::V, MM = Acc::MM;
    const QkvArgs& a = this->params_;

    const int m_blk = static_cast<int>(get<0>(blk_coord_mnkl));
    const int head = static_cast<int>(get<1>(blk_coord_mnkl));
    const int64_t rows = get<0>(problem_shape_mnkl);
    // A head past q, k and v: the scheduler's rounding (register_epilogue::past_columns).
    // Tile-uniform, before the shuffles.
    if (register_epilogue::past_columns(problem_shape_mnkl, head, kHead)) return;
    // This tile's head: q, k or v, its index there and the heads of that tensor.
    const int kind = head < a.hq ? 0 : (head < a.hq + a.hkv ? 1 : 2);
    const int local = kind == 0 ? head : (kind == 1 ? head - a.hq : head - a.hq - a.hkv);
    const int heads = kind == 0 ? a.hq : a.hkv;
    Bf16* dst = kind == 0 ? a.q : (kind == 1 ? a.k : a.v);
    const Bf16* w = kind == 0 ? a.norm_q : (kind == 1 ? a.norm_k : nullptr);
    const bool rope = kind != 2 && a.freqs != nullptr;

    Tensor coords = make_identity_tensor(make_shape(Int<kTileM>{}, Int<kHead>{}));
    Tensor tc = tiled_mma.get_thread_slice(thread_idx).partition_C(coords);
    // The norm weights of this thread's columns, loaded first (read-only path) so their latency
    // is paid once and overlaps the rounding below; the columns are the same in every row.
    float wv[2 * V];
    if (w != nullptr) {
      CUTLASS_PRAGMA_UNROLL
      for (int v = 0; v < V; ++v) {
        const int col = get<1>(tc(make_coord(make_coord(0, 0, v), 0, 0)));
        const __nv_bfloat162 pair = __ldg(reinterpret_cast<const __nv_bfloat162*>(w + col));
        wv[2 * v] = __low2float(pair);
        wv[2 * v + 1] = __high2float(pair);
      }
    }
    CUTLASS_PRAGMA_UNROLL
    for (int mm = 0; mm < MM; ++mm) {
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < 2; ++r) {
        const int row = get<0>(tc(make_coord(make_coord(0, r, 0), mm, 0)));
        const int64_t grow = static_cast<int64_t>(m_blk) * kTileM + row;
        const bool in = grow < rows;
        // This row's RoPE pairs, requested before the norm needs the shuffles.
        float2 cs[V];
        if (rope) {
          const int64_t token = a.seq_if_shared > 0 ? grow % a.seq_if_shared : grow;
          const float2* f =
              reinterpret_cast<const float2*>(a.freqs) + (in ? token : 0) * (kHead / 2);
          CUTLASS_PRAGMA_UNROLL
          for (int v = 0; v < V; ++v)
            cs[v] = __ldg(f + get<1>(tc(make_coord(make_coord(0, r, v), mm, 0))) / 2);
        }
        float e[2 * V];
        CUTLASS_PRAGMA_UNROLL
        for (int v = 0; v < V; ++v) {
          e[2 * v] = round_bf16(acc(make_coord(make_coord(0, r, v), mm, 0)));
          e[2 * v + 1] = round_bf16(acc(make_coord(make_coord(1, r, v), mm, 0)));
        }
        if (w != nullptr) {  // tile-uniform; every lane reaches the shuffles
          float ss = 0.f;
          CUTLASS_PRAGMA_UNROLL
          for (int i = 0; i < 2 * V; ++i) ss += e[i] * e[i];
          ss += __shfl_xor_sync(0xffffffffu, ss, 1);  // the quad holds the row
          ss += __shfl_xor_sync(0xffffffffu, ss, 2);
          const float inv = rsqrtf(ss / static_cast<float>(kHead) + a.eps);
          CUTLASS_PRAGMA_UNROLL
          for (int i = 0; i < 2 * V; ++i) e[i] = round_bf16(round_bf16(e[i] * inv) * wv[i]);
        }
        if (!in) continue;
        Bf16* out = dst + (grow * heads + local) * kHead;
        CUTLASS_PRAGMA_UNROLL
        for (int v = 0; v < V; ++v) {
          const int col = get<1>(tc(make_coord(make_coord(0, r, v), mm, 0)));
          float x0 = e[2 * v], x1 = e[2 * v + 1];
          if (rope) {
            const float y0 = x0 * cs[v].x - x1 * cs[v].y, y1 = x0 * cs[v].y + x1 * cs[v].x;
            x0 = y0, x1 = y1;
          }
          cutlass::Array<Bf16, 2> pair;
          pair[0] = Bf16(x0);
          pair[1] = Bf16(x1);
          *reinterpret_cast<cutlass::Array<Bf16, 2>*>(out + col) = pair;
        }
      }
    }
  }
};

// The four tile configurations (gemm_cutlass.h GemmSchedule).
using Cluster = Shape<_2, _1, _1>;
using Coop = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
using Ping = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
using Cooperative =
    register_epilogue::Gemm<Shape<_128, Int<kHead>, _64>, Cluster, Coop, QkvEpilogue<128>>;
using CooperativeTall =
    register_epilogue::Gemm<Shape<_256, Int<kHead>, _64>, Cluster, Coop, QkvEpilogue<256>>;
using Pingpong =
    register_epilogue::Gemm<Shape<_128, Int<kHead>, _64>, Cluster, Ping, QkvEpilogue<128>>;
using PingpongNarrow =
    register_epilogue::Gemm<Shape<_64, Int<kHead>, _64>, Cluster, Ping, QkvEpilogue<64>>;

using Fused = register_epilogue::Configs<Cooperative, CooperativeTall, Pingpong, PingpongNarrow>;

}  // namespace

size_t cutlass_bf16_qkv_norm_rope_workspace(int64_t m, int64_t n, int64_t k) {
  if (m <= 0 || n <= 0 || k <= 0 || m > INT32_MAX || n > INT32_MAX || k > INT32_MAX) return 0;
  const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
  return Fused::workspace(mi, ni, ki);
}

Status cutlass_bf16_qkv_norm_rope(const void* x, const void* wqkv, const QkvPrologue& p, int64_t m,
                                  int64_t k, void* workspace, size_t workspace_bytes,
                                  cudaStream_t stream, const GemmTuning& tuning) {
  constexpr const char* what = "CUTLASS q|k|v GEMM";
  static const bool sm90 = cutlass_device_is_sm90();
  if (!sm90) return Unsupported(std::string(what) + ": the device is not sm_90");
  const int64_t n = (int64_t{p.hq} + 2 * int64_t{p.hkv}) * kHead;
  if (m <= 0 || k <= 0 || p.hq <= 0 || p.hkv <= 0 || m > INT32_MAX || n > INT32_MAX ||
      k > INT32_MAX || k % 8 != 0)
    return Unsupported(std::string(what) + ": shape m " + std::to_string(m) + ", heads " +
                       std::to_string(p.hq) + "+2x" + std::to_string(p.hkv) + ", k " +
                       std::to_string(k) + " (needs k % 8 == 0)");
  using register_epilogue::aligned16;
  if (!aligned16(x) || !aligned16(wqkv) || !aligned16(p.q) || !aligned16(p.k) || !aligned16(p.v) ||
      (p.freqs != nullptr && (reinterpret_cast<uintptr_t>(p.freqs) & 7u) != 0))
    return Unsupported(std::string(what) + ": operands not aligned");
  const QkvArgs args{static_cast<Bf16*>(p.q),
                     static_cast<Bf16*>(p.k),
                     static_cast<Bf16*>(p.v),
                     static_cast<const Bf16*>(p.norm_q),
                     static_cast<const Bf16*>(p.norm_k),
                     p.freqs,
                     p.seq_if_shared,
                     p.hq,
                     p.hkv,
                     p.eps};
  const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
  if (tuning.schedule == GemmSchedule::kCooperative256x192)
    return Unsupported(std::string(what) + ": the 256 x 192 tile is the SwiGLU GEMM's only");
  return Fused::run(what, x, wqkv, mi, ni, ki, args, tuning, workspace, workspace_bytes, stream);
}

}  // namespace zimage::cuda

#else  // !ZIMAGE_WITH_CUTLASS

namespace zimage::cuda {

size_t cutlass_bf16_qkv_norm_rope_workspace(int64_t, int64_t, int64_t) {
  return 0;
}

Status cutlass_bf16_qkv_norm_rope(const void*, const void*, const QkvPrologue&, int64_t, int64_t,
                                  void*, size_t, cudaStream_t, const GemmTuning&) {
  return Unsupported("this build has no CUTLASS kernels (run scripts/setup.sh, target sm_90a)");
}

}  // namespace zimage::cuda

#endif

// Flash attention (FlashAttention-2 style) for bf16, head_dim 64 and 128: the DiT's and the text
// encoder's hot path. One block of 8 warps owns 128 query rows of one (batch, head); each warp
// owns 16 rows and keeps its output accumulator and the running softmax statistics in registers;
// its Q fragments either stay in registers too or are re-read from shared memory (two builds,
// see FlashTraits). Keys/values stream through shared memory in tiles of 64 rows with cp.async
// (the V tile loads while QKᵀ runs, the next K tile while PV runs). Products use mma.sync
// m16n8k16 (bf16 in, fp32 accumulate) fed by ldmatrix from an XOR-swizzled layout
// (conflict-free). Softmax is online in fp32 (base-2 exponentials with the scale folded in).
// Masks: keys >= key_len[b], keys > query (causal); rows with no visible key output 0.
#include <cuda_bf16.h>

#include "backend/cuda/kernels/device_utils.cuh"

namespace zimage::cuda {
namespace {

using bf16 = __nv_bfloat16;

template <int D, bool kQRegs>
struct FlashTraits {
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBM = 16 * kWarps;  // query rows per block
  static constexpr int kBN = 64;           // key rows per tile
  // kQRegs: Q fragments live in registers (~250 registers, one block of 8 warps per SM).
  // Otherwise they are re-read from shared memory for every K tile, which keeps a thread at 128
  // registers so two blocks (16 warps) share an SM. Which is faster is measured (CUDA_NOTES.md).
  static constexpr int kMinBlocks = kQRegs ? 1 : 2;
  static constexpr size_t kSmemBytes = static_cast<size_t>(kBM + 2 * kBN) * D * sizeof(bf16);
};

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// d += a · b for a 16x16 (row) bf16 tile and a 16x8 (col) bf16 tile, fp32 accumulators.
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Byte offset of (row, 16-byte chunk) in a swizzled tile of rows of D bf16.
template <int D>
__device__ __forceinline__ uint32_t swz(int row, int chunk) {
  return static_cast<uint32_t>((row * D + ((chunk ^ (row & 7)) << 3)) * sizeof(bf16));
}

// Loads rows [0, ROWS) of a tile (row r at g + r*stride) into shared memory; rows >= valid are
// zero-filled. `safe` is any valid global address (read by nothing, but must be legal).
template <int D, int ROWS, int THREADS>
__device__ __forceinline__ void load_tile(uint32_t s_base, const bf16* g, int64_t stride, int valid,
                                          const bf16* safe) {
  constexpr int kChunks = D / 8;
  static_assert((ROWS * kChunks) % THREADS == 0, "tile chunks must split evenly over threads");
#pragma unroll
  for (int it = 0; it < ROWS * kChunks / THREADS; ++it) {
    const int i = it * THREADS + static_cast<int>(threadIdx.x);
    const int r = i / kChunks, c = i % kChunks;
    const bool ok = r < valid;
    cp_async16(s_base + swz<D>(r, c), ok ? g + r * stride + c * 8 : safe, ok);
  }
}

template <int D, bool kQRegs>
__global__ void __launch_bounds__(FlashTraits<D, kQRegs>::kThreads,
                                  FlashTraits<D, kQRegs>::kMinBlocks)
    flash_fwd_kernel(const FlashArgs a) {
  using Tr = FlashTraits<D, kQRegs>;
  constexpr int kBM = Tr::kBM, kBN = Tr::kBN, kNT = kBN / 8, kDT = D / 8;
  extern __shared__ __align__(128) unsigned char flash_smem[];
  const uint32_t sQ = smem_addr(flash_smem);
  const uint32_t sK = sQ + kBM * D * sizeof(bf16);
  const uint32_t sV = sK + kBN * D * sizeof(bf16);

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int m_block = gridDim.x - 1 - blockIdx.x;  // heaviest (causal) blocks first
  const int h = blockIdx.y, b = blockIdx.z;
  const int kvh = h / (a.heads_q / a.heads_kv);
  const int64_t q_rs = static_cast<int64_t>(a.heads_q) * D;
  const int64_t kv_rs = static_cast<int64_t>(a.heads_kv) * D;
  const bf16* q = static_cast<const bf16*>(a.q);
  const bf16* qg = q + (static_cast<int64_t>(b) * a.seq_q * a.heads_q + h) * D;
  const bf16* kg =
      static_cast<const bf16*>(a.k) + (static_cast<int64_t>(b) * a.seq_k * a.heads_kv + kvh) * D;
  const bf16* vg =
      static_cast<const bf16*>(a.v) + (static_cast<int64_t>(b) * a.seq_k * a.heads_kv + kvh) * D;
  bf16* og = static_cast<bf16*>(a.out) + (static_cast<int64_t>(b) * a.seq_q * a.heads_q + h) * D;

  const int m0 = m_block * kBM;
  int kv_limit = a.seq_k;
  if (a.has_key_len) kv_limit = min(kv_limit, max(a.key_len[b], 0));
  int kv_end = kv_limit;
  if (a.causal) kv_end = min(kv_end, m0 + kBM);
  const int n_blocks = kv_end > 0 ? (kv_end + kBN - 1) / kBN : 0;

  load_tile<D, kBM, Tr::kThreads>(sQ, qg + m0 * q_rs, q_rs, min(kBM, a.seq_q - m0), q);
  if (n_blocks > 0) load_tile<D, kBN, Tr::kThreads>(sK, kg, kv_rs, min(kBN, a.seq_k), kg);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  const int q_frag_row = warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
  uint32_t qreg[kQRegs ? D / 16 : 1][4];
  if constexpr (kQRegs) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      ldmatrix_x4(qreg[kk], sQ + swz<D>(q_frag_row, kk * 2 + (lane >> 4)));
  }

  float o[kDT][4];
#pragma unroll
  for (int i = 0; i < kDT; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};
  const float sl2 = a.scale * 1.4426950408889634f;
  const int qrow[2] = {m0 + warp * 16 + (lane >> 2), m0 + warp * 16 + (lane >> 2) + 8};

  for (int nb = 0; nb < n_blocks; ++nb) {
    const int n0 = nb * kBN;
    __syncthreads();  // every warp is done with the previous V tile
    load_tile<D, kBN, Tr::kThreads>(sV, vg + n0 * kv_rs, kv_rs, min(kBN, a.seq_k - n0), vg);
    cp_async_commit();
    cp_async_wait<1>();  // this K tile has landed (the V tile may still be in flight)
    __syncthreads();

    float s[kNT][4];
#pragma unroll
    for (int j = 0; j < kNT; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t qs[4];
      if constexpr (!kQRegs) ldmatrix_x4(qs, sQ + swz<D>(q_frag_row, kk * 2 + (lane >> 4)));
      const uint32_t(&qf)[4] = kQRegs ? qreg[kQRegs ? kk : 0] : qs;
#pragma unroll
      for (int j = 0; j < kNT; j += 2) {
        uint32_t kf[4];
        ldmatrix_x4(kf,
                    sK + swz<D>(j * 8 + (lane & 7) + (lane >> 4) * 8, 2 * kk + ((lane >> 3) & 1)));
        mma_16816(s[j], qf, kf[0], kf[1]);
        mma_16816(s[j + 1], qf, kf[2], kf[3]);
      }
    }
    __syncthreads();  // every warp is done with this K tile
    if (nb + 1 < n_blocks)
      load_tile<D, kBN, Tr::kThreads>(sK, kg + (n0 + kBN) * kv_rs, kv_rs,
                                      min(kBN, a.seq_k - n0 - kBN), kg);
    cp_async_commit();  // possibly empty: keeps the wait counts uniform

    if (n0 + kBN > kv_limit || (a.causal && n0 + kBN - 1 > m0)) {
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = n0 + j * 8 + 2 * (lane & 3) + (e & 1);
          if (key >= kv_limit || (a.causal && key > qrow[e >> 1])) s[j][e] = -INFINITY;
        }
      }
    }

    uint32_t pa[kBN / 16][4];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < kNT; ++j) mx = fmaxf(mx, fmaxf(s[j][2 * r], s[j][2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(row_max[r], mx * sl2);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;
      const float corr = exp2f(row_max[r] - m_use);
      row_max[r] = m_new;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
        s[j][2 * r] = exp2f(s[j][2 * r] * sl2 - m_use);
        s[j][2 * r + 1] = exp2f(s[j][2 * r + 1] * sl2 - m_use);
        sum += s[j][2 * r] + s[j][2 * r + 1];
      }
      row_sum[r] = row_sum[r] * corr + sum;
#pragma unroll
      for (int i = 0; i < kDT; ++i) {
        o[i][2 * r] *= corr;
        o[i][2 * r + 1] *= corr;
      }
    }
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      pa[kk][0] = pack_bf16x2(s[2 * kk][0], s[2 * kk][1]);
      pa[kk][1] = pack_bf16x2(s[2 * kk][2], s[2 * kk][3]);
      pa[kk][2] = pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      pa[kk][3] = pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    }

    cp_async_wait<1>();  // this V tile has landed (the next K tile may still be in flight)
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
#pragma unroll
      for (int dn = 0; dn < kDT; dn += 2) {
        uint32_t vf[4];
        ldmatrix_x4_trans(
            vf, sV + swz<D>(kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, dn + (lane >> 4)));
        mma_16816(o[dn], pa[kk], vf[0], vf[1]);
        mma_16816(o[dn + 1], pa[kk], vf[2], vf[3]);
      }
    }
  }
  cp_async_wait<0>();

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l = row_sum[r];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const int row = qrow[r];
    if (row < a.seq_q) {
      bf16* dst = og + row * q_rs + 2 * (lane & 3);
#pragma unroll
      for (int i = 0; i < kDT; ++i)
        *reinterpret_cast<uint32_t*>(dst + i * 8) =
            pack_bf16x2(o[i][2 * r] * inv, o[i][2 * r + 1] * inv);
    }
  }
}

template <int D, bool kQRegs>
cudaError_t launch_flash(const FlashArgs& a, cudaStream_t s) {
  using Tr = FlashTraits<D, kQRegs>;
  // Per device and cheap; done on every launch so any device the process uses gets it.
  const cudaError_t attr_status =
      cudaFuncSetAttribute(flash_fwd_kernel<D, kQRegs>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(Tr::kSmemBytes));
  if (attr_status != cudaSuccess) return attr_status;
  const dim3 grid((a.seq_q + Tr::kBM - 1) / Tr::kBM, a.heads_q, a.batch);
  flash_fwd_kernel<D, kQRegs><<<grid, Tr::kThreads, Tr::kSmemBytes, s>>>(a);
  return cudaGetLastError();
}

}  // namespace

bool flash_attention_supported(int head_dim, const FlashArgs& a) {
  if (head_dim != 64 && head_dim != 128) return false;
  if (a.batch > kMaxAttentionBatch || a.batch > 65535 || a.heads_q > 65535) return false;
  if (a.heads_kv <= 0 || a.heads_q % a.heads_kv != 0) return false;
  return aligned16(a.q) && aligned16(a.k) && aligned16(a.v) && aligned16(a.out);
}

cudaError_t launch_flash_attention(const FlashArgs& a, cudaStream_t s) {
  if (a.batch <= 0 || a.seq_q <= 0 || a.heads_q <= 0) return cudaSuccess;
  const bool q_regs = a.variant == FlashVariant::kQInRegisters ||
                      (a.variant == FlashVariant::kAuto && a.head_dim == 128);
  switch (a.head_dim) {
    case 64:
      return q_regs ? launch_flash<64, true>(a, s) : launch_flash<64, false>(a, s);
    case 128:
      return q_regs ? launch_flash<128, true>(a, s) : launch_flash<128, false>(a, s);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace zimage::cuda

// NHWC group norm (+ SiLU) for the VAE: statistics per (batch, group) over H*W*(C/G) elements,
// which at 1024^2 is millions of values, so they are gathered in three steps: per-chunk partial
// sums in fp64 (per thread in registers, then per group: through per-channel shared-memory atomics
// in the general kernel, by a fixed-order reduction in the row-walking one), a per-(b, g) finalize
// over the chunks, and an elementwise apply pass (16-byte packs along channels). The partials are
// per group, not per channel: at the VAE's 128² x 512 they were 8 MB written and read again for a
// 16 MB tensor, and the finalize's 32 blocks walked them with 64-bit divisions (measured on an
// H100: 0.15 ms a call, ~0.3 TB/s). The apply pass computes y = x·scale + shift with scale =
// rstd·gamma and shift = beta - mean·scale per channel, as PyTorch's GroupNorm kernels do. The CPU
// oracle's (x - mean)·rstd·gamma + beta subtracts first: the two differ by about |mean·scale|·2^-24
// absolute (f32 rounding of the shift), negligible for the VAE's activations but not for a group
// whose mean is far larger than its spread. The normalised value is rounded to the storage type
// before SiLU, as a framework running GroupNorm then SiLU would.
#include "backend/cuda/kernels/device_utils.cuh"

namespace zimage::cuda {
namespace {

constexpr int kThreads = 256;

// Chunks of spatial rows per batch item for the statistics pass: ~1024 blocks in all, each of at
// least 32768 values (at 128² x 512, 1024 blocks of 16 rows spent more on their set-up and
// reduction than on their loads).
int64_t gn_chunks(int64_t batch, int64_t hw, int64_t c) {
  int64_t want = (1024 + batch - 1) / batch;
  const int64_t by_size = hw * c / 32768;
  if (want > by_size) want = by_size;
  if (want > hw) want = hw;
  if (want < 1) want = 1;
  const int64_t rows_per_chunk = (hw + want - 1) / want;
  return (hw + rows_per_chunk - 1) / rows_per_chunk;
}

// Adds one pack's values and squares to the running fp64 sums.
template <typename T, int VEC>
__device__ __forceinline__ void gn_accumulate(const T* p, double (&s)[VEC], double (&q)[VEC]) {
  float v[VEC];
  load_f32<T, VEC>(p, v);
#pragma unroll
  for (int k = 0; k < VEC; ++k) {
    s[k] += v[k];
    q[k] += static_cast<double>(v[k]) * v[k];
  }
}

// The end of a statistics block: each thread adds its sums for pack position `pk` (when it saw
// rows) into the block's shared sums, then the block writes each group's sums (its channels in
// order) to partial[b][chunk][g][2]. Every thread of the block calls it.
template <int VEC>
__device__ __forceinline__ void gn_finish_chunk(double* ssum, double* ssq, int64_t pk, bool saw,
                                                const double (&s)[VEC], const double (&q)[VEC],
                                                double* partial, int64_t b, int64_t chunk,
                                                int64_t c, int groups) {
  if (saw) {
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      atomicAdd(ssum + pk * VEC + k, s[k]);
      atomicAdd(ssq + pk * VEC + k, q[k]);
    }
  }
  __syncthreads();
  double* out = partial + (b * gridDim.x + chunk) * groups * 2;
  const int64_t cpg = c / groups;
  for (int g = static_cast<int>(threadIdx.x); g < groups; g += static_cast<int>(blockDim.x)) {
    double gs = 0.0, gq = 0.0;
    for (int64_t i = g * cpg; i < (g + 1) * cpg; ++i) {
      gs += ssum[i];
      gq += ssq[i];
    }
    out[2 * g] = gs;
    out[2 * g + 1] = gq;
  }
}

// Grid (chunks, batch). Per-group sum and sum of squares of one chunk of rows, in fp64,
// written to partial[b][chunk][g][2]. Dynamic shared memory: 2 * c doubles.
template <typename T, int VEC>
__global__ void gn_partial_kernel(const T* x, int64_t hw, int64_t c, int groups,
                                  int64_t rows_per_chunk, double* partial) {
  extern __shared__ double gn_smem[];
  double* ssum = gn_smem;
  double* ssq = gn_smem + c;
  for (int64_t i = threadIdx.x; i < 2 * c; i += blockDim.x) gn_smem[i] = 0.0;
  __syncthreads();
  const int64_t b = blockIdx.y, chunk = blockIdx.x;
  const int64_t r0 = chunk * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < hw ? r0 + rows_per_chunk : hw;
  const int64_t ppr = c / VEC;
  const T* xb = x + (b * hw + r0) * c;
  const int64_t total = (r1 - r0) * ppr;
  double s[VEC], q[VEC];
#pragma unroll
  for (int k = 0; k < VEC; ++k) s[k] = q[k] = 0.0;
  int64_t cur = -1;
  for (int64_t p = threadIdx.x; p < total; p += blockDim.x) {
    const int64_t pk = p % ppr;
    if (pk != cur) {  // flush: happens once per thread when blockDim is a multiple of ppr
      if (cur >= 0) {
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          atomicAdd(ssum + cur * VEC + k, s[k]);
          atomicAdd(ssq + cur * VEC + k, q[k]);
          s[k] = q[k] = 0.0;
        }
      }
      cur = pk;
    }
    gn_accumulate<T, VEC>(xb + p * VEC, s, q);
  }
  gn_finish_chunk<VEC>(ssum, ssq, cur, cur >= 0, s, q, partial, b, chunk, c, groups);
}

// Grid (groups, batch): combines the chunks' partials into mean and rstd per (b, g).
__global__ void gn_finalize_kernel(const double* partial, int64_t chunks, int64_t hw, int64_t c,
                                   int groups, float eps, float* stats) {
  __shared__ double scratch[32];
  const int64_t b = blockIdx.y, g = blockIdx.x, cpg = c / groups;
  double s = 0.0, q = 0.0;
  const double* p = partial + (b * chunks * groups + g) * 2;
  for (int64_t chunk = threadIdx.x; chunk < chunks; chunk += blockDim.x) {
    s += p[chunk * groups * 2];
    q += p[chunk * groups * 2 + 1];
  }
  s = block_sum(s, scratch);
  q = block_sum(q, scratch);
  if (threadIdx.x == 0) {
    const double n = static_cast<double>(hw) * static_cast<double>(cpg);
    const double mean = s / n;
    double var = q / n - mean * mean;
    if (var < 0.0) var = 0.0;
    stats[(b * groups + g) * 2] = static_cast<float>(mean);
    stats[(b * groups + g) * 2 + 1] =
        static_cast<float>(1.0 / sqrt(var + static_cast<double>(eps)));
  }
}

template <typename T, int VEC>
__global__ void gn_apply_kernel(const T* x, const T* gamma, const T* beta, const float* stats, T* y,
                                int64_t total, int64_t hwc, int64_t c, int64_t cpg, int groups,
                                bool silu) {
  const int64_t npack = (total + VEC - 1) / VEC;
  for (int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; p < npack;
       p += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i0 = p * VEC;
    const int64_t b = i0 / hwc, c0 = i0 % c;
    const float* st = stats + b * groups * 2;
    float v[VEC];
    load_f32<T, VEC>(x + i0, v);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const int64_t ch = c0 + k;
      const int64_t g = ch / cpg;
      const float a = st[2 * g + 1] * (gamma ? to_f32<T>(gamma[ch]) : 1.f);
      float o = fmaf(v[k], a, fmaf(-a, st[2 * g], beta ? to_f32<T>(beta[ch]) : 0.f));
      if (silu) {
        o = round_to<T>(o);
        o = o / (1.0f + expf(-o));
      }
      v[k] = o;
    }
    store_f32<T, VEC>(y + i0, v);
  }
}

// The same two passes for rows of c = ppr packs with ppr dividing kThreads (the VAE's 128, 256
// and 512 channels): each thread keeps one pack position of the row for the whole kernel, so
// there is no per-element index arithmetic (the 64-bit divisions above cost more than the memory
// traffic: measured at ~1.2 TB/s on the H200), and the apply pass holds its channels' scale and
// shift in registers; both load kRowsInFlight rows before computing. The statistics sum
// per thread, then per group in a fixed order (another order than gn_partial_kernel's, so the
// fp64 sums may differ in their last bits); the apply pass computes the same expression.
// Rows a statistics or apply thread loads before it computes (more bytes in flight: measured
// with ncu on an H100 at 35-66 % of DRAM bandwidth with two rows a step and one).
constexpr int kRowsInFlight = 4;

template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads)
    gn_partial_rows_kernel(const T* x, int64_t hw, int64_t c, int groups, int64_t rows_per_chunk,
                           double* partial) {
  // Each thread's sums, reduced per group in a fixed order at the end. (With shared fp64 atomics
  // instead, ncu timed the pass at 84 µs for 16 MB at 128² x 512: each block made 4096 atomics
  // for 16 rows of loads.)
  __shared__ double part_s[kThreads * VEC], part_q[kThreads * VEC];
  const int ppr = static_cast<int>(c / VEC);
  const int t = static_cast<int>(threadIdx.x);
  const int pk = t % ppr, rstep = static_cast<int>(blockDim.x) / ppr;
  const int64_t b = blockIdx.y, chunk = blockIdx.x;
  const int64_t r0 = chunk * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < hw ? r0 + rows_per_chunk : hw;
  const T* xb = x + b * hw * c + int64_t{pk} * VEC;
  double s[VEC], q[VEC];
#pragma unroll
  for (int k = 0; k < VEC; ++k) s[k] = q[k] = 0.0;
  int64_t r = r0 + t / ppr;
  using P = Pack<T, VEC>;
  for (; r + (kRowsInFlight - 1) * int64_t{rstep} < r1; r += kRowsInFlight * int64_t{rstep}) {
    P in[kRowsInFlight];  // packed while in flight (gn_apply_rows_kernel)
#pragma unroll
    for (int i = 0; i < kRowsInFlight; ++i)
      in[i] = *reinterpret_cast<const P*>(xb + (r + i * rstep) * c);
#pragma unroll
    for (int i = 0; i < kRowsInFlight; ++i)
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const float v = to_f32<T>(in[i].v[k]);
        s[k] += v;
        q[k] += static_cast<double>(v) * v;
      }
  }
  for (; r < r1; r += rstep) gn_accumulate<T, VEC>(xb + r * c, s, q);
#pragma unroll
  for (int k = 0; k < VEC; ++k) {
    part_s[t * VEC + k] = s[k];
    part_q[t * VEC + k] = q[k];
  }
  __syncthreads();
  // Group g: its channels in order, each summed over the threads holding that pack position.
  double* out = partial + (b * gridDim.x + chunk) * groups * 2;
  const int cpg = static_cast<int>(c / groups);
  for (int g = t; g < groups; g += static_cast<int>(blockDim.x)) {
    double gs = 0.0, gq = 0.0;
    for (int ch = g * cpg; ch < (g + 1) * cpg; ++ch) {
      for (int j = 0; j < rstep; ++j) {  // thread j * ppr + ch / VEC, its value ch % VEC
        gs += part_s[j * ppr * VEC + ch];
        gq += part_q[j * ppr * VEC + ch];
      }
    }
    out[2 * g] = gs;
    out[2 * g + 1] = gq;
  }
}

// Grid (blocks, batch); each thread one pack position of the rows of batch item blockIdx.y.
// At most 64 registers, 4 blocks an SM: with mean, rstd, gamma and beta held apart it took 88, two
// blocks an SM, and ncu timed it at 42 % of DRAM bandwidth at 1024² x 128 (H100, base clocks).
template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads, 4)
    gn_apply_rows_kernel(const T* x, const T* gamma, const T* beta, const float* stats, T* y,
                         int64_t hw, int64_t c, int64_t cpg, int groups, bool silu) {
  const int ppr = static_cast<int>(c / VEC);
  const int pk = static_cast<int>(threadIdx.x) % ppr;
  const int64_t b = blockIdx.y;
  const float* st = stats + b * groups * 2;
  float scale[VEC], shift[VEC];  // y = x·scale + shift (gn_scale_shift)
#pragma unroll
  for (int k = 0; k < VEC; ++k) {
    const int64_t ch = int64_t{pk} * VEC + k, g = ch / cpg;
    scale[k] = st[2 * g + 1] * (gamma ? to_f32<T>(gamma[ch]) : 1.f);
    shift[k] = fmaf(-scale[k], st[2 * g], beta ? to_f32<T>(beta[ch]) : 0.f);
  }
  const T* xb = x + b * hw * c + int64_t{pk} * VEC;
  T* yb = y + b * hw * c + int64_t{pk} * VEC;
  auto apply = [&](float(&v)[VEC]) {
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      float o = fmaf(v[k], scale[k], shift[k]);
      if (silu) {
        o = round_to<T>(o);
        o = o / (1.0f + expf(-o));
      }
      v[k] = o;
    }
  };
  // In place is fine: each thread reads its rows before it writes them.
  const int64_t rstep = int64_t{gridDim.x} * (blockDim.x / ppr);
  int64_t r = int64_t{blockIdx.x} * (blockDim.x / ppr) + threadIdx.x / ppr;
  using P = Pack<T, VEC>;
  for (; r + (kRowsInFlight - 1) * rstep < hw; r += kRowsInFlight * rstep) {
    P in[kRowsInFlight];  // the loads in flight stay packed: half the registers of floats for bf16
#pragma unroll
    for (int i = 0; i < kRowsInFlight; ++i)
      in[i] = *reinterpret_cast<const P*>(xb + (r + i * rstep) * c);
#pragma unroll
    for (int i = 0; i < kRowsInFlight; ++i) {
      float v[VEC];
#pragma unroll
      for (int k = 0; k < VEC; ++k) v[k] = to_f32<T>(in[i].v[k]);
      apply(v);
      store_f32<T, VEC>(yb + (r + i * rstep) * c, v);
    }
  }
  for (; r < hw; r += rstep) {
    float v[VEC];
    load_f32<T, VEC>(xb + r * c, v);
    apply(v);
    store_f32<T, VEC>(yb + r * c, v);
  }
}

bool all_aligned(std::initializer_list<const void*> ps) {
  for (const void* p : ps)
    if (p && !aligned16(p)) return false;
  return true;
}

}  // namespace

size_t group_norm_workspace_bytes(int64_t batch, int64_t hw, int64_t c, int groups) {
  if (batch <= 0 || hw <= 0 || c <= 0 || groups <= 0) return 0;
  const int64_t chunks = gn_chunks(batch, hw, c);
  return static_cast<size_t>(batch * chunks * groups * 2) * sizeof(double) +
         static_cast<size_t>(batch * groups * 2) * sizeof(float);
}

cudaError_t launch_group_norm(KType t, const void* x, const void* gamma, const void* beta, void* y,
                              int64_t batch, int64_t hw, int64_t c, int groups, float eps,
                              bool silu, void* workspace, cudaStream_t s) {
  if (batch <= 0 || hw <= 0 || c <= 0) return cudaSuccess;
  if (groups <= 0 || c % groups != 0 || batch > 65535) return cudaErrorInvalidValue;
  if (2 * c * static_cast<int64_t>(sizeof(double)) > 48 * 1024) return cudaErrorInvalidValue;
  const int64_t chunks = gn_chunks(batch, hw, c);
  const int64_t rows_per_chunk = (hw + chunks - 1) / chunks;
  double* partial = static_cast<double*>(workspace);
  float* stats = reinterpret_cast<float*>(partial + batch * chunks * groups * 2);
  return dispatch_ktype(t, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = kVec16<T>;
    auto xp = static_cast<const T*>(x);
    auto yp = static_cast<T*>(y);
    auto gp = static_cast<const T*>(gamma);
    auto bp = static_cast<const T*>(beta);
    const bool vec = c % V == 0 && all_aligned({x, y});
    const int tuned = row_kernel_tuning().row_walk;
    const bool rows = vec && kThreads % (c / V) == 0 &&  // a thread keeps one pack position
                      (tuned != 0 ? tuned : row_kernel_defaults().row_walk) == 2;
    const dim3 pgrid(static_cast<unsigned>(chunks), static_cast<unsigned>(batch));
    const size_t smem = 2 * static_cast<size_t>(c) * sizeof(double);
    if (rows)
      gn_partial_rows_kernel<T, V>
          <<<pgrid, kThreads, 0, s>>>(xp, hw, c, groups, rows_per_chunk, partial);
    else if (vec)
      gn_partial_kernel<T, V>
          <<<pgrid, kThreads, smem, s>>>(xp, hw, c, groups, rows_per_chunk, partial);
    else
      gn_partial_kernel<T, 1>
          <<<pgrid, kThreads, smem, s>>>(xp, hw, c, groups, rows_per_chunk, partial);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    gn_finalize_kernel<<<dim3(groups, static_cast<unsigned>(batch)), kThreads, 0, s>>>(
        partial, chunks, hw, c, groups, eps, stats);
    e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    const int64_t total = batch * hw * c;
    if (rows) {
      // Enough blocks per batch item to fill the GPU a few times over; each loops over rows.
      const int64_t rows_per_block = kThreads / (c / V);
      int64_t blocks = (hw + rows_per_block - 1) / rows_per_block;
      const int64_t cap = (int64_t{8} * 1024 + batch - 1) / batch;
      if (blocks > cap) blocks = cap;
      gn_apply_rows_kernel<T, V>
          <<<dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(batch)), kThreads, 0, s>>>(
              xp, gp, bp, stats, yp, hw, c, c / groups, groups, silu);
    } else if (vec)
      gn_apply_kernel<T, V><<<grid_for(total / V, kThreads), kThreads, 0, s>>>(
          xp, gp, bp, stats, yp, total, hw * c, c, c / groups, groups, silu);
    else
      gn_apply_kernel<T, 1><<<grid_for(total, kThreads), kThreads, 0, s>>>(
          xp, gp, bp, stats, yp, total, hw * c, c, c / groups, groups, silu);
    return cudaGetLastError();
  });
}

}  // namespace zimage::cuda

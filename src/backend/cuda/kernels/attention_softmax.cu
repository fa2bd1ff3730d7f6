// The masked softmax of the general attention path (any head_dim, f32, and the VAE's single
// 512-wide head): scores come from a cuBLAS batched GEMM as fp32 rows; one block per row finds the
// max, the sum of exponentials and writes probabilities in the type of the second GEMM's inputs.
//
// The path is bound by memory traffic: at the VAE's 2048² mid-block (65536 keys) the scores are
// 17 GB of fp32 per decode. So where the row fits on chip (keys a multiple of 4, up to 32768 in
// registers, up to 65536 with the rest in shared memory) it is read from memory once, kept, and
// its exponentials computed once; otherwise (odd lengths, longer rows, GPUs with less shared
// memory) the row is read three times. Both compute the same expression per element
// (expf(s * scale - max) * (1 / sum)); only the order of the block's sums differs.
#include <atomic>

#include "backend/cuda/kernels/device_utils.cuh"

namespace zimage::cuda {
namespace {

std::atomic<bool> g_on_chip{true};  // set_masked_softmax_on_chip (tests and measurements)

constexpr int kThreads = 256;

// Keys of row `row` (of `rows` per head) that take part: those below key_len and, if causal, up
// to the row's own query position.
__device__ __forceinline__ int64_t softmax_limit(int64_t row, int64_t rows, int64_t seq_k,
                                                 int64_t q0, bool causal, int64_t key_len) {
  int64_t limit = key_len >= 0 && key_len < seq_k ? key_len : seq_k;
  if (causal) {
    const int64_t q = q0 + row % rows;
    if (q + 1 < limit) limit = q + 1;
  }
  return limit;
}

template <typename P>
__global__ void masked_softmax_kernel(const float* scores, P* probs, int64_t rows, int64_t seq_k,
                                      int64_t q0, float scale, bool causal, int64_t key_len) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;  // over heads * rows
  const float* sr = scores + row * seq_k;
  P* pr = probs + row * seq_k;
  const int64_t limit = softmax_limit(row, rows, seq_k, q0, causal, key_len);
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < limit; j += blockDim.x) mx = fmaxf(mx, sr[j] * scale);
  mx = block_max(mx, scratch);
  float sum = 0.f;
  for (int64_t j = threadIdx.x; j < limit; j += blockDim.x) sum += expf(sr[j] * scale - mx);
  sum = block_sum(sum, scratch);
  const float inv = sum > 0.f ? 1.f / sum : 0.f;
  for (int64_t j = threadIdx.x; j < seq_k; j += blockDim.x) {
    const float p = j < limit ? expf(sr[j] * scale - mx) * inv : 0.f;
    pr[j] = from_f32<P>(p);
  }
}

// The max (and below: the exponentials, masked keys 0) of pack j..j+3 of a row, keys < limit.
__device__ __forceinline__ float masked_max4(const float4 v, int64_t j, int64_t limit, float scale,
                                             float mx) {
  if (j < limit) mx = fmaxf(mx, v.x * scale);
  if (j + 1 < limit) mx = fmaxf(mx, v.y * scale);
  if (j + 2 < limit) mx = fmaxf(mx, v.z * scale);
  if (j + 3 < limit) mx = fmaxf(mx, v.w * scale);
  return mx;
}

__device__ __forceinline__ float4 masked_exp4(const float4 v, int64_t j, int64_t limit, float scale,
                                              float mx, float& sum) {
  float4 e;
  e.x = j < limit ? expf(v.x * scale - mx) : 0.f;
  e.y = j + 1 < limit ? expf(v.y * scale - mx) : 0.f;
  e.z = j + 2 < limit ? expf(v.z * scale - mx) : 0.f;
  e.w = j + 3 < limit ? expf(v.w * scale - mx) : 0.f;
  sum += (e.x + e.y) + (e.z + e.w);
  return e;
}

template <typename P>
__device__ __forceinline__ void store4(P* p, const float4 e, float inv) {
  const float v[4] = {e.x * inv, e.y * inv, e.z * inv, e.w * inv};
  store_f32<P, 4>(p, v);
}

// The row on chip: pack i (4 keys) of the row is held by thread i % T, the first kRegPacks * T
// packs in registers, the rest in dynamic shared memory (each thread reads back only what it
// wrote, so no barrier guards it). The probabilities may overwrite the scores (p_t f32): every
// read happens before the block's first reduction.
template <typename P, int T, int kRegPacks>
__global__ void __launch_bounds__(T, 16 * 32 / T)
    masked_softmax_onchip_kernel(const float* scores, P* probs, int64_t rows, int64_t seq_k,
                                 int64_t q0, float scale, bool causal, int64_t key_len) {
  extern __shared__ float4 spill[];
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const float4* sr = reinterpret_cast<const float4*>(scores + row * seq_k);
  P* pr = probs + row * seq_k;
  const int npacks = static_cast<int>(seq_k / 4);
  const int t = static_cast<int>(threadIdx.x);
  const int64_t limit = softmax_limit(row, rows, seq_k, q0, causal, key_len);
  constexpr int kFirstSpill = kRegPacks * T;

  float4 reg[kRegPacks];
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < kRegPacks; ++i) {
    const int pk = i * T + t;
    if (pk < npacks) reg[i] = sr[pk];
  }
  for (int pk = kFirstSpill + t; pk < npacks; pk += T) {
    const float4 v = sr[pk];
    spill[pk - kFirstSpill] = v;
    mx = masked_max4(v, int64_t{pk} * 4, limit, scale, mx);
  }
#pragma unroll
  for (int i = 0; i < kRegPacks; ++i) {
    const int pk = i * T + t;
    if (pk < npacks) mx = masked_max4(reg[i], int64_t{pk} * 4, limit, scale, mx);
  }
  mx = block_max(mx, scratch);

  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < kRegPacks; ++i) {
    const int pk = i * T + t;
    if (pk < npacks) reg[i] = masked_exp4(reg[i], int64_t{pk} * 4, limit, scale, mx, sum);
  }
  for (int pk = kFirstSpill + t; pk < npacks; pk += T)
    spill[pk - kFirstSpill] =
        masked_exp4(spill[pk - kFirstSpill], int64_t{pk} * 4, limit, scale, mx, sum);
  sum = block_sum(sum, scratch);
  const float inv = sum > 0.f ? 1.f / sum : 0.f;

#pragma unroll
  for (int i = 0; i < kRegPacks; ++i) {
    const int pk = i * T + t;
    if (pk < npacks) store4(pr + int64_t{pk} * 4, reg[i], inv);
  }
  for (int pk = kFirstSpill + t; pk < npacks; pk += T)
    store4(pr + int64_t{pk} * 4, spill[pk - kFirstSpill], inv);
}

// Up to 16384 keys in registers (64 floats a thread, two blocks an SM); up to 32768 in the
// registers of 512 threads; up to 65536 with the rest of the row in up to 128 KiB of shared
// memory (one block an SM, 16 warps with 16 loads each in flight).
constexpr int kSmallThreads = 256, kLargeThreads = 512, kRegPacksPerThread = 16;
constexpr int64_t kSmallKeys = int64_t{4} * kRegPacksPerThread * kSmallThreads;     // 16384
constexpr int64_t kLargeRegKeys = int64_t{4} * kRegPacksPerThread * kLargeThreads;  // 32768
constexpr int64_t kLargeMaxKeys = 2 * kLargeRegKeys;                                // 65536
constexpr int kMaxSpillBytes = static_cast<int>((kLargeMaxKeys - kLargeRegKeys) * 4);

// Whether the large kernel of P may take kMaxSpillBytes of shared memory on the current device:
// the attribute is set once per device (to the most any row needs, so concurrent launches never
// see a smaller limit), and refused on GPUs without that much (rows past 32768 keys then take the
// three-pass kernel).
template <typename P>
bool large_spill_ready() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> state[kMaxDevices];  // 0 unknown, 1 ready, -1 refused
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) {
    cudaGetLastError();
    return false;
  }
  int s = state[dev].load(std::memory_order_acquire);
  if (s == 0) {
    int optin = 0;
    const bool ok = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) ==
                        cudaSuccess &&
                    optin >= kMaxSpillBytes + 1024 &&  // + the kernel's static scratch
                    cudaFuncSetAttribute(
                        masked_softmax_onchip_kernel<P, kLargeThreads, kRegPacksPerThread>,
                        cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSpillBytes) == cudaSuccess;
    if (!ok) cudaGetLastError();
    s = ok ? 1 : -1;
    state[dev].store(s, std::memory_order_release);
  }
  return s == 1;
}

}  // namespace

void set_masked_softmax_on_chip(bool on) {
  g_on_chip.store(on, std::memory_order_relaxed);
}

cudaError_t launch_masked_softmax(KType p_t, const float* scores, void* probs, int64_t heads,
                                  int64_t rows, int64_t seq_k, int64_t q0, float scale, bool causal,
                                  int64_t key_len, cudaStream_t s) {
  const int64_t total = heads * rows;
  if (total <= 0 || seq_k <= 0) return cudaSuccess;
  if (total > 0x7fffffff) return cudaErrorInvalidValue;
  const auto grid = static_cast<unsigned>(total);
  return dispatch_ktype(p_t, [&](auto tag) {
    using P = decltype(tag);
    P* out = static_cast<P*>(probs);
    // float4 loads need 16-byte rows; the probabilities are stored 4 at a time.
    const bool packs = seq_k % 4 == 0 && aligned16(scores) &&
                       reinterpret_cast<uintptr_t>(probs) % (4 * sizeof(P)) == 0;
    const bool on_chip = packs && g_on_chip.load(std::memory_order_relaxed);
    if (on_chip && seq_k <= kSmallKeys) {
      masked_softmax_onchip_kernel<P, kSmallThreads, kRegPacksPerThread>
          <<<grid, kSmallThreads, 0, s>>>(scores, out, rows, seq_k, q0, scale, causal, key_len);
      return cudaGetLastError();
    }
    const int64_t spill_bytes = seq_k > kLargeRegKeys ? (seq_k - kLargeRegKeys) * 4 : 0;  // fp32
    if (on_chip && seq_k <= kLargeMaxKeys && (spill_bytes == 0 || large_spill_ready<P>())) {
      masked_softmax_onchip_kernel<P, kLargeThreads, kRegPacksPerThread>
          <<<grid, kLargeThreads, static_cast<size_t>(spill_bytes), s>>>(
              scores, out, rows, seq_k, q0, scale, causal, key_len);
      return cudaGetLastError();
    }
    masked_softmax_kernel<P>
        <<<grid, kThreads, 0, s>>>(scores, out, rows, seq_k, q0, scale, causal, key_len);
    return cudaGetLastError();
  });
}

}  // namespace zimage::cuda

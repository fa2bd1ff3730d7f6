// The masked softmax of the general attention path (any head_dim, f32, and the VAE's single
// 512-wide head): scores come from a cuBLAS batched GEMM as fp32 rows; one block per row finds the
// max, the sum of exponentials and writes probabilities in the type of the second GEMM's inputs.
#include "backend/cuda/kernels/device_utils.cuh"

namespace zimage::cuda {
namespace {

constexpr int kThreads = 256;

template <typename P>
__global__ void masked_softmax_kernel(const float* scores, P* probs, int64_t rows, int64_t seq_k,
                                      int64_t q0, float scale, bool causal, int64_t key_len) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;  // over heads * rows
  const float* sr = scores + row * seq_k;
  P* pr = probs + row * seq_k;
  int64_t limit = key_len >= 0 && key_len < seq_k ? key_len : seq_k;
  if (causal) {
    const int64_t q = q0 + row % rows;
    if (q + 1 < limit) limit = q + 1;
  }
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

}  // namespace

cudaError_t launch_masked_softmax(KType p_t, const float* scores, void* probs, int64_t heads,
                                  int64_t rows, int64_t seq_k, int64_t q0, float scale, bool causal,
                                  int64_t key_len, cudaStream_t s) {
  const int64_t total = heads * rows;
  if (total <= 0 || seq_k <= 0) return cudaSuccess;
  if (total > 0x7fffffff) return cudaErrorInvalidValue;
  return dispatch_ktype(p_t, [&](auto tag) {
    using P = decltype(tag);
    masked_softmax_kernel<P><<<static_cast<unsigned>(total), kThreads, 0, s>>>(
        scores, static_cast<P*>(probs), rows, seq_k, q0, scale, causal, key_len);
    return cudaGetLastError();
  });
}

}  // namespace zimage::cuda

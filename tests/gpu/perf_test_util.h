// Timing helpers of the GPU op timings (test_cuda_perf.cpp, test_cuda_packed_rows.cpp): a call's
// median time alone and under sustained load, and the printed PERF line.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "cuda_test_util.h"

namespace zimage::test {

// Median of 20 timed calls (CUDA events on the backend's stream) after 3 warm-up calls.
inline double median_ms(cuda::CudaBackend* g, const std::function<Status()>& f) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(f().ok());
  std::vector<float> ms;
  for (int i = 0; i < 20; ++i) {
    cudaEventRecord(a, g->stream());
    const Status s = f();
    cudaEventRecord(b, g->stream());
    cudaEventSynchronize(b);
    EXPECT_TRUE(s.ok()) << s.to_string();
    float t = 0;
    cudaEventElapsedTime(&t, a, b);
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// The DiT's attention operands at a sequence of `s` tokens, 30 heads of 128: the packed q|k|v
// projection, the q and k norm weights, the output, the parameters and the FLOPs of one call.
struct DitAttentionCase {
  static constexpr int64_t h = 30, d = 128, f = 3 * h * d;
  Tensor qkv, wq, wk, o;
  AttentionParams p;
  double flop = 0;
  DitAttentionCase(cuda::CudaBackend* g, int64_t s, uint32_t& seed)
      : qkv(rand_dev(g, {1, s, f}, seed++)),
        wq(rand_dev(g, {d}, seed++, 0.5f, 1.5f)),
        wk(rand_dev(g, {d}, seed++, 0.5f, 1.5f)),
        o(take(g->alloc(DType::kBF16, {1, s, h, d}), "o")),
        flop(4.0 * s * s * d * h) {
    p.scale = 1.0f / std::sqrt(static_cast<float>(d));
  }
};

inline void report(const std::string& what, double ms, double flop, double bytes) {
  std::printf("  PERF %-48s %8.3f ms", what.c_str(), ms);
  if (flop > 0) std::printf("  %7.1f TFLOP/s", flop / (ms * 1e-3) / 1e12);
  if (bytes > 0) std::printf("  %7.1f GB/s", bytes / (ms * 1e-3) / 1e9);
  std::printf("\n");
}

// Per call over 10 calls back to back (the GPU under sustained load, as in a forward, where the
// H200 runs at its power limit), median of 5 such runs.
inline double sustained_ms(cuda::CudaBackend* g, const std::function<Status()>& f) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(f().ok());
  std::vector<float> ms;
  for (int r = 0; r < 5; ++r) {
    cudaEventRecord(a, g->stream());
    for (int i = 0; i < 10; ++i) EXPECT_TRUE(f().ok());
    cudaEventRecord(b, g->stream());
    cudaEventSynchronize(b);
    float t = 0;
    cudaEventElapsedTime(&t, a, b);
    ms.push_back(t / 10);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace zimage::test

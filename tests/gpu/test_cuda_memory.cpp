// The CUDA backend's memory machinery: the caching allocator (size classes, no cudaMalloc in a
// steady state, current/peak statistics, out-of-memory as a Status after which the backend still
// works) and CUDA graph capture/replay of a planned op sequence.
#include <string>
#include <vector>

#include "backend/cuda/allocator.h"
#include "cuda_test_util.h"

namespace zimage::test {
namespace {

TEST(CudaOps, AllocatorSizeClasses) {
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{511}, size_t{513}, size_t{1} << 20,
                       (size_t{1} << 20) + 1, size_t{3} << 28, (size_t{5} << 30) + 12345}) {
    const size_t r = cuda::CachingAllocator::round_size(bytes);
    EXPECT_GE(r, bytes);
    EXPECT_EQ(r % 512, 0u) << bytes;
    if (bytes >= (size_t{1} << 20)) {
      EXPECT_LE(r, bytes + bytes / 8) << bytes;
    }
  }
}

TEST(CudaOps, AllocatorReusesBlocksAndTracksPeak) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kF32);
  { Tensor warm = take(g->alloc(DType::kF32, {777, 1001}), "warm"); }
  const cuda::AllocatorStats s0 = g->memory_stats();
  for (int i = 0; i < 5; ++i) {
    Tensor t = take(g->alloc(DType::kF32, {777, 1001}), "t");
    ZI_ASSERT_OK(g->fill(t, 1.f));
  }
  const cuda::AllocatorStats s1 = g->memory_stats();
  EXPECT_EQ(s1.num_device_mallocs, s0.num_device_mallocs) << "steady state must not cudaMalloc";
  EXPECT_GE(s1.num_cache_hits, s0.num_cache_hits + 5);
  ZI_ASSERT_OK(g->synchronize());
  g->reset_peak_memory();
  const size_t base = g->memory_stats().in_use_bytes;
  {
    Tensor a = take(g->alloc(DType::kF32, {10 << 20}), "a");  // 40 MiB
    EXPECT_GE(g->memory_stats().in_use_bytes, base + (size_t{40} << 20));
  }
  const cuda::AllocatorStats s2 = g->memory_stats();
  EXPECT_EQ(s2.in_use_bytes, base);
  EXPECT_GE(s2.peak_in_use_bytes, base + (size_t{40} << 20));
  std::printf("  allocator: in use %zu B, peak %zu B, reserved %zu B, %llu cudaMalloc calls\n",
              s2.in_use_bytes, s2.peak_in_use_bytes, s2.reserved_bytes,
              static_cast<unsigned long long>(s2.num_device_mallocs));
}

TEST(CudaOps, OutOfMemoryIsAStatus) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kF32);
  auto r = g->alloc(DType::kF32, {int64_t{1} << 48});  // 1 PiB
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kOutOfMemory) << r.status().to_string();
  // The backend still works afterwards.
  Both x = both_rand({4, 33}, 1200, DType::kF32);
  Both y = outputs({4, 33}, DType::kF32);
  ZI_ASSERT_OK(cpu_oracle().silu(x.cpu, y.cpu));
  ZI_ASSERT_OK(g->silu(x.gpu, y.gpu));
  expect_match("silu after out-of-memory", DType::kF32, y);
}

TEST(CudaOps, GraphCaptureReplay) {
  ZI_REQUIRE_GPU();
  for (DType dt : kDTypes) {
    cuda::CudaBackend* g = gpu(dt);
    const int64_t m = 37, k = 64, n = 96;
    Tensor x = take(g->upload(rand_host({m, k}, 1300, dt), dt), "x");
    Tensor w = take(g->upload(rand_host({n, k}, 1301, dt), dt), "w");
    Tensor b = take(g->upload(rand_host({n}, 1302, dt), dt), "b");
    Tensor nw = take(g->upload(rand_host({n}, 1303, dt, 0.5f, 1.5f), dt), "nw");
    Tensor y = take(g->alloc(dt, {m, n}), "y");
    auto step = [&]() -> Status {
      ZI_TRY(g->matmul(x, w, b, y));
      ZI_TRY(g->rms_norm(y, nw, 1e-6f, Tensor(), y));
      return g->silu(y, y);
    };
    ZI_ASSERT_OK(step());  // plans the GEMM outside the capture
    ZI_ASSERT_OK(g->synchronize());
    const uint64_t mallocs = g->memory_stats().num_device_mallocs;
    ZI_ASSERT_OK(g->begin_capture());
    const Status captured = step();
    auto graph = g->end_capture();
    ZI_ASSERT_OK(captured);
    ASSERT_TRUE(graph.ok()) << graph.status().to_string();
    EXPECT_EQ(g->memory_stats().num_device_mallocs, mallocs) << "capture must not cudaMalloc";
    // New input values, then replay, against an eager run on the same values.
    Tensor x2 = take(g->upload(rand_host({m, k}, 1304, dt), dt), "x2");
    ZI_ASSERT_OK(g->convert(x2, x));
    ZI_ASSERT_OK(g->fill(y, std::numeric_limits<float>::quiet_NaN()));
    ZI_ASSERT_OK(g->replay(graph.value()));
    std::vector<float> replayed = fetch(*g, y);
    ZI_ASSERT_OK(step());
    std::vector<float> eager = fetch(*g, y);
    expect_close("graph replay vs eager (matmul, rms_norm, silu)", dt, replayed, eager, 0.0);
  }
}

}  // namespace
}  // namespace zimage::test

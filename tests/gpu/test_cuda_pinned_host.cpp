// Page-locked host memory (backend/cuda/runtime/pinned_host.h): huge pages zeroed and registered
// by default, cudaHostAlloc with ZIMAGE_HOST_PIN=alloc; either way zeroed, page-locked in the
// driver's eyes, usable by DMA both ways, moved without a second free, and a zero-byte request
// named. The uploader's and the streaming staging's own tests (test_cuda_upload.cpp,
// test_cuda_streaming.cpp) run on this memory.
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/pinned_host.h"
#include "cuda_test_util.h"

namespace zimage::test {
namespace {

using cuda::PinnedHost;

// Zeroed, locked, and a pattern through the device and back comes out the same.
void check_block(PinnedHost& h, size_t bytes) {
  ASSERT_TRUE(h);
  ASSERT_EQ(h.size(), bytes);
  auto* p = static_cast<uint8_t*>(h.data());
  size_t nonzero = 0;
  for (size_t i = 0; i < bytes; ++i) nonzero += p[i] != 0;
  EXPECT_EQ(nonzero, 0u) << bytes << " bytes";
  EXPECT_TRUE(cuda::is_page_locked(p)) << bytes << " bytes";
  EXPECT_TRUE(cuda::is_page_locked(p + bytes - 1)) << "last byte of " << bytes;
  for (size_t i = 0; i < bytes; ++i) p[i] = static_cast<uint8_t>(i * 131u + 7u);
  void* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, bytes), cudaSuccess);
  std::vector<uint8_t> want(p, p + bytes);
  ASSERT_EQ(cudaMemcpy(dev, p, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  std::memset(p, 0, bytes);
  ASSERT_EQ(cudaMemcpy(p, dev, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(std::memcmp(p, want.data(), bytes), 0) << bytes << " bytes";
  cudaFree(dev);
}

TEST(CudaPinnedHost, ZeroedLockedAndUsableByDma) {
  ZI_REQUIRE_GPU();
  unsetenv("ZIMAGE_HOST_PIN");
  for (size_t bytes : {size_t{1}, size_t{4097}, (size_t{3} << 20) + 5, size_t{64} << 20}) {
    auto h = PinnedHost::allocate(bytes);
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    EXPECT_EQ(h->method(), PinnedHost::Method::kRegistered)
        << "ordinary memory registered (huge pages where the kernel has them)";
    check_block(*h, bytes);
  }
  setenv("ZIMAGE_HOST_PIN", "alloc", 1);
  auto a = PinnedHost::allocate(size_t{5} << 20);
  unsetenv("ZIMAGE_HOST_PIN");
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ(a->method(), PinnedHost::Method::kHostAlloc);
  check_block(*a, size_t{5} << 20);
  auto zero = PinnedHost::allocate(0);
  EXPECT_EQ(zero.status().code(), ErrorCode::kInvalidArgument);
}

TEST(CudaPinnedHost, MovedOnceFreedOnce) {
  ZI_REQUIRE_GPU();
  auto r = PinnedHost::allocate(size_t{8} << 20);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  PinnedHost a = std::move(r).value();
  void* p = a.data();
  PinnedHost b = std::move(a);
  EXPECT_FALSE(a);
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(b.data(), p);
  PinnedHost c;
  c = std::move(b);
  EXPECT_EQ(c.data(), p);
  c.reset();
  EXPECT_FALSE(c);
  EXPECT_FALSE(cuda::is_page_locked(p)) << "unlocked once reset";
  c.reset();  // twice: nothing
}

}  // namespace
}  // namespace zimage::test

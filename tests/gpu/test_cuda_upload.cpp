// Uploads through the CUDA backend's pinned staging buffers (backend/cuda/runtime/uploader.h):
// contents exact around the buffer boundaries and across many wraps of the ring, with the host
// source overwritten as soon as upload() returns (the contract of backend.h), with on-device dtype
// conversion, through concat_rows (uploaded parts freed while their row copy is still queued), and
// the fallback when pinned memory cannot be allocated, and the staging readied ahead of a load;
// downloads into pageable memory through the same staging.
// CudaUploadPerf times a 1 GiB tensor from a freshly mapped file in the page cache, which is what
// model loading does.
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/cuda/runtime/uploader.h"
#include "cuda_test_util.h"
#include "io/weights/safetensors.h"
#include "model/common/load_util.h"

namespace zimage::test {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Deterministic bytes: a different pattern per seed, not periodic on any power of two.
std::vector<uint8_t> pattern(size_t bytes, uint32_t seed) {
  std::vector<uint8_t> v(bytes);
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < bytes; ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    v[i] = static_cast<uint8_t>(x);
  }
  return v;
}

// Random finite values of `dt` (bf16 or f32), as raw bytes of a host tensor.
Tensor random_host(DType dt, int64_t n, uint32_t seed) {
  Tensor t = Tensor::host(dt, {n});
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-4.f, 4.f);
  for (int64_t i = 0; i < n; ++i) {
    const float v = dist(gen);
    if (dt == DType::kBF16)
      t.data_as<uint16_t>()[i] = f32_to_bf16(v);
    else
      t.data_as<float>()[i] = v;
  }
  return t;
}

// The exact bytes `host` must become on the device in `to`: the device converts bf16 <-> f32 the
// same way as the host (widening is exact; narrowing rounds to nearest even).
std::vector<uint8_t> expected_bytes(const Tensor& host, DType to) {
  const size_t n = static_cast<size_t>(host.numel());
  std::vector<uint8_t> out(n * dtype_size(to));
  if (host.dtype() == to) {
    if (n) std::memcpy(out.data(), host.data(), out.size());
  } else if (host.dtype() == DType::kBF16 && to == DType::kF32) {
    auto* d = reinterpret_cast<float*>(out.data());
    for (size_t i = 0; i < n; ++i) d[i] = bf16_to_f32(host.data_as<uint16_t>()[i]);
  } else {
    auto* d = reinterpret_cast<uint16_t*>(out.data());
    for (size_t i = 0; i < n; ++i) d[i] = f32_to_bf16(host.data_as<float>()[i]);
  }
  return out;
}

// The device tensor's bytes (same-dtype download: a plain copy, no conversion).
std::vector<uint8_t> device_bytes(cuda::CudaBackend* g, const Tensor& t) {
  Tensor h = Tensor::host(t.dtype(), t.shape());
  const Status s = g->download(t, h);
  EXPECT_TRUE(s.ok()) << s.to_string();
  const auto* p = static_cast<const uint8_t*>(h.data());
  return std::vector<uint8_t>(p, p + h.nbytes());
}

// Index of the first differing byte, or -1.
int64_t first_difference(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return static_cast<int64_t>(i);
  return -1;
}

// Three 64 KiB buffers, staged at any size: a short test crosses many piece and buffer
// boundaries and wraps the ring many times.
cuda::PinnedUploader::Options tiny_ring() {
  cuda::PinnedUploader::Options o;
  o.buffer_bytes = 64 * 1024;
  o.buffers = 3;
  o.threads = 4;
  o.min_bytes = 0;
  o.start_bytes = 0;
  o.grain = 4096;
  return o;
}

// The uploader on its own with tiny buffers, so a short test crosses many piece and buffer
// boundaries and comes back to every buffer many times (the host must wait for its DMA).
TEST(CudaUpload, StagedCopiesAroundBufferBoundaries) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  ASSERT_NE(g, nullptr);
  const cuda::PinnedUploader::Options o = tiny_ring();
  cuda::PinnedUploader up(g->device_index(), g->stream(), o);
  const size_t b = o.buffer_bytes;
  const std::vector<size_t> sizes{1,         4095, 4096,       4097,  b - 1,       b,    b + 1,
                                  b * 7 / 2, 17,   10 * b + 3, 2 * b, 3 * b - 100, 5000, 64};
  std::vector<Tensor> dev;
  // The sources stay allocated, so the overwrites below are not dead stores to freed memory.
  std::vector<std::vector<uint8_t>> srcs;
  for (size_t i = 0; i < sizes.size(); ++i) {
    dev.push_back(take(g->alloc(DType::kU8, {static_cast<int64_t>(sizes[i])}), "alloc"));
    srcs.push_back(pattern(sizes[i], static_cast<uint32_t>(i)));
    std::vector<uint8_t>& src = srcs.back();
    ZI_ASSERT_OK(up.copy(dev.back().data(), src.data(), src.size()));
    std::memset(src.data(), 0xEE, src.size());  // allowed as soon as copy() returns
  }
  EXPECT_EQ(up.stats().staged_copies, sizes.size());
  EXPECT_EQ(up.stats().plain_copies, 0u);
  ZI_ASSERT_OK(g->synchronize());
  for (size_t i = 0; i < sizes.size(); ++i)
    EXPECT_EQ(
        first_difference(device_bytes(g, dev[i]), pattern(sizes[i], static_cast<uint32_t>(i))), -1)
        << "upload " << i << " of " << sizes[i] << " bytes";
  ZI_ASSERT_OK(up.release());
  EXPECT_FALSE(up.has_staging());
}

// download() through the same tiny ring: sizes around the buffer boundaries and across many
// wraps, into pageable memory, each exact; uploads queued before a download (the ring part-full)
// and after it stay exact too; without staging it takes the driver's path.
TEST(CudaUpload, StagedDownloadsAroundBufferBoundaries) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  ASSERT_NE(g, nullptr);
  const cuda::PinnedUploader::Options o = tiny_ring();
  cuda::PinnedUploader up(g->device_index(), g->stream(), o);
  const size_t b = o.buffer_bytes;
  const std::vector<size_t> sizes{1, 4097, b - 1, b, b + 1, 3 * b, 3 * b + 1, 10 * b + 3, 77};
  for (size_t i = 0; i < sizes.size(); ++i) {
    const std::vector<uint8_t> want = pattern(sizes[i], static_cast<uint32_t>(40 + i));
    Tensor dev = take(g->alloc(DType::kU8, {static_cast<int64_t>(sizes[i])}), "alloc");
    // Uploaded through the ring (which the download then starts over), then read back.
    ZI_ASSERT_OK(up.copy(dev.data(), want.data(), want.size()));
    std::vector<uint8_t> got(sizes[i], 0xAB);
    ZI_ASSERT_OK(up.download(got.data(), dev.data(), got.size()));
    EXPECT_EQ(first_difference(got, want), -1) << "download " << i << " of " << sizes[i];
  }
  EXPECT_EQ(up.stats().staged_downloads, sizes.size());
  // An upload after the downloads still lands exactly.
  const std::vector<uint8_t> last = pattern(5 * b + 9, 99);
  Tensor dev = take(g->alloc(DType::kU8, {static_cast<int64_t>(last.size())}), "alloc");
  ZI_ASSERT_OK(up.copy(dev.data(), last.data(), last.size()));
  ZI_ASSERT_OK(g->synchronize());
  EXPECT_EQ(first_difference(device_bytes(g, dev), last), -1);
  ZI_ASSERT_OK(up.release());
  // Without staging: the driver's copy, still exact.
  std::vector<uint8_t> plain(last.size());
  ZI_ASSERT_OK(up.download(plain.data(), dev.data(), plain.size()));
  EXPECT_EQ(first_difference(plain, last), -1);
  EXPECT_EQ(up.stats().staged_downloads, sizes.size());
}

// Backend::download into a large pageable tensor while the load's staging exists takes the staged
// path (a weight moved back to host memory, linear.h move_to_host), exact; into page-locked
// memory, or once the staging is gone, the driver's path.
TEST(CudaUpload, BackendDownloadDuringALoad) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  ASSERT_NE(g, nullptr);
  ZI_ASSERT_OK(g->finish_uploads());
  g->prepare_uploads();
  ASSERT_TRUE(g->uploader().has_staging());
  const uint64_t d0 = g->uploader().stats().staged_downloads;
  const int64_t n = static_cast<int64_t>(g->uploader().options().buffer_bytes) * 5 / 2 + 3;
  const Tensor src = random_host(DType::kBF16, n / 2, 321);
  Tensor dev = take(g->upload(src, DType::kBF16), "upload");
  Tensor host = Tensor::host_for_overwrite(DType::kBF16, src.shape());
  ASSERT_TRUE(host.defined());
  ZI_ASSERT_OK(g->download(dev, host));
  EXPECT_EQ(g->uploader().stats().staged_downloads, d0 + 1);
  EXPECT_EQ(std::memcmp(host.data(), src.data(), src.nbytes()), 0);
  Tensor pinned = take(g->alloc_pinned(DType::kBF16, src.shape()), "alloc_pinned");
  ZI_ASSERT_OK(g->download(dev, pinned));
  EXPECT_EQ(g->uploader().stats().staged_downloads, d0 + 1) << "pinned: the driver's copy";
  EXPECT_EQ(std::memcmp(pinned.data(), src.data(), src.nbytes()), 0);
  ZI_ASSERT_OK(g->finish_uploads());
  Tensor after = Tensor::host_for_overwrite(DType::kBF16, src.shape());
  ZI_ASSERT_OK(g->download(dev, after));
  EXPECT_EQ(g->uploader().stats().staged_downloads, d0 + 1) << "no staging: the driver's copy";
  EXPECT_EQ(std::memcmp(after.data(), src.data(), src.nbytes()), 0);
}

struct Case {
  DType from, to;
};

// Backend::upload with the backend's own uploader (64 MiB buffers): element counts around one
// buffer and 3.5 buffers, same dtype and converted on the device, source overwritten right after
// upload() returns.
TEST(CudaUpload, BackendUploadAroundChunkSizes) {
  ZI_REQUIRE_GPU();
  for (const Case c : {Case{DType::kBF16, DType::kBF16}, Case{DType::kBF16, DType::kF32},
                       Case{DType::kF32, DType::kBF16}, Case{DType::kF32, DType::kF32}}) {
    // The backend whose act dtype is the target (either accepts both; this also covers both).
    cuda::CudaBackend* g = gpu(c.to);
    ASSERT_NE(g, nullptr);
    ZI_ASSERT_OK(g->finish_uploads());  // start from a fresh ring
    const uint64_t staged0 = g->uploader().stats().staged_copies;
    const size_t chunk = g->uploader().options().buffer_bytes;
    const int64_t per = static_cast<int64_t>(chunk / dtype_size(c.from));  // elements per chunk
    const std::vector<int64_t> counts{0, 1, per - 1, per, per + 1, per * 7 / 2};
    std::vector<Tensor> dev, hosts;  // hosts stay allocated: the overwrites are not dead stores
    std::vector<std::vector<uint8_t>> want;
    for (size_t i = 0; i < counts.size(); ++i) {
      hosts.push_back(random_host(c.from, counts[i], static_cast<uint32_t>(100 + i)));
      const Tensor& host = hosts.back();
      want.push_back(expected_bytes(host, c.to));
      dev.push_back(take(g->upload(host, c.to), "upload"));
      if (host.nbytes()) std::memset(host.data(), 0xFF, host.nbytes());  // NaNs if read late
    }
    // Every upload of at least one chunk took the staged path.
    EXPECT_GE(g->uploader().stats().staged_copies, staged0 + 4)
        << dtype_name(c.from) << " -> " << dtype_name(c.to);
    ZI_ASSERT_OK(g->finish_uploads());
    EXPECT_FALSE(g->uploader().has_staging());
    for (size_t i = 0; i < counts.size(); ++i) {
      EXPECT_EQ(dev[i].dtype(), c.to);
      EXPECT_EQ(first_difference(device_bytes(g, dev[i]), want[i]), -1)
          << dtype_name(c.from) << " -> " << dtype_name(c.to) << ", " << counts[i] << " elements";
    }
  }
}

// prepare_uploads (what Engine::create calls on the thread that starts the backend, while the
// files open): the staging is allocated once, there, and the load's copies use it, the small
// ones included, with exact contents; finish_uploads frees it as before.
TEST(CudaUpload, PreparedStagingServesTheLoadsCopies) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  ASSERT_NE(g, nullptr);
  ZI_ASSERT_OK(g->finish_uploads());
  ASSERT_FALSE(g->uploader().has_staging());
  const uint64_t allocations0 = g->uploader().stats().allocations;
  std::thread([g] { g->prepare_uploads(); }).join();
  EXPECT_TRUE(g->uploader().has_staging());
  EXPECT_EQ(g->uploader().stats().allocations, allocations0 + 1);
  const uint64_t staged0 = g->uploader().stats().staged_copies;
  const int64_t per = static_cast<int64_t>(g->uploader().options().buffer_bytes / 2);
  std::vector<Tensor> hosts, dev;
  std::vector<std::vector<uint8_t>> want;
  for (const int64_t n : {int64_t{4096}, per * 3 + 5}) {  // below start_bytes, then a large one
    hosts.push_back(random_host(DType::kBF16, n, static_cast<uint32_t>(500 + n % 7)));
    want.push_back(expected_bytes(hosts.back(), DType::kBF16));
    dev.push_back(take(g->upload(hosts.back(), DType::kBF16), "upload"));
    std::memset(hosts.back().data(), 0xFF, hosts.back().nbytes());  // NaNs if read late
  }
  EXPECT_EQ(g->uploader().stats().staged_copies, staged0 + 2) << "both went through the staging";
  EXPECT_EQ(g->uploader().stats().allocations, allocations0 + 1) << "allocated once";
  ZI_ASSERT_OK(g->finish_uploads());
  EXPECT_FALSE(g->uploader().has_staging());
  for (size_t i = 0; i < dev.size(); ++i)
    EXPECT_EQ(first_difference(device_bytes(g, dev[i]), want[i]), -1) << "upload " << i;
}

// concat_rows uploads each part, queues its row copy into the fused tensor and drops the part;
// the next part's upload gets the same block from the caching allocator. The DMA runs on the
// backend stream, so it cannot overtake the queued row copy of the previous part.
TEST(CudaUpload, ConcatRowsReusesFreedPartsSafely) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  ASSERT_NE(g, nullptr);
  const int64_t rows = 2560, k = 4096;  // 20 MiB of bf16 per part
  std::vector<Tensor> parts;
  std::vector<uint8_t> want;
  for (uint32_t i = 0; i < 4; ++i) {
    Tensor p = random_host(DType::kBF16, rows * k, 300 + i).view({rows, k});
    const auto* b = static_cast<const uint8_t*>(p.data());
    want.insert(want.end(), b, b + p.nbytes());
    parts.push_back(std::move(p));
  }
  Tensor fused = take(load::concat_rows(*g, parts, "test"), "concat_rows");
  ASSERT_EQ(fused.shape(), (Shape{4 * rows, k}));
  ZI_ASSERT_OK(g->finish_uploads());
  EXPECT_EQ(first_difference(device_bytes(g, fused), want), -1);
}

// cudaHostAlloc fails (1 EiB: more than the address space, so it fails before pinning anything):
// one warning, the copies take the plain path, results are exact and the backend keeps working.
TEST(CudaUpload, FallsBackWhenPinnedMemoryIsUnavailable) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  ASSERT_NE(g, nullptr);
  cuda::PinnedUploader::Options o;
  o.buffer_bytes = size_t{1} << 60;
  o.buffers = 1;
  o.min_bytes = 0;
  o.start_bytes = 0;
  cuda::PinnedUploader up(g->device_index(), g->stream(), o);
  Tensor dev = take(g->alloc(DType::kU8, {3 << 20}), "alloc");
  std::vector<uint8_t> src;
  for (int i = 0; i < 2; ++i) {  // the second copy does not retry the allocation
    src = pattern(3 << 20, 7 + static_cast<uint32_t>(i));
    ZI_ASSERT_OK(up.copy(dev.data(), src.data(), src.size()));
    std::memset(src.data(), 0, src.size());
    EXPECT_EQ(
        first_difference(device_bytes(g, dev), pattern(3 << 20, 7 + static_cast<uint32_t>(i))), -1);
  }
  EXPECT_FALSE(up.has_staging());
  EXPECT_EQ(up.stats().plain_copies, 2u);
  EXPECT_EQ(up.stats().staged_copies, 0u);
  Both x = both_rand({4, 33}, 1201, DType::kBF16);
  Both y = outputs({4, 33}, DType::kBF16);
  ZI_ASSERT_OK(cpu_oracle().silu(x.cpu, y.cpu));
  ZI_ASSERT_OK(g->silu(x.gpu, y.gpu));
  expect_match("silu after a failed pinned allocation", DType::kBF16, y);
}

// ---- timing ------------------------------------------------------------------------------------

class TempFile {
 public:
  explicit TempFile(const std::string& name)
      : path_((std::filesystem::temp_directory_path() / name).string()) {}
  ~TempFile() {
    std::error_code ec;
    std::filesystem::remove(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A 1 GiB bf16 tensor in a safetensors file (just written, so in the page cache), uploaded from a
// fresh mapping each time (so page faults are part of the cost, as when loading a model): the
// plain pageable cudaMemcpyAsync (the old path), the staged path with 1..16 copy threads, the
// staged path from a mapping already faulted in (memcpy + DMA only), and Backend::upload as the
// loader calls it (including the pinned allocation). Sanity checks only; figures are printed.
TEST(CudaUploadPerf, OneGibFromMappedFile) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  ASSERT_NE(g, nullptr);
  const int64_t n = int64_t{512} << 20;  // bf16 elements: 1 GiB
  const size_t bytes = static_cast<size_t>(n) * 2;
  TempFile file("zimage_upload_perf_" + std::to_string(::getpid()) + ".safetensors");
  {
    auto w = take(SafetensorsWriter::create(file.path(), {{"w", DType::kBF16, {n}}}), "writer");
    ASSERT_NE(w, nullptr);
    const size_t block = size_t{64} << 20;
    for (size_t off = 0; off < bytes; off += block) {
      std::vector<uint8_t> v = pattern(block, static_cast<uint32_t>(off / block));
      ZI_ASSERT_OK(w->write(v.data(), v.size()));
    }
    ZI_ASSERT_OK(w->finish());
  }
  Tensor dev = take(g->alloc(DType::kBF16, {n}), "alloc");
  ZI_ASSERT_OK(g->finish_uploads());

  auto report = [&](const std::string& what, double s) {
    std::printf("  PERF upload 1 GiB %-46s %8.1f ms  %6.1f GB/s\n", what.c_str(), s * 1e3,
                static_cast<double>(bytes) / s / 1e9);
  };
  // A fresh mapping of the file: none of its pages are mapped into this process yet.
  auto fresh = [&]() -> Tensor {
    auto f = take(SafetensorsFile::open(file.path()), "open");
    return f ? take(f->tensor("w"), "tensor") : Tensor();
  };

  {
    Tensor src = fresh();
    ASSERT_TRUE(src.defined());
    const double t0 = now_s();
    ASSERT_EQ(cudaMemcpyAsync(dev.data(), src.data(), bytes, cudaMemcpyHostToDevice, g->stream()),
              cudaSuccess);
    ZI_ASSERT_OK(g->synchronize());
    report("pageable cudaMemcpyAsync (old path)", now_s() - t0);
  }
  const int max_threads = std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 16);
  std::vector<int> sweep;
  for (int t : {1, 2, 4, 8, 16})
    if (t < max_threads) sweep.push_back(t);
  sweep.push_back(max_threads);  // the uploader's default
  for (int threads : sweep) {
    cuda::PinnedUploader::Options o;
    o.threads = threads;
    cuda::PinnedUploader up(g->device_index(), g->stream(), o);
    {  // allocate the staging outside the timed copy
      std::vector<uint8_t> warm(o.start_bytes);
      ZI_ASSERT_OK(up.copy(dev.data(), warm.data(), warm.size()));
      ZI_ASSERT_OK(g->synchronize());
    }
    Tensor src = fresh();
    ASSERT_TRUE(src.defined());
    double t0 = now_s();
    ZI_ASSERT_OK(up.copy(dev.data(), src.data(), bytes));
    ZI_ASSERT_OK(g->synchronize());
    report("staged, " + std::to_string(threads) + " threads, fresh mapping", now_s() - t0);
    if (threads == max_threads) {  // again from the same mapping: no page faults left
      t0 = now_s();
      ZI_ASSERT_OK(up.copy(dev.data(), src.data(), bytes));
      ZI_ASSERT_OK(g->synchronize());
      report("staged, " + std::to_string(threads) + " threads, pages mapped", now_s() - t0);
    }
  }
  {
    Tensor src = fresh();
    ASSERT_TRUE(src.defined());
    const double t0 = now_s();
    Tensor up = take(g->upload(src, DType::kBF16), "upload");
    ZI_ASSERT_OK(g->finish_uploads());
    report("Backend::upload + finish_uploads (default)", now_s() - t0);
    // And the bytes are the file's.
    std::vector<uint8_t> got = device_bytes(g, up);
    const auto* want = static_cast<const uint8_t*>(src.data());
    EXPECT_EQ(std::memcmp(got.data(), want, bytes), 0);
  }
}

}  // namespace
}  // namespace zimage::test

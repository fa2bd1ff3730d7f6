// The CUDA backend's memory machinery: the caching allocator (512-byte rounding, no cudaMalloc in
// a steady state, memory held close to the peak in use on a VAE-like sequence, private pools whose
// blocks serve nobody else, current/peak statistics, out-of-memory as a Status after which the
// backend still works) and CUDA graph capture/replay of a planned op sequence, also with its
// temporaries in a private pool while other code allocates.
#include <algorithm>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/runtime/allocator.h"
#include "cuda_test_util.h"

namespace zimage::test {
namespace {

TEST(CudaOps, AllocatorSizeClasses) {
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{511}, size_t{513}, size_t{1} << 20,
                       (size_t{1} << 20) + 1, size_t{3} << 28, (size_t{5} << 30) + 12345}) {
    const size_t r = cuda::CachingAllocator::round_size(bytes);
    EXPECT_GE(r, bytes);
    EXPECT_EQ(r % 512, 0u) << bytes;
    EXPECT_LE(r - bytes, 512u) << bytes;
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

// Stages of one tensor size (32-512 MB, different every stage), a few tensors of that size, half
// or double it live at a time, on top of ~1 GB of long-lived "weights": the shape of the VAE
// decoder's requests. The same generator as the BlockAllocator unit test, here on the device.
TEST(CudaOps, AllocatorHeldMemoryStaysNearPeakOnVaeLikeSequence) {
  ZI_REQUIRE_GPU();
  auto alloc = cuda::CachingAllocator::create(gpu(DType::kF32)->device_index());
  std::mt19937_64 rng(1);
  auto get = [&](size_t n) {
    std::shared_ptr<Storage> s = take(alloc->allocate(n), "allocate");
    // The memory is real: write all of it.
    if (s) {
      EXPECT_EQ(cudaMemset(s->data(), 0, n), cudaSuccess);
    }
    return s;
  };
  std::vector<std::shared_ptr<Storage>> weights;
  for (int i = 0; i < 20; ++i)
    weights.push_back(get((20 + rng() % 60) * (size_t{1} << 20) + rng() % (size_t{1} << 20)));
  for (int stage = 0; stage < 40; ++stage) {
    const size_t size = 32 * 1000 * 1000 + rng() % (480 * 1000 * 1000);
    std::vector<std::shared_ptr<Storage>> live;
    const int ops = 10 + static_cast<int>(rng() % 30);
    for (int k = 0; k < ops; ++k) {
      if (live.size() < 2 || (live.size() < 5 && rng() % 2 == 0)) {
        static constexpr double kScale[] = {0.5, 1, 1, 1, 2};
        live.push_back(get(
            std::min<size_t>(static_cast<size_t>(size * kScale[rng() % 5]), 512 * 1000 * 1000)));
      } else {
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(rng() % live.size()));
      }
    }
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const cuda::AllocatorStats s = alloc->stats();
  std::printf(
      "  VAE-like: peak in use %.0f MiB, peak reserved %.0f MiB (%.3fx), %llu cudaMalloc, "
      "%llu cudaFree\n",
      s.peak_in_use_bytes / 1048576.0, s.peak_reserved_bytes / 1048576.0,
      static_cast<double>(s.peak_reserved_bytes) / static_cast<double>(s.peak_in_use_bytes),
      static_cast<unsigned long long>(s.num_device_mallocs),
      static_cast<unsigned long long>(s.num_device_frees));
  EXPECT_LE(static_cast<double>(s.peak_reserved_bytes),
            1.15 * static_cast<double>(s.peak_in_use_bytes));
  weights.clear();
  ZI_ASSERT_OK(alloc->empty_cache());
  EXPECT_EQ(alloc->stats().reserved_bytes, 0u);
  EXPECT_EQ(alloc->stats().in_use_bytes, 0u);
}

TEST(CudaOps, AllocatorPoolBlocksAreNotReusedOutsideThePool) {
  ZI_REQUIRE_GPU();
  auto alloc = cuda::CachingAllocator::create(gpu(DType::kF32)->device_index());
  constexpr size_t kBig = size_t{30} << 20, kSmall = 4096;
  ZI_ASSERT_OK(alloc->begin_pool(1));
  std::shared_ptr<Storage> a = take(alloc->allocate(kBig), "a");
  std::shared_ptr<Storage> b = take(alloc->allocate(kSmall), "b");
  ZI_ASSERT_OK(alloc->end_pool());
  ASSERT_TRUE(a && b);
  void* const pa = a->data();
  void* const pb = b->data();
  a.reset();  // freed after end_pool(): back to pool 1
  b.reset();
  const uint64_t mallocs = alloc->stats().num_device_mallocs;
  std::shared_ptr<Storage> c = take(alloc->allocate(kBig), "c");
  std::shared_ptr<Storage> d = take(alloc->allocate(kSmall), "d");
  EXPECT_NE(c->data(), pa) << "a pool block served an allocation outside the pool";
  EXPECT_NE(d->data(), pb) << "a pool block served an allocation outside the pool";
  EXPECT_EQ(alloc->stats().num_device_mallocs, mallocs + 2);
  void* const pc = c->data();
  c.reset();
  // Inside the pool its own block comes back, and the general one does not.
  ZI_ASSERT_OK(alloc->begin_pool(1));
  std::shared_ptr<Storage> a2 = take(alloc->allocate(kBig), "a2");
  std::shared_ptr<Storage> a3 = take(alloc->allocate(kBig), "a3");
  ZI_ASSERT_OK(alloc->end_pool());
  EXPECT_EQ(a2->data(), pa);
  EXPECT_NE(a3->data(), pc);
  a2.reset();
  a3.reset();
  // Released: the pool's blocks serve everyone, without cudaMalloc.
  ZI_ASSERT_OK(alloc->release_pool(1));
  const uint64_t before = alloc->stats().num_device_mallocs;
  std::vector<std::shared_ptr<Storage>> all;
  for (int i = 0; i < 3; ++i) all.push_back(take(alloc->allocate(kBig), "after release"));
  EXPECT_EQ(alloc->stats().num_device_mallocs, before);
  EXPECT_TRUE(std::any_of(all.begin(), all.end(), [&](const auto& s) { return s->data() == pa; }));
}

// A captured step whose temporary lives in a private pool: after capture, a tensor of the same
// size allocated outside the pool must not get the temporary's block, or every replay would
// overwrite it. (Without the pool it would: the freed temporary is the best fit.)
TEST(CudaOps, GraphReplayInAPrivatePoolIsSafeWhileOthersAllocate) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kF32);
  const int64_t m = 64, k = 64, n = 256;
  Tensor x = take(g->upload(rand_host({m, k}, 1400, DType::kF32), DType::kF32), "x");
  Tensor w = take(g->upload(rand_host({n, k}, 1401, DType::kF32), DType::kF32), "w");
  Tensor y = take(g->alloc(DType::kF32, {m, n}), "y");
  auto step = [&]() -> Status {
    ZI_ASSIGN_OR_RETURN(Tensor tmp, g->alloc(DType::kF32, {m, n}));
    ZI_TRY(g->matmul(x, w, Tensor(), tmp));
    return g->silu(tmp, y);
  };
  ZI_ASSERT_OK(g->begin_memory_pool(77));
  // Warm-up in the pool: plans the GEMM and leaves the temporary's block cached in the pool.
  Status warm = step();
  if (warm.ok()) warm = g->synchronize();
  const uint64_t mallocs = g->memory_stats().num_device_mallocs;
  Status captured = warm;
  Result<cuda::CudaGraph> graph = InternalError("not captured");
  if (warm.ok()) {
    captured = g->begin_capture();
    if (captured.ok()) {
      captured = step();
      graph = g->end_capture();
    }
  }
  ZI_ASSERT_OK(g->end_memory_pool());
  ZI_ASSERT_OK(warm);
  ZI_ASSERT_OK(captured);
  ASSERT_TRUE(graph.ok()) << graph.status().to_string();
  EXPECT_EQ(g->memory_stats().num_device_mallocs, mallocs) << "capture must not cudaMalloc";

  Tensor other = take(g->alloc(DType::kF32, {m, n}), "other");
  ZI_ASSERT_OK(g->fill(other, 7.f));
  ZI_ASSERT_OK(g->fill(y, std::numeric_limits<float>::quiet_NaN()));
  ZI_ASSERT_OK(g->replay(graph.value()));
  const std::vector<float> kept = fetch(*g, other);
  const auto clobbered = std::count_if(kept.begin(), kept.end(), [](float v) { return v != 7.f; });
  EXPECT_EQ(clobbered, 0) << "the replay wrote into a tensor allocated outside the pool";
  const std::vector<float> replayed = fetch(*g, y);
  ZI_ASSERT_OK(step());
  const std::vector<float> eager = fetch(*g, y);
  expect_close("graph replay in a pool vs eager (matmul, silu)", DType::kF32, replayed, eager, 0.0);
  graph = InternalError("destroyed");  // the graph goes before its pool
  ZI_ASSERT_OK(g->release_memory_pool(77));
}

// Repeated work on a fresh backend (core/block_allocator.h, "Repeated work"): phase A (two
// 200 MiB tensors), phase B (1000 MiB; one of A's segments goes back: past the highest bytes in
// use + 256 MiB), phase A again: the segment given back is asked for again, so the budget grows
// by it and nothing goes back. A recording then gives the idle segments back down to the fixed
// budget before its private pool grows (its misses could give nothing back: here B's 1000 MiB
// segment, the least recently used, goes), and runs. ZIMAGE_ALLOC_REPEAT=0 keeps the
// budget fixed (the segment goes back again); another value is refused, naming it.
TEST(CudaOps, RepeatedWorkGrowsTheCacheAndARecordingGivesItBack) {
  ZI_REQUIRE_GPU();
  constexpr int64_t kMiB = int64_t{1} << 20;
  auto fresh = [](const char* repeat) {
    const char* was = std::getenv("ZIMAGE_ALLOC_REPEAT");
    const std::string keep = was ? was : "";
    if (repeat)
      setenv("ZIMAGE_ALLOC_REPEAT", repeat, 1);
    else
      unsetenv("ZIMAGE_ALLOC_REPEAT");
    auto be = cuda::CudaBackend::create(0, DType::kF32);
    if (was != nullptr)
      setenv("ZIMAGE_ALLOC_REPEAT", keep.c_str(), 1);
    else
      unsetenv("ZIMAGE_ALLOC_REPEAT");
    return be;
  };
  auto phases = [&](cuda::CudaBackend& be) -> Status {
    auto phase_a = [&]() -> Status {
      ZI_ASSIGN_OR_RETURN(Tensor x, be.alloc(DType::kU8, {200 * kMiB}));
      ZI_ASSIGN_OR_RETURN(Tensor y, be.alloc(DType::kU8, {200 * kMiB}));
      return Status::Ok();
    };
    ZI_TRY(phase_a());
    { ZI_ASSIGN_OR_RETURN(Tensor b, be.alloc(DType::kU8, {1000 * kMiB})); }
    return phase_a();
  };
  {
    auto be = fresh(nullptr);
    ASSERT_TRUE(be.ok()) << be.status().to_string();
    cuda::CudaBackend& g = **be;
    ZI_ASSERT_OK(g.empty_cache());  // no idle segment of the start-up to go back first
    const cuda::AllocatorStats s0 = g.memory_stats();
    ZI_ASSERT_OK(phases(g));
    const cuda::AllocatorStats s1 = g.memory_stats();
    std::printf("  repeat: %llu segments given back, repeat slack %.0f MiB, %.0f MiB reserved\n",
                static_cast<unsigned long long>(s1.num_device_frees - s0.num_device_frees),
                s1.repeat_slack_bytes / 1048576.0, s1.reserved_bytes / 1048576.0);
    EXPECT_EQ(s1.num_device_frees - s0.num_device_frees, 1u);
    EXPECT_GE(s1.repeat_slack_bytes, static_cast<size_t>(200 * kMiB));
    EXPECT_GE(s1.reserved_bytes, static_cast<size_t>(1400 * kMiB));
    // A recording gives the idle segments back first, then runs and replays.
    Tensor acc = take(g.alloc(DType::kF32, {1000}), "acc");
    Tensor one = take(g.alloc(DType::kF32, {1000}), "one");
    ZI_ASSERT_OK(g.fill(acc, 0.f));
    ZI_ASSERT_OK(g.fill(one, 1.f));
    const cuda::AllocatorStats s1b = g.memory_stats();
    auto work = g.record([&]() -> Status { return g.add(acc, one, acc); });
    ASSERT_TRUE(work.ok()) << work.status().to_string();
    ZI_ASSERT_OK((*work)->replay());
    const std::vector<float> v = fetch(g, acc);
    EXPECT_TRUE(std::all_of(v.begin(), v.end(), [](float x) { return x == 2.f; }));
    const cuda::AllocatorStats s2 = g.memory_stats();
    EXPECT_EQ(s2.num_device_frees - s1b.num_device_frees, 1u);
    EXPECT_LE(s2.reserved_bytes + static_cast<size_t>(1000 * kMiB), s1b.reserved_bytes)
        << "B's idle segment was not given back before the recording";
    EXPECT_EQ(s2.repeat_slack_bytes, s1.repeat_slack_bytes) << "the budget stays grown";
  }
  {
    auto be = fresh("0");
    ASSERT_TRUE(be.ok()) << be.status().to_string();
    ZI_ASSERT_OK((*be)->empty_cache());
    const cuda::AllocatorStats s0 = (*be)->memory_stats();
    ZI_ASSERT_OK(phases(**be));
    const cuda::AllocatorStats s1 = (*be)->memory_stats();
    EXPECT_EQ(s1.repeat_slack_bytes, 0u);
    EXPECT_EQ(s1.num_device_frees - s0.num_device_frees, 2u) << "the fixed budget gives back again";
  }
  auto bad = fresh("2");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("ZIMAGE_ALLOC_REPEAT: '2'"), std::string::npos)
      << bad.status().message();
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

// Backend::record's contract, which the DiT relies on to skip the replay on the call that
// records: the warm-up run is a real run (its results are there when record returns) and the
// recording itself runs nothing, so work that adds 1 has added 1 once after record, and once
// more per replay.
TEST(CudaOps, RecordRunsTheWorkOnceAndTheRecordingNothing) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kF32);
  const int64_t n = 1000;
  Tensor acc = take(g->alloc(DType::kF32, {n}), "acc");
  Tensor one = take(g->alloc(DType::kF32, {n}), "one");
  ZI_ASSERT_OK(g->fill(acc, 0.f));
  ZI_ASSERT_OK(g->fill(one, 1.f));
  int runs = 0;
  auto work = g->record([&]() -> Status {
    ++runs;
    return g->add(acc, one, acc);
  });
  ASSERT_TRUE(work.ok()) << work.status().to_string();
  EXPECT_EQ(runs, 2) << "a warm-up run and the recorded one";
  auto values_are = [&](float want) {
    const std::vector<float> v = fetch(*g, acc);
    return std::all_of(v.begin(), v.end(), [want](float x) { return x == want; });
  };
  EXPECT_TRUE(values_are(1.f)) << "after record: the warm-up's result, once";
  ZI_ASSERT_OK((*work)->replay());
  ZI_ASSERT_OK((*work)->replay());
  EXPECT_TRUE(values_are(3.f)) << "after two replays";
  EXPECT_EQ(runs, 2) << "a replay does not call the work";
}

// The op profiler inside a recording (set_profile_recorded): the recorded ops are reported once
// each from the latest replay, with the time between them; eager ops around the recording are
// not; without recorded mode, captured ops are not timed at all.
TEST(CudaOps, ProfilerTimesOpsInsideARecording) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  const int64_t m = 512, k = 256, n = 384;
  Tensor x = take(g->upload(rand_host({m, k}, 1310, DType::kBF16), DType::kBF16), "x");
  Tensor w = take(g->upload(rand_host({n, k}, 1311, DType::kBF16), DType::kBF16), "w");
  Tensor nw = take(g->upload(rand_host({n}, 1312, DType::kBF16, 0.5f, 1.5f), DType::kBF16), "nw");
  Tensor y = take(g->alloc(DType::kBF16, {m, n}), "y");
  auto step = [&]() -> Status {
    ZI_TRY(g->matmul(x, w, Tensor(), y));
    ZI_TRY(g->rms_norm(y, nw, 1e-6f, Tensor(), y));
    return g->silu(y, y);
  };
  for (bool recorded : {true, false}) {
    ZI_ASSERT_OK(step());  // plans outside the capture
    ZI_ASSERT_OK(g->synchronize());
    g->set_profile_recorded(recorded);
    g->set_profiling(true);
    ZI_ASSERT_OK(g->begin_capture());
    const Status captured = step();
    auto graph = g->end_capture();
    ZI_ASSERT_OK(captured);
    ASSERT_TRUE(graph.ok()) << graph.status().to_string();
    ZI_ASSERT_OK(g->fill(y, 0.f));  // an eager op beside the recording
    for (int i = 0; i < 3; ++i) ZI_ASSERT_OK(g->replay(graph.value()));
    g->set_profiling(false);
    auto rows = g->op_profile();  // in recorded mode still: the recorded marks are reported
    g->set_profile_recorded(false);
    ASSERT_TRUE(rows.ok()) << rows.status().to_string();
    std::map<std::string, Backend::OpProfileEntry> by;
    for (const auto& r : *rows) by[r.op.substr(0, r.op.find(' '))] = r;
    if (!recorded) {
      // Eager mode: only the fill (captured ops cannot be timed there).
      EXPECT_EQ(by.count("matmul"), 0u);
      EXPECT_EQ(by.count("fill"), 1u);
      continue;
    }
    for (const char* op : {"matmul", "rms_norm", "silu", "(between"}) {
      ASSERT_EQ(by.count(op), 1u) << op;
      EXPECT_GE(by[op].total_ms, 0.0) << op;
    }
    EXPECT_EQ(by.count("fill"), 0u) << "eager ops are not part of the recorded report";
    EXPECT_EQ(by["matmul"].calls, 1) << "the latest replay, not the sum of three";
    EXPECT_GT(by["matmul"].total_ms, 0.0);
    EXPECT_EQ(by["(between"].calls, 2);
    std::printf("  recorded: matmul %.4f ms, rms_norm %.4f, silu %.4f, between ops %.4f\n",
                by["matmul"].total_ms, by["rms_norm"].total_ms, by["silu"].total_ms,
                by["(between"].total_ms);
  }
}

}  // namespace
}  // namespace zimage::test

// GPU side of the memory planner: FP8 weight rows against the CPU oracle (the same bytes), weight
// streaming through the copy stream giving exactly the resident model's output (same kernels, same
// order, bf16 and f32), the allocator cap a budget sets, and an impossible budget named at load.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <vector>

#include "backend/cuda/kernels/kernels.h"
#include "backend/cuda/runtime/slot_stager.h"
#include "gpu/cuda_test_util.h"
#include "io/model/model_folder.h"
#include "io/weights/weights.h"
#include "model/common/linear.h"
#include "pipeline/text_to_image.h"

using namespace zimage;
using namespace zimage::test;

namespace {

std::string golden_model_dir(const std::string& name) {
  return std::string(ZIMAGE_GOLDEN_DIR) + "/" + name + "/model";
}

Tensor host_of(Backend& be, const Tensor& t) {
  Tensor h = Tensor::host(DType::kF32, t.shape());
  EXPECT_TRUE(be.download(t, h).ok());
  return h;
}

double max_diff(const Tensor& a, const Tensor& b) {
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    m = std::max(m, std::fabs(static_cast<double>(a.data_as<float>()[i]) - b.data_as<float>()[i]));
  return m;
}

}  // namespace

TEST(CudaFp8Rows, SameBytesAndScalesAsTheCpuOracle) {
  ZI_REQUIRE_GPU();
  // k 1000 and 3840: whole 16-byte packs (the vectorised kernel, which every FP8 GEMM's
  // activations take), bf16 rows staged in shared memory; k 25000 (and f32 rows of 12500 or
  // more): past its 48 KB, so read twice; k 1003: the element-wise kernel. Each must give the
  // oracle's bytes.
  for (const int64_t k : {int64_t{1000}, int64_t{3840}, int64_t{25000}, int64_t{1003}}) {
    SCOPED_TRACE("k " + std::to_string(k));
    const int64_t n = 37;
    Tensor w = rand_host({n, k}, 11, DType::kBF16, -2.f, 2.f);
    for (int64_t r = 0; r < n; ++r)  // magnitudes over many decades, an outlier, a zero row
      for (int64_t i = 0; i < k; ++i)
        w.data_as<float>()[r * k + i] = round_bf16(w.data_as<float>()[r * k + i] *
                                                   std::ldexp(1.f, static_cast<int>(r % 9) - 4));
    w.data_as<float>()[5 * k + 17] = 900.f;
    // A NaN: left out of the row's max and coded as -448 by both backends (fmaxf's rule).
    w.data_as<float>()[3 * k + 11] = std::numeric_limits<float>::quiet_NaN();
    for (int64_t i = 0; i < k; ++i) w.data_as<float>()[7 * k + i] = 0.f;
    Tensor c8 = Tensor::host(DType::kF8E4M3, {n, k}), cs = Tensor::host(DType::kF32, {n});
    ZI_ASSERT_OK(cpu_oracle().quantize_fp8_rows(w, c8, cs));
    Tensor cback = Tensor::host(DType::kF32, {n, k});
    ZI_ASSERT_OK(cpu_oracle().dequantize_fp8_rows(c8, cs, cback));
    for (const DType act : {DType::kF32, DType::kBF16}) {
      cuda::CudaBackend* g = gpu(act);
      ASSERT_NE(g, nullptr);
      Tensor dw = take(g->upload(w, act), "upload");
      Tensor d8 = take(g->alloc(DType::kF8E4M3, {n, k}), "alloc");
      Tensor ds = take(g->alloc(DType::kF32, {n}), "alloc");
      ZI_ASSERT_OK(g->quantize_fp8_rows(dw, d8, ds));
      Tensor h8 = Tensor::host(DType::kF8E4M3, {n, k}), hs = Tensor::host(DType::kF32, {n});
      ZI_ASSERT_OK(g->download(d8, h8));
      ZI_ASSERT_OK(g->download(ds, hs));
      EXPECT_EQ(std::memcmp(h8.data(), c8.data(), h8.nbytes()), 0) << dtype_name(act);
      EXPECT_EQ(std::memcmp(hs.data(), cs.data(), hs.nbytes()), 0) << dtype_name(act);
      Tensor dback = take(g->alloc(act, {n, k}), "alloc");
      ZI_ASSERT_OK(g->dequantize_fp8_rows(d8, ds, dback));
      Tensor got = host_of(*g, dback);
      double worst = 0;  // f32: exact; bf16: the CPU value rounded once to bf16
      for (int64_t i = 0; i < n * k; ++i) {
        const float want =
            act == DType::kBF16 ? round_bf16(cback.data_as<float>()[i]) : cback.data_as<float>()[i];
        worst = std::max(worst, static_cast<double>(std::fabs(got.data_as<float>()[i] - want)));
      }
      std::printf("  fp8 rows %s: dequantised vs CPU max|diff| %.3g\n", dtype_name(act), worst);
      EXPECT_EQ(worst, 0.0);
    }
  }
}

// A streamed DiT (some or all blocks in pinned host memory, or pageable over the host-memory
// limit, or read from the weight files through pinned staging, copied in on the copy stream)
// gives the resident DiT's output bit for bit: resident
// replays a CUDA graph, streamed runs eagerly with copies overlapping compute, FP8 weights or not.
TEST(CudaStreaming, StreamedDitAndTextEncoderEqualResident) {
  ZI_REQUIRE_GPU();
  for (const char* name : {"v_turbo", "v_batch_cfg"}) {
    auto folder = ModelFolder::open(golden_model_dir(name));
    ASSERT_TRUE(folder.ok()) << folder.status().to_string();
    for (DType act : {DType::kF32, DType::kBF16}) {
      for (bool fp8 : {false, true}) {
        cuda::CudaBackend* g = gpu(act);
        ASSERT_NE(g, nullptr);
        auto ws = folder->open_weights("transformer");
        ASSERT_TRUE(ws.ok());
        WeightPlacement base;
        base.fp8_weights = fp8;
        auto resident = ZImageDiT::load(folder->transformer(), *ws, *g, base);
        ASSERT_TRUE(resident.ok()) << resident.status().to_string();
        const int n = (*resident)->num_blocks();
        WeightPlacement all = base, alt = base;
        all.streamed.assign(n, true);
        for (int i = 0; i < n; ++i) alt.streamed.push_back(i % 2 == 0);
        // Over a host-memory limit: every other streamed block in pageable memory.
        WeightPlacement pageable = all;
        for (int i = 0; i < n; ++i) pageable.pageable.push_back(i % 2 == 1);
        // Read from the weight files at every stream (through the backend's pinned staging);
        // only where the files hold the act dtype (bf16) and no FP8 rows are made.
        WeightPlacement files_all = all, files_alt = alt;
        files_all.stream_from_files = files_alt.stream_from_files = true;
        // The files' pages page-locked in place: every other block (the rest staged).
        WeightPlacement locked = files_all;
        locked.lock_files = true;
        for (int i = 0; i < n; ++i) locked.pageable.push_back(i % 2 == 1);
        // Inputs: seeded latents and a caption of 40 tokens.
        const auto& tc = folder->transformer();
        Tensor lat = rand_host({2, tc.in_channels, 8, 8}, 3, DType::kF32);
        Tensor cap = rand_host({40, tc.cap_feat_dim}, 4, act);
        Tensor dlat = take(g->upload(lat, DType::kF32), "upload");
        Tensor dcap = take(g->upload(cap, act), "upload");
        auto run = [&](ZImageDiT& dit) {
          std::vector<Tensor> outs;
          for (float t : {0.1f, 0.7f}) {  // two forwards: the slots wrap into the next pass
            Tensor out;
            EXPECT_TRUE(dit.forward(dlat, {t, t}, {dcap, dcap}, out).ok());
            outs.push_back(host_of(*g, out));
          }
          return outs;
        };
        const auto ref = run(**resident);
        // The copies of `all` once more, page-locked in place (cudaHostRegister) instead of by
        // cudaHostAlloc (CudaBackend::set_pin_by_register).
        int index = 0;
        for (const WeightPlacement& p : {all, alt, pageable, files_all, files_alt, all, locked}) {
          g->set_pin_by_register(index++ == 5);
          auto ws2 = folder->open_weights("transformer");
          ASSERT_TRUE(ws2.ok());
          auto streamed = ZImageDiT::load(tc, *ws2, *g, p);
          g->set_pin_by_register(false);
          ASSERT_TRUE(streamed.ok()) << streamed.status().to_string();
          const bool from_files = p.stream_from_files && act == DType::kBF16 && !fp8;
          EXPECT_EQ((*streamed)->streamed_units_from_files(),
                    from_files ? (*streamed)->streamed_units() : 0);
          if (p.lock_files && from_files) {  // half the blocks' pages, whole pages each
            EXPECT_GE((*streamed)->streamed_locked_bytes(),
                      (*streamed)->streamed_bytes_per_forward() / 2 - (64u << 10))
                << "registering a read-only file mapping (cudaHostRegisterReadOnly)";
          }
          const uint64_t h2d0 = g->streamed_bytes();
          const auto got = run(**streamed);
          // At least one full pass was copied; at most two and the next pass's prefetch.
          const uint64_t moved = g->streamed_bytes() - h2d0;
          const uint64_t pass = (*streamed)->streamed_bytes_per_forward();
          EXPECT_GE(moved, pass);
          EXPECT_LE(moved, 2 * pass + (*streamed)->streaming_slot_bytes());
          for (size_t k = 0; k < ref.size(); ++k) {
            const double d = max_diff(got[k], ref[k]);
            std::printf("  %s %s%s%s streamed DiT vs resident max|diff| %.3g\n", name,
                        dtype_name(act), fp8 ? " fp8-weights" : "",
                        p.stream_from_files ? " from-files" : "", d);
            EXPECT_EQ(d, 0.0) << name << " " << dtype_name(act) << (fp8 ? " fp8" : "");
          }
        }
        // Text encoder: every layer streamed (the embedding table then stays on the host).
        auto te_ws = folder->open_weights("text_encoder");
        ASSERT_TRUE(te_ws.ok());
        auto te_res = Qwen3Encoder::load(folder->text_encoder(), *te_ws, *g, base);
        ASSERT_TRUE(te_res.ok()) << te_res.status().to_string();
        WeightPlacement te_all = base;
        te_all.streamed.assign((*te_res)->layers_run(), true);
        te_all.first_slot = 2;
        auto te_ws2 = folder->open_weights("text_encoder");
        ASSERT_TRUE(te_ws2.ok());
        auto te_str = Qwen3Encoder::load(folder->text_encoder(), *te_ws2, *g, te_all);
        ASSERT_TRUE(te_str.ok()) << te_str.status().to_string();
        const std::vector<std::vector<int32_t>> ids = {{1, 5, 9, 200, 7}, {3, 4}};
        WeightPlacement te_pageable = te_all;  // the first half of the layers pageable
        for (size_t i = 0; i < te_all.streamed.size(); ++i)
          te_pageable.pageable.push_back(2 * i < te_all.streamed.size());
        auto te_ws3 = folder->open_weights("text_encoder");
        ASSERT_TRUE(te_ws3.ok());
        auto te_pg = Qwen3Encoder::load(folder->text_encoder(), *te_ws3, *g, te_pageable);
        ASSERT_TRUE(te_pg.ok()) << te_pg.status().to_string();
        WeightPlacement te_files = te_all;
        te_files.stream_from_files = true;
        auto te_ws4 = folder->open_weights("text_encoder");
        ASSERT_TRUE(te_ws4.ok());
        auto te_fl = Qwen3Encoder::load(folder->text_encoder(), *te_ws4, *g, te_files);
        ASSERT_TRUE(te_fl.ok()) << te_fl.status().to_string();
        EXPECT_EQ((*te_fl)->streamed_units_from_files(),
                  act == DType::kBF16 && !fp8 ? (*te_fl)->streamed_units() : 0);
        for (int pass = 0; pass < 2; ++pass) {  // the second pass refills the staging buffers
          auto a = (*te_res)->encode(ids);
          auto b = (*te_str)->encode(ids);
          auto c = (*te_pg)->encode(ids);
          auto f = (*te_fl)->encode(ids);
          ASSERT_TRUE(a.ok() && b.ok() && c.ok() && f.ok());
          for (size_t i = 0; i < a->size(); ++i) {
            EXPECT_EQ(max_diff(host_of(*g, (*a)[i]), host_of(*g, (*b)[i])), 0.0);
            EXPECT_EQ(max_diff(host_of(*g, (*a)[i]), host_of(*g, (*c)[i])), 0.0) << "pageable";
            EXPECT_EQ(max_diff(host_of(*g, (*a)[i]), host_of(*g, (*f)[i])), 0.0) << "files";
          }
        }
      }
    }
  }
}

// stream_in from ordinary memory (a file mapping's pages, a pageable copy) goes through the
// slot's pinned staging in 16 MiB pieces, from pinned memory straight to the DMA; several parts
// per slot land at their offsets, and a slot refilled with other bytes (its staging reused, then
// grown for a larger unit) carries the new ones.
TEST(CudaStreaming, StreamInThroughStagingAndPinnedSources) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  ASSERT_NE(g, nullptr);
  auto pattern = [](int64_t n, uint32_t seed) {
    Tensor t = Tensor::host(DType::kU8, {n});
    uint32_t x = seed;
    for (int64_t i = 0; i < n; ++i) {
      x = x * 1664525u + 1013904223u;
      t.data_as<uint8_t>()[i] = static_cast<uint8_t>(x >> 24);
    }
    return t;
  };
  for (int round = 0; round < 3; ++round) {
    // Odd sizes: a 40 MiB + 3 part spans three pieces; round 2 grows the staging buffer.
    const int64_t big = (int64_t{40} << 20) + 3 + (round == 2 ? (int64_t{24} << 20) : 0);
    const int64_t small = 4097;
    Tensor a = pattern(big, 1 + round), b = pattern(small, 7 + round);
    Tensor pinned = take(g->alloc_pinned(DType::kU8, {small}), "alloc_pinned");
    std::memcpy(pinned.data(), pattern(small, 11 + round).data(), small);
    Tensor dev = take(g->alloc(DType::kU8, {big + 2 * small}), "alloc");
    Tensor d0(dev.storage(), dev.byte_offset(), DType::kU8, {big});
    Tensor d1(dev.storage(), dev.byte_offset() + big, DType::kU8, {small});
    Tensor d2(dev.storage(), dev.byte_offset() + big + small, DType::kU8, {small});
    const int slot = round % 2;
    ZI_ASSERT_OK(g->stream_in(slot, {{a, d0}, {pinned, d1}, {b, d2}}));
    ZI_ASSERT_OK(g->wait_slot(slot));
    Tensor back = Tensor::host(DType::kU8, {big + 2 * small});
    ZI_ASSERT_OK(g->download(dev, back));
    const auto* h = back.data_as<uint8_t>();
    EXPECT_EQ(std::memcmp(h, a.data(), big), 0) << "round " << round;
    EXPECT_EQ(std::memcmp(h + big, pinned.data(), small), 0) << "round " << round;
    EXPECT_EQ(std::memcmp(h + big + small, b.data(), small), 0) << "round " << round;
    ZI_ASSERT_OK(g->release_slot(slot));
  }
  // A pair the backend cannot stream (dtypes differ) is an error, not a conversion.
  Tensor f = Tensor::host(DType::kF32, {8});
  Tensor d = take(g->alloc(DType::kBF16, {8}), "alloc");
  EXPECT_FALSE(g->stream_in(0, {{f, d}}).ok());
  EXPECT_FALSE(g->can_stream(DType::kF32, DType::kBF16));
  EXPECT_TRUE(g->can_stream(DType::kBF16, DType::kBF16));
}

// SlotStager::prepare: requests for several slots, from two threads at once, queue for one worker
// without blocking the callers; the buffers they page-lock hold at least what was asked before
// any copy, and the copies (each waiting only for its own slot) use them without growing them;
// the staged bytes land exactly; staged_stream_bytes counts only the parts not page-locked.
TEST(CudaStreaming, PreparedStagingServesCopiesPerSlot) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  ASSERT_NE(g, nullptr);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  {
    cuda::SlotStager st(g->device_index(), 4, 4);
    const size_t sizes[4] = {size_t{48} << 20, size_t{16} << 20, (size_t{8} << 20) + 5, 4096};
    // Two threads ask at once (the load's and the warm-up's, as in a budgeted load).
    std::thread other([&] {
      st.prepare(3, sizes[3]);
      st.prepare(1, sizes[1]);
    });
    st.prepare(0, sizes[0]);
    st.prepare(2, sizes[2]);
    other.join();
    // Every buffer page-locked by the requests alone, before any copy.
    const uint64_t prepared = st.pinned_bytes();
    EXPECT_GE(prepared, sizes[0] + sizes[1] + sizes[2] + sizes[3]);
    for (int slot : {2, 0, 3, 1}) {
      std::vector<uint8_t> src(sizes[slot]);
      for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + slot);
      Tensor dev = take(g->alloc(DType::kU8, {static_cast<int64_t>(src.size())}), "alloc");
      ZI_ASSERT_OK(st.copy(slot, {{dev.data(), src.data(), src.size()}}, stream));
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      std::vector<uint8_t> back(src.size());
      ASSERT_EQ(cudaMemcpy(back.data(), dev.data(), back.size(), cudaMemcpyDeviceToHost),
                cudaSuccess);
      EXPECT_EQ(back, src) << "slot " << slot;
    }
    EXPECT_EQ(st.pinned_bytes(), prepared) << "the copies found their buffers ready";
  }
  cudaStreamDestroy(stream);
  Tensor pinned = take(g->alloc_pinned(DType::kU8, {1000}), "alloc_pinned");
  Tensor plain = Tensor::host(DType::kU8, {3000});
  EXPECT_EQ(g->staged_stream_bytes({pinned, plain, Tensor()}), 3000u);
  EXPECT_EQ(g->staged_stream_bytes({pinned}), 0u);
}

// Uploads from a page-locked range (a weight file's mapping under ZIMAGE_UPLOAD=locked) go
// straight to the DMA engine and land whole; a source only partly inside a locked range takes the
// staging; the lock's release waits for the copies.
TEST(CudaStreaming, UploadsFromLockedRanges) {
  ZI_REQUIRE_GPU();
  cuda::CudaBackend* g = gpu(DType::kBF16);
  ASSERT_NE(g, nullptr);
  constexpr size_t kPage = size_t{2} << 20, kBytes = size_t{48} << 20;
  void* raw = std::aligned_alloc(kPage, kBytes + kPage);
  ASSERT_NE(raw, nullptr);
  auto* bytes = static_cast<uint8_t*>(raw);
  for (size_t i = 0; i < kBytes + kPage; ++i) bytes[i] = static_cast<uint8_t>(i * 7 + (i >> 13));
  {
    auto lock = g->lock_host_range(raw, kBytes);
    ASSERT_TRUE(lock.ok()) << lock.status().to_string();
    const uint64_t direct0 = g->uploader().stats().locked_copies;
    // Inside: direct (40 MiB, larger than the staging's start size).
    Tensor inside = Tensor::wrap(bytes + 4096, DType::kU8, {int64_t{40} << 20});
    Tensor d1 = take(g->upload(inside, DType::kU8), "upload inside");
    EXPECT_EQ(g->uploader().stats().locked_copies, direct0 + 1);
    // Running past the locked range: staged.
    Tensor across = Tensor::wrap(bytes + kBytes - 4096, DType::kU8, {int64_t{1} << 20});
    Tensor d2 = take(g->upload(across, DType::kU8), "upload across");
    EXPECT_EQ(g->uploader().stats().locked_copies, direct0 + 1);
    ZI_ASSERT_OK(g->finish_uploads());
    Tensor h1 = Tensor::host(DType::kU8, inside.shape()),
           h2 = Tensor::host(DType::kU8, across.shape());
    ZI_ASSERT_OK(g->download(d1, h1));
    ZI_ASSERT_OK(g->download(d2, h2));
    EXPECT_EQ(std::memcmp(h1.data(), inside.data(), inside.nbytes()), 0);
    EXPECT_EQ(std::memcmp(h2.data(), across.data(), across.nbytes()), 0);
  }  // unlocked here
  EXPECT_FALSE(g->lock_host_range(nullptr, 10).ok());
  std::free(raw);
}

// prepare_stream_staging while the warm-up runs on another thread (a budgeted load's text encoder
// asking while the warm-up loads its plans): held or not, the request is served by the
// time the warm-up has ended; one made after it too. A fresh backend, so no earlier test's
// staging counts.
TEST(CudaStreaming, StagingRequestsDuringTheWarmUpAreServed) {
  ZI_REQUIRE_GPU();
  auto be = make_cuda_backend(0, DType::kBF16);
  ASSERT_TRUE(be.ok());
  auto* g = dynamic_cast<cuda::CudaBackend*>(be->get());
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->stream_staging_bytes(), 0u);
  const uint64_t a = uint64_t{24} << 20, b = uint64_t{10} << 20;
  std::thread warm([g] { g->warm_up(); });
  g->prepare_stream_staging(2, a);
  g->prepare_stream_staging(3, a);
  warm.join();
  EXPECT_GE(g->stream_staging_bytes(), 2 * a);
  EXPECT_LT(g->stream_staging_bytes(), 2 * a + (uint64_t{8} << 20)) << "no more than asked";
  g->prepare_stream_staging(0, b);
  EXPECT_GE(g->stream_staging_bytes(), 2 * a + b);
  // Out of range or empty: nothing.
  g->prepare_stream_staging(-1, b);
  g->prepare_stream_staging(Backend::kStreamSlots, b);
  g->prepare_stream_staging(1, 0);
  EXPECT_LT(g->stream_staging_bytes(), 2 * a + b + (uint64_t{8} << 20));
}

TEST(CudaStreaming, AllocatorCapAndImpossibleBudget) {
  ZI_REQUIRE_GPU();
  auto be = make_cuda_backend(0, DType::kBF16);
  ASSERT_TRUE(be.ok());
  auto* g = dynamic_cast<cuda::CudaBackend*>(be->get());
  g->set_memory_limit(size_t{64} << 20);
  auto small = g->alloc(DType::kU8, {32 << 20});
  EXPECT_TRUE(small.ok());
  auto big = g->alloc(DType::kU8, {48 << 20});  // 32 + 48 MiB > 64 MiB
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), ErrorCode::kOutOfMemory);
  EXPECT_NE(big.status().message().find("budget"), std::string::npos) << big.status().to_string();
  EXPECT_LE(g->memory_stats().reserved_bytes, size_t{64} << 20);
  g->set_memory_limit(0);

  // A budget below the context itself: the load fails up front, stating the minimum.
  PipelineLoadOptions o;
  o.vram_budget = uint64_t{100} << 20;
  auto pipe = TextToImage::load(golden_model_dir("v_turbo"), **be, o);
  ASSERT_FALSE(pipe.ok());
  EXPECT_EQ(pipe.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(pipe.status().message().find("below the minimum"), std::string::npos)
      << pipe.status().to_string();
  std::printf("  impossible budget: %s\n", pipe.status().to_string().c_str());
}

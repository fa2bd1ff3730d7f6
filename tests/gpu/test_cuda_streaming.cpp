// GPU side of the memory planner: FP8 weight rows against the CPU oracle (the same bytes), weight
// streaming through the copy stream giving exactly the resident model's output (same kernels, same
// order, bf16 and f32), the allocator cap a budget sets, and an impossible budget named at load.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

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
  const int64_t n = 37, k = 1000;
  Tensor w = rand_host({n, k}, 11, DType::kBF16, -2.f, 2.f);
  for (int64_t r = 0; r < n; ++r)  // magnitudes over many decades, an outlier, a zero row
    for (int64_t i = 0; i < k; ++i)
      w.data_as<float>()[r * k + i] =
          round_bf16(w.data_as<float>()[r * k + i] * std::ldexp(1.f, static_cast<int>(r % 9) - 4));
  w.data_as<float>()[5 * k + 17] = 900.f;
  for (int64_t i = 0; i < k; ++i) w.data_as<float>()[7 * k + i] = 0.f;
  Tensor c8 = Tensor::host(DType::kF8E4M3, {n, k}), cs = Tensor::host(DType::kF32, {n});
  ZI_ASSERT_OK(cpu_oracle().quantize_fp8_rows(w, c8, cs));
  Tensor cback = Tensor::host(DType::kF32, {n, k});
  ZI_ASSERT_OK(cpu_oracle().dequantize_fp8_rows(c8, cs, cback));
  for (DType act : {DType::kF32, DType::kBF16}) {
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

// A streamed DiT (some or all blocks in pinned host memory, or pageable over the host-memory
// limit, copied in on the copy stream) gives the resident DiT's output bit for bit: resident
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
        for (const WeightPlacement& p : {all, alt, pageable}) {
          auto ws2 = folder->open_weights("transformer");
          ASSERT_TRUE(ws2.ok());
          auto streamed = ZImageDiT::load(tc, *ws2, *g, p);
          ASSERT_TRUE(streamed.ok()) << streamed.status().to_string();
          const uint64_t h2d0 = g->streamed_bytes();
          const auto got = run(**streamed);
          // At least one full pass was copied; at most two and the next pass's prefetch.
          const uint64_t moved = g->streamed_bytes() - h2d0;
          const uint64_t pass = (*streamed)->streamed_bytes_per_forward();
          EXPECT_GE(moved, pass);
          EXPECT_LE(moved, 2 * pass + (*streamed)->streaming_slot_bytes());
          for (size_t k = 0; k < ref.size(); ++k) {
            const double d = max_diff(got[k], ref[k]);
            std::printf("  %s %s%s streamed DiT vs resident max|diff| %.3g\n", name,
                        dtype_name(act), fp8 ? " fp8-weights" : "", d);
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
        auto a = (*te_res)->encode(ids);
        auto b = (*te_str)->encode(ids);
        auto c = (*te_pg)->encode(ids);
        ASSERT_TRUE(a.ok() && b.ok() && c.ok());
        for (size_t i = 0; i < a->size(); ++i) {
          EXPECT_EQ(max_diff(host_of(*g, (*a)[i]), host_of(*g, (*b)[i])), 0.0);
          EXPECT_EQ(max_diff(host_of(*g, (*a)[i]), host_of(*g, (*c)[i])), 0.0) << "pageable";
        }
      }
    }
  }
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

// CPU layout and memory ops: embedding gather (ids checked), patchify / unpatchify against the
// index formula of spec §4.4 / §4.6 and as a round trip, copy_2d (bounds, overlap), fill, alloc,
// and upload / download / convert through bf16, f16 and both fp8 formats.
#include <thread>

#include "backend/cpu/cpu_gemm.h"
#include "core/thread_pool.h"
#include "test_cpu_util.h"

namespace zimage::test {
namespace {

TEST(CpuOps, EmbeddingGatherAndIdChecks) {
  Tensor table = rand_f32({37, 33}, 1500);
  Tensor ids = Tensor::host(DType::kI32, {5});
  const int32_t idv[5] = {0, 36, 5, 5, 17};
  std::memcpy(ids.data(), idv, sizeof(idv));
  Tensor out = f32({5, 33});
  ASSERT_TRUE(cpu().embedding(table, ids, out).ok());
  std::vector<double> ref;
  for (int32_t id : idv)
    for (int64_t j = 0; j < 33; ++j) ref.push_back(at(table, id * 33 + j));
  expect_close("embedding 5 of [37,33]", out, ref, 0.0);
  ids.data_as<int32_t>()[3] = 37;
  expect_invalid(cpu().embedding(table, ids, out), "ids[3] = 37 is outside the 37 rows");
  ids.data_as<int32_t>()[3] = -1;
  expect_invalid(cpu().embedding(table, ids, out), "ids[3] = -1");
  Tensor ids64 = Tensor::host(DType::kI64, {5});
  expect_invalid(cpu().embedding(table, ids64, out), "rank-1 i32");
}

TEST(CpuOps, PatchifyIndexFormulaAndRoundTrip) {
  struct Case {
    int64_t b, c, h, w;
    int p;
  };
  for (const Case& cs :
       {Case{1, 16, 4, 6, 2}, Case{2, 3, 6, 10, 2}, Case{1, 5, 3, 3, 1}, Case{2, 2, 9, 6, 3}}) {
    const int64_t ht = cs.h / cs.p, wt = cs.w / cs.p, feat = cs.p * cs.p * cs.c;
    Tensor lat = rand_f32({cs.b, cs.c, cs.h, cs.w}, 1600 + static_cast<uint32_t>(cs.c));
    Tensor tok = f32({cs.b, ht * wt, feat});
    ASSERT_TRUE(cpu().patchify(lat, cs.p, tok).ok());
    // token n = r*Wt + s, feature (ph*p + pw)*C + c = X[c, r*p + ph, s*p + pw]
    std::vector<double> ref(static_cast<size_t>(tok.numel()));
    for (int64_t b = 0; b < cs.b; ++b)
      for (int64_t r = 0; r < ht; ++r)
        for (int64_t s = 0; s < wt; ++s)
          for (int64_t ph = 0; ph < cs.p; ++ph)
            for (int64_t pw = 0; pw < cs.p; ++pw)
              for (int64_t c = 0; c < cs.c; ++c)
                ref[static_cast<size_t>((b * ht * wt + r * wt + s) * feat +
                                        (ph * cs.p + pw) * cs.c + c)] =
                    at(lat, ((b * cs.c + c) * cs.h + r * cs.p + ph) * cs.w + s * cs.p + pw);
    const std::string tag = "patchify " + shape_string(lat.shape()) + " p" + std::to_string(cs.p);
    expect_close(tag, tok, ref, 0.0);
    // Unpatchify from a longer sequence (extra padded rows are ignored), scaled by alpha.
    Tensor longer = rand_f32({cs.b, ht * wt + 3, feat}, 1700);
    for (int64_t b = 0; b < cs.b; ++b) {
      std::memcpy(longer.data_as<float>() + b * (ht * wt + 3) * feat,
                  tok.data_as<float>() + b * ht * wt * feat, ht * wt * feat * sizeof(float));
    }
    Tensor back = f32(lat.shape());
    ASSERT_TRUE(cpu().unpatchify(longer, cs.p, -1.0f, back).ok());
    std::vector<double> neg(static_cast<size_t>(lat.numel()));
    for (size_t i = 0; i < neg.size(); ++i) neg[i] = -at(lat, static_cast<int64_t>(i));
    expect_close("unpatchify(patchify) alpha -1 " + shape_string(lat.shape()), back, neg, 0.0);
  }
  Tensor lat = rand_f32({1, 4, 5, 6}, 1);
  expect_invalid(cpu().patchify(lat, 2, lval(f32({1, 6, 16}))), "must be >= 1 and divide H and W");
  Tensor lat2 = rand_f32({1, 4, 4, 6}, 2);
  expect_invalid(cpu().patchify(lat2, 2, lval(f32({1, 5, 16}))), "must be [1, 6, 16]");
  expect_invalid(cpu().unpatchify(f32({1, 5, 16}), 2, 1.0f, lat2), "must be [1, >= 6, 16]");
}

TEST(CpuOps, Copy2dBlocksBoundsAndOverlap) {
  // Concatenate two [4, 3] blocks into columns of a [4, 8] tensor, at column offsets 0 and 5.
  Tensor a = rand_f32({4, 3}, 1800), b = rand_f32({4, 3}, 1801);
  Tensor dst = f32({4, 8});
  ASSERT_TRUE(cpu().fill(dst, 7.5f).ok());
  ASSERT_TRUE(cpu().copy_2d(a, 0, 3, dst, 0, 8, 4, 3).ok());
  ASSERT_TRUE(cpu().copy_2d(b, 0, 3, dst, 5, 8, 4, 3).ok());
  std::vector<double> ref(32, 7.5);
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t c = 0; c < 3; ++c) {
      ref[static_cast<size_t>(r * 8 + c)] = at(a, r * 3 + c);
      ref[static_cast<size_t>(r * 8 + 5 + c)] = at(b, r * 3 + c);
    }
  expect_close("copy_2d concat + fill", dst, ref, 0.0);
  // Overlapping source and destination in one tensor: shift columns 0..3 right by one.
  Tensor t = rand_f32({3, 5}, 1802);
  Tensor orig = copy_of(t);
  ASSERT_TRUE(cpu().copy_2d(t, 0, 5, t, 1, 5, 3, 4).ok());
  std::vector<double> sref;
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t c = 0; c < 5; ++c)
      sref.push_back(c == 0 ? at(orig, r * 5) : at(orig, r * 5 + c - 1));
  expect_close("copy_2d overlapping shift", t, sref, 0.0);
  expect_invalid(cpu().copy_2d(a, 1, 3, dst, 0, 8, 4, 3), "is outside src f32[4, 3]");
  expect_invalid(cpu().copy_2d(a, 0, 3, dst, 6, 8, 4, 3), "is outside dst f32[4, 8]");
  expect_invalid(cpu().copy_2d(a, -1, 3, dst, 0, 8, 1, 1), "is outside src");
  Tensor hb = Tensor::host(DType::kBF16, {4, 8});
  expect_invalid(cpu().copy_2d(a, 0, 3, hb, 0, 8, 4, 3), "dtypes differ");
}

TEST(CpuOps, UploadDownloadConvertDtypes) {
  // Values exactly representable in every format (fp8 e4m3 has 3 mantissa bits, max 448).
  Tensor exact = f32({2, 8});
  const float vals[16] = {0.0f,    1.0f,  -1.5f, 0.25f,  3.0f, -448.0f, 0.015625f, 2.5f,
                          -0.375f, 96.0f, 7.0f,  -12.0f, 0.5f, 1.75f,   -3.5f,     224.0f};
  std::memcpy(exact.data(), vals, sizeof(vals));
  for (DType dt : {DType::kBF16, DType::kF16, DType::kF8E4M3, DType::kF8E5M2}) {
    Tensor host = Tensor::host(dt, {2, 8});
    ASSERT_TRUE(convert_from_f32(dt, vals, host.data(), 16));
    auto up = cpu().upload(host, DType::kF32);
    ASSERT_TRUE(up.ok()) << up.status().to_string();
    std::vector<double> ref(vals, vals + 16);
    expect_close(std::string("upload ") + dtype_name(dt) + " -> f32 (exact values)", *up, ref, 0.0);
  }
  // Random values: upload f32 -> bf16 rounds like core/dtype.h; download returns the rounding.
  Tensor x = rand_f32({3, 17}, 1900, -5.0f, 5.0f);
  auto xb = cpu().upload(x, DType::kBF16);
  ASSERT_TRUE(xb.ok());
  EXPECT_EQ(xb->dtype(), DType::kBF16);
  Tensor back = f32({3, 17});
  ASSERT_TRUE(cpu().download(*xb, back).ok());
  std::vector<double> rounded, f16r, e4r;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const float v = x.data_as<float>()[i];
    rounded.push_back(round_bf16(v));
    f16r.push_back(f16_to_f32(f32_to_f16(v)));
    e4r.push_back(f8e4m3_to_f32(f32_to_f8e4m3(v)));
  }
  expect_close("upload f32->bf16, download bf16->f32", back, rounded, 0.0);
  // convert f32 -> f16 -> f32 and bf16 -> f16 (via f32, double rounding as torch does).
  auto h16 = cpu().alloc(DType::kF16, {3, 17});
  ASSERT_TRUE(h16.ok());
  ASSERT_TRUE(cpu().convert(x, *h16).ok());
  Tensor back16 = f32({3, 17});
  ASSERT_TRUE(cpu().convert(*h16, back16).ok());
  expect_close("convert f32->f16->f32", back16, f16r, 0.0);
  // download into an fp8 host tensor rounds like f32_to_f8e4m3.
  Tensor h8 = Tensor::host(DType::kF8E4M3, {3, 17});
  ASSERT_TRUE(cpu().download(x, h8).ok());
  auto up8 = cpu().upload(h8, DType::kF32);
  ASSERT_TRUE(up8.ok());
  expect_close("download f32->fp8 e4m3, upload ->f32", *up8, e4r, 0.0);
  // errors
  expect_invalid(cpu().download(x, lval(f32({17, 3}))), "shapes differ");
  expect_invalid(cpu().convert(x, lval(f32({50}))), "element counts differ");
  Tensor bf16_over_x(x.storage(), 0, DType::kBF16, {3, 17});  // in place across dtypes
  expect_invalid(cpu().convert(x, bf16_over_x), "not allowed");
  Tensor ints = Tensor::host(DType::kI32, {4});
  expect_invalid(cpu().upload(ints, DType::kF32).status(), "only float dtypes convert");
  auto same = cpu().upload(ints, DType::kI32);  // same-dtype copies are allowed for any dtype
  EXPECT_TRUE(same.ok());
}

TEST(CpuOps, AllocFillAndName) {
  auto t = cpu().alloc(DType::kBF16, {3, 5});
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(cpu().fill(*t, 1.5f).ok());
  Tensor back = f32({3, 5});
  ASSERT_TRUE(cpu().download(*t, back).ok());
  expect_close("fill bf16 1.5", back, std::vector<double>(15, 1.5), 0.0);
  EXPECT_FALSE(cpu().alloc(DType::kF32, {-1, 3}).ok());
  EXPECT_EQ(cpu().act_dtype(), DType::kF32);
  EXPECT_EQ(cpu().device(), Device::kCPU);
  EXPECT_NE(cpu().name().find("3 threads"), std::string::npos) << cpu().name();
  EXPECT_TRUE(cpu().synchronize().ok());
}

TEST(CpuOps, EachBackendAppliesItsOwnBlasThreadCount) {
  // OpenBLAS's thread count is process-global; a second (1-thread) backend must not leave the
  // 3-thread one running its GEMMs single-threaded.
  std::unique_ptr<Backend> one = make_cpu_backend(1);
  Tensor x = rand_f32({8, 8}, 1), w = rand_f32({8, 8}, 2), y = f32({8, 8});
  ASSERT_TRUE(one->matmul(x, w, Tensor(), y).ok());
  EXPECT_EQ(cpu::blas_threads(), 1);
  ASSERT_TRUE(cpu().matmul(x, w, Tensor(), y).ok());
  EXPECT_EQ(cpu::blas_threads(), 3);
}

TEST(CpuOps, ThreadPoolCoversEveryIndexOnceAndNests) {
  ThreadPool pool(4);
  EXPECT_EQ(pool.size(), 4);
  for (int64_t n : {0, 1, 7, 1000, 100003}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    pool.parallel_for(n, 3, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
      // A nested call runs inline instead of deadlocking.
      pool.parallel_for(4, 1, [&](int64_t, int64_t) {});
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << i;
  }
  // Two threads sharing the pool: one gets it, the other runs inline; both complete.
  std::atomic<int64_t> total{0};
  auto work = [&] {
    for (int rep = 0; rep < 200; ++rep) {
      pool.parallel_for(64, 1, [&](int64_t b, int64_t e) { total.fetch_add(e - b); });
    }
  };
  std::thread t1(work), t2(work);
  t1.join();
  t2.join();
  EXPECT_EQ(total.load(), 2 * 200 * 64);
}

}  // namespace
}  // namespace zimage::test

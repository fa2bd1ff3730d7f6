// The memory planner's weight placements on the CPU oracle (golden tiny models):
//  * a DiT / text encoder whose blocks stream in through the slots gives bit for bit the output
//    of the resident model (the same ops on the same bytes; only where the weights live differs),
//    for every pattern of streamed blocks, from host copies or read from the weight files
//    themselves (WeightPlacement::stream_from_files: the fused q|k|v and w1|w3 rows straight from
//    their three and two file tensors);
//  * FP8 weights with one scale per output channel: the quantiser's contract (scale = row max /
//    448, round-trip error within e4m3's half step), and the DiT / text encoder with FP8 weights
//    stay close to the full-precision ones (max error reported).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "io/weights/weights.h"
#include "model/common/linear.h"
#include "parity/golden_models_util.h"

using namespace zimage;
using namespace zimage::golden;

namespace {

double max_abs(const Tensor& a, const Tensor& b) {
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    m = std::max(m, std::fabs(static_cast<double>(a.data_as<float>()[i]) - b.data_as<float>()[i]));
  return m;
}

double cosine(const Tensor& a, const Tensor& b) {
  double ab = 0, aa = 0, bb = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.data_as<float>()[i], y = b.data_as<float>()[i];
    ab += x * y, aa += x * x, bb += y * y;
  }
  return ab / std::sqrt(aa * bb);
}

std::unique_ptr<ZImageDiT> dit_with(const Case& c, const WeightPlacement& p) {
  auto ws = WeightStore::open(c.dir + "/model/transformer");
  EXPECT_TRUE(ws.ok()) << ws.status().to_string();
  if (!ws.ok()) return nullptr;
  auto dit = ZImageDiT::load(c.dit, *ws, cpu(), p);
  EXPECT_TRUE(dit.ok()) << dit.status().to_string();
  return dit.ok() ? std::move(dit).value() : nullptr;
}

std::unique_ptr<Qwen3Encoder> te_with(const Case& c, const WeightPlacement& p) {
  auto ws = WeightStore::open(c.dir + "/model/text_encoder");
  EXPECT_TRUE(ws.ok()) << ws.status().to_string();
  if (!ws.ok()) return nullptr;
  auto te = Qwen3Encoder::load(c.te, *ws, cpu(), p);
  EXPECT_TRUE(te.ok()) << te.status().to_string();
  return te.ok() ? std::move(te).value() : nullptr;
}

// Two DiT forwards (steps 0 and 1 of the case) as host f32.
std::vector<Tensor> dit_outputs(const Case& c, ZImageDiT& dit) {
  std::vector<Tensor> outs;
  const Tensor lat = npy(c.dir + "/init_noise.npy");
  std::vector<Tensor> caps;
  for (size_t i = 0; i < c.ids.size(); ++i)
    caps.push_back(to_device(npy(c.dir + "/prompt_embeds_" + std::to_string(i) + ".npy")));
  for (int step = 0; step < 2; ++step) {
    Tensor out;
    const std::vector<float> t(caps.size(), t_model_at(c.steps, step));
    const Status st = dit.forward(to_device(lat), t, caps, out);
    EXPECT_TRUE(st.ok()) << st.to_string();
    if (!st.ok()) return {};
    outs.push_back(to_host(out));
  }
  return outs;
}

}  // namespace

TEST(WeightStreaming, StreamedDitEqualsResidentBitForBit) {
  const Case c = load_case("v_turbo");
  auto resident = dit_with(c, {});
  ASSERT_NE(resident, nullptr);
  const int n = resident->num_blocks();
  ASSERT_GE(n, 3);
  const std::vector<Tensor> ref = dit_outputs(c, *resident);
  ASSERT_EQ(ref.size(), 2u);
  // All streamed, every other block, only the last; one and two slots.
  std::vector<std::vector<bool>> patterns = {std::vector<bool>(n, true), {}, {}};
  for (int i = 0; i < n; ++i) patterns[1].push_back(i % 2 == 1);
  patterns[2].assign(n, false);
  patterns[2][n - 1] = true;
  for (int slots : {1, 2}) {
    for (const auto& pat : patterns) {
      WeightPlacement p;
      p.streamed = pat;
      p.slots = slots;
      auto dit = dit_with(c, p);
      ASSERT_NE(dit, nullptr);
      EXPECT_GT(dit->streamed_bytes_per_forward(), 0u);
      const std::vector<Tensor> got = dit_outputs(c, *dit);  // two passes: the slots wrap around
      ASSERT_EQ(got.size(), 2u);
      for (int k = 0; k < 2; ++k) EXPECT_EQ(max_abs(got[k], ref[k]), 0.0) << "slots " << slots;
    }
  }
}

// Every text-encoder layer streamed, from host copies or from the files (all of them then read
// the files: bf16 files, widened to f32 by the CPU as they stream), encodes bit for bit as the
// resident model does, twice (the slots wrap around).
TEST(WeightStreaming, StreamedTextEncoderEqualsResidentBitForBit) {
  const Case c = load_case("v_turbo");
  auto resident = te_with(c, {});
  ASSERT_NE(resident, nullptr);
  auto ref = resident->encode(c.ids);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  const int n = resident->layers_run();
  for (bool from_files : {false, true}) {
    WeightPlacement p;
    p.streamed.assign(n, true);
    p.first_slot = 2;
    p.stream_from_files = from_files;
    auto streamed = te_with(c, p);
    ASSERT_NE(streamed, nullptr);
    EXPECT_EQ(streamed->streamed_units(), n);
    EXPECT_EQ(streamed->streamed_units_from_files(), from_files ? n : 0);
    for (int pass = 0; pass < 2; ++pass) {
      auto got = streamed->encode(c.ids);
      ASSERT_TRUE(got.ok()) << got.status().to_string();
      ASSERT_EQ(got->size(), ref->size());
      for (size_t i = 0; i < got->size(); ++i)
        EXPECT_EQ(max_abs(to_host((*got)[i]), to_host((*ref)[i])), 0.0) << from_files;
    }
  }
}

TEST(WeightStreaming, DitStreamedFromTheFilesEqualsResidentBitForBit) {
  const Case c = load_case("v_turbo");
  auto resident = dit_with(c, {});
  ASSERT_NE(resident, nullptr);
  const int n = resident->num_blocks();
  const std::vector<Tensor> ref = dit_outputs(c, *resident);
  ASSERT_EQ(ref.size(), 2u);
  std::vector<std::vector<bool>> patterns = {std::vector<bool>(n, true), {}};
  for (int i = 0; i < n; ++i) patterns[1].push_back(i % 2 == 0);
  for (int slots : {1, 2}) {
    for (const auto& pat : patterns) {
      WeightPlacement p;
      p.streamed = pat;
      p.slots = slots;
      p.stream_from_files = true;
      p.lock_files = slots == 2;  // nothing to lock on the CPU: the same path
      auto dit = dit_with(c, p);
      ASSERT_NE(dit, nullptr);
      // The files are bf16, the CPU computes in f32: every tensor streams from its file view,
      // widened as it is copied (Backend::can_stream).
      const int streamed = static_cast<int>(std::count(pat.begin(), pat.end(), true));
      EXPECT_EQ(dit->streamed_units(), streamed);
      EXPECT_EQ(dit->streamed_units_from_files(), streamed);
      const std::vector<Tensor> got = dit_outputs(c, *dit);
      ASSERT_EQ(got.size(), 2u);
      for (int k = 0; k < 2; ++k) EXPECT_EQ(max_abs(got[k], ref[k]), 0.0) << "slots " << slots;
    }
  }
}

// FP8 weight rows are made on the device, so those linears cannot stream from the files: they
// are host copies (the rest of each block still reads the files), and the output is the FP8
// model's.
TEST(WeightStreaming, Fp8RowsStreamFromCopiesUnderStreamFromFiles) {
  const Case c = load_case("v_turbo");
  WeightPlacement fp8;
  fp8.fp8_weights = true;
  auto resident = dit_with(c, fp8);
  ASSERT_NE(resident, nullptr);
  const std::vector<Tensor> ref = dit_outputs(c, *resident);
  ASSERT_EQ(ref.size(), 2u);
  WeightPlacement p = fp8;
  p.streamed.assign(resident->num_blocks(), true);
  p.stream_from_files = true;
  auto dit = dit_with(c, p);
  ASSERT_NE(dit, nullptr);
  EXPECT_EQ(dit->streamed_units(), resident->num_blocks());
  EXPECT_EQ(dit->streamed_units_from_files(), 0);  // every block holds copied FP8 rows
  const std::vector<Tensor> got = dit_outputs(c, *dit);
  ASSERT_EQ(got.size(), 2u);
  for (int k = 0; k < 2; ++k) EXPECT_EQ(max_abs(got[k], ref[k]), 0.0);
}

TEST(WeightStreaming, BadPlacementIsAnError) {
  const Case c = load_case("v_turbo");
  WeightPlacement p;
  p.streamed = {true};  // wrong length
  auto ws = WeightStore::open(c.dir + "/model/transformer");
  ASSERT_TRUE(ws.ok());
  auto dit = ZImageDiT::load(c.dit, *ws, cpu(), p);
  ASSERT_FALSE(dit.ok());
  EXPECT_NE(dit.status().message().find("weight placement"), std::string::npos);
}

TEST(Fp8Weights, RowQuantiserContract) {
  // Rows with different magnitudes, an outlier row, an all-zero row.
  const int64_t n = 6, k = 257;
  Tensor w = Tensor::host(DType::kF32, {n, k});
  std::mt19937 rng(7);
  std::normal_distribution<float> g(0.f, 1.f);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < k; ++i)
      w.data_as<float>()[r * k + i] =
          r == 5 ? 0.f : g(rng) * std::pow(10.f, static_cast<float>(r - 2));
  w.data_as<float>()[3 * k + 11] = 3000.f;  // outlier
  Tensor w8 = Tensor::host(DType::kF8E4M3, {n, k}), s = Tensor::host(DType::kF32, {n});
  Tensor back = Tensor::host(DType::kF32, {n, k});
  ASSERT_TRUE(cpu().quantize_fp8_rows(w, w8, s).ok());
  ASSERT_TRUE(cpu().dequantize_fp8_rows(w8, s, back).ok());
  for (int64_t r = 0; r < n; ++r) {
    float amax = 0;
    for (int64_t i = 0; i < k; ++i) amax = std::max(amax, std::fabs(w.data_as<float>()[r * k + i]));
    const float want = amax > 0 ? amax / 448.f : 1.f;
    EXPECT_EQ(s.data_as<float>()[r], want) << "row " << r;
    for (int64_t i = 0; i < k; ++i) {
      const float x = w.data_as<float>()[r * k + i], y = back.data_as<float>()[r * k + i];
      // e4m3: 3 mantissa bits (relative half step 1/16) down to 2^-6 of the scale, subnormal
      // steps of 2^-9 below that.
      const float tol = std::max(std::fabs(x) / 16.f, want * std::ldexp(1.f, -9));
      EXPECT_LE(std::fabs(x - y), tol * 1.0001f) << r << "," << i;
    }
  }
  // The largest element of each non-zero row maps to ±448 exactly.
  EXPECT_EQ(back.data_as<float>()[3 * k + 11], 3000.f);
  // Shape errors are errors.
  Tensor bad = Tensor::host(DType::kF32, {n - 1});
  EXPECT_FALSE(cpu().quantize_fp8_rows(w, w8, bad).ok());
  // A NaN is left out of its row's max and coded as -448, as the GPU kernels code it
  // (fminf(fmaxf(NaN, -448), 448) = -448; CudaFp8Rows compares the bytes).
  Tensor nan_row = Tensor::host(DType::kF32, {1, 4});
  const float vals[4] = {std::numeric_limits<float>::quiet_NaN(), 1.f, -2.f, 0.5f};
  std::copy(vals, vals + 4, nan_row.data_as<float>());
  Tensor q = Tensor::host(DType::kF8E4M3, {1, 4}), qs = Tensor::host(DType::kF32, {1});
  Tensor qb = Tensor::host(DType::kF32, {1, 4});
  ASSERT_TRUE(cpu().quantize_fp8_rows(nan_row, q, qs).ok());
  EXPECT_EQ(qs.data_as<float>()[0], 2.f / 448.f);
  ASSERT_TRUE(cpu().dequantize_fp8_rows(q, qs, qb).ok());
  EXPECT_EQ(qb.data_as<float>()[0], -2.f);  // -448 codes, times the scale
  EXPECT_EQ(qb.data_as<float>()[2], -2.f);
}

TEST(Fp8Weights, DitAndTextEncoderStayClose) {
  const Case c = load_case("v_turbo");
  auto ref_dit = dit_with(c, {});
  WeightPlacement f8;
  f8.fp8_weights = true;
  auto f8_dit = dit_with(c, f8);
  ASSERT_NE(ref_dit, nullptr);
  ASSERT_NE(f8_dit, nullptr);
  const auto a = dit_outputs(c, *ref_dit), b = dit_outputs(c, *f8_dit);
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  const double cos = cosine(a[0], b[0]);
  report("v_turbo dit fp8 weights vs f32 (cosine " + std::to_string(cos) + ")",
         max_abs(a[0], b[0]));
  EXPECT_GT(cos, 0.995);
  EXPECT_GT(max_abs(a[0], b[0]), 0.0);  // it did quantise
  // FP8 weights and streaming together: streamed equals resident.
  WeightPlacement both = f8;
  both.streamed.assign(f8_dit->num_blocks(), true);
  auto both_dit = dit_with(c, both);
  ASSERT_NE(both_dit, nullptr);
  const auto d = dit_outputs(c, *both_dit);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(max_abs(d[0], b[0]), 0.0);

  auto ref_te = te_with(c, {}), f8_te = te_with(c, f8);
  ASSERT_NE(ref_te, nullptr);
  ASSERT_NE(f8_te, nullptr);
  auto e0 = ref_te->encode(c.ids), e1 = f8_te->encode(c.ids);
  ASSERT_TRUE(e0.ok() && e1.ok());
  const double tcos = cosine(to_host((*e0)[0]), to_host((*e1)[0]));
  report("v_turbo text encoder fp8 weights vs f32 (cosine " + std::to_string(tcos) + ")",
         max_abs(to_host((*e0)[0]), to_host((*e1)[0])));
  EXPECT_GT(tcos, 0.995);
}

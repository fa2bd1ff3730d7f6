// GGUF quantisers (io/gguf/gguf_quantize.h): Q8_0 and Q4_0 byte for byte against the gguf Python
// package (tools/make_gguf_quant_cases.py), every type round-tripped through the dequantisation
// oracle (io/gguf/gguf_quants.h) within a stated bound of its step size.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "io/gguf/gguf_quantize.h"

namespace zimage {
namespace {

std::vector<uint8_t> read_bytes(const std::string& name) {
  std::ifstream f(std::string(ZIMAGE_TEST_DATA_DIR) + "/gguf_quant/" + name, std::ios::binary);
  EXPECT_TRUE(f.good()) << name;
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

std::vector<float> input() {
  const std::vector<uint8_t> b = read_bytes("input.f32");
  std::vector<float> x(b.size() / 4);
  std::memcpy(x.data(), b.data(), x.size() * 4);
  return x;
}

std::vector<uint8_t> quantize(GgmlType t, const std::vector<float>& x, int64_t row) {
  uint64_t rb = 0;
  EXPECT_TRUE(ggml_row_bytes(t, row, &rb));
  const int64_t rows = static_cast<int64_t>(x.size()) / row;
  std::vector<uint8_t> q(static_cast<size_t>(rb * rows));
  for (int64_t r = 0; r < rows; ++r)
    EXPECT_TRUE(quantize_row(t, x.data() + r * row, q.data() + r * rb, row));
  return q;
}

TEST(GgufQuantize, Q8_0AndQ4_0EqualTheGgufPackage) {
  const std::vector<float> x = input();
  ASSERT_EQ(x.size(), 4096u);
  for (const auto& [t, file] :
       {std::pair{GgmlType::kQ8_0, "q8_0.bin"}, {GgmlType::kQ4_0, "q4_0.bin"}}) {
    const std::vector<uint8_t> want = read_bytes(file);
    const std::vector<uint8_t> got = quantize(t, x, 1024);
    ASSERT_EQ(got.size(), want.size()) << file;
    size_t diff = 0;
    for (size_t i = 0; i < got.size(); ++i) diff += got[i] != want[i];
    std::printf("  %s: %zu bytes, %zu differ from the gguf package\n", file, got.size(), diff);
    EXPECT_EQ(diff, 0u) << file;
  }
}

// Round trip: dequantise(quantise(x)) per block stays within `step_bound` x (the block's range,
// zero included) / levels, and the whole tensor's relative RMS error is below `rms`. Bounds stated
// per type: the simple K-quant method of gguf_quantize.h loses up to about one step to its 6/8-bit
// scales.
TEST(GgufQuantize, RoundTripErrorWithinStatedBounds) {
  struct Want {
    GgmlType t;
    double levels;  // quantisation levels per block (step = block range / levels)
    double step_bound;
    double rms;
  };
  const Want wants[] = {{GgmlType::kQ8_0, 127, 0.51, 0.01},  {GgmlType::kQ4_0, 8, 1.01, 0.15},
                        {GgmlType::kQ4_K, 15, 1.6, 0.12},    {GgmlType::kQ5_K, 31, 1.6, 0.06},
                        {GgmlType::kQ6_K, 62, 1.6, 0.03},    {GgmlType::kBF16, 128, 0.51, 0.004},
                        {GgmlType::kF16, 1024, 0.51, 0.001}, {GgmlType::kF32, 1, 0.0, 0.0}};
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  const int64_t row = 1024, rows = 16;
  std::vector<float> x(static_cast<size_t>(row * rows));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < row; ++i)
      x[r * row + i] = nd(rng) * std::pow(10.0f, static_cast<float>(r % 5) - 2.0f);
  for (const Want& w : wants) {
    const std::vector<uint8_t> q = quantize(w.t, x, row);
    std::vector<float> y(x.size());
    ASSERT_TRUE(dequantize_rows(w.t, q.data(), y.data(), rows, row));
    const int64_t bs = ggml_type_info(w.t)->block_size > 1 ? ggml_type_info(w.t)->block_size : 32;
    double worst = 0, se = 0, sx = 0;
    for (size_t b0 = 0; b0 < x.size(); b0 += bs) {
      float lo = 0, hi = 0;
      for (int64_t i = 0; i < bs; ++i) lo = std::min(lo, x[b0 + i]), hi = std::max(hi, x[b0 + i]);
      const double step = (hi - lo) / w.levels;
      for (int64_t i = 0; i < bs; ++i) {
        const double e = std::fabs(double{y[b0 + i]} - x[b0 + i]);
        se += e * e;
        sx += double{x[b0 + i]} * x[b0 + i];
        if (step > 0) worst = std::max(worst, e / step);
      }
    }
    const double rel = std::sqrt(se / sx);
    std::printf("  %-5s worst error %.3f steps, relative RMS %.4f\n", ggml_type_name(w.t).c_str(),
                worst, rel);
    EXPECT_LE(worst, w.step_bound) << ggml_type_name(w.t);
    EXPECT_LE(rel, w.rms) << ggml_type_name(w.t);
    if (w.t != GgmlType::kF32) {
      EXPECT_GT(rel, 0.0) << ggml_type_name(w.t);  // really quantised
    }
  }
}

TEST(GgufQuantize, RejectsBadRowsAndTypes) {
  std::vector<float> x(64, 1.0f);
  std::vector<uint8_t> q(1024);
  EXPECT_FALSE(quantize_row(GgmlType::kQ4_K, x.data(), q.data(), 64));    // not a multiple of 256
  EXPECT_FALSE(quantize_row(GgmlType::kQ8_0, x.data(), q.data(), 33));    // not a multiple of 32
  EXPECT_FALSE(quantize_row(GgmlType::kIQ2_XS, x.data(), q.data(), 64));  // no quantiser
  EXPECT_TRUE(quantize_row(GgmlType::kQ8_0, x.data(), q.data(), 64));
}

}  // namespace
}  // namespace zimage

// GGUF block dequantisation against the gguf Python package (llama.cpp's gguf-py): every tensor of
// build/<preset>/gguf/types/types.gguf (tools/make_gguf_cases.py: random blocks of every type with
// realistic scales, edge scales 0 / -0 / subnormal / 65504 / inf / nan, realistic weights
// quantised by the package, 1-D / 3-D / 4-D shapes) dequantised by zimage equals the package's
// numpy dequantisation of the same bytes bit for bit (NaN where it has NaN).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "common/npy.h"
#include "core/thread_pool.h"
#include "io/gguf/gguf.h"
#include "io/gguf/gguf_quants.h"

namespace zimage {
namespace {

std::string types_dir() {
  return std::string(ZIMAGE_GGUF_DIR) + "/types";
}

struct Diff {
  double max_abs = 0;     // over elements finite in both
  int64_t differing = 0;  // elements whose bits differ (NaN vs NaN counts as equal)
  int64_t nan = 0;
};

Diff compare(const float* got, const float* ref, int64_t n) {
  Diff d;
  for (int64_t i = 0; i < n; ++i) {
    const float a = got[i], b = ref[i];
    if (std::isnan(a) || std::isnan(b)) {
      if (!(std::isnan(a) && std::isnan(b))) ++d.differing;
      ++d.nan;
      continue;
    }
    uint32_t ua, ub;
    std::memcpy(&ua, &a, 4);
    std::memcpy(&ub, &b, 4);
    if (ua != ub) ++d.differing;
    if (std::isfinite(a) && std::isfinite(b))
      d.max_abs = std::max(d.max_abs, static_cast<double>(std::fabs(a - b)));
  }
  return d;
}

TEST(GgufQuants, TypeTableMatchesGgml) {
  // (block size, bytes per block) as ggml defines them.
  const std::map<GgmlType, std::pair<int64_t, int64_t>> expected = {
      {GgmlType::kF32, {1, 4}},      {GgmlType::kF16, {1, 2}},       {GgmlType::kBF16, {1, 2}},
      {GgmlType::kQ4_0, {32, 18}},   {GgmlType::kQ4_1, {32, 20}},    {GgmlType::kQ5_0, {32, 22}},
      {GgmlType::kQ5_1, {32, 24}},   {GgmlType::kQ8_0, {32, 34}},    {GgmlType::kQ2_K, {256, 84}},
      {GgmlType::kQ3_K, {256, 110}}, {GgmlType::kQ4_K, {256, 144}},  {GgmlType::kQ5_K, {256, 176}},
      {GgmlType::kQ6_K, {256, 210}}, {GgmlType::kIQ4_XS, {256, 136}}};
  for (const auto& [t, geo] : expected) {
    const GgmlTypeInfo* info = ggml_type_info(t);
    ASSERT_NE(info, nullptr) << ggml_type_name(t);
    EXPECT_EQ(info->block_size, geo.first) << info->name;
    EXPECT_EQ(info->type_size, geo.second) << info->name;
  }
  EXPECT_EQ(ggml_type_info(4u), nullptr);  // retired Q4_2
  EXPECT_EQ(ggml_type_info(99u), nullptr);
  EXPECT_EQ(ggml_type_name(99u), "type 99");
  uint64_t bytes = 0;
  EXPECT_TRUE(ggml_row_bytes(GgmlType::kQ4_K, 512, &bytes));
  EXPECT_EQ(bytes, 288u);
  EXPECT_FALSE(ggml_row_bytes(GgmlType::kQ4_K, 100, &bytes));  // not whole blocks
  EXPECT_FALSE(ggml_row_bytes(GgmlType::kQ8_0, int64_t{1} << 62, &bytes) &&
               bytes < (uint64_t{1} << 62));                               // no silent wrap
  EXPECT_FALSE(ggml_row_bytes(GgmlType::kF64, int64_t{1} << 62, &bytes));  // 2^65 bytes
  float out[32];
  const uint8_t zeros[36] = {};
  EXPECT_FALSE(dequantize_row(GgmlType::kIQ4_NL, zeros, out, 32));  // not dequantizable
  EXPECT_FALSE(dequantize_row(GgmlType::kQ8_0, zeros, out, 31));    // not whole blocks
}

// The package's numpy result for every tensor, compared bit for bit; one line per tensor.
TEST(GgufQuants, EveryTypeEqualsTheGgufPackage) {
  std::ifstream mf(types_dir() + "/manifest.json");
  ASSERT_TRUE(mf.good()) << "missing " << types_dir() << "/manifest.json";
  const nlohmann::json manifest = nlohmann::json::parse(mf);
  auto file = GgufFile::open(types_dir() + "/types.gguf");
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  ASSERT_EQ((*file)->tensors().size(), manifest.size());
  std::map<std::string, double> worst;  // per type
  ThreadPool pool(4);
  for (const auto& m : manifest) {
    const std::string name = m["name"].get<std::string>();
    const GgufTensorInfo* ti = (*file)->find_tensor(name);
    ASSERT_NE(ti, nullptr) << name;
    EXPECT_EQ(ggml_type_name(ti->type), m["type"].get<std::string>()) << name;
    EXPECT_EQ(ti->shape(), m["shape"].get<Shape>()) << name;
    auto got = (*file)->dequantize(name);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    auto ref = test::load_npy(types_dir() + "/" + name + ".npy");
    ASSERT_TRUE(ref.ok()) << ref.status().to_string();
    ASSERT_EQ(got->shape(), ref->shape()) << name;
    ASSERT_EQ(ref->dtype(), DType::kF32);
    const Diff d = compare(got->data_as<float>(), ref->data_as<float>(), got->numel());
    std::printf(
        "[ gguf ] %-12s %-16s %6lld values, max |diff| %g, %lld bitwise differences, %lld NaN\n",
        m["type"].get<std::string>().c_str(), name.c_str(), static_cast<long long>(got->numel()),
        d.max_abs, static_cast<long long>(d.differing), static_cast<long long>(d.nan));
    EXPECT_EQ(d.differing, 0) << name;
    worst[m["type"].get<std::string>()] = std::max(worst[m["type"].get<std::string>()], d.max_abs);
    // The thread-pool path gives the same bytes.
    auto par = (*file)->dequantize(name, &pool);
    ASSERT_TRUE(par.ok());
    EXPECT_EQ(compare(par->data_as<float>(), got->data_as<float>(), got->numel()).differing, 0);
  }
  for (const char* t : {"F32", "F16", "BF16", "Q8_0", "Q6_K", "Q5_K", "Q5_0", "Q5_1", "Q4_K",
                        "Q4_0", "Q4_1", "Q3_K", "Q2_K"}) {
    ASSERT_TRUE(worst.count(t)) << "no case of type " << t;
    ::testing::Test::RecordProperty(std::string("max_abs_diff_") + t, std::to_string(worst[t]));
  }
}

// A larger tensor through the thread pool: rows split across threads give the same floats as one
// thread (the split must not shift a row).
TEST(GgufQuants, ParallelRowsEqualSerial) {
  const int64_t rows = 300, cols = 512;
  for (GgmlType t : {GgmlType::kQ4_K, GgmlType::kQ8_0, GgmlType::kQ6_K}) {
    uint64_t row_bytes = 0;
    ASSERT_TRUE(ggml_row_bytes(t, cols, &row_bytes));
    std::vector<uint8_t> blocks(row_bytes * rows);
    uint32_t x = 12345;
    for (auto& b : blocks) {
      x = x * 1664525u + 1013904223u;
      b = static_cast<uint8_t>(x >> 24);
    }
    // Keep the scale fields finite: put a small f16 (0x1400 = 2^-10) in every 2-byte slot the
    // types use for d; other bytes stay random.
    const GgmlTypeInfo* info = ggml_type_info(t);
    for (int64_t b = 0; b < rows * cols / info->block_size; ++b) {
      uint8_t* blk = blocks.data() + b * info->type_size;
      const int64_t off = t == GgmlType::kQ6_K ? 208 : 0;
      blk[off] = 0x00;
      blk[off + 1] = 0x14;
      if (t == GgmlType::kQ4_K) {
        blk[2] = 0x00;
        blk[3] = 0x10;
      }
    }
    std::vector<float> serial(rows * cols), parallel(rows * cols);
    ThreadPool pool(3);
    ASSERT_TRUE(dequantize_rows(t, blocks.data(), serial.data(), rows, cols, nullptr));
    ASSERT_TRUE(dequantize_rows(t, blocks.data(), parallel.data(), rows, cols, &pool));
    EXPECT_EQ(compare(parallel.data(), serial.data(), rows * cols).differing, 0)
        << ggml_type_name(t);
    for (int64_t r = 0; r < rows; r += 37) {  // and each row equals its own single-row call
      std::vector<float> one(cols);
      ASSERT_TRUE(dequantize_row(t, blocks.data() + r * row_bytes, one.data(), cols));
      EXPECT_EQ(compare(one.data(), serial.data() + r * cols, cols).differing, 0);
    }
  }
}

}  // namespace
}  // namespace zimage

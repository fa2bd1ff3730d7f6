// GGUF dequantisation kernels (src/backend/cuda/kernels/gguf_dequant.cu) against the CPU oracle
// (io/gguf/gguf_quants.cpp) and the gguf Python package's cases: f32 output must equal the oracle bit
// for bit (same float32 operations in the same order, no fused multiply-add; NaN where the oracle
// has NaN), bf16 output must equal the oracle's value rounded by core/dtype.h's f32_to_bf16. Random
// blocks with realistic and edge scales, aligned and misaligned outputs; bad arguments are errors;
// the throughput of a full-size weight is printed.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/kernels/gguf_dequant.h"
#include "common/npy.h"
#include "core/dtype.h"
#include "cuda_test_util.h"
#include "io/gguf/gguf.h"
#include "io/gguf/gguf_quants.h"

namespace zimage {
namespace {

constexpr GgmlType kTypes[] = {GgmlType::kF32,  GgmlType::kF16,  GgmlType::kBF16, GgmlType::kQ8_0,
                               GgmlType::kQ6_K, GgmlType::kQ5_K, GgmlType::kQ5_0, GgmlType::kQ5_1,
                               GgmlType::kQ4_K, GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ3_K,
                               GgmlType::kQ2_K};

// Byte offsets of the f16 scale fields of each block type.
std::vector<int> scale_fields(GgmlType t) {
  switch (t) {
    case GgmlType::kQ4_0:
    case GgmlType::kQ5_0:
    case GgmlType::kQ8_0:
      return {0};
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_1:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
      return {0, 2};
    case GgmlType::kQ2_K:
      return {80, 82};
    case GgmlType::kQ3_K:
      return {108};
    case GgmlType::kQ6_K:
      return {208};
    default:
      return {};
  }
}

// Random block bytes; scale fields hold realistic f16 values, every 13th an edge value (0, -0,
// subnormal, 65504, inf, NaN). Plain types: random weights with a few specials.
std::vector<uint8_t> random_blocks(GgmlType t, int64_t rows, int64_t cols, uint32_t seed) {
  uint64_t row_bytes = 0;
  EXPECT_TRUE(ggml_row_bytes(t, cols, &row_bytes));
  std::vector<uint8_t> b(row_bytes * rows);
  std::mt19937 gen(seed);
  for (auto& x : b) x = static_cast<uint8_t>(gen());
  const GgmlTypeInfo* info = ggml_type_info(t);
  std::uniform_real_distribution<float> mag(2e-4f, 2e-2f);
  const float edges[] = {0.f, -0.f, 5.96e-8f, 65504.f, INFINITY, NAN, -0.0123f};
  if (info->block_size == 1) {  // plain: replace the random bits by weights
    const int64_t n = rows * cols;
    std::normal_distribution<float> w(0.f, 0.05f);
    for (int64_t i = 0; i < n; ++i) {
      float v = i % 97 == 5 ? edges[(i / 97) % 7] : w(gen);
      if (t == GgmlType::kF32) {
        std::memcpy(&b[4 * i], &v, 4);
      } else {
        const uint16_t h = t == GgmlType::kF16 ? f32_to_f16(v) : f32_to_bf16(v);
        b[2 * i] = static_cast<uint8_t>(h);
        b[2 * i + 1] = static_cast<uint8_t>(h >> 8);
      }
    }
    return b;
  }
  const int64_t blocks = rows * cols / info->block_size;
  int k = 0;
  for (int64_t i = 0; i < blocks; ++i) {
    for (int off : scale_fields(t)) {
      const float v = ++k % 13 == 0 ? edges[(k / 13) % 7] : (gen() % 2 ? 1.f : -1.f) * mag(gen);
      const uint16_t h = f32_to_f16(v);
      b[i * info->type_size + off] = static_cast<uint8_t>(h);
      b[i * info->type_size + off + 1] = static_cast<uint8_t>(h >> 8);
    }
  }
  return b;
}

struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(size_t bytes) { EXPECT_EQ(cudaMalloc(&p, bytes ? bytes : 1), cudaSuccess); }
  ~DeviceBuffer() {
    if (p) cudaFree(p);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

bool same_f32(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  uint32_t ua, ub;
  std::memcpy(&ua, &a, 4);
  std::memcpy(&ub, &b, 4);
  return ua == ub;
}

bool same_bf16(uint16_t a, uint16_t b) {
  const bool na = (a & 0x7fff) > 0x7f80, nb = (b & 0x7fff) > 0x7f80;
  return na || nb ? na && nb : a == b;
}

// Runs both launchers on `blocks` (rows x cols of type t) and compares with the CPU oracle.
// `offset` shifts the output pointer by that many elements (0: 16-byte aligned stores).
void check_against_oracle(GgmlType t, const std::vector<uint8_t>& blocks, int64_t rows,
                          int64_t cols, int offset, const std::string& what) {
  const int64_t n = rows * cols;
  std::vector<float> ref(n);
  ASSERT_TRUE(dequantize_rows(t, blocks.data(), ref.data(), rows, cols));
  DeviceBuffer src(blocks.size()), out32((n + offset) * 4), out16((n + offset) * 2);
  ASSERT_EQ(cudaMemcpy(src.p, blocks.data(), blocks.size(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemset(out32.p, 0xff, (n + offset) * 4), cudaSuccess);  // NaN: unwritten shows
  ASSERT_EQ(cudaMemset(out16.p, 0xff, (n + offset) * 2), cudaSuccess);
  float* o32 = static_cast<float*>(out32.p) + offset;
  uint16_t* o16 = static_cast<uint16_t*>(out16.p) + offset;
  ZI_ASSERT_OK(cuda::gguf_dequantize_f32(t, src.p, rows, cols, o32, nullptr));
  ZI_ASSERT_OK(cuda::gguf_dequantize_bf16(t, src.p, rows, cols, o16, nullptr));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> got32(n);
  std::vector<uint16_t> got16(n);
  ASSERT_EQ(cudaMemcpy(got32.data(), o32, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(got16.data(), o16, n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  int64_t diff32 = 0, diff16 = 0, nan = 0;
  double max_abs = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!same_f32(got32[i], ref[i])) ++diff32;
    if (!same_bf16(got16[i], f32_to_bf16(ref[i]))) ++diff16;
    if (std::isnan(ref[i])) ++nan;
    if (std::isfinite(ref[i]) && std::isfinite(got32[i]))
      max_abs = std::max(max_abs, static_cast<double>(std::fabs(got32[i] - ref[i])));
  }
  std::printf(
      "  %-26s %-5s %7lld values: f32 max |diff| %g, %lld bitwise differences; bf16 %lld "
      "differences (%lld NaN)\n",
      what.c_str(), ggml_type_name(t).c_str(), static_cast<long long>(n), max_abs,
      static_cast<long long>(diff32), static_cast<long long>(diff16), static_cast<long long>(nan));
  EXPECT_EQ(diff32, 0) << what << " " << ggml_type_name(t);
  EXPECT_EQ(diff16, 0) << what << " " << ggml_type_name(t);
}

TEST(CudaGguf, EveryTypeEqualsTheCpuOracleBitForBit) {
  ZI_REQUIRE_GPU();
  uint32_t seed = 1;
  for (GgmlType t : kTypes) {
    const int64_t bs = ggml_type_info(t)->block_size;
    const int64_t cols = bs == 1 ? 520 : 2 * std::max<int64_t>(bs, 256);
    check_against_oracle(t, random_blocks(t, 37, cols, seed++), 37, cols, 0, "random 37 rows");
    check_against_oracle(t, random_blocks(t, 5, cols, seed++), 5, cols, 1, "misaligned output");
  }
}

// The package's own cases (tools/make_gguf_cases.py) through the device: packed bytes from the
// file, f32 output against the package's numpy dequantisation.
TEST(CudaGguf, PackageCasesOnTheDevice) {
  ZI_REQUIRE_GPU();
  const std::string dir = std::string(ZIMAGE_GGUF_DIR) + "/types";
  auto file = GgufFile::open(dir + "/types.gguf");
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  int checked = 0;
  for (const GgufTensorInfo& ti : (*file)->tensors()) {
    auto p = (*file)->packed(ti.name);
    ASSERT_TRUE(p.ok());
    if (p->cols % 8 != 0) continue;  // plain 1-D tensor of 7: not a device case
    auto ref = test::load_npy(dir + "/" + ti.name + ".npy");
    ASSERT_TRUE(ref.ok()) << ref.status().to_string();
    DeviceBuffer src(p->bytes), out(ref->numel() * 4);
    ASSERT_EQ(cudaMemcpy(src.p, p->data, p->bytes, cudaMemcpyHostToDevice), cudaSuccess);
    ZI_ASSERT_OK(cuda::gguf_dequantize_f32(p->type, src.p, p->rows, p->cols,
                                           static_cast<float*>(out.p), nullptr));
    std::vector<float> got(ref->numel());
    ASSERT_EQ(cudaMemcpy(got.data(), out.p, got.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    int64_t diff = 0;
    for (int64_t i = 0; i < ref->numel(); ++i)
      if (!same_f32(got[i], ref->data_as<float>()[i])) ++diff;
    EXPECT_EQ(diff, 0) << ti.name;
    ++checked;
  }
  std::printf("  %d package cases equal on the device\n", checked);
  EXPECT_GE(checked, 30);
}

TEST(CudaGguf, BadArgumentsAreErrors) {
  ZI_REQUIRE_GPU();
  DeviceBuffer buf(1 << 16);
  Status s = cuda::gguf_dequantize_bf16(GgmlType::kQ4_K, buf.p, 2, 100, buf.p, nullptr);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("multiple of 256"), std::string::npos) << s.message();
  s = cuda::gguf_dequantize_f32(GgmlType::kIQ4_XS, buf.p, 1, 256, static_cast<float*>(buf.p),
                                nullptr);
  EXPECT_EQ(s.code(), ErrorCode::kUnsupported) << s.to_string();
  s = cuda::gguf_dequantize_f32(GgmlType::kF16, buf.p, 1, 12, static_cast<float*>(buf.p), nullptr);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument) << s.to_string();
  EXPECT_TRUE(cuda::gguf_dequantize_f32(GgmlType::kQ8_0, nullptr, 0, 64, nullptr, nullptr).ok());
}

// Full-size weights (the DiT's feed-forward 10240 x 3840 and its transpose): time per call and
// the bytes moved per second (packed in + bf16 out). Printed, not asserted.
TEST(CudaGguf, Throughput) {
  ZI_REQUIRE_GPU();
  for (GgmlType t : {GgmlType::kQ8_0, GgmlType::kQ6_K, GgmlType::kQ5_K, GgmlType::kQ4_K,
                     GgmlType::kQ4_0, GgmlType::kQ3_K, GgmlType::kQ2_K}) {
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{10240, 3840}, {3840, 10240}}) {
      const std::vector<uint8_t> blocks = random_blocks(t, rows, cols, 7);
      DeviceBuffer src(blocks.size()), out(rows * cols * 2);
      ASSERT_EQ(cudaMemcpy(src.p, blocks.data(), blocks.size(), cudaMemcpyHostToDevice),
                cudaSuccess);
      cudaEvent_t a, b;
      cudaEventCreate(&a);
      cudaEventCreate(&b);
      ZI_ASSERT_OK(cuda::gguf_dequantize_bf16(t, src.p, rows, cols, out.p, nullptr));  // warm up
      constexpr int kRuns = 20;
      cudaEventRecord(a);
      for (int r = 0; r < kRuns; ++r)
        ZI_ASSERT_OK(cuda::gguf_dequantize_bf16(t, src.p, rows, cols, out.p, nullptr));
      cudaEventRecord(b);
      ASSERT_EQ(cudaEventSynchronize(b), cudaSuccess);
      float ms = 0;
      cudaEventElapsedTime(&ms, a, b);
      ms /= kRuns;
      const double gbs = (static_cast<double>(blocks.size()) + rows * cols * 2.0) / (ms * 1e6);
      std::printf("  %-5s %6lld x %-6lld -> bf16: %.3f ms, %.0f GB/s\n", ggml_type_name(t).c_str(),
                  static_cast<long long>(rows), static_cast<long long>(cols), ms, gbs);
      cudaEventDestroy(a);
      cudaEventDestroy(b);
    }
  }
}

}  // namespace
}  // namespace zimage

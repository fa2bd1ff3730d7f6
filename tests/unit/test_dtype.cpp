#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "core/dtype.h"
#include "core/host_memory.h"
#include "core/status.h"
#include "core/tensor.h"

using namespace zimage;

TEST(DType, Bf16RoundTripAndRounding) {
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f)), 1.0f);
  // 1 + 2^-8 is halfway between bf16 neighbours 1 and 1+2^-7: ties to even -> 1.
  EXPECT_EQ(round_bf16(1.0f + std::ldexp(1.0f, -8)), 1.0f);
  EXPECT_EQ(round_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 1.0f + std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isnan(round_bf16(NAN)));
  EXPECT_EQ(round_bf16(-INFINITY), -INFINITY);
}

TEST(DType, F16AllValuesRoundTrip) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_f16(f), h) << h;
  }
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // rounds to inf
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(f16_to_f32(1), std::ldexp(1.0f, -24));
}

TEST(DType, Fp8AllValuesRoundTrip) {
  for (uint32_t v = 0; v < 256; ++v) {
    const float a = f8e4m3_to_f32(static_cast<uint8_t>(v));
    if (!std::isnan(a)) {
      EXPECT_EQ(f32_to_f8e4m3(a), v) << v;
    }
    const float b = f8e5m2_to_f32(static_cast<uint8_t>(v));
    if (!std::isnan(b)) {
      EXPECT_EQ(f32_to_f8e5m2(b), v) << v;
    }
  }
  EXPECT_EQ(f8e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(f32_to_f8e4m3(460.0f), 0x7e);                         // rounds down to max
  EXPECT_TRUE(std::isnan(f8e4m3_to_f32(f32_to_f8e4m3(500.0f))));  // torch: out of range -> NaN
  EXPECT_EQ(f8e5m2_to_f32(0x7b), 57344.0f);
  EXPECT_TRUE(std::isinf(f8e5m2_to_f32(f32_to_f8e5m2(1e6f))));
}

TEST(DType, SafetensorsNames) {
  EXPECT_EQ(dtype_from_safetensors("BF16"), DType::kBF16);
  EXPECT_EQ(dtype_from_safetensors("F8_E4M3"), DType::kF8E4M3);
  EXPECT_FALSE(dtype_from_safetensors("F4").has_value());
  EXPECT_STREQ(dtype_to_safetensors(DType::kF8E5M2), "F8_E5M2");
}

TEST(Tensor, ViewsAndSlices) {
  Tensor t = Tensor::host(DType::kF32, {4, 3});
  for (int i = 0; i < 12; ++i) t.data_as<float>()[i] = static_cast<float>(i);
  Tensor s = t.slice0(1, 3);
  ASSERT_TRUE(s.defined());
  EXPECT_EQ(s.shape(), (Shape{2, 3}));
  EXPECT_EQ(s.data_as<float>()[0], 3.0f);
  EXPECT_FALSE(t.slice0(2, 5).defined());
  EXPECT_FALSE(t.view({5, 3}).defined());
  EXPECT_EQ(t.view({12}).numel(), 12);
  EXPECT_EQ(shape_numel({1LL << 40, 1LL << 40}), -1);
}

TEST(Status, FieldSurvivesCopiesAndContext) {
  const Status st = FieldError("width", "63 is odd");
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "width: 63 is odd");
  EXPECT_EQ(st.field(), "width");
  EXPECT_EQ(st.field_detail(), "63 is odd");
  Result<int> r = st;
  EXPECT_EQ(r.status().field(), "width");
  const Status ctx = st.with_context("run 1");
  EXPECT_EQ(ctx.message(), "run 1: width: 63 is odd");
  EXPECT_EQ(ctx.field(), "width");
  EXPECT_FALSE(ctx.field_detail().has_value());  // the field no longer leads the message
  EXPECT_EQ(InvalidArgument("width: 63").field(), "");
  EXPECT_FALSE(InvalidArgument("width: 63").field_detail().has_value());
  EXPECT_EQ(Status::Ok().with_field("width").field(), "");
}

TEST(Status, ResultCarriesError) {
  Result<int> r = NotFound("tensor 'x'");
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().to_string(), "not found: tensor 'x'");
  Result<int> v = 3;
  EXPECT_TRUE(v.ok());
  EXPECT_EQ(*v, 3);
}

// Large host buffers (core/host_memory.h allocate_large, HostStorage from kLargeHostBytes on)
// start on a 2 MiB boundary, so transparent huge pages can back them; smaller ones keep the
// 64-byte alignment; every byte is writable and the tensor's view of it is whole.
TEST(HostMemory, LargeBuffersStartOnAHugePage) {
  const size_t big = kLargeHostBytes + 12345;
  void* p = allocate_large(big);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % (size_t{2} << 20), 0u);
  std::memset(p, 0x5a, big);
  EXPECT_EQ(static_cast<unsigned char*>(p)[big - 1], 0x5a);
  std::free(p);
  const Tensor t = Tensor::host(DType::kF32, {static_cast<int64_t>(big / 4)});
  ASSERT_TRUE(t.defined());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % (size_t{2} << 20), 0u);
  EXPECT_EQ(t.data_as<float>()[t.numel() - 1], 0.f);  // Tensor::host zeroes
  const Tensor s = Tensor::host(DType::kF32, {1000});
  ASSERT_TRUE(s.defined());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(s.data()) % 64, 0u);
}

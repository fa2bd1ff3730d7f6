// Scaled FP8 (io/weights/scaled_fp8.h) and component selection (io/weights/single_file.h) on small hand-made
// files: each ComfyUI format dequantises to float32(q) * scale exactly (checked element by element
// against the FP8 decoding of core/dtype.h), the scales and markers count as used, the FP8 bytes
// stay reachable, and every malformed variant fails with a message naming the file and layer.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "io/weights/safetensors.h"
#include "io/weights/scaled_fp8.h"
#include "io/weights/single_file.h"

namespace zimage {
namespace {

namespace fs = std::filesystem;
using Tensors = std::vector<std::pair<std::string, Tensor>>;

class ScaledFp8 : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("zimage_fp8_" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const Tensors& t, const std::map<std::string, std::string>& meta = {}) {
    const std::string path = (dir_ / ("f" + std::to_string(n_++) + ".safetensors")).string();
    Status s = write_safetensors(path, t, meta);
    EXPECT_TRUE(s.ok()) << s.to_string();
    return path;
  }
  fs::path dir_;
  int n_ = 0;
};

// A [rows, cols] FP8 tensor of the bytes 0, 1, 2, ... (NaN codes skipped).
Tensor fp8(DType dt, int64_t rows, int64_t cols) {
  Tensor t = Tensor::host(dt, {rows, cols});
  auto* p = static_cast<uint8_t*>(t.data());
  for (int64_t i = 0; i < rows * cols; ++i) {
    uint8_t v = static_cast<uint8_t>((i * 37 + 11) & 0xff);
    if (dt == DType::kF8E4M3 && (v & 0x7f) == 0x7f) v = 0x10;
    if (dt == DType::kF8E5M2 && (v & 0x7c) == 0x7c) v = 0x20;
    p[i] = v;
  }
  return t;
}

Tensor f32(std::vector<float> v, Shape shape) {
  Tensor t = Tensor::host(DType::kF32, std::move(shape));
  std::memcpy(t.data(), v.data(), v.size() * 4);
  return t;
}

Tensor bf16(int64_t n) {
  Tensor t = Tensor::host(DType::kBF16, {n});
  for (int64_t i = 0; i < n; ++i) t.data_as<uint16_t>()[i] = f32_to_bf16(1.0f + i);
  return t;
}

Tensor text(const std::string& s) {
  Tensor t = Tensor::host(DType::kU8, {static_cast<int64_t>(s.size())});
  std::memcpy(t.data(), s.data(), s.size());
  return t;
}

float decode(DType dt, uint8_t v) {
  return dt == DType::kF8E4M3 ? f8e4m3_to_f32(v) : f8e5m2_to_f32(v);
}

// Every element of `got` (f32) is decode(q) * scale[row or 0], bit for bit.
void expect_dequantised(const Tensor& got, const Tensor& q, const std::vector<float>& scale) {
  ASSERT_EQ(got.dtype(), DType::kF32);
  ASSERT_EQ(got.shape(), q.shape());
  const int64_t rows = q.dim(0), cols = q.numel() / rows;
  const auto* b = static_cast<const uint8_t*>(q.data());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float want = decode(q.dtype(), b[r * cols + c]) * scale[scale.size() == 1 ? 0 : r];
      ASSERT_EQ(got.data_as<float>()[r * cols + c], want) << r << "," << c;
    }
}

TEST_F(ScaledFp8, CurrentComfyFormatDequantisesPerTensor) {
  const Tensor q = fp8(DType::kF8E4M3, 6, 5);
  const std::string path =
      write({{"layers.0.attention.qkv.weight", q},
             {"layers.0.attention.qkv.weight_scale", f32({0.0125f}, {})},
             {"layers.0.attention.qkv.input_scale", f32({0.5f}, {})},
             {"layers.0.attention.qkv.comfy_quant", text("{\"format\": \"float8_e4m3fn\"}")},
             {"cap_embedder.1.weight", bf16(4)}});
  auto cw = open_component_file(path, Component::kTransformer);
  ASSERT_TRUE(cw.ok()) << cw.status().to_string();
  EXPECT_EQ(cw->fp8.format, "comfy quant");
  EXPECT_EQ(cw->fp8.scaled_weights, 1);
  EXPECT_EQ(cw->fp8.input_scales, 1);
  EXPECT_EQ(cw->store.names(),
            (std::vector<std::string>{"cap_embedder.1.weight", "layers.0.attention.qkv.weight"}));
  auto w = cw->store.get("layers.0.attention.qkv.weight");
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  expect_dequantised(*w, q, {0.0125f});
  ASSERT_TRUE(cw->store.get("cap_embedder.1.weight").ok());
  EXPECT_TRUE(cw->store.unused_names().empty());  // scales and markers are accounted for
  // The FP8 bytes and the scale behind the dequantised weight.
  ASSERT_TRUE(cw->fp8_index->contains("layers.0.attention.qkv.weight"));
  auto sw = cw->fp8_index->get("layers.0.attention.qkv.weight");
  ASSERT_TRUE(sw.ok());
  EXPECT_EQ(sw->data.dtype(), DType::kF8E4M3);
  EXPECT_EQ(std::memcmp(sw->data.data(), q.data(), q.nbytes()), 0);
  EXPECT_EQ(sw->scale.data_as<float>()[0], 0.0125f);
  EXPECT_EQ(sw->input_scale, 0.5f);
}

TEST_F(ScaledFp8, LegacyFormatWithMarkerAndPerRowMetadataFormat) {
  const Tensor q = fp8(DType::kF8E4M3, 4, 3);
  const std::string legacy =
      write({{"model.diffusion_model.scaled_fp8", Tensor::host(DType::kF8E4M3, {0})},
             {"model.diffusion_model.layers.0.feed_forward.w2.weight", q},
             {"model.diffusion_model.layers.0.feed_forward.w2.scale_weight", f32({3.0f}, {1})},
             {"model.diffusion_model.layers.0.feed_forward.w2.scale_input", f32({1.0f}, {})},
             {"model.diffusion_model.cap_embedder.1.weight", bf16(2)},
             {"vae.decoder.conv_in.weight", bf16(2)}});
  auto cw = open_component_file(legacy, Component::kTransformer);
  ASSERT_TRUE(cw.ok()) << cw.status().to_string();
  EXPECT_EQ(cw->prefix, "model.diffusion_model.");
  EXPECT_EQ(cw->fp8.format, "comfy scaled_fp8 (legacy)");
  auto w = cw->store.get("layers.0.feed_forward.w2.weight");
  ASSERT_TRUE(w.ok());
  expect_dequantised(*w, q, {3.0f});
  ASSERT_TRUE(cw->store.get("cap_embedder.1.weight").ok());
  EXPECT_TRUE(cw->store.unused_names().empty());  // the VAE's tensor was dropped, not left over
  auto vae = open_component_file(legacy, Component::kVae);
  ASSERT_TRUE(vae.ok());
  EXPECT_EQ(vae->store.names(), (std::vector<std::string>{"decoder.conv_in.weight"}));

  const Tensor q5 = fp8(DType::kF8E5M2, 3, 4);
  const std::string rows = write(
      {{"layers.1.attention.out.weight", q5},
       {"layers.1.attention.out.weight_scale", f32({0.5f, 2.0f, 0.25f}, {3, 1})},
       {"cap_embedder.1.weight", bf16(2)}},
      {{"_quantization_metadata",
        R"({"format_version": "1.0", "layers": {"layers.1.attention.out": {"format": "float8_e5m2"}}})"}});
  cw = open_component_file(rows, Component::kTransformer);
  ASSERT_TRUE(cw.ok()) << cw.status().to_string();
  EXPECT_EQ(cw->fp8.per_row_scales, 1);
  w = cw->store.get("layers.1.attention.out.weight");
  ASSERT_TRUE(w.ok());
  expect_dequantised(*w, q5, {0.5f, 2.0f, 0.25f});
}

TEST_F(ScaledFp8, PlainFp8IsCountedAndLeftAsStored) {
  const Tensor q = fp8(DType::kF8E4M3, 2, 2);
  auto cw = open_component_file(write({{"cap_embedder.1.weight", q}}), Component::kTransformer);
  ASSERT_TRUE(cw.ok());
  EXPECT_EQ(cw->fp8.format, "fp8");
  EXPECT_EQ(cw->fp8.plain_fp8, 1);
  EXPECT_EQ(cw->store.info("cap_embedder.1.weight")->dtype, DType::kF8E4M3);
}

TEST_F(ScaledFp8, MalformedFilesAreNamed) {
  const std::string w = "layers.0.attention.out.weight", l = "layers.0.attention.out";
  const Tensor q = fp8(DType::kF8E4M3, 4, 4);
  const Tensor marker = bf16(2);
  struct Bad {
    const char* what;
    Tensors tensors;
    std::map<std::string, std::string> meta;
    const char* expect;
    ErrorCode code = ErrorCode::kFormat;
  };
  const std::vector<Bad> cases = {
      {"scale next to a bf16 weight",
       {{w, bf16(16).view({4, 4})}, {l + ".weight_scale", f32({1}, {})}},
       {},
       "a scaled weight must be F8_E4M3 or F8_E5M2"},
      {"scale of the wrong shape",
       {{w, q}, {l + ".weight_scale", f32({1, 2}, {2})}},
       {},
       "one per output row ([4] or [4, 1])"},
      {"NaN scale", {{w, q}, {l + ".weight_scale", f32({NAN}, {})}}, {}, "NaN or infinite"},
      {"scale without weight",
       {{l + "x.weight_scale", f32({1}, {})}, {w, q}},
       {},
       "has no weight 'layers.0.attention.outx.weight'"},
      {"unsupported format",
       {{w, q},
        {l + ".weight_scale", f32({1}, {})},
        {l + ".comfy_quant", text(R"({"format": "nvfp4"})")}},
       {},
       "'nvfp4' is not supported",
       ErrorCode::kUnsupported},
      {"format and dtype disagree",
       {{w, q},
        {l + ".weight_scale", f32({1}, {})},
        {l + ".comfy_quant", text(R"({"format": "float8_e5m2"})")}},
       {},
       "says 'float8_e5m2'"},
      {"marked without a scale",
       {{w, q}, {l + ".comfy_quant", text(R"({"format": "float8_e4m3fn"})")}},
       {},
       "is marked 'float8_e4m3fn' but has no weight_scale"},
      {"malformed comfy_quant", {{w, q}, {l + ".comfy_quant", text("{format")}}, {}, "comfy_quant"},
      {"metadata names a missing layer",
       {{w, q}},
       {{"_quantization_metadata", R"({"layers": {"layers.9.x": {"format": "float8_e4m3fn"}}})"}},
       "which has no weight in the file"},
      {"metadata without layers",
       {{w, q}},
       {{"_quantization_metadata", R"({"x": 1})"}},
       "expected an object with an object 'layers'"},
      {"input scale alone",
       {{w, q}, {l + ".input_scale", f32({0.5f}, {})}},
       {},
       "which has no weight scale"},
      {"two scales",
       {{w, q}, {l + ".weight_scale", f32({1}, {})}, {l + ".scale_weight", f32({1}, {})}},
       {},
       "has two weight scales"},
  };
  for (const Bad& b : cases) {
    SCOPED_TRACE(b.what);
    Tensors t = b.tensors;
    t.emplace_back("cap_embedder.1.weight", marker);
    const std::string path = write(t, b.meta);
    auto r = open_component_file(path, Component::kTransformer);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), b.code) << r.status().to_string();
    EXPECT_NE(r.status().message().find(b.expect), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status().message();
  }
}

TEST_F(ScaledFp8, ComponentSelectionNamesWhatAFileHolds) {
  const std::string dit = write({{"cap_embedder.1.weight", bf16(2)}});
  auto r = open_component_file(dit, Component::kVae);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(r.status().message().find("holds no vae tensors (it holds transformer)"),
            std::string::npos)
      << r.status().message();
  const SingleFileLayout l =
      detect_single_file({"model.diffusion_model.cap_embedder.1.weight",
                          "text_encoders.qwen3_4b.transformer.model.embed_tokens.weight",
                          "vae.decoder.conv_in.weight"});
  EXPECT_EQ(l.count(), 3);
  EXPECT_EQ(l.text_encoder.prefix, "text_encoders.qwen3_4b.transformer.");
  EXPECT_EQ(l.describe(),
            "transformer (prefix 'model.diffusion_model.'), text_encoder (prefix "
            "'text_encoders.qwen3_4b.transformer.'), vae (prefix 'vae.')");
  auto folder = open_component_file(dir_.string(), Component::kVae);
  ASSERT_FALSE(folder.ok());
  EXPECT_EQ(folder.status().code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace zimage

// The GGUF reader on files written by the gguf Python package (tools/make_gguf_cases.py,
// build/<preset>/gguf/meta/meta.gguf): every metadata value type read back with its value, type
// mismatches named, a non-default alignment, zero-copy views in PyTorch order, dequantisation and
// packed blocks; and the WeightStore built from a GGUF file (names, shapes, ComfyUI-GGUF's
// orig_shape, the qwen3 renames, packed views, used-name tracking).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/gguf_builder.h"
#include "io/gguf/gguf.h"
#include "io/gguf/gguf_weights.h"
#include "io/weights/weights.h"

namespace zimage {
namespace {

std::string meta_path() {
  return std::string(ZIMAGE_GGUF_DIR) + "/meta/meta.gguf";
}

std::shared_ptr<GgufFile> open_meta() {
  auto f = GgufFile::open(meta_path());
  EXPECT_TRUE(f.ok()) << f.status().to_string();
  return f.ok() ? *f : nullptr;
}

TEST(GgufReader, ReadsEveryMetadataType) {
  auto f = open_meta();
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->header().version, 3u);
  EXPECT_EQ(f->architecture(), "zimage-test");
  auto i = [&](const char* k) { return f->get_int(k).ok() ? *f->get_int(k) : -999; };
  EXPECT_EQ(i("test.u8"), 200);
  EXPECT_EQ(i("test.i8"), -100);
  EXPECT_EQ(i("test.u16"), 60000);
  EXPECT_EQ(i("test.i16"), -30000);
  EXPECT_EQ(i("test.u32"), 4000000000LL);
  EXPECT_EQ(i("test.i32"), -2000000000LL);
  EXPECT_EQ(i("test.i64"), -(int64_t{1} << 62));
  EXPECT_EQ(f->find("test.u32")->type, GgufType::kU32);
  EXPECT_EQ(f->find("test.i8")->type, GgufType::kI8);
  EXPECT_EQ(*f->get_float("test.f32"), 1.5);
  EXPECT_EQ(*f->get_float("test.f64"), 0.1);
  EXPECT_EQ(*f->get_bool("test.bool"), true);
  EXPECT_EQ(*f->get_string("test.string"), "h\u00e9llo w\u00f6rld \u2713");
  EXPECT_EQ(*f->get_int_array("test.arr_i32"), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(*f->get_int_array("test.arr_u8"), (std::vector<int64_t>{7, 8, 255}));
  EXPECT_EQ(*f->get_float_array("test.arr_f32"), (std::vector<double>{0.5, -1.25}));
  EXPECT_EQ(*f->get_string_array("test.arr_str"), (std::vector<std::string>{"a", "bc", ""}));
  const GgufKv* b = f->find("test.arr_bool");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->elem_type, GgufType::kBool);
  EXPECT_EQ(b->count, 2u);
  // Nested arrays are parsed and described (array of 2 arrays), not flattened.
  const GgufKv* n = f->find("test.nested");
  ASSERT_NE(n, nullptr);
  EXPECT_EQ(n->type, GgufType::kArray);
  EXPECT_EQ(n->elem_type, GgufType::kArray);
  EXPECT_EQ(n->count, 2u);
  EXPECT_EQ(f->find("test.nested_str")->count, 2u);
}

// What the Python writer refuses to write (empty strings, empty arrays, zero-size tensors) is still
// valid GGUF.
TEST(GgufReader, EmptyValuesAndTensors) {
  test::GgufBuilder g;
  g.header(2, 3).kv_str("s", "").kv_i32_array("a", {});
  g.str("strs").u32(test::GgufBuilder::kArray).u32(test::GgufBuilder::kString).u64(0);
  g.tensor_info("empty", {0, 4}, 8, 0).tensor_info("one", {8}, 0, 0).pad_to(32).zeros(32);
  auto f = GgufFile::view(g.bytes.data(), g.bytes.size(), "empty.gguf");
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(*(*f)->get_string("s"), "");
  EXPECT_TRUE((*f)->get_int_array("a")->empty());
  EXPECT_TRUE((*f)->get_string_array("strs")->empty());
  auto e = (*f)->dequantize("empty");
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  EXPECT_EQ(e->shape(), (Shape{4, 0}));
  EXPECT_EQ((*f)->find_tensor("one")->bytes, 32u);
}

TEST(GgufReader, TypeMismatchesAndMissingKeysAreNamed) {
  auto f = open_meta();
  ASSERT_NE(f, nullptr);
  auto u64 = f->get_int("test.u64");  // 2^63 + 5 does not fit int64
  ASSERT_FALSE(u64.ok());
  EXPECT_NE(u64.status().message().find("test.u64': value 9223372036854775813 is out of range"),
            std::string::npos)
      << u64.status().message();
  auto s = f->get_string("test.i32");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), ErrorCode::kFormat);
  EXPECT_NE(s.status().message().find("key 'test.i32' is a int32, expected a string"),
            std::string::npos)
      << s.status().message();
  auto nested = f->get_int_array("test.nested");
  ASSERT_FALSE(nested.ok());
  EXPECT_NE(nested.status().message().find("is a array of array, expected an array of integers"),
            std::string::npos)
      << nested.status().message();
  auto missing = f->get_string("no.such.key");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(missing.status().message().find(meta_path()), std::string::npos);
  EXPECT_FALSE(f->get_bool("test.u8").ok());
  EXPECT_FALSE(f->get_float("test.string").ok());
}

TEST(GgufReader, TensorViewsFollowTheAlignmentAndPyTorchOrder) {
  auto f = open_meta();
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->header().alignment, 64u);
  EXPECT_EQ(f->header().data_start % 64, 0u);
  for (const GgufTensorInfo& t : f->tensors()) EXPECT_EQ(t.offset % 64, 0u) << t.name;
  // "plain" was written from numpy shape (3, 4): ne = [4, 3].
  const GgufTensorInfo* p = f->find_tensor("plain");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->ne, (std::vector<int64_t>{4, 3}));
  auto t = f->tensor("plain");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t->shape(), (Shape{3, 4}));
  EXPECT_EQ(t->dtype(), DType::kF32);
  for (int k = 0; k < 12; ++k) EXPECT_EQ(t->data_as<float>()[k], static_cast<float>(k));
  // Zero-copy: the view points into the file's bytes and keeps the file alive.
  Tensor kept = *t;
  f.reset();
  EXPECT_EQ(kept.data_as<float>()[11], 11.0f);
}

TEST(GgufReader, QuantisedTensorsDequantiseAndExposeTheirBlocks) {
  auto f = open_meta();
  ASSERT_NE(f, nullptr);
  auto view = f->tensor("quant");
  ASSERT_FALSE(view.ok());
  EXPECT_NE(view.status().message().find("is Q8_0-quantised"), std::string::npos);
  auto q = f->dequantize("quant");
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  EXPECT_EQ(q->shape(), (Shape{2, 32}));
  // linspace(-1, 1, 64) through Q8_0: within half a quantisation step (1/127 of the block max).
  for (int k = 0; k < 64; ++k) {
    const float x = -1.0f + 2.0f * static_cast<float>(k) / 63.0f;
    EXPECT_NEAR(q->data_as<float>()[k], x, 0.5 / 127 + 1e-3) << k;
  }
  auto packed = f->packed("quant");
  ASSERT_TRUE(packed.ok());
  EXPECT_EQ(packed->type, GgmlType::kQ8_0);
  EXPECT_EQ(packed->rows, 2);
  EXPECT_EQ(packed->cols, 32);
  EXPECT_EQ(packed->bytes, 68u);
  std::vector<float> row(32);
  ASSERT_TRUE(dequantize_row(GgmlType::kQ8_0, static_cast<const uint8_t*>(packed->data) + 34,
                             row.data(), 32));
  EXPECT_EQ(std::memcmp(row.data(), q->data_as<float>() + 32, 32 * 4), 0);
  EXPECT_EQ(f->tensor("nope").status().code(), ErrorCode::kNotFound);
}

TEST(GgufReader, WeightStoreFromGguf) {
  auto ws = WeightStore::open(meta_path());
  ASSERT_TRUE(ws.ok()) << ws.status().to_string();
  EXPECT_EQ(ws->names(), (std::vector<std::string>{"plain", "quant", "reshaped"}));
  EXPECT_EQ(ws->files(), std::vector<std::string>{meta_path()});
  // ComfyUI-GGUF's orig_shape: stored [4, 8], recorded [2, 2, 8].
  auto info = ws->info("reshaped");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->shape, (Shape{2, 2, 8}));
  auto r = ws->get("reshaped", {2, 2, 8});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->data_as<float>()[31], 31.0f);
  // Quantised tensors are declared and made as f32; plain ones keep their dtype (zero-copy).
  EXPECT_EQ(ws->info("quant")->dtype, DType::kF32);
  auto q = ws->get("quant", {2, 32});
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  EXPECT_EQ(q->dtype(), DType::kF32);
  auto packed = ws->packed("quant");
  ASSERT_TRUE(packed.ok()) << packed.status().to_string();
  EXPECT_EQ(packed->ggml_type, static_cast<uint32_t>(GgmlType::kQ8_0));
  EXPECT_EQ(packed->shape, (Shape{2, 32}));
  EXPECT_EQ(packed->bytes, 68u);
  EXPECT_EQ(ws->total_bytes(), 48u + 68u + 128u);
  EXPECT_EQ(ws->unused_names(), std::vector<std::string>{"plain"});
}

TEST(GgufReader, UsedNamesAndPackedOfSafetensorsTensors) {
  auto ws = WeightStore::open(meta_path());
  ASSERT_TRUE(ws.ok());
  EXPECT_EQ(ws->unused_names().size(), 3u);
  ASSERT_TRUE(ws->packed("quant").ok());  // counts as used
  ASSERT_TRUE(ws->get("plain").ok());
  EXPECT_EQ(ws->unused_names(), std::vector<std::string>{"reshaped"});
  // A safetensors tensor is not stored packed.
  const std::string st = std::string(ZIMAGE_GOLDEN_DIR) + "/v_turbo/model/transformer";
  auto sws = WeightStore::open(st);
  ASSERT_TRUE(sws.ok());
  auto p = sws->packed("x_pad_token");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), ErrorCode::kUnsupported);
}

TEST(GgufReader, Qwen3NamesBecomeTransformersNames) {
  EXPECT_EQ(gguf_store_name("qwen3", "token_embd.weight"), "model.embed_tokens.weight");
  EXPECT_EQ(gguf_store_name("qwen3", "output_norm.weight"), "model.norm.weight");
  EXPECT_EQ(gguf_store_name("qwen3", "output.weight"), "lm_head.weight");
  EXPECT_EQ(gguf_store_name("qwen3", "blk.0.attn_q.weight"),
            "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(gguf_store_name("qwen3", "blk.35.attn_output.weight"),
            "model.layers.35.self_attn.o_proj.weight");
  EXPECT_EQ(gguf_store_name("qwen3", "blk.2.attn_k_norm.weight"),
            "model.layers.2.self_attn.k_norm.weight");
  EXPECT_EQ(gguf_store_name("qwen3", "blk.2.attn_norm.weight"),
            "model.layers.2.input_layernorm.weight");
  EXPECT_EQ(gguf_store_name("qwen3", "blk.7.ffn_norm.weight"),
            "model.layers.7.post_attention_layernorm.weight");
  EXPECT_EQ(gguf_store_name("qwen3", "blk.7.ffn_gate.weight"),
            "model.layers.7.mlp.gate_proj.weight");
  EXPECT_EQ(gguf_store_name("qwen3", "blk.7.ffn_up.weight"), "model.layers.7.mlp.up_proj.weight");
  EXPECT_EQ(gguf_store_name("qwen3", "blk.7.ffn_down.weight"),
            "model.layers.7.mlp.down_proj.weight");
  // Unknown or malformed names, and other architectures, keep their names.
  EXPECT_EQ(gguf_store_name("qwen3", "blk.x.attn_q.weight"), "blk.x.attn_q.weight");
  EXPECT_EQ(gguf_store_name("qwen3", "blk.1.rope_freqs.weight"), "blk.1.rope_freqs.weight");
  EXPECT_EQ(gguf_store_name("qwen3", "blk.1.attn_q.scale"), "blk.1.attn_q.scale");
  EXPECT_EQ(gguf_store_name("lumina2", "layers.0.attention.qkv.weight"),
            "layers.0.attention.qkv.weight");
  EXPECT_EQ(gguf_store_name("llama", "blk.0.attn_q.weight"), "blk.0.attn_q.weight");
}

// A folder whose only weight file is a .gguf opens as that file.
TEST(GgufReader, FolderWithOneGgufFile) {
  const std::string dir = ::testing::TempDir() + "zimage_gguf_folder_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::vector<uint8_t> bytes = test::small_valid_gguf();
  std::ofstream(dir + "/model.gguf", std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
  auto ws = WeightStore::open(dir);
  ASSERT_TRUE(ws.ok()) << ws.status().to_string();
  EXPECT_EQ(ws->names(), (std::vector<std::string>{"a", "b"}));
  auto b = ws->get("b", {32});
  ASSERT_TRUE(b.ok());
  for (int k = 0; k < 32; ++k) EXPECT_EQ(b->data_as<float>()[k], static_cast<float>(k - 16));
  std::ofstream(dir + "/second.gguf", std::ios::binary) << "GGUF";
  auto two = WeightStore::open(dir);
  ASSERT_FALSE(two.ok());
  EXPECT_NE(two.status().message().find("several .gguf files"), std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace zimage

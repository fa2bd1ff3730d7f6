// The GGUF reader on malformed files: a corpus of corrupt files, each built here byte by byte
// (tests/common/gguf_builder.h) from the checklist of llama.cpp's GGUF CVEs of 2024-25 (counts,
// string lengths, array sizes and nesting, dims, types, sizes and offsets that overflow or run
// past the end, alignment, duplicates, truncation), written to disk and opened both as a buffer
// (parse_gguf) and as a file (WeightStore::open, through the GGUF magic). Every one must fail with
// a FormatError whose message names the file and the problem (a substring checked per file);
// none may crash or allocate what the file cannot back (ASan/UBSan runs and the fuzzer,
// fuzz/fuzz_gguf.cpp, cover the rest). Plus: every truncation of a valid file fails, and single
// byte changes of its header either fail cleanly or give a self-consistent header.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "common/gguf_builder.h"
#include "io/gguf/gguf.h"
#include "io/weights/weights.h"

namespace zimage {
namespace {

using test::GgufBuilder;
using B = GgufBuilder;

struct Case {
  std::string label;
  std::vector<uint8_t> bytes;
  std::string expect;  // substring of the error message
};

constexpr uint64_t kMax64 = std::numeric_limits<uint64_t>::max();

// One kv "k" of the given type and raw value bytes, no tensors.
std::vector<uint8_t> one_kv(const std::function<void(B&)>& value) {
  B g;
  g.header(0, 1).str("k");
  value(g);
  return g.bytes;
}

// A file with one tensor info (and enough zero data after it for small tensors).
std::vector<uint8_t> one_tensor(std::string_view name, const std::vector<uint64_t>& ne,
                                uint32_t type, uint64_t offset, size_t data = 256) {
  B g;
  g.header(1, 0).tensor_info(name, ne, type, offset).pad_to(32).zeros(data);
  return g.bytes;
}

std::vector<uint8_t> with_alignment(const std::function<void(B&)>& kv_value) {
  B g;
  g.header(1, 1).str("general.alignment");
  kv_value(g);
  g.tensor_info("a", {8}, 0, 0).pad_to(32).zeros(32);
  return g.bytes;
}

std::vector<Case> corpus() {
  std::vector<Case> c;
  const std::vector<uint8_t> valid = test::small_valid_gguf();
  auto patched = [&](size_t at, std::vector<uint8_t> with) {
    std::vector<uint8_t> b = valid;
    std::copy(with.begin(), with.end(), b.begin() + at);
    return b;
  };
  auto cut = [&](size_t n) { return std::vector<uint8_t>(valid.begin(), valid.begin() + n); };

  // ---- header ----
  c.push_back({"empty", {}, "too short for the magic"});
  c.push_back({"bad_magic", patched(0, {'G', 'G', 'U', 'X'}), "bad magic 'GGUX'"});
  c.push_back({"version_1", patched(4, {1, 0, 0, 0}), "unsupported GGUF version 1"});
  c.push_back({"version_4", patched(4, {4, 0, 0, 0}), "unsupported GGUF version 4"});
  c.push_back({"big_endian", patched(4, {0, 0, 0, 3}), "big-endian GGUF"});
  c.push_back({"truncated_header", cut(12), "truncated: the tensor count needs 8 bytes"});
  c.push_back({"huge_tensor_count", B().header(uint64_t{1} << 63, 0).bytes,
               "tensor count 9223372036854775808 cannot fit"});
  c.push_back({"tensor_count_past_eof", B().header(1000, 0).zeros(100).bytes,
               "tensor count 1000 cannot fit"});
  c.push_back({"huge_kv_count", B().header(0, uint64_t{1} << 40).zeros(64).bytes,
               "metadata key count 1099511627776 cannot fit"});
  // ---- keys ----
  c.push_back({"key_length_past_eof", B().header(0, 1).u64(1000).raw("abcdefghijklmnop").bytes,
               "key #0 name: string length 1000 runs past the end"});
  c.push_back({"key_length_overflow", B().header(0, 1).u64(kMax64).zeros(16).bytes,
               "string length 18446744073709551615 runs past the end"});
  c.push_back({"empty_key", B().header(0, 1).str("").u32(B::kU32).u32(1).bytes,
               "key #0 has an empty name"});
  c.push_back({"key_too_long",
               B().header(0, 1).str(std::string(70000, 'k')).u32(B::kU8).u8(1).bytes,
               "exceeds the limit of 65536 bytes"});
  c.push_back({"duplicate_key", B().header(0, 2).kv_u32("k", 1).kv_u32("k", 2).bytes,
               "duplicate metadata key 'k'"});
  // ---- values ----
  c.push_back({"unknown_value_type", one_kv([](B& g) { g.u32(13).u64(0); }),
               "key 'k': unknown value type 13"});
  c.push_back({"scalar_past_eof", one_kv([](B& g) { g.u32(B::kU64).u32(0); }),
               "truncated: key 'k' needs 8 bytes"});
  c.push_back({"string_value_past_eof",
               one_kv([](B& g) { g.u32(B::kString).u64(uint64_t{1} << 40).raw("xy"); }),
               "key 'k': string length 1099511627776 runs past the end"});
  c.push_back({"bool_value_2", one_kv([](B& g) { g.u32(B::kBool).u8(2); }),
               "bool value 2 is neither 0 nor 1"});
  c.push_back({"array_count_overflow",
               one_kv([](B& g) { g.u32(B::kArray).u32(B::kU64).u64((uint64_t{1} << 61) + 1); }),
               "array of 2305843009213693953 uint64 elements cannot fit"});
  c.push_back({"string_array_huge_count", one_kv([](B& g) {
                 g.u32(B::kArray).u32(B::kString).u64(uint64_t{1} << 62).zeros(64);
               }),
               "string elements cannot fit"});
  c.push_back({"array_element_string_past_eof",
               one_kv([](B& g) { g.u32(B::kArray).u32(B::kString).u64(2).str("ok").u64(999); }),
               "key 'k' element 1: string length 999 runs past the end"});
  c.push_back({"unknown_array_element_type",
               one_kv([](B& g) { g.u32(B::kArray).u32(42).u64(1).u8(0); }),
               "unknown array element type 42"});
  c.push_back({"bool_array_value_7",
               one_kv([](B& g) { g.u32(B::kArray).u32(B::kBool).u64(2).u8(1).u8(7); }),
               "key 'k' element 1: bool value 7"});
  c.push_back({"nested_array_bomb", one_kv([](B& g) {
                 g.u32(B::kArray).u32(B::kArray).u64(uint64_t{1} << 40).zeros(48);
               }),
               "array of 1099511627776 array elements cannot fit"});
  c.push_back({"nested_too_deep", one_kv([](B& g) {
                 g.u32(B::kArray);
                 for (int d = 0; d < 4; ++d) g.u32(B::kArray).u64(1);
                 g.u32(B::kU8).u64(1).u8(0);
               }),
               "arrays nested more than 4 deep"});
  c.push_back({"nested_inner_string_past_eof", one_kv([](B& g) {
                 g.u32(B::kArray).u32(B::kArray).u64(1).u32(B::kString).u64(1).u64(1 << 20);
               }),
               "key 'k' element 0 element 0: string length 1048576 runs past the end"});
  // ---- alignment ----
  c.push_back({"alignment_zero", with_alignment([](B& g) { g.u32(B::kU32).u32(0); }),
               "general.alignment 0 is not a power of two"});
  c.push_back({"alignment_48", with_alignment([](B& g) { g.u32(B::kU32).u32(48); }),
               "general.alignment 48 is not a power of two"});
  c.push_back({"alignment_huge", with_alignment([](B& g) { g.u32(B::kU32).u32(1u << 31); }),
               "general.alignment 2147483648 exceeds the limit"});
  c.push_back({"alignment_wrong_type", with_alignment([](B& g) { g.u32(B::kU64).u64(32); }),
               "key 'general.alignment' is a uint64, expected a uint32"});
  // ---- tensor infos ----
  c.push_back({"empty_tensor_name", one_tensor("", {8}, 0, 0), "tensor #0 has an empty name"});
  c.push_back({"tensor_name_past_eof", B().header(1, 0).u64(500).raw("abc").zeros(30).bytes,
               "tensor #0 name: string length 500 runs past the end"});
  c.push_back({"n_dims_5", one_tensor("t", {1, 1, 1, 1, 8}, 0, 0),
               "tensor 't': n_dims 5 exceeds the maximum of 4"});
  c.push_back({"n_dims_huge", B().header(1, 0).str("t").u32(0xffffffffu).zeros(64).bytes,
               "n_dims 4294967295 exceeds the maximum"});
  c.push_back({"ne_out_of_range", one_tensor("t", {uint64_t{1} << 63}, 0, 0),
               "ne[0] = 9223372036854775808 is out of range"});
  c.push_back({"ne_product_overflow", one_tensor("t", {uint64_t{1} << 32, uint64_t{1} << 32}, 0, 0),
               "element count of ne [4294967296, 4294967296] overflows"});
  c.push_back({"byte_size_overflow", one_tensor("t", {uint64_t{1} << 31, uint64_t{1} << 31}, 0, 0),
               "tensor 't': byte size overflows"});
  c.push_back({"row_size_overflow", one_tensor("t", {uint64_t{1} << 61}, 28, 0),
               "tensor 't': row size overflows"});
  c.push_back({"unknown_ggml_type", one_tensor("t", {8}, 99, 0), "unknown ggml type 99"});
  c.push_back({"retired_ggml_type", one_tensor("t", {32}, 4, 0), "unknown ggml type 4"});
  c.push_back({"row_not_whole_q8_0_blocks", one_tensor("t", {33, 2}, 8, 0),
               "row length ne[0] = 33 is not a multiple of the Q8_0 block size 32"});
  c.push_back({"row_not_whole_q4_k_blocks", one_tensor("t", {128, 2}, 12, 0),
               "is not a multiple of the Q4_K block size 256"});
  c.push_back({"duplicate_tensor_name",
               B().header(2, 0)
                   .tensor_info("a", {8}, 0, 0)
                   .tensor_info("a", {8}, 0, 32)
                   .pad_to(32)
                   .zeros(64)
                   .bytes,
               "duplicate tensor name 'a'"});
  c.push_back({"truncated_in_tensor_info", cut(170), "truncated: tensor 'b' type needs 4 bytes"});
  c.push_back({"truncated_in_value", B().header(0, 1).str("key").u32(B::kString).u32(0).bytes,
               "truncated: key 'key' length needs 8 bytes"});
  // ---- offsets and the data section ----
  c.push_back({"misaligned_offset", one_tensor("t", {8}, 0, 4),
               "tensor 't': offset 4 is not a multiple of the alignment 32"});
  c.push_back({"offset_past_eof", one_tensor("t", {8}, 0, 1 << 20),
               "bytes [1048576, 1048608) run past the end of the data section (256 bytes)"});
  c.push_back({"offset_overflow", one_tensor("t", {64}, 0, kMax64 - 31), "+ 256 bytes overflows"});
  c.push_back({"tensor_larger_than_file", one_tensor("t", {1 << 20}, 0, 0, 64),
               "run past the end of the data section"});
  c.push_back({"data_truncated", cut(valid.size() - 10),
               "tensor 'b': bytes [32, 66) run past the end of the data section (56 bytes)"});
  c.push_back({"data_section_missing", B().header(1, 0).tensor_info("t", {8}, 0, 0).bytes,
               "truncated: the data section starts at offset"});
  c.push_back({"overlapping_tensors",
               B().header(2, 0)
                   .tensor_info("a", {16}, 0, 0)
                   .tensor_info("b", {8}, 0, 32)
                   .pad_to(32)
                   .zeros(64)
                   .bytes,
               "tensors 'a' and 'b' overlap"});
  return c;
}

std::string temp_path(const std::string& label) {
  return ::testing::TempDir() + "zimage_gguf_" + std::to_string(getpid()) + "_" + label + ".gguf";
}

TEST(GgufCorrupt, EveryCorruptFileGivesAFormatErrorNamingTheProblem) {
  const std::vector<Case> cases = corpus();
  EXPECT_GE(cases.size(), 30u);
  std::set<std::string> labels;
  for (const Case& k : cases) {
    SCOPED_TRACE(k.label);
    EXPECT_TRUE(labels.insert(k.label).second) << "duplicate label";
    // From a buffer.
    auto h = parse_gguf(k.bytes.data(), k.bytes.size(), k.label + ".gguf");
    ASSERT_FALSE(h.ok()) << "accepted";
    EXPECT_EQ(h.status().code(), ErrorCode::kFormat) << h.status().to_string();
    EXPECT_NE(h.status().message().find(k.expect), std::string::npos)
        << "expected \"" << k.expect << "\" in: " << h.status().message();
    EXPECT_EQ(h.status().message().rfind(k.label + ".gguf: ", 0), 0u) << h.status().message();
    // From a file, through WeightStore::open (the GGUF magic picks the reader). Files without the
    // magic are not GGUF to the store; they are still rejected (by the safetensors reader).
    const std::string path = temp_path(k.label);
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(k.bytes.data()),
               static_cast<std::streamsize>(k.bytes.size()));
    auto ws = WeightStore::open(path);
    ASSERT_FALSE(ws.ok());
    EXPECT_NE(ws.status().message().find(path), std::string::npos) << ws.status().message();
    if (is_gguf_magic(k.bytes.data(), k.bytes.size())) {
      EXPECT_EQ(ws.status().code(), ErrorCode::kFormat) << ws.status().to_string();
      EXPECT_NE(ws.status().message().find(k.expect), std::string::npos) << ws.status().message();
    }
    std::filesystem::remove(path);
  }
  std::printf("[ gguf ] %zu corrupt files rejected with their messages\n", cases.size());
  ::testing::Test::RecordProperty("corrupt_files", static_cast<int>(cases.size()));
}

TEST(GgufCorrupt, EveryTruncationOfAValidFileFails) {
  const std::vector<uint8_t> valid = test::small_valid_gguf();
  ASSERT_TRUE(parse_gguf(valid.data(), valid.size(), "valid.gguf").ok());
  for (size_t n = 0; n < valid.size(); ++n) {
    auto h = parse_gguf(valid.data(), n, "cut.gguf");
    ASSERT_FALSE(h.ok()) << "a file cut to " << n << " bytes was accepted";
    EXPECT_EQ(h.status().code(), ErrorCode::kFormat);
  }
}

// Every single-byte change of the header and infos (four values per byte): an error, or a header
// whose tensors all lie inside the file, aligned and without overlap.
TEST(GgufCorrupt, ByteChangesFailCleanlyOrStayConsistent) {
  const std::vector<uint8_t> valid = test::small_valid_gguf();
  int accepted = 0, rejected = 0;
  auto h0 = parse_gguf(valid.data(), valid.size(), "valid.gguf");
  ASSERT_TRUE(h0.ok());
  for (size_t at = 0; at < h0->data_start; ++at) {
    for (uint8_t v :
         {uint8_t{0}, uint8_t{0xff}, uint8_t{0x80}, static_cast<uint8_t>(valid[at] + 1)}) {
      std::vector<uint8_t> b = valid;
      b[at] = v;
      auto h = parse_gguf(b.data(), b.size(), "flip.gguf");
      if (!h.ok()) {
        EXPECT_EQ(h.status().code(), ErrorCode::kFormat) << h.status().to_string();
        EXPECT_FALSE(h.status().message().empty());
        ++rejected;
        continue;
      }
      ++accepted;
      for (const GgufTensorInfo& t : h->tensors) {
        EXPECT_EQ(t.offset % h->alignment, 0u);
        EXPECT_LE(h->data_start + t.offset + t.bytes, b.size()) << t.name;
      }
    }
  }
  std::printf("[ gguf ] header byte changes: %d rejected, %d accepted (consistent)\n", rejected,
              accepted);
  EXPECT_GT(rejected, 0);
}

// Problems the container is fine with but the weight store is not: a type zimage cannot
// dequantise, a ComfyUI original shape that does not fit, names that collide after renaming.
TEST(GgufCorrupt, StoreLevelProblemsNameTheTensor) {
  struct StoreCase {
    std::string label;
    std::vector<uint8_t> bytes;
    ErrorCode code;
    std::string expect;
  };
  std::vector<StoreCase> cases;
  cases.push_back(
      {"iq4_xs", one_tensor("blk.0.ffn_down.weight", {256}, 23, 0), ErrorCode::kUnsupported,
       "tensor 'blk.0.ffn_down.weight' has type IQ4_XS, which zimage cannot dequantise"});
  {
    B g;
    g.header(1, 1).kv_i32_array("comfy.gguf.orig_shape.t", {3, 3});
    g.tensor_info("t", {8}, 0, 0).pad_to(32).zeros(32);
    cases.push_back({"orig_shape_mismatch", g.bytes, ErrorCode::kFormat,
                     "comfy.gguf.orig_shape.t = [3, 3] does not fit the stored [8]"});
  }
  {
    B g;
    g.header(1, 1).kv_str("comfy.gguf.orig_shape.t", "8");
    g.tensor_info("t", {8}, 0, 0).pad_to(32).zeros(32);
    cases.push_back({"orig_shape_not_array", g.bytes, ErrorCode::kFormat,
                     "is a string, expected an array of integers"});
  }
  {
    B g;
    g.header(2, 1).kv_str("general.architecture", "qwen3");
    g.tensor_info("token_embd.weight", {8}, 0, 0)
        .tensor_info("model.embed_tokens.weight", {8}, 0, 32)
        .pad_to(32)
        .zeros(64);
    cases.push_back({"rename_collision", g.bytes, ErrorCode::kFormat,
                     "tensors 'token_embd.weight' and 'model.embed_tokens.weight' both map to "
                     "'model.embed_tokens.weight'"});
  }
  for (const StoreCase& k : cases) {
    SCOPED_TRACE(k.label);
    const std::string path = temp_path(k.label);
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(k.bytes.data()),
               static_cast<std::streamsize>(k.bytes.size()));
    auto ws = WeightStore::open(path);
    ASSERT_FALSE(ws.ok());
    EXPECT_EQ(ws.status().code(), k.code) << ws.status().to_string();
    EXPECT_NE(ws.status().message().find(k.expect), std::string::npos) << ws.status().message();
    EXPECT_NE(ws.status().message().find(path), std::string::npos) << ws.status().message();
    std::filesystem::remove(path);
  }
}

}  // namespace
}  // namespace zimage

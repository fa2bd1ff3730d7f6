// Writes GGUF bytes field by field, for the reader's tests: a valid small file to start from, and
// the malformed ones (the corrupt corpus, tests/unit/test_gguf_corrupt.cpp) that no well-behaved
// writer would produce. Little-endian, as GGUF is.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace zimage::test {

class GgufBuilder {
 public:
  enum Type : uint32_t {
    kU8 = 0,
    kI8,
    kU16,
    kI16,
    kU32,
    kI32,
    kF32,
    kBool,
    kString,
    kArray,
    kU64,
    kI64,
    kF64
  };

  std::vector<uint8_t> bytes;

  GgufBuilder& u8(uint8_t v) {
    bytes.push_back(v);
    return *this;
  }
  GgufBuilder& u32(uint32_t v) { return le(v, 4); }
  GgufBuilder& u64(uint64_t v) { return le(v, 8); }
  GgufBuilder& f32(float v) {
    uint32_t u;
    std::memcpy(&u, &v, 4);
    return u32(u);
  }
  GgufBuilder& raw(std::string_view s) {
    bytes.insert(bytes.end(), s.begin(), s.end());
    return *this;
  }
  GgufBuilder& str(std::string_view s) { return u64(s.size()).raw(s); }
  GgufBuilder& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    return raw("GGUF").u32(version).u64(n_tensors).u64(n_kv);
  }
  // key + type + value
  GgufBuilder& kv_u32(std::string_view key, uint32_t v) { return str(key).u32(kU32).u32(v); }
  GgufBuilder& kv_str(std::string_view key, std::string_view v) {
    return str(key).u32(kString).str(v);
  }
  GgufBuilder& kv_i32_array(std::string_view key, const std::vector<int32_t>& v) {
    str(key).u32(kArray).u32(kI32).u64(v.size());
    for (int32_t x : v) u32(static_cast<uint32_t>(x));
    return *this;
  }
  GgufBuilder& tensor_info(std::string_view name, const std::vector<uint64_t>& ne, uint32_t type,
                           uint64_t offset) {
    str(name).u32(static_cast<uint32_t>(ne.size()));
    for (uint64_t d : ne) u64(d);
    return u32(type).u64(offset);
  }
  GgufBuilder& pad_to(size_t alignment) {
    while (bytes.size() % alignment) bytes.push_back(0);
    return *this;
  }
  GgufBuilder& zeros(size_t n) {
    bytes.insert(bytes.end(), n, 0);
    return *this;
  }
  GgufBuilder& f32s(const std::vector<float>& v) {
    for (float x : v) f32(x);
    return *this;
  }

 private:
  GgufBuilder& le(uint64_t v, int n) {
    for (int k = 0; k < n; ++k) bytes.push_back(static_cast<uint8_t>(v >> (8 * k)));
    return *this;
  }
};

// A valid file: general.architecture = "zimage-test", general.alignment = 32, tensors "a" (F32
// [2, 4], values 0..7) at offset 0 and "b" (Q8_0, one block: d = 1.0, q = -16..15) at offset 32.
inline std::vector<uint8_t> small_valid_gguf() {
  GgufBuilder g;
  g.header(2, 2).kv_str("general.architecture", "zimage-test").kv_u32("general.alignment", 32);
  g.tensor_info("a", {4, 2}, 0, 0).tensor_info("b", {32}, 8, 32).pad_to(32);
  g.f32s({0, 1, 2, 3, 4, 5, 6, 7});  // 32 bytes
  g.u8(0x00).u8(0x3c);               // f16 1.0
  for (int q = -16; q < 16; ++q) g.u8(static_cast<uint8_t>(static_cast<int8_t>(q)));
  return g.bytes;
}

}  // namespace zimage::test

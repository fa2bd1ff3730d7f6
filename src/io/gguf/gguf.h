// GGUF files (llama.cpp's container, versions 2 and 3, little-endian): validated, memory-mapped.
//
// Layout: "GGUF", u32 version, u64 tensor_count, u64 kv_count; kv_count pairs (string key, u32
// value type, value); tensor_count infos (string name, u32 n_dims, n_dims x u64 ne, u32 ggml
// type, u64 offset); padding to the alignment (`general.alignment`, default 32); the data section.
// Strings are u64 length + bytes; an array is u32 element type + u64 count + elements. ne[] is
// innermost first (ne[0] is the row length), the reverse of PyTorch's shape.
//
// Weight files come from the internet, and the GGUF parser bugs of 2024-25 (llama.cpp CVEs:
// overflowing counts, string lengths and array sizes, unbounded dims, tensor sizes and offsets
// that wrap) are the checklist. Before anything is allocated or read, every count and length is
// checked against the bytes that remain; every size computation is overflow-checked; arrays nest
// at most kMaxGgufArrayDepth deep and are walked, never copied, while parsing; keys and tensor
// names are unique; every tensor has 0-4 dims, a known type, a row length divisible by its block
// size, an aligned offset and a byte range inside the file that overlaps no other tensor. Every
// error names the file, the key or tensor, and what is wrong. parse_gguf works on a plain byte
// buffer so the fuzzer (fuzz/fuzz_gguf.cpp) drives it without files.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "io/fs/mapped_files.h"
#include "io/gguf/gguf_quants.h"

namespace zimage {

inline constexpr uint64_t kGgufDefaultAlignment = 32;
inline constexpr uint64_t kMaxGgufAlignment = 1 << 20;  // 1 MiB
inline constexpr uint64_t kMaxGgufTensors = 1 << 20;    // far above any model (Qwen3-4B: 398)
inline constexpr uint64_t kMaxGgufKeys = 1 << 20;       // tokenizers are arrays under one key
inline constexpr uint64_t kMaxGgufNameBytes = 1 << 16;  // keys and tensor names
inline constexpr int kMaxGgufArrayDepth = 4;            // array of array of ... (4 levels)
inline constexpr uint32_t kMaxGgufDims = 4;

enum class GgufType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};
const char* gguf_type_name(GgufType t);  // "uint32", "string", "array", ...

// One metadata value. Scalars are decoded; a string is copied; an array is described (element
// type, count, where its elements lie in the file) and decoded on request.
struct GgufKv {
  std::string key;
  GgufType type = GgufType::kU8;
  uint64_t u = 0;                      // unsigned integers and bool
  int64_t i = 0;                       // signed integers
  double f = 0;                        // floats
  std::string str;                     // kString
  GgufType elem_type = GgufType::kU8;  // kArray: element type (kArray for nested arrays)
  uint64_t count = 0;                  // kArray: element count
  uint64_t offset = 0;                 // file offset of the value (arrays: of the first element)
  uint64_t bytes = 0;                  // bytes the value occupies from `offset`
};

struct GgufTensorInfo {
  std::string name;
  GgmlType type = GgmlType::kF32;
  std::vector<int64_t> ne;  // innermost first, as stored
  uint64_t offset = 0;      // relative to the data section
  uint64_t bytes = 0;       // stored bytes
  Shape shape() const;      // PyTorch order: ne reversed
  int64_t numel() const;
  int64_t row_length() const { return ne.empty() ? 1 : ne[0]; }
  int64_t rows() const;  // numel / row_length (1 for a scalar)
};

struct GgufHeader {
  uint32_t version = 0;
  uint64_t alignment = kGgufDefaultAlignment;
  uint64_t data_start = 0;  // file offset of the data section
  uint64_t file_size = 0;
  std::vector<GgufKv> kvs;              // in file order
  std::vector<GgufTensorInfo> tensors;  // in file order
};

// Validates a complete GGUF file image of `size` bytes at `data` (null only when size is 0).
// `file` names it in messages. Never reads outside [data, data + size).
Result<GgufHeader> parse_gguf(const uint8_t* data, size_t size,
                              const std::string& file = "<buffer>");

// The zimage dtype of a plain (unquantised) ggml type: F32, F16, BF16, F64, I8..I64; false for the
// block-quantised ones.
bool ggml_plain_dtype(GgmlType t, DType* out);

// True when the bytes start with the GGUF magic.
bool is_gguf_magic(const uint8_t* data, size_t size);
// True when the file at `path` starts with the GGUF magic (false if it cannot be read).
bool file_has_gguf_magic(const std::string& path);

// A tensor's stored blocks: what a device-side dequantisation needs.
struct GgufPackedView {
  GgmlType type = GgmlType::kF32;
  Shape shape;                 // PyTorch order
  int64_t rows = 0, cols = 0;  // cols = the innermost dim (the quantised row), rows the rest
  const void* data = nullptr;  // host bytes inside the mapping
  uint64_t bytes = 0;
};

// A validated GGUF file: memory-mapped (open) or over a caller's buffer (view, for the fuzzer and
// tests; the caller keeps the buffer alive). Tensors returned keep the file alive.
class GgufFile : public std::enable_shared_from_this<GgufFile> {
 public:
  static Result<std::shared_ptr<GgufFile>> open(const std::string& path);
  static Result<std::shared_ptr<GgufFile>> view(const uint8_t* data, size_t size,
                                                const std::string& name);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t file_size() const { return size_; }
  const GgufHeader& header() const { return header_; }
  const std::vector<GgufTensorInfo>& tensors() const { return header_.tensors; }
  const GgufTensorInfo* find_tensor(std::string_view name) const;  // nullptr if absent

  // ---- metadata ----
  const GgufKv* find(std::string_view key) const;  // nullptr if absent
  // NotFound when absent; FormatError naming the key when the type does not fit.
  Result<std::string> get_string(std::string_view key) const;
  Result<int64_t> get_int(std::string_view key) const;   // any integer type that fits int64
  Result<double> get_float(std::string_view key) const;  // f32, f64 or an integer
  Result<bool> get_bool(std::string_view key) const;
  Result<std::vector<int64_t>> get_int_array(std::string_view key) const;
  Result<std::vector<double>> get_float_array(std::string_view key) const;
  Result<std::vector<std::string>> get_string_array(std::string_view key) const;
  // general.architecture, or "" when absent or not a string.
  std::string architecture() const;

  // ---- tensors ----
  // Zero-copy host view of an F32, F16, BF16, F64 or integer tensor in PyTorch order (copied into
  // aligned memory only when the file's alignment leaves it misaligned). Quantised tensors:
  // FormatError pointing to dequantize().
  Result<Tensor> tensor(std::string_view name) const;
  // Any dequantizable tensor as an owned host f32 tensor (PyTorch order); rows run on `pool`.
  Result<Tensor> dequantize(std::string_view name, ThreadPool* pool = nullptr) const;
  // The stored blocks of `name`.
  Result<GgufPackedView> packed(std::string_view name) const;

 private:
  GgufFile() = default;
  Status build_index();

  std::string path_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  bool mapped_ = false;
  MappedFileRegistration registration_;  // lets the read-ahead's gate find this mapping
  GgufHeader header_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
  std::map<std::string, size_t, std::less<>> kv_index_;
};

}  // namespace zimage

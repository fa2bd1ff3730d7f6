// GGUF parsing and validation (see gguf.h for the rules). The parser is a bounds-checked cursor:
// every read first checks the bytes that remain, so no length, count or offset from the file is
// trusted before it has been compared with the file.
#include "io/gguf/gguf.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <new>
#include <numeric>

#include "io/fs/file_io.h"
#include "io/gguf/gguf_internal.h"
#include "io/fs/json_util.h"

namespace zimage {
namespace {

using namespace gguf_detail;  // NOLINT: the helpers read as this file's vocabulary

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "GGUF is read as little-endian");

constexpr uint8_t kMagic[4] = {'G', 'G', 'U', 'F'};

// A bounds-checked reader over [data, data + size).
class Cursor {
 public:
  Cursor(const uint8_t* data, uint64_t size, const std::string& file)
      : data_(data), size_(size), file_(file) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }
  const uint8_t* here() const { return data_ + pos_; }
  const std::string& file() const { return file_; }

  // Fails (naming `what`) unless n more bytes exist.
  Status need(uint64_t n, const std::string& what) const {
    if (n <= remaining()) return Status::Ok();
    return FormatError(file_ + ": truncated: " + what + " needs " + std::to_string(n) +
                       " bytes at offset " + std::to_string(pos_) + ", only " +
                       std::to_string(remaining()) + " remain");
  }
  void skip(uint64_t n) { pos_ += n; }  // after need()
  Status u32(uint32_t* v, const std::string& what) {
    ZI_TRY(need(4, what));
    *v = static_cast<uint32_t>(load_uint(here(), 4));
    pos_ += 4;
    return Status::Ok();
  }
  Status u64(uint64_t* v, const std::string& what) {
    ZI_TRY(need(8, what));
    *v = load_uint(here(), 8);
    pos_ += 8;
    return Status::Ok();
  }
  // A string: u64 length, then that many bytes (returned as a view into the buffer).
  Status str(std::string_view* v, uint64_t max_len, const std::string& what) {
    uint64_t len = 0;
    ZI_TRY(u64(&len, what + " length"));
    if (len > remaining()) {
      return FormatError(file_ + ": " + what + ": string length " + std::to_string(len) +
                         " runs past the end of the file (" + std::to_string(remaining()) +
                         " bytes remain at offset " + std::to_string(pos_) + ")");
    }
    if (len > max_len) {
      return FormatError(file_ + ": " + what + ": string length " + std::to_string(len) +
                         " exceeds the limit of " + std::to_string(max_len) + " bytes");
    }
    *v = std::string_view(reinterpret_cast<const char*>(here()), static_cast<size_t>(len));
    pos_ += len;
    return Status::Ok();
  }

 private:
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
  const std::string& file_;
};

// Where a value sits, for messages: the key and the element index at each array level. The text
// is built only when there is an error (a tokenizer array has 150k elements).
struct ValuePath {
  std::string_view key;
  int depth = 0;
  uint64_t index[kMaxGgufArrayDepth] = {};
  std::string describe() const {
    std::string out = "key " + in_quotes(key);
    for (int d = 0; d < depth; ++d) out += " element " + std::to_string(index[d]);
    return out;
  }
};

// Walks one value of type `t` (arrays to any allowed depth), validating it.
Status walk_value(Cursor& c, GgufType t, ValuePath& path) {
  const uint64_t fs = fixed_size(t);
  if (fs) {
    ZI_TRY(c.need(fs, path.describe()));
    if (t == GgufType::kBool && *c.here() > 1) {
      return FormatError(c.file() + ": " + path.describe() + ": bool value " +
                         std::to_string(*c.here()) + " is neither 0 nor 1");
    }
    c.skip(fs);
    return Status::Ok();
  }
  if (t == GgufType::kString) {
    if (c.remaining() >= 8) {  // the common case, without building a message
      const uint64_t len = load_uint(c.here(), 8);
      if (len <= c.remaining() - 8) {
        c.skip(8 + len);
        return Status::Ok();
      }
    }
    std::string_view s;
    return c.str(&s, std::numeric_limits<uint64_t>::max(), path.describe());
  }
  // Array: element type, count, elements.
  if (path.depth >= kMaxGgufArrayDepth) {
    return FormatError(c.file() + ": " + path.describe() + ": arrays nested more than " +
                       std::to_string(kMaxGgufArrayDepth) + " deep");
  }
  uint32_t et = 0;
  uint64_t count = 0;
  ZI_TRY(c.u32(&et, path.describe() + " array element type"));
  if (!known_value_type(et)) {
    return FormatError(c.file() + ": " + path.describe() + ": unknown array element type " +
                       std::to_string(et));
  }
  ZI_TRY(c.u64(&count, path.describe() + " array count"));
  const GgufType elem = static_cast<GgufType>(et);
  // Every element takes at least this many bytes (a string its length, an array its type and
  // count), so the count cannot exceed remaining / min_elem.
  const uint64_t min_elem =
      fixed_size(elem) ? fixed_size(elem) : (elem == GgufType::kString ? 8 : 12);
  if (count > c.remaining() / min_elem) {
    return FormatError(c.file() + ": " + path.describe() + ": array of " + std::to_string(count) +
                       " " + gguf_type_name(elem) + " elements cannot fit in the " +
                       std::to_string(c.remaining()) + " bytes that remain");
  }
  if (fixed_size(elem) && elem != GgufType::kBool) {
    c.skip(count * min_elem);  // count * min_elem <= remaining: no overflow
    return Status::Ok();
  }
  const int d = path.depth++;
  for (uint64_t k = 0; k < count; ++k) {
    path.index[d] = k;
    ZI_TRY(walk_value(c, elem, path));
  }
  --path.depth;
  return Status::Ok();
}

Status parse_kv(Cursor& c, uint64_t index, GgufKv* kv) {
  const std::string what = "key #" + std::to_string(index);
  std::string_view key;
  ZI_TRY(c.str(&key, kMaxGgufNameBytes, what + " name"));
  if (key.empty()) return FormatError(c.file() + ": " + what + " has an empty name");
  kv->key = std::string(key);
  const std::string where = "key " + in_quotes(key);
  uint32_t t = 0;
  ZI_TRY(c.u32(&t, where + " value type"));
  if (!known_value_type(t)) {
    return FormatError(c.file() + ": " + where + ": unknown value type " + std::to_string(t));
  }
  kv->type = static_cast<GgufType>(t);
  const uint64_t start = c.pos();
  if (kv->type == GgufType::kArray) {
    // Peek the element type and count (walk_value re-reads and validates them).
    if (c.remaining() >= 12) {
      kv->elem_type = static_cast<GgufType>(load_uint(c.here(), 4));
      kv->count = load_uint(c.here() + 4, 8);
    }
  }
  const uint8_t* p = c.here();
  ValuePath path{key};
  ZI_TRY(walk_value(c, kv->type, path));
  kv->offset = kv->type == GgufType::kArray ? start + 12 : start;
  kv->bytes = c.pos() - kv->offset;
  const uint64_t fs = fixed_size(kv->type);
  if (kv->type == GgufType::kString) {
    kv->str.assign(reinterpret_cast<const char*>(p + 8), static_cast<size_t>(kv->bytes - 8));
    kv->offset = start + 8;
    kv->bytes -= 8;
  } else if (kv->type == GgufType::kF32 || kv->type == GgufType::kF64) {
    kv->f = load_float(p, kv->type);
  } else if (is_integer(kv->type) || kv->type == GgufType::kBool) {
    if (is_signed(kv->type)) {
      kv->i = load_int(p, fs);
    } else {
      kv->u = load_uint(p, fs);
    }
  }
  return Status::Ok();
}

Status parse_tensor_info(Cursor& c, uint64_t index, GgufTensorInfo* ti) {
  const std::string what = "tensor #" + std::to_string(index);
  std::string_view name;
  ZI_TRY(c.str(&name, kMaxGgufNameBytes, what + " name"));
  if (name.empty()) return FormatError(c.file() + ": " + what + " has an empty name");
  ti->name = std::string(name);
  const std::string where = c.file() + ": tensor " + in_quotes(name) + ": ";
  uint32_t n_dims = 0;
  ZI_TRY(c.u32(&n_dims, "tensor " + in_quotes(name) + " n_dims"));
  if (n_dims > kMaxGgufDims) {
    return FormatError(where + "n_dims " + std::to_string(n_dims) + " exceeds the maximum of " +
                       std::to_string(kMaxGgufDims));
  }
  ti->ne.resize(n_dims);
  for (uint32_t d = 0; d < n_dims; ++d) {
    uint64_t v = 0;
    ZI_TRY(c.u64(&v, "tensor " + in_quotes(name) + " ne[" + std::to_string(d) + "]"));
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return FormatError(where + "ne[" + std::to_string(d) + "] = " + std::to_string(v) +
                         " is out of range");
    }
    ti->ne[d] = static_cast<int64_t>(v);
  }
  uint32_t type = 0;
  ZI_TRY(c.u32(&type, "tensor " + in_quotes(name) + " type"));
  const GgmlTypeInfo* info = ggml_type_info(type);
  if (!info) {
    return FormatError(where + "unknown ggml type " + std::to_string(type));
  }
  ti->type = static_cast<GgmlType>(type);
  ZI_TRY(c.u64(&ti->offset, "tensor " + in_quotes(name) + " offset"));

  // Element count and bytes with checked multiplication.
  int64_t numel = 1;
  for (int64_t d : ti->ne) {
    if (__builtin_mul_overflow(numel, d, &numel)) {
      std::string dims;
      for (int64_t x : ti->ne) dims += (dims.empty() ? "" : ", ") + std::to_string(x);
      return FormatError(where + "element count of ne [" + dims + "] overflows");
    }
  }
  const int64_t row = ti->row_length();
  if (row % info->block_size != 0) {
    return FormatError(where + "row length ne[0] = " + std::to_string(row) +
                       " is not a multiple of the " + info->name + " block size " +
                       std::to_string(info->block_size));
  }
  uint64_t row_bytes = 0;
  if (!ggml_row_bytes(ti->type, row, &row_bytes)) {
    return FormatError(where + "row size overflows");
  }
  const uint64_t rows = row == 0 ? 0 : static_cast<uint64_t>(numel / row);
  if (__builtin_mul_overflow(row_bytes, rows, &ti->bytes)) {
    return FormatError(where + "byte size overflows");
  }
  return Status::Ok();
}

}  // namespace

const char* gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::kU8:
      return "uint8";
    case GgufType::kI8:
      return "int8";
    case GgufType::kU16:
      return "uint16";
    case GgufType::kI16:
      return "int16";
    case GgufType::kU32:
      return "uint32";
    case GgufType::kI32:
      return "int32";
    case GgufType::kF32:
      return "float32";
    case GgufType::kBool:
      return "bool";
    case GgufType::kString:
      return "string";
    case GgufType::kArray:
      return "array";
    case GgufType::kU64:
      return "uint64";
    case GgufType::kI64:
      return "int64";
    case GgufType::kF64:
      return "float64";
  }
  return "unknown";
}

Shape GgufTensorInfo::shape() const {
  return Shape(ne.rbegin(), ne.rend());
}

int64_t GgufTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;  // checked when parsed
  return n;
}

int64_t GgufTensorInfo::rows() const {
  const int64_t r = row_length();
  return r == 0 ? 0 : numel() / r;
}

bool is_gguf_magic(const uint8_t* data, size_t size) {
  return size >= 4 && std::memcmp(data, kMagic, 4) == 0;
}

bool file_has_gguf_magic(const std::string& path) {
  auto fd = open_input_file(path);
  if (!fd.ok()) return false;
  uint8_t buf[4];
  const ssize_t n = ::pread(fd->get(), buf, 4, 0);
  return n == 4 && is_gguf_magic(buf, 4);
}

Result<GgufHeader> parse_gguf(const uint8_t* data, size_t size, const std::string& file) try {
  Cursor c(data, size, file);
  if (size < 4) {
    return FormatError(file + ": not a GGUF file: " + std::to_string(size) +
                       " bytes, too short for the magic");
  }
  if (!is_gguf_magic(data, size)) {
    std::string got(reinterpret_cast<const char*>(data), 4);
    return FormatError(file + ": not a GGUF file: bad magic " + in_quotes(got) +
                       " (expected 'GGUF')");
  }
  c.skip(4);
  GgufHeader h;
  h.file_size = size;
  ZI_TRY(c.u32(&h.version, "the version"));
  if (h.version == 0x02000000u || h.version == 0x03000000u) {
    return FormatError(file + ": big-endian GGUF files are not supported");
  }
  if (h.version != 2 && h.version != 3) {
    return FormatError(file + ": unsupported GGUF version " + std::to_string(h.version) +
                       " (zimage reads versions 2 and 3)");
  }
  uint64_t n_tensors = 0, n_kv = 0;
  ZI_TRY(c.u64(&n_tensors, "the tensor count"));
  ZI_TRY(c.u64(&n_kv, "the metadata key count"));
  // Each key takes at least 13 bytes (length, type, a 1-byte value); each tensor info 24.
  if (n_kv > kMaxGgufKeys || n_kv > c.remaining() / 13) {
    return FormatError(file + ": metadata key count " + std::to_string(n_kv) +
                       " cannot fit in the file (" + std::to_string(c.remaining()) +
                       " bytes remain, limit " + std::to_string(kMaxGgufKeys) + " keys)");
  }
  if (n_tensors > kMaxGgufTensors || n_tensors > c.remaining() / 24) {
    return FormatError(file + ": tensor count " + std::to_string(n_tensors) +
                       " cannot fit in the file (" + std::to_string(c.remaining()) +
                       " bytes remain, limit " + std::to_string(kMaxGgufTensors) + " tensors)");
  }

  std::map<std::string_view, uint64_t> seen_keys;
  for (uint64_t k = 0; k < n_kv; ++k) {
    GgufKv kv;
    ZI_TRY(parse_kv(c, k, &kv));
    h.kvs.push_back(std::move(kv));
  }
  for (uint64_t k = 0; k < h.kvs.size(); ++k) {
    auto [it, inserted] = seen_keys.emplace(h.kvs[k].key, k);
    if (!inserted) {
      return FormatError(file + ": duplicate metadata key " + in_quotes(h.kvs[k].key) + " (#" +
                         std::to_string(it->second) + " and #" + std::to_string(k) + ")");
    }
  }
  auto align_it = seen_keys.find("general.alignment");
  if (align_it != seen_keys.end()) {
    const GgufKv& kv = h.kvs[align_it->second];
    if (kv.type != GgufType::kU32) {
      return FormatError(file + ": key 'general.alignment' is a " +
                         std::string(gguf_type_name(kv.type)) + ", expected a uint32");
    }
    if (kv.u == 0 || (kv.u & (kv.u - 1)) != 0) {
      return FormatError(file + ": general.alignment " + std::to_string(kv.u) +
                         " is not a power of two");
    }
    if (kv.u > kMaxGgufAlignment) {
      return FormatError(file + ": general.alignment " + std::to_string(kv.u) +
                         " exceeds the limit of " + std::to_string(kMaxGgufAlignment));
    }
    h.alignment = kv.u;
  }

  for (uint64_t k = 0; k < n_tensors; ++k) {
    GgufTensorInfo ti;
    ZI_TRY(parse_tensor_info(c, k, &ti));
    h.tensors.push_back(std::move(ti));
  }
  std::map<std::string_view, uint64_t> seen_names;
  for (uint64_t k = 0; k < h.tensors.size(); ++k) {
    auto [it, inserted] = seen_names.emplace(h.tensors[k].name, k);
    if (!inserted) {
      return FormatError(file + ": duplicate tensor name " + in_quotes(h.tensors[k].name) + " (#" +
                         std::to_string(it->second) + " and #" + std::to_string(k) + ")");
    }
  }

  // The data section starts at the next multiple of the alignment (pos <= size, alignment
  // <= 1 MiB: no overflow).
  h.data_start = (c.pos() + h.alignment - 1) / h.alignment * h.alignment;
  const uint64_t data_bytes = h.data_start <= size ? size - h.data_start : 0;
  if (!h.tensors.empty() && h.data_start > size) {
    return FormatError(file + ": truncated: the data section starts at offset " +
                       std::to_string(h.data_start) + " but the file has " + std::to_string(size) +
                       " bytes");
  }
  for (const GgufTensorInfo& ti : h.tensors) {
    const std::string where = file + ": tensor " + in_quotes(ti.name) + ": ";
    if (ti.offset % h.alignment != 0) {
      return FormatError(where + "offset " + std::to_string(ti.offset) +
                         " is not a multiple of the alignment " + std::to_string(h.alignment));
    }
    uint64_t end = 0;
    if (__builtin_add_overflow(ti.offset, ti.bytes, &end)) {
      return FormatError(where + "offset " + std::to_string(ti.offset) + " + " +
                         std::to_string(ti.bytes) + " bytes overflows");
    }
    if (end > data_bytes) {
      return FormatError(where + "bytes [" + std::to_string(ti.offset) + ", " +
                         std::to_string(end) + ") run past the end of the data section (" +
                         std::to_string(data_bytes) + " bytes)");
    }
  }
  // No two tensors share bytes.
  std::vector<size_t> order(h.tensors.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return h.tensors[a].offset < h.tensors[b].offset; });
  for (size_t k = 1; k < order.size(); ++k) {
    const GgufTensorInfo& prev = h.tensors[order[k - 1]];
    const GgufTensorInfo& cur = h.tensors[order[k]];
    if (prev.bytes > 0 && cur.bytes > 0 && cur.offset < prev.offset + prev.bytes) {
      return FormatError(file + ": tensors " + in_quotes(prev.name) + " and " +
                         in_quotes(cur.name) + " overlap (bytes [" + std::to_string(prev.offset) +
                         ", " + std::to_string(prev.offset + prev.bytes) + ") and [" +
                         std::to_string(cur.offset) + ", " +
                         std::to_string(cur.offset + cur.bytes) + "))");
    }
  }
  return h;
} catch (const std::bad_alloc&) {
  return OutOfMemory(file + ": out of memory while reading the GGUF header");
}

}  // namespace zimage

// See gguf_writer.h. Layout (GGUF v3): magic "GGUF", u32 version, u64 tensor count, u64 KV count,
// the KVs (u64-length strings, u32 value type, value), the tensor infos (name, u32 n_dims, u64
// ne[n_dims], u32 type, u64 offset from the data start), padding to the alignment, the data.
#include "io/gguf/gguf_writer.h"

#include <cstring>
#include <set>

namespace zimage {
namespace {

constexpr uint64_t kAlign = 32;

void put_u32(std::string& s, uint32_t v) {
  s.append(reinterpret_cast<const char*>(&v), 4);
}
void put_u64(std::string& s, uint64_t v) {
  s.append(reinterpret_cast<const char*>(&v), 8);
}
void put_str(std::string& s, const std::string& v) {
  put_u64(s, v.size());
  s += v;
}

uint64_t align_up(uint64_t v) {
  return (v + kAlign - 1) / kAlign * kAlign;
}

}  // namespace

Result<std::unique_ptr<GgufWriter>> GgufWriter::create(const std::string& path,
                                                       const GgufWriteMetadata& metadata,
                                                       std::vector<GgufWriteTensor> tensors) {
  std::unique_ptr<GgufWriter> w(new GgufWriter());
  w->path_ = path;
  std::string head = "GGUF";
  put_u32(head, 3);
  put_u64(head, tensors.size());
  put_u64(head, metadata.strings.size() + metadata.u32s.size() + 1);
  put_str(head, "general.alignment");
  put_u32(head, 4);  // uint32
  put_u32(head, static_cast<uint32_t>(kAlign));
  for (const auto& [k, v] : metadata.strings) {
    put_str(head, k);
    put_u32(head, 8);  // string
    put_str(head, v);
  }
  for (const auto& [k, v] : metadata.u32s) {
    put_str(head, k);
    put_u32(head, 4);
    put_u32(head, v);
  }
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const GgufWriteTensor& t : tensors) {
    if (t.name.empty() || !names.insert(t.name).second)
      return InvalidArgument(path + ": GGUF tensor name '" + t.name + "' is empty or repeated");
    if (t.shape.empty() || t.shape.size() > 4)
      return InvalidArgument(path + ": GGUF tensor '" + t.name + "' has shape " +
                             shape_string(t.shape) + " (1 to 4 dimensions)");
    uint64_t row = 0;
    if (!ggml_row_bytes(t.type, t.shape.back(), &row))
      return InvalidArgument(path + ": tensor '" + t.name + "' " + shape_string(t.shape) +
                             ": rows of " + std::to_string(t.shape.back()) +
                             " elements do not fit " + ggml_type_name(t.type) + " blocks");
    const uint64_t rows = static_cast<uint64_t>(shape_numel(t.shape) / t.shape.back());
    w->bytes_.push_back(row * rows);
    put_str(head, t.name);
    put_u32(head, static_cast<uint32_t>(t.shape.size()));
    for (size_t d = t.shape.size(); d-- > 0;) put_u64(head, static_cast<uint64_t>(t.shape[d]));
    put_u32(head, static_cast<uint32_t>(t.type));
    put_u64(head, offset);
    offset = align_up(offset + row * rows);
  }
  head.resize(align_up(head.size()), '\0');
  ZI_ASSIGN_OR_RETURN(w->out_, OutputFile::create(path));
  ZI_TRY(w->out_->write(head.data(), head.size()));
  return w;
}

Status GgufWriter::pad_to_next() {
  static const char zeros[kAlign] = {};
  const uint64_t pad = align_up(bytes_[current_]) - bytes_[current_];
  if (pad) ZI_TRY(out_->write(zeros, pad));
  ++current_;
  written_in_current_ = 0;
  return Status::Ok();
}

Status GgufWriter::write(const void* data, size_t size) {
  if (current_ >= bytes_.size() || written_in_current_ + size > bytes_[current_])
    return InternalError(path_ + ": GGUF write of " + std::to_string(size) +
                         " bytes past the declared tensor " + std::to_string(current_));
  ZI_TRY(out_->write(data, size));
  written_in_current_ += size;
  if (written_in_current_ == bytes_[current_]) ZI_TRY(pad_to_next());
  return Status::Ok();
}

Status GgufWriter::finish() {
  // Zero-byte tensors need no write call.
  while (current_ < bytes_.size() && bytes_[current_] == 0) ZI_TRY(pad_to_next());
  if (current_ != bytes_.size())
    return InternalError(path_ + ": GGUF tensor " + std::to_string(current_) + " of " +
                         std::to_string(bytes_.size()) + " not fully written");
  return out_->commit();
}

}  // namespace zimage

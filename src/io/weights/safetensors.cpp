// safetensors validation, mapping and streaming writer (see safetensors.h for the rules).
#include "io/weights/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <set>
#include <string_view>

#include "io/fs/json_util.h"

namespace zimage {
namespace {

using nlohmann::json;

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors data is little-endian");

std::string in_quotes(const std::string& s) {
  std::string out(1, '\'');
  out += json_util::printable(s);
  out += '\'';
  return out;
}

std::string offsets_string(uint64_t b, uint64_t e) {
  std::string out(1, '[');
  out += std::to_string(b);
  out += ", ";
  out += std::to_string(e);
  out += ']';
  return out;
}

// Reads a JSON integer as uint64 (non-negative); false for anything else.
bool as_u64(const json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer() && v.get<int64_t>() >= 0) {
    *out = static_cast<uint64_t>(v.get<int64_t>());
    return true;
  }
  return false;
}

Status parse_metadata(const json& v, const std::string& file,
                      std::map<std::string, std::string>* out) {
  if (v.is_null()) return Status::Ok();
  if (!v.is_object()) {
    return FormatError(file + ": '__metadata__' is a " + json_util::type_name(v) +
                       ", expected an object mapping strings to strings");
  }
  for (const auto& [k, val] : v.items()) {
    if (!val.is_string()) {
      return FormatError(file + ": '__metadata__' value of key " + in_quotes(k) + " is a " +
                         json_util::type_name(val) + ", expected a string");
    }
    (*out)[k] = val.get<std::string>();
  }
  return Status::Ok();
}

Status parse_tensor_entry(const std::string& name, const json& v, const std::string& file,
                          SafetensorsTensorInfo* info) {
  const std::string where = file + ": tensor " + in_quotes(name) + ": ";
  if (!v.is_object()) {
    return FormatError(where + "entry is a " + json_util::type_name(v) +
                       ", expected an object with dtype, shape and data_offsets");
  }
  for (const auto& [k, unused] : v.items()) {
    (void)unused;
    if (k != "dtype" && k != "shape" && k != "data_offsets") {
      return FormatError(where + "unexpected field " + in_quotes(k) +
                         " (allowed: dtype, shape, data_offsets)");
    }
  }
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    if (!v.contains(field)) return FormatError(where + "missing field '" + field + "'");
  }
  info->name = name;

  const json& dt = v["dtype"];
  if (!dt.is_string()) {
    return FormatError(where + "dtype is a " + json_util::type_name(dt) + ", expected a string");
  }
  const std::string dt_name = dt.get<std::string>();
  const auto dtype = dtype_from_safetensors(dt_name);
  if (!dtype) {
    return FormatError(where + "unknown dtype " + in_quotes(dt_name) +
                       " (zimage reads F64, F32, F16, BF16, F8_E4M3, F8_E5M2, I64, I32, I16, I8, "
                       "U8, BOOL)");
  }
  info->dtype = *dtype;

  const json& shape = v["shape"];
  if (!shape.is_array()) {
    return FormatError(where + "shape is a " + json_util::type_name(shape) + ", expected a list");
  }
  // Element count with checked multiplication, in the same order and range as shape_numel().
  int64_t numel = 1;
  bool overflow = false;
  info->shape.clear();
  for (size_t i = 0; i < shape.size(); ++i) {
    const json& d = shape[i];
    uint64_t u = 0;
    if (!d.is_number_integer()) {
      return FormatError(where + "shape[" + std::to_string(i) + "] is " + d.dump() +
                         ", expected a non-negative integer");
    }
    if (!as_u64(d, &u)) {
      return FormatError(where + "negative dimension " + d.dump() + " in shape " + shape.dump());
    }
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return FormatError(where + "dimension " + d.dump() + " in shape " + shape.dump() +
                         " is too large");
    }
    const int64_t dim = static_cast<int64_t>(u);
    if (!overflow && dim != 0 && numel > std::numeric_limits<int64_t>::max() / dim) overflow = true;
    if (!overflow) numel *= dim;
    info->shape.push_back(dim);
  }
  if (overflow) {
    return FormatError(where + "shape " + shape.dump() + " has too many elements (overflow)");
  }
  const uint64_t elem = dtype_size(info->dtype);
  const uint64_t n = static_cast<uint64_t>(numel);
  if (n != 0 && elem > std::numeric_limits<uint64_t>::max() / n) {
    return FormatError(where + "shape " + shape.dump() + " of " + dt_name +
                       " has too many bytes (overflow)");
  }
  const uint64_t need = n * elem;

  const json& off = v["data_offsets"];
  if (!off.is_array() || off.size() != 2) {
    return FormatError(where + "data_offsets is " + off.dump() + ", expected [begin, end]");
  }
  if (!as_u64(off[0], &info->begin) || !as_u64(off[1], &info->end)) {
    return FormatError(where + "data_offsets " + off.dump() + " must be two non-negative integers");
  }
  if (info->begin > info->end) {
    return FormatError(where + "data_offsets " + offsets_string(info->begin, info->end) +
                       " are reversed (begin > end)");
  }
  if (info->end - info->begin != need) {
    return FormatError(where + "data_offsets " + offsets_string(info->begin, info->end) +
                       " but shape " + shape_string(info->shape) + " of " + dt_name + " needs " +
                       std::to_string(need) + " bytes");
  }
  return Status::Ok();
}

Result<SafetensorsHeader> parse_header_impl(const uint8_t* data, size_t size,
                                            const std::string& file) {
  if (size == 0 || data == nullptr) {
    return FormatError(file + ": file is empty (expected an 8-byte header length)");
  }
  if (size < 8) {
    return FormatError(file + ": file is " + std::to_string(size) +
                       " bytes, too short for the 8-byte header length");
  }
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(data[i]) << (8 * i);
  if (n > kMaxSafetensorsHeaderBytes) {
    return FormatError(file + ": header length " + std::to_string(n) + " exceeds the limit of " +
                       std::to_string(kMaxSafetensorsHeaderBytes) + " bytes");
  }
  if (n > size - 8) {
    return FormatError(file + ": header length " + std::to_string(n) +
                       " exceeds the file size (8 + " + std::to_string(n) + " > " +
                       std::to_string(size) + " bytes; truncated file?)");
  }
  if (n == 0 || data[8] != '{') {
    return FormatError(file + ": header does not start with '{' (not a safetensors file?)");
  }
  SafetensorsHeader h;
  h.header_bytes = n;
  h.data_start = 8 + n;
  h.data_bytes = size - 8 - n;

  const std::string_view text(reinterpret_cast<const char*>(data + 8), n);
  ZI_ASSIGN_OR_RETURN(json root, json_util::parse_strict(text, file + ": header"));
  if (!root.is_object()) {
    return FormatError(file + ": header is a JSON " + json_util::type_name(root) +
                       ", expected an object");
  }
  h.tensors.reserve(root.size());
  for (const auto& [key, val] : root.items()) {
    if (key == "__metadata__") {
      ZI_TRY(parse_metadata(val, file, &h.metadata));
      continue;
    }
    SafetensorsTensorInfo info;
    ZI_TRY(parse_tensor_entry(key, val, file, &info));
    if (info.end > h.data_bytes) {
      return FormatError(file + ": tensor " + in_quotes(key) + ": data_offsets " +
                         offsets_string(info.begin, info.end) +
                         " extend past the data section of " + std::to_string(h.data_bytes) +
                         " bytes (truncated file?)");
    }
    h.tensors.push_back(std::move(info));
  }

  // The data must be laid out contiguously from 0, no holes, no overlaps, nothing left over.
  std::sort(h.tensors.begin(), h.tensors.end(),
            [](const SafetensorsTensorInfo& a, const SafetensorsTensorInfo& b) {
              if (a.begin != b.begin) return a.begin < b.begin;
              if (a.end != b.end) return a.end < b.end;
              return a.name < b.name;
            });
  uint64_t covered = 0;
  const SafetensorsTensorInfo* prev = nullptr;
  for (const SafetensorsTensorInfo& t : h.tensors) {
    if (t.begin > covered) {
      return FormatError(file + ": hole of " + std::to_string(t.begin - covered) +
                         " bytes in the data section before tensor " + in_quotes(t.name) +
                         " (data_offsets " + offsets_string(t.begin, t.end) +
                         ", previous data ends at " + std::to_string(covered) + ")");
    }
    if (t.begin < covered) {
      return FormatError(file + ": tensor " + in_quotes(t.name) + " (data_offsets " +
                         offsets_string(t.begin, t.end) + ") overlaps tensor " +
                         in_quotes(prev->name) + " (data_offsets " +
                         offsets_string(prev->begin, prev->end) + ")");
    }
    covered = t.end;
    prev = &t;
  }
  if (covered != h.data_bytes) {
    return FormatError(file + ": data section is " + std::to_string(h.data_bytes) +
                       " bytes but the tensors cover " + std::to_string(covered) + " (" +
                       std::to_string(h.data_bytes - covered) + " trailing bytes)");
  }
  return h;
}

}  // namespace

Result<SafetensorsHeader> parse_safetensors_header(const uint8_t* data, size_t size,
                                                   const std::string& file) {
  try {
    return parse_header_impl(data, size, file);
  } catch (const std::bad_alloc&) {
    return OutOfMemory(file + ": out of memory while reading the header");
  } catch (const std::exception& e) {
    return FormatError(file + ": invalid header: " + e.what());
  }
}

// ---- SafetensorsFile ---------------------------------------------------------------------------

Result<std::shared_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  // Non-blocking open and a file-type check before anything is read: a FIFO here must not hang.
  uint64_t file_size = 0;
  ZI_ASSIGN_OR_RETURN(ScopedFd opened, open_input_file(path, &file_size));
  const int fd = opened.release();
  std::shared_ptr<SafetensorsFile> file(new (std::nothrow) SafetensorsFile());
  if (!file) {
    ::close(fd);
    return OutOfMemory(path + ": out of memory");
  }
  file->path_ = path;
  file->size_ = file_size;
  if (file->size_ > 0) {
    // A plain lazy mapping, no madvise. Measured on Linux 6.18 with a 1 GiB file in the page
    // cache: MAP_POPULATE costs 2 ms (file read back from disk, large page-cache folios) to
    // 35 ms (file just written, 4 KiB pages) per GiB, serially on the opening thread and on the
    // CPU path too (20 GiB: up to 0.7 s before anything else runs). It saves up to 70 ms/GiB of
    // page faults on a single thread, but the CUDA uploader's copy threads take those faults in
    // parallel. MADV_WILLNEED costs 0.05 ms but the kernel caps
    // it at the readahead window (8 MiB of an evicted 1 GiB file), so it does not prefetch a
    // file. MADV_SEQUENTIAL only changes readahead of files not in the page cache, and makes
    // reclaim ignore accesses through this mapping: the weights would leave the page cache
    // sooner and the next load would read the disk.
    void* p = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return IoError(path + ": cannot memory-map " + std::to_string(file->size_) +
                     " bytes: " + std::strerror(err));
    }
    file->base_ = static_cast<const uint8_t*>(p);
    file->registration_ = MappedFileRegistration(p, file->size_, fd);
  }
  ::close(fd);  // the mapping stays valid

  ZI_ASSIGN_OR_RETURN(file->header_, parse_safetensors_header(file->base_, file->size_, path));
  for (size_t i = 0; i < file->header_.tensors.size(); ++i) {
    file->index_.emplace(file->header_.tensors[i].name, i);
  }
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  registration_ = MappedFileRegistration();  // no longer found before the address is reused
  if (base_) ::munmap(const_cast<uint8_t*>(base_), size_);
}

const SafetensorsTensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

Result<Tensor> SafetensorsFile::tensor(const std::string& name) const {
  const SafetensorsTensorInfo* info = find(name);
  if (!info) return NotFound(path_ + ": no tensor named " + in_quotes(name));
  const uint8_t* p = base_ + header_.data_start + info->begin;
  const size_t bytes = static_cast<size_t>(info->nbytes());
  if (reinterpret_cast<uintptr_t>(p) % dtype_size(info->dtype) != 0) {
    Tensor copy = Tensor::host(info->dtype, info->shape);
    if (!copy.defined()) {
      return OutOfMemory(path_ + ": tensor " + in_quotes(name) + ": out of memory copying " +
                         std::to_string(bytes) + " unaligned bytes");
    }
    if (bytes) std::memcpy(copy.data(), p, bytes);
    return copy;
  }
  std::shared_ptr<void> keep_alive = std::const_pointer_cast<SafetensorsFile>(shared_from_this());
  auto storage = std::make_shared<BorrowedStorage>(const_cast<uint8_t*>(p), bytes, Device::kCPU,
                                                   std::move(keep_alive));
  return Tensor(std::move(storage), 0, info->dtype, info->shape);
}

// ---- writer -----------------------------------------------------------------------------------

Result<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::create(
    const std::string& path, std::vector<SafetensorsEntry> tensors,
    const std::map<std::string, std::string>& metadata) {
  std::string text;
  uint64_t offset = 0;
  try {
    json h = json::object();
    if (!metadata.empty()) h["__metadata__"] = metadata;
    std::set<std::string> seen;
    for (const SafetensorsEntry& t : tensors) {
      if (t.name == "__metadata__") {
        return InvalidArgument(path + ": '__metadata__' cannot be a tensor name");
      }
      if (!seen.insert(t.name).second) {
        return InvalidArgument(path + ": tensor " + in_quotes(t.name) + " is listed twice");
      }
      const int64_t numel = shape_numel(t.shape);
      const uint64_t elem = dtype_size(t.dtype);
      if (numel < 0 || (numel > 0 && elem > std::numeric_limits<uint64_t>::max() /
                                                static_cast<uint64_t>(numel))) {
        return InvalidArgument(path + ": tensor " + in_quotes(t.name) + ": invalid shape " +
                               shape_string(t.shape));
      }
      const uint64_t bytes = static_cast<uint64_t>(numel) * elem;
      if (offset > std::numeric_limits<uint64_t>::max() - bytes) {
        return InvalidArgument(path + ": total tensor size overflows");
      }
      h[t.name] = {{"dtype", dtype_to_safetensors(t.dtype)},
                   {"shape", t.shape},
                   {"data_offsets", {offset, offset + bytes}}};
      offset += bytes;
    }
    text = h.dump(-1, ' ', false, json::error_handler_t::strict);
  } catch (const std::bad_alloc&) {
    return OutOfMemory(path + ": out of memory building the header");
  } catch (const std::exception& e) {
    return InvalidArgument(path + ": cannot encode the header (names must be UTF-8): " + e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // data starts 8-byte aligned
  if (text.size() > kMaxSafetensorsHeaderBytes) {
    return InvalidArgument(path + ": header of " + std::to_string(text.size()) +
                           " bytes exceeds the safetensors limit");
  }

  std::unique_ptr<SafetensorsWriter> w(new (std::nothrow) SafetensorsWriter());
  if (!w) return OutOfMemory(path + ": out of memory");
  w->path_ = path;
  w->total_ = offset;
  ZI_ASSIGN_OR_RETURN(w->out_, OutputFile::create(path));
  uint8_t len[8];
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
  ZI_TRY(w->out_->write(len, 8));
  ZI_TRY(w->out_->write(text.data(), n));
  return w;
}

SafetensorsWriter::~SafetensorsWriter() = default;  // an uncommitted OutputFile removes its temp

Status SafetensorsWriter::write(const void* data, size_t bytes) {
  if (finished_ || !out_) return InvalidArgument(path_ + ": write after finish()");
  if (bytes > remaining()) {
    return InvalidArgument(path_ + ": writing " + std::to_string(bytes) + " bytes but only " +
                           std::to_string(remaining()) + " of the declared data remain");
  }
  if (bytes == 0) return Status::Ok();
  ZI_TRY(out_->write(data, bytes));
  written_ += bytes;
  return Status::Ok();
}

Status SafetensorsWriter::finish() {
  if (finished_ || !out_) return InvalidArgument(path_ + ": finish() called twice");
  if (written_ != total_) {
    return InvalidArgument(path_ + ": finish() with " + std::to_string(remaining()) + " of " +
                           std::to_string(total_) + " data bytes unwritten");
  }
  ZI_TRY(out_->commit());
  finished_ = true;
  return Status::Ok();
}

Status write_safetensors(const std::string& path,
                         const std::vector<std::pair<std::string, Tensor>>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsEntry> entries;
  entries.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    if (!t.defined())
      return InvalidArgument(path + ": tensor " + in_quotes(name) + " is undefined");
    if (t.device() != Device::kCPU) {
      return InvalidArgument(path + ": tensor " + in_quotes(name) + " is on " +
                             device_name(t.device()) + ", expected a host tensor");
    }
    entries.push_back({name, t.dtype(), t.shape()});
  }
  ZI_ASSIGN_OR_RETURN(auto writer, SafetensorsWriter::create(path, std::move(entries), metadata));
  for (const auto& [name, t] : tensors) {
    ZI_TRY(writer->write(t.data(), t.nbytes()).with_context("tensor '" + name + "'"));
  }
  return writer->finish();
}

}  // namespace zimage

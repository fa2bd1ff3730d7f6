// GgufFile: the memory-mapped (or borrowed) validated GGUF file, its metadata accessors and its
// tensor views (plain types zero-copy, quantised types dequantised or handed out packed).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <new>

#include "io/fs/file_io.h"
#include "io/gguf/gguf.h"
#include "io/gguf/gguf_internal.h"

namespace zimage {

using namespace gguf_detail;  // NOLINT: the helpers read as this file's vocabulary

// ---- GgufFile
// -------------------------------------------------------------------------------------

Result<std::shared_ptr<GgufFile>> GgufFile::open(const std::string& path) {
  uint64_t file_size = 0;
  ZI_ASSIGN_OR_RETURN(ScopedFd fd, open_input_file(path, &file_size));
  std::shared_ptr<GgufFile> file(new (std::nothrow) GgufFile());
  if (!file) return OutOfMemory(path + ": out of memory");
  file->path_ = path;
  file->size_ = file_size;
  if (file_size > 0) {
    // A plain lazy mapping, as for safetensors (io/weights/safetensors.cpp says why no
    // populate/madvise).
    void* p = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd.get(), 0);
    if (p == MAP_FAILED) {
      return IoError(path + ": cannot memory-map " + std::to_string(file_size) +
                     " bytes: " + std::strerror(errno));
    }
    file->base_ = static_cast<const uint8_t*>(p);
    file->mapped_ = true;
    file->registration_ = MappedFileRegistration(p, file_size, fd.get());
  }
  ZI_ASSIGN_OR_RETURN(file->header_, parse_gguf(file->base_, file->size_, path));
  ZI_TRY(file->build_index());
  return file;
}

Result<std::shared_ptr<GgufFile>> GgufFile::view(const uint8_t* data, size_t size,
                                                 const std::string& name) {
  std::shared_ptr<GgufFile> file(new (std::nothrow) GgufFile());
  if (!file) return OutOfMemory(name + ": out of memory");
  file->path_ = name;
  file->base_ = data;
  file->size_ = size;
  ZI_ASSIGN_OR_RETURN(file->header_, parse_gguf(data, size, name));
  ZI_TRY(file->build_index());
  return file;
}

Status GgufFile::build_index() try {
  for (size_t k = 0; k < header_.tensors.size(); ++k)
    tensor_index_.emplace(header_.tensors[k].name, k);
  for (size_t k = 0; k < header_.kvs.size(); ++k) kv_index_.emplace(header_.kvs[k].key, k);
  return Status::Ok();
} catch (const std::bad_alloc&) {
  return OutOfMemory(path_ + ": out of memory indexing the GGUF header");
}

GgufFile::~GgufFile() {
  registration_ = MappedFileRegistration();  // no longer found before the address is reused
  if (mapped_ && base_) ::munmap(const_cast<uint8_t*>(base_), size_);
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &header_.tensors[it->second];
}

const GgufKv* GgufFile::find(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &header_.kvs[it->second];
}

// ---- metadata accessors -----------------------------------------------------------------------

namespace {

Status wrong_type(const std::string& file, const GgufKv& kv, const char* expected) {
  std::string got = gguf_type_name(kv.type);
  if (kv.type == GgufType::kArray) got += " of " + std::string(gguf_type_name(kv.elem_type));
  return FormatError(file + ": key " + in_quotes(kv.key) + " is a " + got + ", expected " +
                     expected);
}

// Integer value of an element of type t at p, or false when it does not fit int64.
bool element_int(const uint8_t* p, GgufType t, int64_t* out) {
  const uint64_t n = fixed_size(t);
  if (is_signed(t)) {
    *out = load_int(p, n);
    return true;
  }
  const uint64_t u = load_uint(p, n);
  if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
  *out = static_cast<int64_t>(u);
  return true;
}

}  // namespace

Result<std::string> GgufFile::get_string(std::string_view key) const {
  const GgufKv* kv = find(key);
  if (!kv) return NotFound(path_ + ": no metadata key " + in_quotes(key));
  if (kv->type != GgufType::kString) return wrong_type(path_, *kv, "a string");
  return kv->str;
}

Result<int64_t> GgufFile::get_int(std::string_view key) const {
  const GgufKv* kv = find(key);
  if (!kv) return NotFound(path_ + ": no metadata key " + in_quotes(key));
  if (!is_integer(kv->type)) return wrong_type(path_, *kv, "an integer");
  if (is_signed(kv->type)) return kv->i;
  if (kv->u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return FormatError(path_ + ": key " + in_quotes(key) + ": value " + std::to_string(kv->u) +
                       " is out of range");
  }
  return static_cast<int64_t>(kv->u);
}

Result<double> GgufFile::get_float(std::string_view key) const {
  const GgufKv* kv = find(key);
  if (!kv) return NotFound(path_ + ": no metadata key " + in_quotes(key));
  if (kv->type == GgufType::kF32 || kv->type == GgufType::kF64) return kv->f;
  if (is_integer(kv->type)) {
    return is_signed(kv->type) ? static_cast<double>(kv->i) : static_cast<double>(kv->u);
  }
  return wrong_type(path_, *kv, "a number");
}

Result<bool> GgufFile::get_bool(std::string_view key) const {
  const GgufKv* kv = find(key);
  if (!kv) return NotFound(path_ + ": no metadata key " + in_quotes(key));
  if (kv->type != GgufType::kBool) return wrong_type(path_, *kv, "a bool");
  return kv->u != 0;
}

Result<std::vector<int64_t>> GgufFile::get_int_array(std::string_view key) const {
  const GgufKv* kv = find(key);
  if (!kv) return NotFound(path_ + ": no metadata key " + in_quotes(key));
  if (kv->type != GgufType::kArray || !is_integer(kv->elem_type)) {
    return wrong_type(path_, *kv, "an array of integers");
  }
  const uint64_t n = fixed_size(kv->elem_type);
  std::vector<int64_t> out(static_cast<size_t>(kv->count));  // count * n bytes are in the file
  for (uint64_t k = 0; k < kv->count; ++k) {
    if (!element_int(base_ + kv->offset + k * n, kv->elem_type, &out[k])) {
      return FormatError(path_ + ": key " + in_quotes(key) + " element " + std::to_string(k) +
                         " is out of range");
    }
  }
  return out;
}

Result<std::vector<double>> GgufFile::get_float_array(std::string_view key) const {
  const GgufKv* kv = find(key);
  if (!kv) return NotFound(path_ + ": no metadata key " + in_quotes(key));
  const GgufType t = kv->elem_type;
  if (kv->type != GgufType::kArray ||
      !(t == GgufType::kF32 || t == GgufType::kF64 || is_integer(t))) {
    return wrong_type(path_, *kv, "an array of numbers");
  }
  const uint64_t n = fixed_size(t);
  std::vector<double> out(static_cast<size_t>(kv->count));
  for (uint64_t k = 0; k < kv->count; ++k) {
    const uint8_t* p = base_ + kv->offset + k * n;
    if (t == GgufType::kF32 || t == GgufType::kF64) {
      out[k] = load_float(p, t);
    } else if (is_signed(t)) {
      out[k] = static_cast<double>(load_int(p, n));
    } else {
      out[k] = static_cast<double>(load_uint(p, n));
    }
  }
  return out;
}

Result<std::vector<std::string>> GgufFile::get_string_array(std::string_view key) const {
  const GgufKv* kv = find(key);
  if (!kv) return NotFound(path_ + ": no metadata key " + in_quotes(key));
  if (kv->type != GgufType::kArray || kv->elem_type != GgufType::kString) {
    return wrong_type(path_, *kv, "an array of strings");
  }
  std::vector<std::string> out;
  out.reserve(static_cast<size_t>(kv->count));  // each element took >= 8 file bytes
  uint64_t pos = kv->offset;
  for (uint64_t k = 0; k < kv->count; ++k) {  // validated by the parser: lengths are in bounds
    const uint64_t len = load_uint(base_ + pos, 8);
    out.emplace_back(reinterpret_cast<const char*>(base_ + pos + 8), static_cast<size_t>(len));
    pos += 8 + len;
  }
  return out;
}

std::string GgufFile::architecture() const {
  const GgufKv* kv = find("general.architecture");
  return kv && kv->type == GgufType::kString ? kv->str : std::string();
}

// ---- tensors ----------------------------------------------------------------------------------

bool ggml_plain_dtype(GgmlType t, DType* out) {
  switch (t) {
    case GgmlType::kF32:
      *out = DType::kF32;
      return true;
    case GgmlType::kF16:
      *out = DType::kF16;
      return true;
    case GgmlType::kBF16:
      *out = DType::kBF16;
      return true;
    case GgmlType::kF64:
      *out = DType::kF64;
      return true;
    case GgmlType::kI8:
      *out = DType::kI8;
      return true;
    case GgmlType::kI16:
      *out = DType::kI16;
      return true;
    case GgmlType::kI32:
      *out = DType::kI32;
      return true;
    case GgmlType::kI64:
      *out = DType::kI64;
      return true;
    default:
      return false;
  }
}

Result<Tensor> GgufFile::tensor(std::string_view name) const {
  const GgufTensorInfo* ti = find_tensor(name);
  if (!ti) return NotFound(path_ + ": no tensor named " + in_quotes(name));
  DType dt = DType::kF32;
  if (!ggml_plain_dtype(ti->type, &dt)) {
    return FormatError(path_ + ": tensor " + in_quotes(name) + " is " + ggml_type_name(ti->type) +
                       "-quantised: it has no plain view (dequantise it)");
  }
  const uint8_t* p = base_ + header_.data_start + ti->offset;
  const Shape shape = ti->shape();
  if (reinterpret_cast<uintptr_t>(p) % dtype_size(dt) != 0) {
    Tensor copy = Tensor::host(dt, shape);
    if (!copy.defined()) {
      return OutOfMemory(path_ + ": tensor " + in_quotes(name) + ": out of memory copying " +
                         std::to_string(ti->bytes) + " unaligned bytes");
    }
    if (ti->bytes) std::memcpy(copy.data(), p, static_cast<size_t>(ti->bytes));
    return copy;
  }
  std::shared_ptr<void> keep = std::const_pointer_cast<GgufFile>(shared_from_this());
  auto storage = std::make_shared<BorrowedStorage>(
      const_cast<uint8_t*>(p), static_cast<size_t>(ti->bytes), Device::kCPU, std::move(keep));
  return Tensor(std::move(storage), 0, dt, shape);
}

Result<Tensor> GgufFile::dequantize(std::string_view name, ThreadPool* pool) const {
  const GgufTensorInfo* ti = find_tensor(name);
  if (!ti) return NotFound(path_ + ": no tensor named " + in_quotes(name));
  const GgmlTypeInfo* info = ggml_type_info(ti->type);
  if (!info || !info->dequantizable) {
    return Unsupported(path_ + ": tensor " + in_quotes(name) + " has type " +
                       ggml_type_name(ti->type) + ", which zimage cannot dequantise (it reads " +
                       ggml_dequantizable_type_list() + ")");
  }
  // Every element is written below: no zero-fill (Tensor::host would clear it first).
  auto storage = HostStorage::allocate(static_cast<size_t>(ti->numel()) * sizeof(float));
  Tensor out = storage ? Tensor(std::move(storage), 0, DType::kF32, ti->shape()) : Tensor();
  if (!out.defined()) {
    return OutOfMemory(path_ + ": tensor " + in_quotes(name) + ": out of memory for " +
                       std::to_string(ti->numel()) + " floats");
  }
  const uint8_t* p = base_ + header_.data_start + ti->offset;
  if (!dequantize_rows(ti->type, p, out.data_as<float>(), ti->rows(), ti->row_length(), pool)) {
    return InternalError(path_ + ": tensor " + in_quotes(name) + ": dequantisation refused");
  }
  return out;
}

Result<GgufPackedView> GgufFile::packed(std::string_view name) const {
  const GgufTensorInfo* ti = find_tensor(name);
  if (!ti) return NotFound(path_ + ": no tensor named " + in_quotes(name));
  GgufPackedView v;
  v.type = ti->type;
  v.shape = ti->shape();
  v.cols = ti->row_length();
  v.rows = ti->rows();
  v.data = base_ + header_.data_start + ti->offset;
  v.bytes = ti->bytes;
  return v;
}

}  // namespace zimage

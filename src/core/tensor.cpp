#include "core/tensor.h"

#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>

#include "core/host_memory.h"

namespace zimage {

const char* device_name(Device d) {
  return d == Device::kCPU ? "cpu" : "cuda";
}

std::string shape_string(const Shape& s) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ']';
  return os.str();
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) {
    if (d < 0) return -1;
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d) return -1;
    n *= d;
  }
  return n;
}

std::shared_ptr<HostStorage> HostStorage::allocate(size_t bytes) {
  const size_t rounded = (bytes + 63) / 64 * 64;
  void* p = bytes >= kLargeHostBytes ? allocate_large(bytes)
                                     : std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  if (!p) return nullptr;
  return std::shared_ptr<HostStorage>(new HostStorage(p, bytes));
}

HostStorage::~HostStorage() {
  std::free(data_);
}

Tensor::Tensor(std::shared_ptr<Storage> storage, size_t byte_offset, DType dtype, Shape shape)
    : storage_(std::move(storage)), offset_(byte_offset), dtype_(dtype), shape_(std::move(shape)) {}

Tensor Tensor::host(DType dtype, Shape shape) {
  const int64_t n = shape_numel(shape);
  if (n < 0) return Tensor();
  const size_t bytes = static_cast<size_t>(n) * dtype_size(dtype);
  auto st = HostStorage::allocate(bytes);
  if (!st) return Tensor();
  std::memset(st->data(), 0, bytes);
  return Tensor(std::move(st), 0, dtype, std::move(shape));
}

Tensor Tensor::host_for_overwrite(DType dtype, Shape shape) {
  const int64_t n = shape_numel(shape);
  if (n < 0) return Tensor();
  auto st = HostStorage::allocate(static_cast<size_t>(n) * dtype_size(dtype));
  if (!st) return Tensor();
  return Tensor(std::move(st), 0, dtype, std::move(shape));
}

Tensor Tensor::wrap(void* data, DType dtype, Shape shape, Device device) {
  const int64_t n = shape_numel(shape);
  const size_t bytes = n < 0 ? 0 : static_cast<size_t>(n) * dtype_size(dtype);
  return Tensor(std::make_shared<BorrowedStorage>(data, bytes, device, nullptr), 0, dtype,
                std::move(shape));
}

int64_t Tensor::numel() const {
  return shape_numel(shape_);
}

Tensor Tensor::view(Shape shape) const {
  if (shape_numel(shape) != numel()) return Tensor();
  return Tensor(storage_, offset_, dtype_, std::move(shape));
}

Tensor Tensor::slice0(int64_t begin, int64_t end) const {
  if (shape_.empty() || begin < 0 || end < begin || end > shape_[0]) return Tensor();
  Shape s = shape_;
  s[0] = end - begin;
  Shape row(shape_.begin() + 1, shape_.end());
  const size_t row_bytes = static_cast<size_t>(shape_numel(row)) * dtype_size(dtype_);
  return Tensor(storage_, offset_ + static_cast<size_t>(begin) * row_bytes, dtype_, std::move(s));
}

std::string Tensor::describe() const {
  return std::string(dtype_name(dtype_)) + shape_string(shape_) + "@" + device_name(device());
}

}  // namespace zimage

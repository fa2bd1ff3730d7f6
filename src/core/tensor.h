// Tensors: a shape, a dtype and a pointer into storage owned by a backend (or borrowed).
//
// Conventions (PyTorch order, row-major, last dimension fastest):
//   token activations   [B, S, D]
//   attention q/k/v     [B, S, H, Dh]     (the layout a projection writes; no transposes)
//   VAE feature maps    [B, H, W, C]      (NHWC in every backend)
//   conv weights        [Cout, kh, kw, Cin] (OHWI; converted from the file's OIHW at load)
//   linear weights      [N, K] as stored (y = x · Wᵀ + b)
// Views share storage; a Tensor keeps its storage alive.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace zimage {

enum class Device : uint8_t { kCPU, kCUDA };
const char* device_name(Device d);

using Shape = std::vector<int64_t>;
std::string shape_string(const Shape& s);  // "[2, 16, 64]"
// Product of dims; -1 when a dim is negative or the product overflows int64.
int64_t shape_numel(const Shape& s);

// Memory that a backend allocated (or that wraps someone else's bytes).
class Storage {
 public:
  virtual ~Storage() = default;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 protected:
  Storage(void* data, size_t bytes, Device device) : data_(data), bytes_(bytes), device_(device) {}
  void* data_;
  size_t bytes_;
  Device device_;
};

// Host memory, 64-byte aligned, owned.
class HostStorage final : public Storage {
 public:
  static std::shared_ptr<HostStorage> allocate(size_t bytes);  // nullptr when out of memory
  ~HostStorage() override;

 private:
  HostStorage(void* p, size_t n) : Storage(p, n, Device::kCPU) {}
};

// Borrowed bytes (a memory-mapped file, a caller's buffer). `keep_alive` owns them.
class BorrowedStorage final : public Storage {
 public:
  BorrowedStorage(void* p, size_t n, Device d, std::shared_ptr<void> keep_alive)
      : Storage(p, n, d), keep_alive_(std::move(keep_alive)) {}

 private:
  std::shared_ptr<void> keep_alive_;
};

class Tensor {
 public:
  Tensor() = default;
  Tensor(std::shared_ptr<Storage> storage, size_t byte_offset, DType dtype, Shape shape);

  // A contiguous host tensor (zero-filled). Empty Tensor (defined() false) when out of memory.
  static Tensor host(DType dtype, Shape shape);
  // The same without the zero fill, for a destination the caller overwrites completely (a
  // weight moved to host memory: filling gigabytes on one thread first cost seconds).
  static Tensor host_for_overwrite(DType dtype, Shape shape);
  // A non-owning view of caller memory; the caller keeps `data` alive.
  static Tensor wrap(void* data, DType dtype, Shape shape, Device device = Device::kCPU);

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : Device::kCPU; }
  const Shape& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const { return shape_[i < 0 ? i + rank() : i]; }
  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }

  void* data() const { return static_cast<char*>(storage_->data()) + offset_; }
  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data());
  }
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  size_t byte_offset() const { return offset_; }

  // Same bytes, another shape of equal numel (tensors here are always contiguous).
  Tensor view(Shape shape) const;
  // Rows [begin, end) of dimension 0: still contiguous.
  Tensor slice0(int64_t begin, int64_t end) const;

  std::string describe() const;  // "bf16[2, 16, 64]@cuda"

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;
  DType dtype_ = DType::kF32;
  Shape shape_;
};

}  // namespace zimage

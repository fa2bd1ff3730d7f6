// CPU backend construction and the memory ops: alloc, upload/download/convert (element-wise
// dtype conversion through float32, rounding as core/dtype.h describes), copy_2d and fill.
#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "backend/cpu/cpu_check.h"
#include "backend/cpu/cpu_gemm.h"

namespace zimage {

std::unique_ptr<Backend> make_cpu_backend(int threads) {
  return std::make_unique<cpu::CpuBackend>(threads);
}

int max_cpu_threads() {
  const int hw = static_cast<int>(std::thread::hardware_concurrency());
  return std::min(ThreadPool::kMaxThreads, std::max(4, 4 * std::max(hw, 1)));
}

Status check_cpu_threads(int threads, const char* field) {
  if (threads < 0) {
    return InvalidArgument(std::string(field) + ": must be >= 0 (0 = all), got " +
                           std::to_string(threads));
  }
  if (threads > max_cpu_threads()) {
    return InvalidArgument(std::string(field) + ": " + std::to_string(threads) +
                           " is more than 4x this machine's " +
                           std::to_string(std::thread::hardware_concurrency()) +
                           " hardware threads (at most " + std::to_string(max_cpu_threads()) + ")");
  }
  return Status::Ok();
}

Result<std::unique_ptr<Backend>> create_cpu_backend(int threads) {
  ZI_TRY(check_cpu_threads(threads));
  auto be = std::make_unique<cpu::CpuBackend>(threads);
  const Status& started = be->pool().start_status();
  if (!started.ok()) {
    return started.with_context("CPU backend with " + std::to_string(be->threads()) + " threads");
  }
  return std::unique_ptr<Backend>(std::move(be));
}

namespace cpu {

namespace {

int resolve_threads(int threads) {
  if (threads > 0) return threads;
  const int hw = static_cast<int>(std::thread::hardware_concurrency());
  return hw > 0 ? hw : 1;
}

// Element-wise dtype conversion of n elements, through float32 in cache-sized pieces.
void convert_elements(ThreadPool& pool, DType from, const void* src, DType to, void* dst,
                      int64_t n) {
  if (from == to) {
    std::memmove(dst, src, static_cast<size_t>(n) * dtype_size(from));
    return;
  }
  constexpr int64_t kPiece = 2048;
  const size_t from_size = dtype_size(from);
  const size_t to_size = dtype_size(to);
  const int64_t pieces = (n + kPiece - 1) / kPiece;
  pool.parallel_for(pieces, 8, [&](int64_t p0, int64_t p1) {
    float buf[kPiece];
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t begin = p * kPiece;
      const size_t len = static_cast<size_t>(std::min(kPiece, n - begin));
      convert_to_f32(from, static_cast<const char*>(src) + begin * from_size, buf, len);
      convert_from_f32(to, buf, static_cast<char*>(dst) + begin * to_size, len);
    }
  });
}

bool convertible(DType d) {
  return dtype_is_float(d);
}

// Whether [offset, offset + (rows-1)*stride + cols) lies inside [0, numel).
bool block_in_bounds(int64_t offset, int64_t stride, int64_t rows, int64_t cols, int64_t numel) {
  if (offset < 0 || stride < 0 || rows < 0 || cols < 0) return false;
  if (rows == 0 || cols == 0) return true;
  if (offset > numel || cols > numel - offset) return false;
  const int64_t room = numel - offset - cols;  // what (rows-1)*stride may reach
  if (rows - 1 == 0 || stride == 0) return true;
  return rows - 1 <= room / stride;
}

}  // namespace

CpuBackend::CpuBackend(int threads) : threads_(resolve_threads(threads)), pool_(threads_) {
  set_blas_threads(threads_);
  warn_if_slow_blas_kernels();
}

std::string CpuBackend::name() const {
  return "cpu (OpenBLAS " + blas_core_name() + ", " + std::to_string(threads_) + " threads)";
}

Result<Tensor> CpuBackend::alloc(DType dtype, const Shape& shape) {
  const int64_t n = shape_numel(shape);
  if (n < 0) return InvalidArgument("alloc: invalid shape " + shape_string(shape));
  const size_t bytes = static_cast<size_t>(n) * dtype_size(dtype);
  if (bytes / dtype_size(dtype) != static_cast<size_t>(n)) {
    return InvalidArgument("alloc: shape " + shape_string(shape) + " overflows the address space");
  }
  auto storage = HostStorage::allocate(bytes);
  if (!storage) {
    return OutOfMemory("alloc: " + std::string(dtype_name(dtype)) + shape_string(shape) + " (" +
                       std::to_string(bytes) + " bytes)");
  }
  return Tensor(std::move(storage), 0, dtype, shape);
}

Result<Tensor> CpuBackend::upload(const Tensor& host, DType dtype) {
  ZI_TRY(check_tensor("upload", "host", host));
  if (host.dtype() != dtype && (!convertible(host.dtype()) || !convertible(dtype))) {
    return InvalidArgument("upload: host " + desc(host) + " cannot be converted to " +
                           dtype_name(dtype) + " (only float dtypes convert)");
  }
  ZI_ASSIGN_OR_RETURN(Tensor t, alloc(dtype, host.shape()));
  convert_elements(pool_, host.dtype(), host.data(), dtype, t.data(), host.numel());
  return t;
}

Status CpuBackend::download(const Tensor& src, Tensor& host) {
  ZI_TRY(check_tensor("download", "src", src));
  ZI_TRY(check_tensor("download", "host", host));
  ZI_TRY(check_same_shape("download", "src", src, "host", host));
  if (src.dtype() != host.dtype() && (!convertible(src.dtype()) || !convertible(host.dtype()))) {
    return InvalidArgument("download: src " + desc(src) + " cannot be converted to host " +
                           desc(host) + " (only float dtypes convert)");
  }
  // Downloading a CPU tensor onto itself is a no-op; any other overlap is an error.
  ZI_TRY(check_alias("download", "src", src, "host", host, src.dtype() == host.dtype()));
  if (same_data(src, host)) return Status::Ok();
  convert_elements(pool_, src.dtype(), src.data(), host.dtype(), host.data(), src.numel());
  return Status::Ok();
}

Status CpuBackend::convert(const Tensor& src, Tensor& dst) {
  ZI_TRY(check_tensor("convert", "src", src));
  ZI_TRY(check_tensor("convert", "dst", dst));
  if (src.numel() != dst.numel()) {
    return InvalidArgument("convert: src " + desc(src) + " and dst " + desc(dst) +
                           ": element counts differ");
  }
  if (src.dtype() != dst.dtype() && (!convertible(src.dtype()) || !convertible(dst.dtype()))) {
    return InvalidArgument("convert: src " + desc(src) + " cannot be converted to dst " +
                           desc(dst) + " (only float dtypes convert)");
  }
  ZI_TRY(check_alias("convert", "src", src, "dst", dst, src.dtype() == dst.dtype()));
  if (same_data(src, dst)) return Status::Ok();
  convert_elements(pool_, src.dtype(), src.data(), dst.dtype(), dst.data(), src.numel());
  return Status::Ok();
}

Status CpuBackend::copy_2d(const Tensor& src, int64_t src_offset, int64_t src_row_stride,
                           Tensor& dst, int64_t dst_offset, int64_t dst_row_stride, int64_t rows,
                           int64_t cols) {
  ZI_TRY(check_tensor("copy_2d", "src", src));
  ZI_TRY(check_tensor("copy_2d", "dst", dst));
  if (src.dtype() != dst.dtype()) {
    return InvalidArgument("copy_2d: src " + desc(src) + " and dst " + desc(dst) +
                           ": dtypes differ");
  }
  auto block = [&](int64_t off, int64_t stride) {
    std::string m = "a [";  // built with += : g++ 12 warns falsely (-Wrestrict) on "[" + string
    m += std::to_string(rows);
    m += " x ";
    m += std::to_string(cols);
    m += "] block at offset ";
    m += std::to_string(off);
    m += ", row stride ";
    m += std::to_string(stride);
    return m;
  };
  if (!block_in_bounds(src_offset, src_row_stride, rows, cols, src.numel())) {
    return InvalidArgument("copy_2d: " + block(src_offset, src_row_stride) + " is outside src " +
                           desc(src));
  }
  if (!block_in_bounds(dst_offset, dst_row_stride, rows, cols, dst.numel())) {
    return InvalidArgument("copy_2d: " + block(dst_offset, dst_row_stride) + " is outside dst " +
                           desc(dst));
  }
  if (rows == 0 || cols == 0) return Status::Ok();
  const size_t es = dtype_size(src.dtype());
  const size_t row_bytes = static_cast<size_t>(cols) * es;
  const char* s = static_cast<const char*>(src.data()) + src_offset * es;
  char* d = static_cast<char*>(dst.data()) + dst_offset * es;
  const size_t s_span = static_cast<size_t>((rows - 1) * src_row_stride) * es + row_bytes;
  const size_t d_span = static_cast<size_t>((rows - 1) * dst_row_stride) * es + row_bytes;
  if (s < d + d_span && d < s + s_span) {
    // Source and destination blocks share bytes: gather first, then scatter.
    auto tmp = HostStorage::allocate(static_cast<size_t>(rows) * row_bytes);
    if (!tmp) return OutOfMemory("copy_2d: temporary for an overlapping copy");
    char* t = static_cast<char*>(tmp->data());
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(t + r * row_bytes, s + r * src_row_stride * es, row_bytes);
    }
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(d + r * dst_row_stride * es, t + r * row_bytes, row_bytes);
    }
    return Status::Ok();
  }
  pool_.parallel_for(rows, std::max<int64_t>(1, 65536 / static_cast<int64_t>(row_bytes)),
                     [&](int64_t r0, int64_t r1) {
                       for (int64_t r = r0; r < r1; ++r) {
                         std::memcpy(d + r * dst_row_stride * es, s + r * src_row_stride * es,
                                     row_bytes);
                       }
                     });
  return Status::Ok();
}

Status CpuBackend::fill(Tensor& t, float value) {
  ZI_TRY(check_tensor("fill", "t", t));
  unsigned char pattern[8] = {};
  const size_t es = dtype_size(t.dtype());
  if (es > sizeof(pattern) || !convert_from_f32(t.dtype(), &value, pattern, 1)) {
    return InvalidArgument("fill: t " + desc(t) + ": dtype cannot hold a float value");
  }
  const int64_t n = t.numel();
  char* base = static_cast<char*>(t.data());
  pool_.parallel_for(n, 65536, [&](int64_t i0, int64_t i1) {
    if (t.dtype() == DType::kF32) {
      std::fill(reinterpret_cast<float*>(base) + i0, reinterpret_cast<float*>(base) + i1, value);
      return;
    }
    for (int64_t i = i0; i < i1; ++i) std::memcpy(base + i * es, pattern, es);
  });
  return Status::Ok();
}

}  // namespace cpu
}  // namespace zimage

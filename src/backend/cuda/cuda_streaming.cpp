// CudaBackend's weight streaming and per-channel FP8 weights: pinned host tensors, a copy stream
// with per-slot events (so weight copies overlap compute, double-buffered by the model), the
// driver's view of device memory, the FP8 row (de)quantisation ops and the W8A8 GEMM with
// per-row scales built on them.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <iterator>
#include <memory>
#include <string>
#include <thread>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernels/gguf_dequant.h"
#include "backend/cuda/kernels/kernels.h"
#include "backend/cuda/libs/gemm_cublaslt.h"
#include "backend/cuda/libs/gemm_cutlass.h"
#include "backend/cuda/runtime/capture_guard.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/pinned_host.h"
#include "backend/cuda/runtime/upload_plan.h"
#include "backend/cuda/validate.h"
#include "core/host_memory.h"
#include "core/log.h"
#include "core/read_gate.h"
#include "core/thread_pool.h"

namespace zimage::cuda {
namespace {

// Page-locked host memory (runtime/pinned_host.h), unlocked and freed with the storage.
class PinnedStorage final : public Storage {
 public:
  PinnedStorage(PinnedHost mem, size_t n)
      : Storage(mem.data(), n, Device::kCPU), mem_(std::move(mem)) {}

 private:
  PinnedHost mem_;
};

// Page-aligned ordinary host memory from std::aligned_alloc, page-locked in place by
// cudaHostRegister when `registered`; unregistered and freed with it.
class AlignedHostStorage final : public Storage {
 public:
  AlignedHostStorage(void* p, size_t n, bool registered)
      : Storage(p, n, Device::kCPU), registered_(registered) {}
  ~AlignedHostStorage() override {
    if (registered_) {
      std::lock_guard<std::mutex> sync_lock(device_sync_mutex());  // capture_guard.h
      cudaHostUnregister(data_);
    }
    std::free(data_);
  }

 private:
  bool registered_;
};

}  // namespace

Result<Tensor> CudaBackend::host_copy(const std::vector<Tensor>& parts, bool pinned) {
  ZI_ASSIGN_OR_RETURN(const int64_t n, host_copy_elements(parts));
  const DType dt = parts[0].dtype();
  const size_t bytes = static_cast<size_t>(n) * dtype_size(dt);
  constexpr size_t kAlign = size_t{2} << 20;  // whole pages: two registrations never share one
  const size_t rounded = std::max(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
  const bool reg = pinned && pin_by_register_;
  void* p = nullptr;
  PinnedHost locked;
  if (pinned && !reg) {
    ZI_ASSIGN_OR_RETURN(locked, PinnedHost::allocate(std::max<size_t>(bytes, 1)));
    p = locked.data();
  } else {
    p = allocate_large(rounded);  // in huge pages where THP is on "madvise"
    if (p == nullptr) return OutOfMemory("host copy of " + std::to_string(bytes >> 20) + " MiB");
  }
  // Owned here until a storage takes it: the pinned allocation at once, the ordinary one after
  // the copy (registered or not).
  std::shared_ptr<Storage> st;
  std::unique_ptr<void, void (*)(void*)> owned(nullptr, std::free);
  if (pinned && !reg) {
    st = std::make_shared<PinnedStorage>(std::move(locked), bytes);
  } else {
    owned.reset(p);
  }
  if (!host_pool_)  // as many copy threads as the uploader: more only add wake-up cost
    host_pool_ = std::make_unique<ThreadPool>(
        std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 16));
  size_t at = 0;
  for (const Tensor& t : parts) {
    // In 64 MiB slices, each first asking the read gate (core/read_gate.h), which holds it only
    // with ZIMAGE_PREFETCH_GATE=1, until the read-ahead has read it (off: measured slower).
    constexpr size_t kSlice = size_t{64} << 20;
    const auto* src = static_cast<const uint8_t*>(t.data());
    for (size_t off = 0; off < t.nbytes(); off += kSlice) {
      const size_t len = std::min(kSlice, t.nbytes() - off);
      wait_readable(src + off, len);
      parallel_copy(*host_pool_, static_cast<uint8_t*>(p) + at + off, src + off, len,
                    size_t{1} << 20);
    }
    at += t.nbytes();
  }
  if (!st) {
    bool registered = false;
    if (reg) {
      const cudaError_t e = cudaHostRegister(p, rounded, cudaHostRegisterDefault);
      registered = e == cudaSuccess;
      if (!registered) {
        cudaGetLastError();
        static std::atomic<bool> warned{false};
        if (!warned.exchange(true))
          ZI_WARN(
              "cuda: cannot page-lock host memory in place (%s); streamed weights stay in "
              "pageable memory",
              cudaGetErrorString(e));
      }
    }
    try {  // the storage owns the bytes once it exists; until then `owned` does
      st = std::make_shared<AlignedHostStorage>(owned.get(), bytes, registered);
    } catch (...) {
      if (registered) {
        std::lock_guard<std::mutex> sync_lock(device_sync_mutex());  // capture_guard.h
        cudaHostUnregister(owned.get());
      }
      throw;
    }
    owned.release();
  }
  return Tensor(std::move(st), 0, dt, {n});
}

Result<std::shared_ptr<void>> CudaBackend::lock_host_range(const void* p, size_t bytes) {
  if (p == nullptr || bytes == 0) return InvalidArgument("lock_host_range: empty range");
  // The registration keeps no reference to the bytes: the caller's handle owner keeps the
  // mapping alive at least as long as the handle.
  void* q = const_cast<void*>(p);
  const cudaError_t e = cudaHostRegister(q, bytes, cudaHostRegisterReadOnly);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return DeviceError(std::string("cannot page-lock ") + std::to_string(bytes >> 20) +
                       " MiB of host memory in place: " + cudaGetErrorString(e));
  }
  locked_->add(p, bytes);
  const int device = device_;
  std::shared_ptr<LockedRanges> ranges = locked_;
  return std::shared_ptr<void>(q, [device, ranges](void* r) {
    ranges->remove(r);
    // No copy may still read the range when it is unlocked.
    int prev = -1;
    if (cudaGetDevice(&prev) == cudaSuccess && prev != device) cudaSetDevice(device);
    {
      std::lock_guard<std::mutex> sync_lock(device_sync_mutex());  // capture_guard.h
      cudaDeviceSynchronize();
      cudaHostUnregister(r);
    }
    cudaGetLastError();
    if (prev >= 0 && prev != device) cudaSetDevice(prev);
  });
}

Result<Tensor> CudaBackend::alloc_pinned(DType dtype, const Shape& shape) {
  const int64_t n = shape_numel(shape);
  if (n < 0) return InvalidArgument("alloc_pinned: bad shape " + shape_string(shape));
  const size_t bytes = std::max<size_t>(1, static_cast<size_t>(n) * dtype_size(dtype));
  ZI_ASSIGN_OR_RETURN(PinnedHost mem, PinnedHost::allocate(bytes));
  return Tensor(std::make_shared<PinnedStorage>(std::move(mem), bytes), 0, dtype, shape);
}

Status CudaBackend::ensure_streaming() {
  // The load thread and the warm-up's (prepare_stream_staging) may both get here first.
  std::lock_guard<std::mutex> lock(streaming_init_mu_);
  if (streaming_ready_) return Status::Ok();
  // All or nothing: made into locals, kept only once every part exists.
  cudaStream_t stream = nullptr;
  std::array<cudaEvent_t, kStreamSlots> loaded{}, released{};
  auto destroy = [&] {
    for (cudaEvent_t e : loaded)
      if (e) cudaEventDestroy(e);
    for (cudaEvent_t e : released)
      if (e) cudaEventDestroy(e);
    if (stream) cudaStreamDestroy(stream);
  };
  Status st = cuda_status(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                          "cudaStreamCreateWithFlags");
  for (int i = 0; st.ok() && i < kStreamSlots; ++i) {
    st = cuda_status(cudaEventCreateWithFlags(&loaded[i], cudaEventDisableTiming),
                     "cudaEventCreateWithFlags");
    if (st.ok())
      st = cuda_status(cudaEventCreateWithFlags(&released[i], cudaEventDisableTiming),
                       "cudaEventCreateWithFlags");
  }
  std::unique_ptr<SlotStager> stager;
  if (st.ok()) {
    try {
      stager = std::make_unique<SlotStager>(device_, kStreamSlots);
    } catch (const std::exception&) {
      st = OutOfMemory("cuda streaming: no host memory for the staging");
    }
  }
  if (!st.ok()) {
    destroy();
    cudaGetLastError();
    return st;
  }
  copy_stream_ = stream;
  for (int i = 0; i < kStreamSlots; ++i) loaded_[i] = loaded[i], released_[i] = released[i];
  stager_ = std::move(stager);
  streaming_ready_ = true;
  return Status::Ok();
}

namespace {
// Whether stream_in hands `host` to the DMA engine directly: inside a locked file range, or a
// page-locked allocation of ours (alloc_pinned, host_copy).
bool streams_directly(const LockedRanges& locked, const Tensor& host) {
  const LockedRanges::Cover cover = locked.find(host.data(), host.nbytes());
  if (cover != LockedRanges::Cover::kNone) return cover == LockedRanges::Cover::kInside;
  return is_page_locked(host.data());
}
}  // namespace

uint64_t CudaBackend::staged_stream_bytes(const std::vector<Tensor>& host_parts) const {
  uint64_t n = 0;
  for (const Tensor& t : host_parts)
    if (t.defined() && t.device() == Device::kCPU && t.nbytes() > 0 &&
        !streams_directly(*locked_, t))
      n += t.nbytes();
  return n;
}

void CudaBackend::prepare_stream_staging(int slot, uint64_t bytes) noexcept {
  if (slot < 0 || slot >= kStreamSlots || bytes == 0) return;
  try {
    // Beside the warm-up's cuDNN plan loads, page-locking slowed both (an H100 host: the warm-up
    // 0.68 s instead of 0.28, and the load waits for it): requests made while it runs are held,
    // and the warm-up hands them to the stager when it ends (start_staging_requests). The lock
    // orders the two threads' requests and the stager's creation.
    std::lock_guard<std::mutex> lock(staging_mu_);
    if (warming_) {
      staging_requests_.emplace_back(slot, bytes);
      return;
    }
    if (!ensure_streaming().ok()) return;
    stager_->prepare(slot, static_cast<size_t>(bytes));
  } catch (...) {  // no memory for the hint: the staging is allocated at first use
  }
}

void CudaBackend::start_staging_requests() noexcept {
  try {
    std::lock_guard<std::mutex> lock(staging_mu_);
    warming_ = false;
    if (staging_requests_.empty() || !ensure_streaming().ok()) {
      staging_requests_.clear();
      return;
    }
    for (const auto& [slot, bytes] : staging_requests_)
      stager_->prepare(slot, static_cast<size_t>(bytes));
    staging_requests_.clear();
  } catch (...) {  // a lock that cannot be taken: the staging is allocated at first use
  }
}

Status CudaBackend::stream_in(int slot, const std::vector<std::pair<Tensor, Tensor>>& copies) {
  if (slot < 0 || slot >= kStreamSlots)
    return InvalidArgument("stream_in: slot " + std::to_string(slot) + " out of range");
  ZI_TRY(ensure_streaming());
  // The slot's previous contents may still be read by queued compute (release_slot recorded it);
  // an event never recorded is already complete.
  ZI_CUDA_TRY(cudaStreamWaitEvent(copy_stream_, released_[slot], 0));
  // Page-locked sources (pinned host copies) go straight to the DMA engine; ordinary memory
  // (views of the weight files, pageable copies) through the slot's staging buffer.
  std::vector<SlotStager::Copy> staged;
  for (const auto& [host, dev] : copies) {
    if (!host.defined() || !dev.defined() || host.dtype() != dev.dtype() ||
        host.numel() != dev.numel() || host.device() != Device::kCPU ||
        dev.device() != Device::kCUDA)
      return InvalidArgument("stream_in: " + host.describe() + " -> " + dev.describe());
    if (host.nbytes() == 0) continue;
    // Locked file ranges (lock_host_range): direct only when the source lies inside one. Any
    // other page-locked source is a whole allocation of ours (alloc_pinned, host_copy).
    if (streams_directly(*locked_, host)) {
      ZI_CUDA_TRY(cudaMemcpyAsync(dev.data(), host.data(), host.nbytes(), cudaMemcpyHostToDevice,
                                  copy_stream_));
    } else {
      staged.push_back({dev.data(), host.data(), host.nbytes()});
    }
    streamed_bytes_ += host.nbytes();
  }
  if (!staged.empty()) ZI_TRY(stager_->copy(slot, staged, copy_stream_));
  ZI_CUDA_TRY(cudaEventRecord(loaded_[slot], copy_stream_));
  return Status::Ok();
}

Status CudaBackend::wait_slot(int slot) {
  if (slot < 0 || slot >= kStreamSlots)
    return InvalidArgument("wait_slot: slot " + std::to_string(slot) + " out of range");
  ZI_TRY(ensure_streaming());
  ZI_CUDA_TRY(cudaStreamWaitEvent(stream_, loaded_[slot], 0));
  return Status::Ok();
}

Status CudaBackend::release_slot(int slot) {
  if (slot < 0 || slot >= kStreamSlots)
    return InvalidArgument("release_slot: slot " + std::to_string(slot) + " out of range");
  ZI_TRY(ensure_streaming());
  ZI_CUDA_TRY(cudaEventRecord(released_[slot], stream_));
  return Status::Ok();
}

Result<std::pair<uint64_t, uint64_t>> CudaBackend::device_memory() const {
  size_t free_b = 0, total_b = 0;
  ZI_CUDA_TRY(cudaMemGetInfo(&free_b, &total_b));
  return std::pair<uint64_t, uint64_t>{total_b, free_b};
}

Status CudaBackend::quantize_fp8_rows(const Tensor& w, Tensor& w8, Tensor& scale) {
  constexpr const char* op = "quantize_fp8_rows";
  ZI_TRY(check_cuda_tensor(op, "w", w));
  ZI_TRY(check_cuda_tensor(op, "w8", w8));
  ZI_TRY(check_cuda_tensor(op, "scale", scale));
  ZI_TRY(check_rank(op, "w", w, 2));
  ZI_ASSIGN_OR_RETURN(KType kt, ktype_of(op, w.dtype()));
  ZI_TRY(check_dtype(op, "w8", w8, DType::kF8E4M3));
  ZI_TRY(check_shape(op, "w8", w8, w.shape()));
  ZI_TRY(check_dtype(op, "scale", scale, DType::kF32));
  ZI_TRY(check_shape(op, "scale", scale, {w.dim(0)}));
  ZI_LAUNCH_TRY(op, launch_quantize_fp8_rows(kt, w.data(), w.dim(0), w.dim(1), w8.data(),
                                             scale.data_as<float>(), stream_));
  return Status::Ok();
}

Status CudaBackend::dequantize_fp8_rows(const Tensor& w8, const Tensor& scale, Tensor& y) {
  ZI_OP_SCOPE("dequantize_fp8_rows", &w8);
  constexpr const char* op = "dequantize_fp8_rows";
  ZI_TRY(contract::dequantize_fp8_rows(cuda_env(act_), w8, scale, y));
  ZI_ASSIGN_OR_RETURN(KType kt, ktype_of(op, y.dtype()));
  ZI_LAUNCH_TRY(
      op, launch_dequantize_fp8_rows(kt, w8.data(), scale.data_as<float>(), w8.dim(0), w8.dim(1),
                                     y.data(), stream_, w8.dtype() == DType::kF8E5M2));
  return Status::Ok();
}

// Activations quantised per row by the weights' own row kernel, then an FP8 GEMM
// (matmul_fp8_quantized).
Status CudaBackend::matmul_fp8_rows(const Tensor& x, const Tensor& w8, const Tensor& w_scale,
                                    const Tensor& bias, Tensor& y) {
  ZI_OP_SCOPE("matmul_fp8_rows", &x, &w8);
  ZI_TRY(check_fp8_capable());
  ZI_TRY(contract::matmul_fp8_rows(cuda_env(act_), x, w8, w_scale, bias, y));
  const int64_t k = w8.dim(1);
  const int64_t m = x.numel() / std::max<int64_t>(k, 1);
  if (m == 0 || w8.dim(0) == 0) return Status::Ok();
  ZI_ASSIGN_OR_RETURN(Tensor x8, alloc(DType::kF8E4M3, {m, k}));
  ZI_ASSIGN_OR_RETURN(Tensor sx, alloc(DType::kF32, {m}));
  ZI_TRY(quantize_fp8_rows(x.view({m, k}), x8, sx));
  return fp8_gemm(x8, sx, w8, w_scale, bias, y);
}

Status CudaBackend::matmul_fp8_quantized(const Tensor& x8, const Tensor& x_scale, const Tensor& w8,
                                         const Tensor& w_scale, const Tensor& bias, Tensor& y) {
  ZI_OP_SCOPE("matmul_fp8_quantized", &x8, &w8);
  ZI_TRY(check_fp8_capable());
  ZI_TRY(contract::matmul_fp8_quantized(cuda_env(act_), x8, x_scale, w8, w_scale, bias, y));
  const int64_t k = w8.dim(1);
  const int64_t m = x8.numel() / std::max<int64_t>(k, 1);
  if (m == 0 || w8.dim(0) == 0) return Status::Ok();
  return fp8_gemm(x8.view({m, k}), x_scale.view({m}), w8, w_scale, bias, y);
}

// The FP8 GEMM of checked, quantised operands (x8 [m, k], sx [m]), three ways; every way
// multiplies the same FP8 operands, they differ in roundings only.
Status CudaBackend::fp8_gemm(const Tensor& x8, const Tensor& sx, const Tensor& w8,
                             const Tensor& w_scale, const Tensor& bias, Tensor& y) {
  constexpr const char* op = "matmul_fp8_rows";
  const int64_t n = w8.dim(0), k = w8.dim(1), m = x8.dim(0);
  ZI_ASSIGN_OR_RETURN(KType kt, ktype_of(op, act_));
  // 0. CUTLASS's Hopper FP8 GEMM with both scales and the bias in its epilogue (bf16 out): one
  //    pass over the output, the fp32 sums rounded once.
  if (use_cutlass_ && act_ == DType::kBF16 && cutlass_available()) {
    const size_t ws_bytes = cutlass_fp8_rows_workspace(m, n, k);
    Tensor ws;
    if (ws_bytes > 0) {
      ZI_ASSIGN_OR_RETURN(ws, alloc(DType::kU8, {static_cast<int64_t>(ws_bytes)}));
    }
    const Status cs = cutlass_fp8_rows(
        x8.data(), w8.data(), sx.data_as<float>(), w_scale.data_as<float>(), ptr_or_null(bias),
        y.data(), m, n, k, ws_bytes ? ws.data() : nullptr, ws_bytes, stream_, fp8_fast_accum_,
        fp8_tile_, gemm_order_for(m, n, k, /*fp8=*/true));
    if (cs.ok()) return Status::Ok();
    if (cs.code() != ErrorCode::kUnsupported) return cs.with_context(op);
  }
  // 1. cuBLASLt's outer-vector scales, where the library has an algorithm for them.
  Status st = gemm_->linear_fp8_rows(x8.data(), w8.data(), sx.data_as<float>(),
                                     w_scale.data_as<float>(), y.data(), m, n, k, act_);
  if (st.ok()) {
    if (bias.defined())
      ZI_LAUNCH_TRY("matmul_fp8_rows bias",
                    launch_add(kt, y.data(), bias.data(), y.data(), m * n, n, stream_));
    return Status::Ok();
  }
  if (st.code() != ErrorCode::kUnsupported) return st.with_context(op);
  // 2. The per-tensor FP8 GEMM with unit scales (the raw sums, rounded once to the compute
  //    dtype), then the scales (and bias) applied in one pass: cuBLAS 13.0 has no outer-vector
  //    algorithm on sm_90 (measured on the H200), this path runs at FP8 tensor-core rate.
  const Status raw =
      gemm_->linear_fp8(x8.data(), w8.data(), nullptr, nullptr, y.data(), m, n, k, act_);
  if (raw.ok()) {
    ZI_LAUNCH_TRY(
        "matmul_fp8_rows scales",
        launch_scale_rows_cols(kt, y.data(), sx.data_as<float>(), w_scale.data_as<float>(),
                               ptr_or_null(bias), m, n, stream_));
    return Status::Ok();
  }
  if (raw.code() != ErrorCode::kUnsupported) return raw.with_context(op);
  // 3. No FP8 GEMM at all for this shape (tiny or misaligned): widen the same FP8 operands.
  static std::atomic<bool> said{false};
  if (!said.exchange(true))
    ZI_INFO("FP8: %s; such GEMMs widen their FP8 operands and run in %s", raw.message().c_str(),
            dtype_name(act_));
  ZI_ASSIGN_OR_RETURN(Tensor xd, alloc(act_, {m, k}));
  ZI_ASSIGN_OR_RETURN(Tensor wd, alloc(act_, {n, k}));
  ZI_TRY(dequantize_fp8_rows(x8, sx, xd));
  ZI_TRY(dequantize_fp8_rows(w8, w_scale, wd));
  Tensor y2 = y.view({m, n});
  return matmul(xd, wd, bias, y2);
}

Status CudaBackend::dequantize_packed(uint32_t ggml_type, const Tensor& blocks, Tensor& y) {
  ZI_OP_SCOPE("dequantize_packed", &blocks);
  constexpr const char* op = "dequantize_packed";
  ZI_TRY(check_cuda_tensor(op, "blocks", blocks));
  ZI_TRY(check_cuda_tensor(op, "y", y));
  ZI_TRY(check_rank(op, "blocks", blocks, 2));
  ZI_TRY(check_dtype(op, "blocks", blocks, DType::kU8));
  ZI_TRY(check_rank(op, "y", y, 2));
  ZI_TRY(check_dtype(op, "y", y, act_));
  const GgmlType type = static_cast<GgmlType>(ggml_type);
  uint64_t row_bytes = 0;
  if (y.dim(0) != blocks.dim(0) || !ggml_row_bytes(type, y.dim(1), &row_bytes) ||
      row_bytes != static_cast<uint64_t>(blocks.dim(1)))
    return InvalidArgument(std::string(op) + ": " + blocks.describe() + " does not hold " +
                           y.describe() + " as " + ggml_type_name(ggml_type) + " rows");
  if (y.dtype() == DType::kBF16)
    return gguf_dequantize_bf16(type, blocks.data(), y.dim(0), y.dim(1), y.data(), stream_);
  return gguf_dequantize_f32(type, blocks.data(), y.dim(0), y.dim(1), y.data_as<float>(), stream_);
}

// ---- a caller's stream (Backend::wait_for_stream / signal_stream) ----

Status CudaBackend::check_external_stream(cudaStream_t s, const char* what) {
  int dev = -1;
  ZI_CUDA_TRY(cudaStreamGetDevice(s, &dev));
  if (dev != device_)
    return InvalidArgument(std::string(what) +
                           ": the stream belongs to cuda:" + std::to_string(dev) +
                           ", this backend runs on cuda:" + std::to_string(device_));
  return Status::Ok();
}

Status CudaBackend::wait_for_stream(void* stream) {
  const auto caller = static_cast<cudaStream_t>(stream);
  ZI_TRY(check_external_stream(caller, "wait_for_stream"));
  if (!external_in_) ZI_CUDA_TRY(cudaEventCreateWithFlags(&external_in_, cudaEventDisableTiming));
  ZI_CUDA_TRY(cudaEventRecord(external_in_, caller));
  ZI_CUDA_TRY(cudaStreamWaitEvent(stream_, external_in_, 0));
  return Status::Ok();
}

Status CudaBackend::signal_stream(void* stream) {
  const auto caller = static_cast<cudaStream_t>(stream);
  ZI_TRY(check_external_stream(caller, "signal_stream"));
  if (!external_out_) ZI_CUDA_TRY(cudaEventCreateWithFlags(&external_out_, cudaEventDisableTiming));
  ZI_CUDA_TRY(cudaEventRecord(external_out_, stream_));
  ZI_CUDA_TRY(cudaStreamWaitEvent(caller, external_out_, 0));
  return Status::Ok();
}

}  // namespace zimage::cuda

// See uploader.h for the pipeline, the choice of stream and the buffer sizes.
#include "backend/cuda/runtime/uploader.h"

#include <algorithm>
#include <exception>
#include <string>
#include <thread>

#include "backend/cuda/runtime/capture_guard.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "core/log.h"
#include "core/read_gate.h"

namespace zimage::cuda {
namespace {

int default_threads() {
  const int hw = static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(hw, 1, 16);
}

// Makes `device` current for the calling scope (the uploader may be driven from a thread other
// than the one that created the backend) and restores the previous device.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&prev_) != cudaSuccess) prev_ = -1;
    if (prev_ != device) cudaSetDevice(device);
  }
  ~DeviceScope() {
    if (prev_ >= 0) cudaSetDevice(prev_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int prev_ = -1;
};

std::string mib(size_t bytes) {
  return std::to_string(bytes >> 20) + " MiB";
}

}  // namespace

PinnedUploader::PinnedUploader(int device, cudaStream_t stream, Options options)
    : device_(device),
      stream_(stream),
      opt_(options),
      ring_(options.buffer_bytes, options.buffers) {
  if (opt_.threads <= 0) opt_.threads = default_threads();
  // The ring rounds the buffer size to its alignment; keep the options in step with it.
  opt_.buffer_bytes = ring_.buffer_bytes();
  opt_.buffers = ring_.buffers();
}

PinnedUploader::~PinnedUploader() {
  // Errors cannot be reported from here; release() still waits before freeing anything.
  (void)release();
}

Status PinnedUploader::copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return Status::Ok();
  if (dst == nullptr || src == nullptr)
    return InvalidArgument("upload: null pointer for a copy of " + std::to_string(bytes) +
                           " bytes");
  if (bytes < opt_.min_bytes) return plain_copy(dst, src, bytes);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  ZI_CUDA_TRY(cudaStreamIsCapturing(stream_, &capture));
  // A DMA from a staging buffer would be recorded into the graph and replayed later from a buffer
  // that holds other bytes by then. The plain path keeps what uploads always did under capture:
  // the runtime refuses them.
  if (capture != cudaStreamCaptureStatusNone) return plain_copy(dst, src, bytes);
  const LockedRanges::Cover cover =
      locked_ ? locked_->find(src, bytes) : LockedRanges::Cover::kNone;
  if (cover == LockedRanges::Cover::kInside) {
    ZI_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
    ++stats_.locked_copies;
    stats_.locked_bytes += bytes;
    return Status::Ok();
  }
  // A source that starts or ends in a locked range but does not lie inside it: the driver takes
  // its start for page-locked memory and refuses the copy (cudaErrorInvalidValue, measured), so
  // it always goes through the staging.
  const bool must_stage = cover == LockedRanges::Cover::kPartly;
  const bool staged =
      staging_ != nullptr || ((bytes >= opt_.start_bytes || must_stage) && ensure_staging());
  if (!staged) {
    if (must_stage)
      return DeviceError(
          "upload: a copy partly inside a page-locked range needs pinned staging, "
          "which could not be allocated");
    return plain_copy(dst, src, bytes);
  }
  const Status s = staged_copy(dst, src, bytes);
  if (!s.ok()) {
    // Leave no DMA reading a buffer the ring no longer tracks: drain the stream (its own error,
    // if any, is the one already being returned) and start the ring over.
    cudaStreamSynchronize(stream_);
    cudaGetLastError();
    ring_.reset();
  }
  return s;
}

Status PinnedUploader::plain_copy(void* dst, const void* src, size_t bytes) {
  // From pageable memory the runtime stages through its own pinned buffer and returns once the
  // source has been read, which is what copy() promises.
  ZI_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
  ++stats_.plain_copies;
  stats_.plain_bytes += bytes;
  return Status::Ok();
}

Status PinnedUploader::staged_copy(void* dst, const void* src, size_t bytes) {
  pieces_.clear();
  ring_.plan(bytes, &pieces_);
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  for (const StagePiece& p : pieces_) {
    if (p.wait) ZI_CUDA_TRY(cudaEventSynchronize(events_[static_cast<size_t>(p.buffer)]));
    uint8_t* buf = staging_ + static_cast<size_t>(p.buffer) * opt_.buffer_bytes + p.buffer_offset;
    // The read gate (core/read_gate.h): with ZIMAGE_PREFETCH_GATE=1, waits until the read-ahead
    // has read the piece rather than let the copy threads fault it in (off: measured slower).
    wait_readable(s + p.src_offset, p.bytes);
    parallel_copy(*pool_, buf, s + p.src_offset, p.bytes, opt_.grain);
    ZI_CUDA_TRY(cudaMemcpyAsync(d + p.src_offset, buf, p.bytes, cudaMemcpyHostToDevice, stream_));
    ZI_CUDA_TRY(cudaEventRecord(events_[static_cast<size_t>(p.buffer)], stream_));
  }
  ++stats_.staged_copies;
  stats_.staged_bytes += bytes;
  return Status::Ok();
}

Status PinnedUploader::download(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return Status::Ok();
  if (dst == nullptr || src == nullptr)
    return InvalidArgument("download: null pointer for a copy of " + std::to_string(bytes) +
                           " bytes");
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  ZI_CUDA_TRY(cudaStreamIsCapturing(stream_, &capture));
  if (capture != cudaStreamCaptureStatusNone || staging_ == nullptr) {
    ZI_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    ZI_CUDA_TRY(cudaStreamSynchronize(stream_));
    return Status::Ok();
  }
  // After this no DMA reads or writes a staging buffer: the ring starts over, and each buffer's
  // event from here on marks the DMA into it.
  ZI_CUDA_TRY(cudaStreamSynchronize(stream_));
  ring_.reset();
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  const size_t piece = opt_.buffer_bytes;
  const size_t pieces = (bytes + piece - 1) / piece;
  const auto nbuf = static_cast<size_t>(opt_.buffers);
  auto queue = [&](size_t i) -> Status {  // piece i's DMA into buffer i % nbuf
    const size_t off = i * piece, n = std::min(piece, bytes - off);
    uint8_t* buf = staging_ + (i % nbuf) * piece;
    ZI_CUDA_TRY(cudaMemcpyAsync(buf, s + off, n, cudaMemcpyDeviceToHost, stream_));
    ZI_CUDA_TRY(cudaEventRecord(events_[i % nbuf], stream_));
    return Status::Ok();
  };
  Status st = Status::Ok();
  for (size_t i = 0; st.ok() && i < std::min(pieces, nbuf); ++i) st = queue(i);
  for (size_t i = 0; st.ok() && i < pieces; ++i) {
    st = cuda_status(cudaEventSynchronize(events_[i % nbuf]), "cudaEventSynchronize");
    if (!st.ok()) break;
    const size_t off = i * piece, n = std::min(piece, bytes - off);
    parallel_copy(*pool_, d + off, staging_ + (i % nbuf) * piece, n, opt_.grain);
    if (i + nbuf < pieces) st = queue(i + nbuf);
  }
  if (!st.ok()) {  // leave no DMA writing a buffer: drain the stream, start the ring over
    cudaStreamSynchronize(stream_);
    cudaGetLastError();
    ring_.reset();
    return st.with_context("download of " + std::to_string(bytes) + " bytes");
  }
  ++stats_.staged_downloads;
  stats_.staged_download_bytes += bytes;
  return Status::Ok();
}

bool PinnedUploader::ensure_staging() {
  if (staging_ != nullptr) return true;
  if (unavailable_) return false;
  const size_t total = opt_.buffer_bytes * static_cast<size_t>(opt_.buffers);
  Status s = Status::Ok();
  try {  // all or nothing: a half-made staging (buffers without threads) is never left behind
    DeviceScope scope(device_);
    Result<PinnedHost> mem = PinnedHost::allocate(total);
    s = mem.status();
    if (s.ok()) {
      staging_mem_ = std::move(mem).value();
      staging_ = static_cast<uint8_t*>(staging_mem_.data());
    }
    events_.reserve(static_cast<size_t>(opt_.buffers));
    for (int i = 0; s.ok() && i < opt_.buffers; ++i) {
      cudaEvent_t e = nullptr;
      s = cuda_status(cudaEventCreateWithFlags(&e, cudaEventDisableTiming),
                      "cudaEventCreateWithFlags");
      if (s.ok()) events_.push_back(e);
    }
    if (s.ok()) pool_ = std::make_unique<ThreadPool>(opt_.threads);
  } catch (const std::exception&) {
    s = OutOfMemory("host memory for the copy threads");
  }
  if (!s.ok()) {
    free_staging();
    cudaGetLastError();  // a failed allocation must not poison the next call
    unavailable_ = true;
    ZI_WARN(
        "cuda upload: cannot allocate %s of pinned staging memory (%s); uploading from "
        "pageable memory instead (slower)",
        mib(total).c_str(), s.message().c_str());
    return false;
  }
  if (!pool_->start_status().ok()) {  // fewer copy threads only slow the upload down
    ZI_WARN("cuda upload: %s; copying with %d threads", pool_->start_status().message().c_str(),
            pool_->size());
  }
  ring_.reset();
  ++stats_.allocations;
  return true;
}

Status PinnedUploader::release() {
  Status s = Status::Ok();
  if (staging_ != nullptr) {
    // Every DMA out of a buffer was followed by a record of that buffer's event.
    for (cudaEvent_t e : events_) {
      const Status w = cuda_status(cudaEventSynchronize(e), "cudaEventSynchronize");
      if (s.ok() && !w.ok()) s = w;
    }
    if (!s.ok()) cudaStreamSynchronize(stream_);  // freeing memory a DMA reads is worse
  }
  free_staging();
  unavailable_ = false;
  return s;
}

void PinnedUploader::free_staging() {
  if (staging_ == nullptr && events_.empty() && !pool_) return;  // no CUDA call at exit
  DeviceScope scope(device_);
  pool_.reset();
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
  events_.clear();
  staging_mem_.reset();  // unlocked under capture_guard.h's lock
  staging_ = nullptr;
  ring_.reset();
}

}  // namespace zimage::cuda

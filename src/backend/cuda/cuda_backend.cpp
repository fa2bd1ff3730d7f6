// CudaBackend: creation, memory (alloc, upload/download with conversion, convert, copy_2d,
// fill), and the extras (graph capture, stats). The compute ops live in cuda_ops.cpp,
// attention in cuda_attention.cpp, conv2d in conv_cudnn.cpp.
#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "backend/cuda/kernels/kernels.h"
#include "backend/cuda/libs/attention_fa3.h"
#include "backend/cuda/libs/attention_flash3.h"
#include "backend/cuda/libs/conv_cudnn.h"
#include "backend/cuda/libs/conv_graph.h"
#include "backend/cuda/libs/cublas_loader.h"
#include "backend/cuda/libs/gemm_cublaslt.h"
#include "backend/cuda/libs/gemm_cutlass.h"
#include "backend/cuda/libs/sdpa_cudnn.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/validate.h"
#include "core/log.h"
#include "core/text.h"

namespace zimage {

Result<std::unique_ptr<Backend>> make_cuda_backend(int device_index, DType act_dtype) {
  ZI_ASSIGN_OR_RETURN(auto b, cuda::CudaBackend::create(device_index, act_dtype));
  return std::unique_ptr<Backend>(std::move(b));
}

Result<std::pair<uint64_t, uint64_t>> cuda_device_memory() {
  size_t free_b = 0, total_b = 0;
  ZI_CUDA_TRY(cudaMemGetInfo(&free_b, &total_b));
  return std::pair<uint64_t, uint64_t>{total_b, free_b};
}

namespace cuda {

CudaGraph& CudaGraph::operator=(CudaGraph&& o) noexcept {
  if (this != &o) {
    if (exec_) cudaGraphExecDestroy(exec_);
    exec_ = o.exec_;
    o.exec_ = nullptr;
  }
  return *this;
}

CudaGraph::~CudaGraph() {
  if (exec_) cudaGraphExecDestroy(exec_);
}

static_assert(kGemmCandidates == LtGemm::kMaxCandidates, "ZIMAGE_GEMM_CANDIDATE's range");

Result<std::unique_ptr<CudaBackend>> CudaBackend::create(int device_index, DType act_dtype) {
  const auto start = std::chrono::steady_clock::now();
  if (act_dtype != DType::kBF16 && act_dtype != DType::kF32)
    return InvalidArgument(std::string("cuda backend: act dtype must be bf16 or f32, got ") +
                           dtype_name(act_dtype));
  // Every ZIMAGE_* setting, checked before anything else (cuda_settings.h): a bad value is an
  // error naming it on any machine, never a silent CPU fallback.
  ZI_ASSIGN_OR_RETURN(const CudaSettings settings, read_cuda_settings());
  // cuBLAS's libraries load on a thread of their own while the driver starts below
  // (libs/cublas_loader.h says why); joined before the first cuBLAS handle.
  // ZIMAGE_CUBLAS_THREAD=0 loads them on this thread after the context instead, serially as
  // when they were linked (to measure the overlap).
  std::thread blas_loader;
  try {
    if (settings.blas_on_thread) blas_loader = std::thread([] { (void)load_cublas(); });
  } catch (const std::system_error&) {  // no thread to spare: loaded below, on this one
  }
  struct JoinOnReturn {
    std::thread& t;
    ~JoinOnReturn() {
      if (t.joinable()) t.join();
    }
  } join_blas_loader{blas_loader};
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    cudaGetLastError();
    return Unsupported(std::string("no CUDA device") +
                       (e != cudaSuccess ? std::string(": ") + cudaGetErrorString(e) : ""));
  }
  if (device_index < 0 || device_index >= count)
    return InvalidArgument("cuda backend: device " + std::to_string(device_index) +
                           " does not exist (" + std::to_string(count) + " present)");
  using Clock = std::chrono::steady_clock;
  auto ms_since = [](Clock::time_point t) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
  };
  Clock::time_point tp = Clock::now();
  ZI_CUDA_TRY(cudaSetDevice(device_index));
  ZI_CUDA_TRY(cudaFree(nullptr));  // the context, made here so its time is its own below
  const double context_ms = ms_since(tp);
  cudaDeviceProp prop{};
  ZI_CUDA_TRY(cudaGetDeviceProperties(&prop, device_index));
  if (prop.major < 8)
    return Unsupported(std::string("cuda backend: ") + prop.name + " is sm_" +
                       std::to_string(prop.major) + std::to_string(prop.minor) +
                       "; sm_80 or newer is required");
  std::unique_ptr<CudaBackend> b(new CudaBackend(device_index, act_dtype));
  b->attention_path_ = settings.attention;
  b->sm_ = prop.major * 10 + prop.minor;
  if (settings.fp8_fast_accum) b->fp8_fast_accum_ = *settings.fp8_fast_accum;
  b->name_ =
      "cuda:" + std::to_string(device_index) + " " + prop.name + " (" + dtype_name(act_dtype) + ")";
  ZI_CUDA_TRY(cudaStreamCreateWithFlags(&b->stream_, cudaStreamNonBlocking));
  // Churn in repeated work (a VAE decode image after image) may grow the cache's budget by up
  // to a tenth of the device's memory (core/block_allocator.h, "Repeated work");
  // ZIMAGE_ALLOC_REPEAT=0 keeps the budget fixed (for comparisons; the rule before, but for the
  // cap at a held limit).
  BlockAllocatorOptions alloc_options;
  alloc_options.repeat_slack_max_bytes = prop.totalGlobalMem / 10;
  if (!settings.alloc_repeat) alloc_options.repeat_slack_max_bytes = 0;
  b->allocator_ = CachingAllocator::create(device_index, alloc_options);
  tp = Clock::now();
  if (blas_loader.joinable()) blas_loader.join();
  const double blas_wait_ms = ms_since(tp);
  ZI_TRY(load_cublas());
  tp = Clock::now();
  ZI_ASSIGN_OR_RETURN(b->gemm_, LtGemm::create(b->stream_, *b->allocator_));
  const double blas_ms = ms_since(tp);
  tp = Clock::now();
  b->conv_ = ConvPlanner::create(b->stream_);
  b->sdpa_ = CudnnSdpa::create(b->stream_);
  const double cudnn_ms = ms_since(tp);
  b->fa3_ = fa3_available(device_index);
  b->flash3_ = flash3_built() && b->sm_ == 90;
  b->num_sms_ = prop.multiProcessorCount;
  // What the cached run-time choices depend on (io/fs/plan_cache.h): the GPU and the libraries.
  const std::string identity = std::string(prop.name) + " sm_" + std::to_string(b->sm_) +
                               " cudnn " + std::to_string(cudnnGetVersion()) + " cublasLt " +
                               std::to_string(cublasLtGetVersion()) + " " + ConvGraphs::cache_tag();
  std::shared_ptr<PlanCache> plan_cache =
      settings.plan_cache ? PlanCache::open("", identity) : nullptr;
  tp = Clock::now();
  b->conv_graphs_ = ConvGraphs::create(b->stream_, plan_cache);
  const double graphs_ms = ms_since(tp);
  b->profiler_ = std::make_unique<OpProfiler>(b->stream_);
  // With debug logging, ops slower than 3 ms on the host are named (a new process's first calls).
  if (log_level() >= LogLevel::kDebug) b->profiler_->set_host_watch_ms(3.0);
  b->uploader_ = std::make_unique<PinnedUploader>(device_index, b->stream_);
  b->uploader_->set_locked_ranges(b->locked_);
  b->apply_settings(settings, plan_cache);
  ZI_INFO("cuda backend %s ready in %.3f s (context, cuBLASLt, cuDNN)", b->name_.c_str(),
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  ZI_DEBUG(
      "cuda backend start: context %.1f ms, then waited %.1f ms for cuBLAS's libraries, "
      "cuBLAS/cuBLASLt handles %.1f ms, cuDNN handles (convolutions, attention) %.1f ms, cuDNN "
      "graph handle %.1f ms",
      context_ms, blas_wait_ms, blas_ms, cudnn_ms, graphs_ms);
  return b;
}

void CudaBackend::apply_settings(const CudaSettings& s,
                                 const std::shared_ptr<PlanCache>& plan_cache) {
  if (s.upload_locked) upload_locked_ = *s.upload_locked;
  if (s.row_kernels) set_row_kernel_tuning(*s.row_kernels);   // process-wide
  if (s.staged_rows) set_staged_row_kernels(*s.staged_rows);  // process-wide
  if (s.packed_rows) set_packed_row_kernels(*s.packed_rows);  // process-wide
  if (s.fp8_tile) fp8_tile_ = *s.fp8_tile;
  if (s.gemm_order) gemm_order_ = *s.gemm_order;
  if (s.bf16_wide_tile) bf16_wide_tile_ = *s.bf16_wide_tile;
  if (s.swiglu_tuning) swiglu_tuning_ = *s.swiglu_tuning;
  if (s.qkv_tuning) qkv_tuning_ = *s.qkv_tuning;
  for (const auto& [set, member] :
       {std::pair{&s.fused_norm, &fused_norm_}, std::pair{&s.fused_conv_add, &fused_conv_add_},
        std::pair{&s.pad_narrow_conv, &pad_narrow_conv_},
        std::pair{&s.warm_execute, &warm_execute_}, std::pair{&s.packed_qkv, &packed_qkv_},
        std::pair{&s.fp8_inputs, &fp8_inputs_}, std::pair{&s.fused_swiglu_fp8, &fused_swiglu_fp8_},
        std::pair{&s.fused_adaln, &fused_adaln_}, std::pair{&s.adaln_layers, &adaln_layers_},
        std::pair{&s.fused_swiglu, &fused_swiglu_}, std::pair{&s.fused_qkv, &fused_qkv_},
        std::pair{&s.fused_swiglu_gemm_fp8, &fused_swiglu_gemm_fp8_}})
    if (set->has_value()) *member = **set;
  set_conv_runtime_compile(s.conv_runtime_compile.value_or(false));  // ConvGraphs' default
  if (s.warm_up) warm_up_ = *s.warm_up;
  if (s.gemm_candidate) gemm_->set_wide_candidate(*s.gemm_candidate);
  if (s.gemm_config) gemm_->set_wide_config(*s.gemm_config);
  if (s.flash3_cluster) flash3_cluster_ = *s.flash3_cluster;
  if (s.gemm_autotune) gemm_->set_autotune(true, plan_cache);
  if (s.pin_by_register) pin_by_register_ = *s.pin_by_register;
}

CudaBackend::CudaBackend(int device, DType act) : device_(device), act_(act) {}

CudaBackend::~CudaBackend() {
  if (stream_) cudaStreamSynchronize(stream_);
  if (copy_stream_) cudaStreamSynchronize(copy_stream_);
  stager_.reset();  // its buffers, once no DMA reads them
  for (int i = 0; i < kStreamSlots; ++i) {
    if (loaded_[i]) cudaEventDestroy(loaded_[i]);
    if (released_[i]) cudaEventDestroy(released_[i]);
  }
  if (copy_stream_) cudaStreamDestroy(copy_stream_);
  if (external_in_) cudaEventDestroy(external_in_);
  if (external_out_) cudaEventDestroy(external_out_);
  profiler_.reset();
  sdpa_.reset();
  conv_graphs_.reset();
  uploader_.reset();
  conv_.reset();
  gemm_.reset();
  if (stream_) cudaStreamDestroy(stream_);
}

Result<Tensor> CudaBackend::alloc(DType dtype, const Shape& shape) {
  const int64_t n = shape_numel(shape);
  if (n < 0) return InvalidArgument("alloc: bad shape " + shape_string(shape));
  ZI_ASSIGN_OR_RETURN(auto st, allocator_->allocate(static_cast<size_t>(n) * dtype_size(dtype)));
  return Tensor(std::move(st), 0, dtype, shape);
}

Result<Tensor> CudaBackend::upload(const Tensor& host, DType dtype) {
  if (!host.defined() || host.device() != Device::kCPU)
    return InvalidArgument("upload: source must be a defined host tensor");
  if (host.numel() < 0) return InvalidArgument("upload: bad shape");
  ZI_ASSIGN_OR_RETURN(Tensor out, alloc(dtype, host.shape()));
  if (host.numel() == 0) return out;
  // The contract of backend.h holds on both of the uploader's paths: when copy() returns the
  // host bytes have been read (into pinned staging or the driver's buffer), so the caller may free
  // or overwrite `host` at once; only DMA from memory the uploader owns may still be in flight, in
  // stream order before any later op.
  if (host.dtype() == dtype) {
    ZI_TRY(uploader_->copy(out.data(), host.data(), host.nbytes()));
    return out;
  }
  if (!is_float_kernel_type(dtype) || !dtype_is_float(host.dtype()))
    return Unsupported(std::string("upload: cannot convert ") + dtype_name(host.dtype()) + " to " +
                       dtype_name(dtype));
  if (is_float_kernel_type(host.dtype())) {  // raw copy, convert on the device
    ZI_ASSIGN_OR_RETURN(Tensor raw, alloc(host.dtype(), host.shape()));
    ZI_TRY(uploader_->copy(raw.data(), host.data(), host.nbytes()));
    ZI_TRY(convert(raw, out));
    return out;
  }
  // fp8/f64 and friends: widen to f32 on the host first.
  std::vector<float> wide(static_cast<size_t>(host.numel()));
  if (!convert_to_f32(host.dtype(), host.data(), wide.data(), wide.size()))
    return Unsupported(std::string("upload: cannot convert ") + dtype_name(host.dtype()));
  Tensor wide_t = Tensor::wrap(wide.data(), DType::kF32, host.shape());
  ZI_ASSIGN_OR_RETURN(Tensor f32, upload(wide_t, DType::kF32));
  if (dtype == DType::kF32) return f32;
  ZI_TRY(convert(f32, out));
  return out;
}

namespace {
// Downloads at least this large into pageable memory take the staged path during a load.
constexpr size_t kStagedDownloadBytes = size_t{4} << 20;
}  // namespace

Status CudaBackend::download(const Tensor& src, Tensor& host) {
  ZI_TRY(check_cuda_tensor("download", "src", src));
  if (!host.defined() || host.device() != Device::kCPU)
    return InvalidArgument("download: destination must be a defined host tensor");
  if (host.shape() != src.shape())
    return InvalidArgument("download: shapes differ: " + src.describe() + " vs " + host.describe());
  if (src.numel() == 0) return Status::Ok();
  if (src.dtype() == host.dtype()) {
    // A large pageable destination while a load's staging exists (weights moved back to host
    // memory): through the staging on the copy threads (uploader.h). Otherwise the driver's copy.
    if (src.nbytes() >= kStagedDownloadBytes && uploader_->has_staging() &&
        !is_page_locked(host.data()))
      return uploader_->download(host.data(), src.data(), src.nbytes());
    ZI_CUDA_TRY(
        cudaMemcpyAsync(host.data(), src.data(), src.nbytes(), cudaMemcpyDeviceToHost, stream_));
    ZI_CUDA_TRY(cudaStreamSynchronize(stream_));
    return Status::Ok();
  }
  if (!is_float_kernel_type(src.dtype()) || !dtype_is_float(host.dtype()))
    return Unsupported(std::string("download: cannot convert ") + dtype_name(src.dtype()) + " to " +
                       dtype_name(host.dtype()));
  if (is_float_kernel_type(host.dtype())) {
    ZI_ASSIGN_OR_RETURN(Tensor tmp, alloc(host.dtype(), src.shape()));
    ZI_TRY(convert(src, tmp));
    return download(tmp, host);
  }
  Tensor wide = Tensor::host(DType::kF32, src.shape());
  if (!wide.defined()) return OutOfMemory("download: host buffer");
  ZI_TRY(download(src, wide));
  if (!convert_from_f32(host.dtype(), wide.data_as<float>(), host.data(),
                        static_cast<size_t>(host.numel())))
    return Unsupported(std::string("download: cannot convert to ") + dtype_name(host.dtype()));
  return Status::Ok();
}

Status CudaBackend::convert(const Tensor& src, Tensor& dst) {
  ZI_OP_SCOPE("convert", &src, &dst);
  ZI_TRY(check_cuda_tensor("convert", "src", src));
  ZI_TRY(check_cuda_tensor("convert", "dst", dst));
  if (src.numel() != dst.numel())
    return InvalidArgument("convert: element counts differ: " + src.describe() + " vs " +
                           dst.describe());
  if (src.numel() == 0) return Status::Ok();
  if (src.dtype() == dst.dtype()) {
    if (src.data() == dst.data()) return Status::Ok();
    ZI_CUDA_TRY(
        cudaMemcpyAsync(dst.data(), src.data(), src.nbytes(), cudaMemcpyDeviceToDevice, stream_));
    return Status::Ok();
  }
  if (overlaps(src, dst)) return InvalidArgument("convert: in place needs equal dtypes");
  ZI_ASSIGN_OR_RETURN(KType from, ktype_of("convert", src.dtype()));
  ZI_ASSIGN_OR_RETURN(KType to, ktype_of("convert", dst.dtype()));
  ZI_LAUNCH_TRY("convert", launch_convert(from, src.data(), to, dst.data(), src.numel(), stream_));
  return Status::Ok();
}

Status CudaBackend::copy_2d(const Tensor& src, int64_t src_offset, int64_t src_row_stride,
                            Tensor& dst, int64_t dst_offset, int64_t dst_row_stride, int64_t rows,
                            int64_t cols) {
  ZI_OP_SCOPE("copy_2d", &dst);
  ZI_TRY(check_cuda_tensor("copy_2d", "src", src));
  ZI_TRY(check_cuda_tensor("copy_2d", "dst", dst));
  if (src.dtype() != dst.dtype())
    return InvalidArgument("copy_2d: dtypes differ: " + src.describe() + " vs " + dst.describe());
  if (rows < 0 || cols < 0 || src_offset < 0 || dst_offset < 0)
    return InvalidArgument("copy_2d: negative size or offset");
  if (rows == 0 || cols == 0) return Status::Ok();
  if (rows > 1 && (src_row_stride < cols || dst_row_stride < cols))
    return InvalidArgument("copy_2d: row strides must be >= cols");
  const int64_t src_end = src_offset + (rows - 1) * src_row_stride + cols;
  const int64_t dst_end = dst_offset + (rows - 1) * dst_row_stride + cols;
  if (src_end > src.numel() || dst_end > dst.numel())
    return InvalidArgument("copy_2d: block of " + std::to_string(rows) + "x" +
                           std::to_string(cols) + " runs past " +
                           (src_end > src.numel() ? src.describe() : dst.describe()));
  const size_t es = dtype_size(src.dtype());
  const size_t width = static_cast<size_t>(cols) * es;
  const size_t spitch = rows > 1 ? static_cast<size_t>(src_row_stride) * es : width;
  const size_t dpitch = rows > 1 ? static_cast<size_t>(dst_row_stride) * es : width;
  const char* s = static_cast<const char*>(src.data()) + src_offset * es;
  char* d = static_cast<char*>(dst.data()) + dst_offset * es;
  ZI_CUDA_TRY(cudaMemcpy2DAsync(d, dpitch, s, spitch, width, static_cast<size_t>(rows),
                                cudaMemcpyDeviceToDevice, stream_));
  return Status::Ok();
}

Status CudaBackend::fill(Tensor& t, float value) {
  ZI_OP_SCOPE("fill", &t);
  ZI_TRY(check_cuda_tensor("fill", "t", t));
  ZI_ASSIGN_OR_RETURN(KType kt, ktype_of("fill", t.dtype()));
  ZI_LAUNCH_TRY("fill", launch_fill(kt, t.data(), t.numel(), value, stream_));
  return Status::Ok();
}

Status CudaBackend::synchronize() {
  ZI_CUDA_TRY(cudaStreamSynchronize(stream_));
  return Status::Ok();
}

Status CudaBackend::bind_thread() {
  ZI_CUDA_TRY(cudaSetDevice(device_));
  return Status::Ok();
}

std::string CudaBackend::pci_bus_id() const {
  char id[32] = {};
  if (cudaDeviceGetPCIBusId(id, sizeof id, device_) != cudaSuccess) {
    (void)cudaGetLastError();
    return {};
  }
  return id;
}

std::optional<uint64_t> CudaBackend::available_memory() const {
  // The engine binds this device in the calling thread (bind_thread) before it decodes.
  auto mem = device_memory();  // {total, free}
  if (!mem.ok()) {
    ZI_WARN("cuda: %s", mem.status().to_string().c_str());
    return std::nullopt;
  }
  const AllocatorStats s = memory_stats();
  uint64_t avail = mem->second + (s.reserved_bytes - s.in_use_bytes);
  // Under a memory budget (set_memory_limit) the allocator gets no more than its cap.
  if (const size_t cap = allocator_->limit(); cap != 0)
    avail = std::min<uint64_t>(avail, cap > s.in_use_bytes ? cap - s.in_use_bytes : 0);
  return avail;
}

Status CudaBackend::finish_uploads() {
  const auto t0 = std::chrono::steady_clock::now();
  ZI_CUDA_TRY(cudaStreamSynchronize(stream_));  // the uploads' DMA runs on stream_
  const double waited =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  host_pool_.reset();
  // What the copies took since the last call (a load's, and any uploads between loads), to tell
  // the staged path from the driver's pageable one when a load is slower than its bytes.
  const PinnedUploader::Stats& st = uploader_->stats();
  ZI_DEBUG(
      "uploads: %.2f GB staged in %llu copies, %.2f GB plain in %llu, %.2f GB from locked "
      "files; %.2f GB downloaded through the staging in %llu; staging allocated %llu times; "
      "%.1f ms waiting for the last DMA",
      static_cast<double>(st.staged_bytes - upload_stats_seen_.staged_bytes) / 1e9,
      static_cast<unsigned long long>(st.staged_copies - upload_stats_seen_.staged_copies),
      static_cast<double>(st.plain_bytes - upload_stats_seen_.plain_bytes) / 1e9,
      static_cast<unsigned long long>(st.plain_copies - upload_stats_seen_.plain_copies),
      static_cast<double>(st.locked_bytes - upload_stats_seen_.locked_bytes) / 1e9,
      static_cast<double>(st.staged_download_bytes - upload_stats_seen_.staged_download_bytes) /
          1e9,
      static_cast<unsigned long long>(st.staged_downloads - upload_stats_seen_.staged_downloads),
      static_cast<unsigned long long>(st.allocations - upload_stats_seen_.allocations), waited);
  upload_stats_seen_ = st;
  return uploader_->release();
}

void CudaBackend::prepare_uploads() noexcept {
  // Page-locked file mappings (ZIMAGE_UPLOAD=locked) take no staging.
  if (!upload_locked_) uploader_->prepare();
}

void CudaBackend::warm_up(const WarmUpHints& hints) noexcept {
  if (warm_up_ == 0) return;
  try {
    std::lock_guard<std::mutex> lock(staging_mu_);
    warming_ = true;
  } catch (...) {  // requests are then not held: they page-lock beside the warm-up
  }
  // Whatever way this returns, the staging requests held meanwhile start.
  struct Release {
    CudaBackend* be;
    ~Release() { be->start_staging_requests(); }
  } release{this};
  using Clock = std::chrono::steady_clock;
  const Clock::time_point t0 = Clock::now();
  if (cudaSetDevice(device_) != cudaSuccess) {
    cudaGetLastError();
    return;
  }
  cudaStream_t side = nullptr;
  if (cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking) != cudaSuccess) {
    cudaGetLastError();
    return;
  }
  WarmUp done;
  const size_t scratch = warm_execute_ ? static_cast<size_t>(hints.scratch_bytes) : 0;
  done.plans = conv_graphs_ ? conv_graphs_->preload_saved(side, act_, hints.conv_inputs, scratch,
                                                          &done.plans_executed)
                            : 0;
  const Clock::time_point t1 = Clock::now();
  done.attention = warm_general_attention(side);
  const Clock::time_point t2 = Clock::now();
  if (warm_up_ >= 2 && !hints.linears.empty())
    done.linears = LtGemm::warm_up(side, hints.linears, act_);
  cudaStreamSynchronize(side);
  cudaStreamDestroy(side);
  cudaGetLastError();
  last_warm_up_ = done;
  auto ms = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
  };
  ZI_DEBUG(
      "warm-up: %d saved convolution plans loaded (%d executed on %.0f MiB of scratch at "
      "most) in %.1f ms; the general attention's GEMMs %s in %.1f ms; %d of %zu linears in "
      "%.1f ms",
      done.plans, done.plans_executed, static_cast<double>(scratch) / (1 << 20), ms(t0, t1),
      done.attention ? "loaded" : "not loaded", ms(t1, t2), done.linears,
      warm_up_ >= 2 ? hints.linears.size() : size_t{0}, ms(t2, Clock::now()));
}

Status CudaBackend::begin_capture() {
  ZI_CUDA_TRY(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  return Status::Ok();
}

Result<CudaGraph> CudaBackend::end_capture() {
  cudaGraph_t graph = nullptr;
  ZI_CUDA_TRY(cudaStreamEndCapture(stream_, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  ZI_TRY(cuda_status(e, "cudaGraphInstantiate"));
  return CudaGraph(exec);
}

namespace {

class CudaRecordedWork final : public RecordedWork {
 public:
  CudaRecordedWork(CudaBackend& be, CudaGraph graph, std::shared_ptr<CachingAllocator> alloc,
                   PoolId pool)
      : be_(be), graph_(std::move(graph)), alloc_(std::move(alloc)), pool_(pool) {}
  ~CudaRecordedWork() override {
    graph_ = CudaGraph();  // the graph goes before the memory it writes
    // No replay may still run on the pool's blocks. A destructor cannot report: a failure here
    // leaves the pool reserved (memory held, nothing corrupted).
    if (be_.synchronize().ok()) (void)alloc_->release_pool(pool_);
  }
  Status replay() override { return be_.replay(graph_); }

 private:
  CudaBackend& be_;
  CudaGraph graph_;
  std::shared_ptr<CachingAllocator> alloc_;
  PoolId pool_;
};

}  // namespace

Result<std::unique_ptr<RecordedWork>> CudaBackend::record(const std::function<Status()>& work) {
  // A private pool's misses cannot give idle general segments back (block_allocator.h): where
  // repeated work has grown the general pool's budget, idle segments go back first, least
  // recently used first, down to the fixed budget, so that the recording finds the room the
  // fixed budget would have left it. What goes back comes back, once, at the next repetition.
  // (Refused only while another pool is active; then nothing changes.)
  if (allocator_->stats().repeat_slack_bytes > 0) (void)allocator_->trim_to_fixed_budget();
  const PoolId pool = next_pool_++;
  ZI_TRY(allocator_->begin_pool(pool));
  auto abandon = [&](Status s) {  // the error of `work` is the one worth reporting
    (void)allocator_->end_pool();
    if (synchronize().ok()) (void)allocator_->release_pool(pool);
    return s;
  };
  // Warm-up: the first run of new shapes plans GEMMs and builds cuDNN graphs (host work and
  // allocations that cannot be captured) and leaves the pool holding every block the work needs.
  // It is a real run, whose results the caller keeps; the capture below queues nothing.
  if (Status w = work(); !w.ok()) return abandon(w);
  if (Status c = begin_capture(); !c.ok()) return abandon(c);
  const Status during = work();
  auto graph = end_capture();
  if (!during.ok() || !graph.ok()) {
    cudaGetLastError();  // a failed capture leaves a sticky error on the last call
    const Status why = !during.ok() ? during : graph.status();
    return abandon(
        Unsupported("cuda: cannot record this work as a CUDA graph (" + why.to_string() + ")"));
  }
  ZI_TRY(allocator_->end_pool());
  return std::unique_ptr<RecordedWork>(
      new CudaRecordedWork(*this, std::move(*graph), allocator_, pool));
}

Status CudaBackend::replay(const CudaGraph& graph) {
  if (!graph.valid()) return InvalidArgument("replay: empty graph");
  ZI_CUDA_TRY(cudaGraphLaunch(graph.exec(), stream_));
  return Status::Ok();
}

Backend::AllocatorCounters CudaBackend::allocator_counters() const {
  const AllocatorStats st = memory_stats();
  return {st.in_use_bytes, st.peak_in_use_bytes, st.peak_reserved_bytes,
          st.num_device_mallocs + st.num_device_frees};
}

void CudaBackend::set_attention_choice(AttentionChoice c) {
  switch (c) {
    case AttentionChoice::kAuto:
      attention_path_ = AttentionPath::kAuto;
      break;

    case AttentionChoice::kOwn:
      attention_path_ = AttentionPath::kOwn;
      break;
    case AttentionChoice::kGeneral:
      attention_path_ = AttentionPath::kGeneral;
      break;
  }
}

Result<std::vector<Backend::OpProfileEntry>> CudaBackend::op_profile() {
  ZI_ASSIGN_OR_RETURN(std::vector<OpProfileRow> rows, profile_report());
  std::vector<OpProfileEntry> out;
  out.reserve(rows.size());
  for (OpProfileRow& r : rows) out.push_back({std::move(r.key), r.count, r.total_ms, r.host_ms});
  return out;
}

}  // namespace cuda
}  // namespace zimage

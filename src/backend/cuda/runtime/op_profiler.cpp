// Per-op GPU timing: see op_profiler.h.
#include "backend/cuda/runtime/op_profiler.h"

#include <algorithm>
#include <map>

#include "backend/cuda/runtime/cuda_check.h"

namespace zimage::cuda {

OpProfiler::~OpProfiler() {
  for (Mark& m : marks_) {
    if (m.start) cudaEventDestroy(m.start);
    if (m.stop) cudaEventDestroy(m.stop);
  }
  for (cudaEvent_t e : spare_) cudaEventDestroy(e);
}

Result<cudaEvent_t> OpProfiler::event() {
  if (!spare_.empty()) {
    cudaEvent_t e = spare_.back();
    spare_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  ZI_CUDA_TRY(cudaEventCreate(&e));
  return e;
}

int OpProfiler::begin(std::string key) {
  if (depth_++ > 0) return -1;
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream_, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone)
    return -1;
  auto start = event();
  auto stop = event();
  if (!start.ok() || !stop.ok()) return -1;  // profiling is best effort; the op still runs
  if (cudaEventRecord(*start, stream_) != cudaSuccess) return -1;
  marks_.push_back(Mark{std::move(key), *start, *stop, 0.0, std::chrono::steady_clock::now()});
  return static_cast<int>(marks_.size()) - 1;
}

void OpProfiler::end(int token) {
  --depth_;
  if (token < 0 || token >= static_cast<int>(marks_.size())) return;
  Mark& m = marks_[static_cast<size_t>(token)];
  cudaEventRecord(m.stop, stream_);
  m.host_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - m.t0).count();
}

Result<std::vector<OpProfileRow>> OpProfiler::report() {
  ZI_CUDA_TRY(cudaStreamSynchronize(stream_));
  std::map<std::string, OpProfileRow> by_key;
  for (Mark& m : marks_) {
    float ms = 0;
    if (cudaEventElapsedTime(&ms, m.start, m.stop) == cudaSuccess) {
      OpProfileRow& r = by_key[m.key];
      r.key = m.key;
      ++r.count;
      r.total_ms += ms;
      r.host_ms += m.host_ms;
    }
    spare_.push_back(m.start);
    spare_.push_back(m.stop);
  }
  marks_.clear();
  std::vector<OpProfileRow> rows;
  for (auto& [k, r] : by_key) rows.push_back(std::move(r));
  std::sort(rows.begin(), rows.end(),
            [](const OpProfileRow& a, const OpProfileRow& b) { return a.total_ms > b.total_ms; });
  return rows;
}

}  // namespace zimage::cuda

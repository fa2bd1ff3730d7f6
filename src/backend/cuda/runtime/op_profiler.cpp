// Per-op GPU timing: see op_profiler.h.
#include "backend/cuda/runtime/op_profiler.h"

#include <algorithm>
#include <map>

#include "backend/cuda/runtime/cuda_check.h"
#include "core/log.h"

namespace zimage::cuda {

void log_slow_op(const std::string& key, double host_ms) {
  ZI_DEBUG("op %s: %.1f ms on the host", key.c_str(), host_ms);
}

OpProfiler::~OpProfiler() {
  for (Mark& m : marks_) {
    if (m.captured) continue;  // graph_events_ holds those
    if (m.start) cudaEventDestroy(m.start);
    if (m.stop) cudaEventDestroy(m.stop);
  }
  for (cudaEvent_t e : spare_) cudaEventDestroy(e);
  for (cudaEvent_t e : graph_events_) cudaEventDestroy(e);
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
  if (cudaStreamIsCapturing(stream_, &cs) != cudaSuccess) return -1;
  const bool captured = cs != cudaStreamCaptureStatusNone;
  if (captured && !recorded_) return -1;
  Mark m{std::move(key), nullptr, nullptr, 0.0, std::chrono::steady_clock::now(), captured};
  if (captured) {  // fresh events: graph nodes will keep writing them
    if (cudaEventCreate(&m.start) != cudaSuccess) return -1;
    graph_events_.push_back(m.start);
    if (cudaEventCreate(&m.stop) != cudaSuccess) return -1;
    graph_events_.push_back(m.stop);
    if (cudaEventRecordWithFlags(m.start, stream_, cudaEventRecordExternal) != cudaSuccess)
      return -1;
  } else {
    auto start = event();
    auto stop = event();
    if (!start.ok() || !stop.ok()) return -1;  // profiling is best effort; the op still runs
    m.start = *start, m.stop = *stop;
    if (cudaEventRecord(m.start, stream_) != cudaSuccess) {
      spare_.push_back(m.start), spare_.push_back(m.stop);
      return -1;
    }
  }
  marks_.push_back(std::move(m));
  return static_cast<int>(marks_.size()) - 1;
}

void OpProfiler::end(int token) {
  --depth_;
  if (token < 0 || token >= static_cast<int>(marks_.size())) return;
  Mark& m = marks_[static_cast<size_t>(token)];
  if (m.captured) {
    cudaEventRecordWithFlags(m.stop, stream_, cudaEventRecordExternal);
    return;  // host time while recording says nothing about a replay
  }
  cudaEventRecord(m.stop, stream_);
  m.host_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - m.t0).count();
}

Result<std::vector<OpProfileRow>> OpProfiler::report() {
  ZI_CUDA_TRY(cudaStreamSynchronize(stream_));
  std::map<std::string, OpProfileRow> by_key;
  // Recorded mode: the captured marks alone, in recording order; their span less their times is
  // the time between ops.
  const Mark* first = nullptr;
  const Mark* last = nullptr;
  double in_ops = 0;
  int64_t n_ops = 0;
  for (Mark& m : marks_) {
    if (m.captured == recorded_) {
      float ms = 0;
      const cudaError_t e = cudaEventElapsedTime(&ms, m.start, m.stop);
      // A mark whose events never completed (a recording abandoned or released before a
      // replay) is left out; its error must not stay behind for the next launch.
      if (e != cudaSuccess) (void)cudaGetLastError();
      if (e == cudaSuccess) {
        OpProfileRow& r = by_key[m.key];
        r.key = m.key;
        ++r.count;
        r.total_ms += ms;
        r.host_ms += m.host_ms;
        if (m.captured) {
          if (!first) first = &m;
          last = &m;
          in_ops += ms;
          ++n_ops;
        }
      }
    }
    if (!m.captured) spare_.push_back(m.start), spare_.push_back(m.stop);
  }
  float span = 0;
  cudaError_t span_err = cudaSuccess;
  if (first) {
    span_err = cudaEventElapsedTime(&span, first->start, last->stop);
    if (span_err != cudaSuccess) (void)cudaGetLastError();
  }
  if (first && span_err == cudaSuccess) {
    OpProfileRow& r = by_key["(between ops)"];
    r.key = "(between ops)";
    r.count = n_ops > 0 ? n_ops - 1 : 0;
    r.total_ms = std::max(0.0, static_cast<double>(span) - in_ops);
  }
  marks_.clear();
  std::vector<OpProfileRow> rows;
  for (auto& [k, r] : by_key) rows.push_back(std::move(r));
  std::sort(rows.begin(), rows.end(),
            [](const OpProfileRow& a, const OpProfileRow& b) { return a.total_ms > b.total_ms; });
  return rows;
}

}  // namespace zimage::cuda

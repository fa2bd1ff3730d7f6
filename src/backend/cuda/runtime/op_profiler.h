// Per-op GPU time for profiling (zimage bench --profile): with profiling on, every CudaBackend op
// records a CUDA event before and after its work on the stream, keyed by the op's name and its
// operand shapes; report() waits for the stream, sums the elapsed times per key and clears. The
// breakdown of a DiT forward or a VAE decode then reads like a kernel profile without an external
// tool (nsys does not run on the GPU machine). Off, an op pays one branch. Ops recorded while the
// stream is being captured into a CUDA graph are skipped, unless set_recorded(true): then their
// events become event-record nodes of the graph (cudaEventRecordExternal), each replay writes
// their timestamps, and report() gives the ops of the latest replay alone, with a
// "(between ops)" row: the replay's span from its first op's start to its last op's end, less the
// ops' own times (launch gaps and the drain of one kernel before the next starts).
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace zimage::cuda {

struct OpProfileRow {
  std::string key;  // "conv2d bf16[1, 128, 128, 512] * bf16[512, 3, 3, 512]"
  int64_t count = 0;
  double total_ms = 0;  // GPU time between the op's events
  double host_ms = 0;   // host time spent inside the op call (planning, library overhead)
};

class OpProfiler {
 public:
  explicit OpProfiler(cudaStream_t stream) : stream_(stream) {}
  ~OpProfiler();
  OpProfiler(const OpProfiler&) = delete;
  OpProfiler& operator=(const OpProfiler&) = delete;

  bool enabled() const { return enabled_; }
  void set_enabled(bool on) { enabled_ = on; }
  // Debug aid for a new process's first calls (plans loaded, kernels loaded by the driver at
  // their first launch, memory reserved): with a threshold > 0, every op whose call takes longer
  // than that on the host is logged at debug level with its key. Independent of profiling; off,
  // an op pays one branch.
  double host_watch_ms() const { return host_watch_ms_; }
  void set_host_watch_ms(double ms) { host_watch_ms_ = ms; }
  void set_recorded(bool on) { recorded_ = on; }
  // Returns a token for end(), or -1 when not recording. Ops called by another op (nesting) are
  // part of the outer op's time, not recorded on their own.
  int begin(std::string key);
  void end(int token);
  // Sorted by total time, largest first. Clears the recorded ops.
  Result<std::vector<OpProfileRow>> report();

 private:
  struct Mark {
    std::string key;
    cudaEvent_t start = nullptr, stop = nullptr;
    double host_ms = 0;
    std::chrono::steady_clock::time_point t0;
    bool captured = false;  // recorded into a graph: its events belong to graph nodes
  };
  Result<cudaEvent_t> event();

  cudaStream_t stream_;
  bool enabled_ = false;
  bool recorded_ = false;
  double host_watch_ms_ = 0;
  int depth_ = 0;  // ops in progress (an op calling another)
  // Events that graph nodes refer to: never reused for other marks (a later replay would write
  // them), destroyed with the profiler.
  std::vector<cudaEvent_t> graph_events_;
  std::vector<Mark> marks_;
  std::vector<cudaEvent_t> spare_;  // events of reported marks, reused
};

// Logs "op KEY: X ms on the host" at debug level (OpProfiler::set_host_watch_ms).
void log_slow_op(const std::string& key, double host_ms);

// RAII scope around one op. The key is built only when profiling is on, or when the op was slower
// on the host than the watch's threshold.
template <typename KeyFn>
class OpScope {
 public:
  OpScope(OpProfiler* p, KeyFn key)
      : p_(p && p->enabled() ? p : nullptr),
        watch_ms_(p ? p->host_watch_ms() : 0),
        key_(std::move(key)) {
    if (watch_ms_ > 0) t0_ = std::chrono::steady_clock::now();
    if (p_) token_ = p_->begin(key_());
  }
  ~OpScope() {
    if (p_) p_->end(token_);
    if (watch_ms_ > 0) {
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_).count();
      try {
        if (ms > watch_ms_) log_slow_op(key_(), ms);
      } catch (...) {  // a debug line that cannot be built is not worth an exception here
      }
    }
  }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  OpProfiler* p_;
  double watch_ms_;
  KeyFn key_;
  std::chrono::steady_clock::time_point t0_{};
  int token_ = -1;
};

// "name a * b": an op's profile key from its operand shapes (null or undefined operands skipped).
inline std::string op_key(const char* name, std::initializer_list<const Tensor*> operands) {
  std::string k = name;
  const char* sep = " ";
  for (const Tensor* t : operands) {
    if (!t || !t->defined()) continue;
    k += sep + t->describe();
    sep = " * ";
  }
  return k;
}

}  // namespace zimage::cuda

// Inside a CudaBackend op: times the op when profiling is on.
#define ZI_OP_SCOPE(name, ...)          \
  ::zimage::cuda::OpScope zi_op_scope_( \
      profiler_.get(), [&] { return ::zimage::cuda::op_key(name, {__VA_ARGS__}); })

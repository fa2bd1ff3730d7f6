// 2-D convolutions through cuDNN's graph API (cudnn-frontend), with the bias fused into the
// convolution's epilogue. Why not the legacy cudnnConvolutionForward: in cuDNN 9 that call plans
// anew on the host every time (it is a wrapper over the graph API), which costs milliseconds per
// call; the VAE decoder's ~40 convolutions then leave the GPU idle for longer than they run. A
// graph here is built once per shape, its candidate plans are timed on the real buffers (the
// engine's own "cudnn.benchmark"), and the fastest is kept; running it afterwards is cheap. The
// winner's index is remembered on disk (io/fs/plan_cache.h), so a new process builds only that plan
// instead of building and timing every candidate; and the built winner itself is saved
// (cudnn-frontend's Graph::serialize, PlanCache::put_blob), so a later process loads it
// (Graph::deserialize) without building the graph, querying the heuristics or compiling the plan.
// A saved plan that no longer loads is dropped and the shape planned again.
//
// Unavailable without the frontend headers; shapes cuDNN cannot fuse are remembered and answered
// with kUnsupported so conv2d falls back to the legacy path (conv_cudnn.h).
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/libs/conv_cudnn.h"
#include "backend/cuda/runtime/allocator.h"
#include "core/status.h"
#include "io/fs/plan_cache.h"

namespace zimage::cuda {

class ConvGraphs {
 public:
  // `cache` (optional): the plan cache of this GPU and library version.
  static std::unique_ptr<ConvGraphs> create(cudaStream_t stream,
                                            std::shared_ptr<PlanCache> cache = nullptr);
  ~ConvGraphs();
  ConvGraphs(const ConvGraphs&) = delete;
  ConvGraphs& operator=(const ConvGraphs&) = delete;

  bool available() const;
  // Whether a shape's plan search (no saved plan, no cached index) may build engines cuDNN
  // compiles at run time (NVRTC). Off (the default; ZIMAGE_CONV_RUNTIME_COMPILE=1 turns it on):
  // only precompiled engines are timed, and a graph only compiled ones take answers kUnsupported,
  // so the caller runs the unfused ops. The VAE's conv + bias + residual graphs are such: their
  // compiles took 2.3-2.8 s each, 10.5 s of a new process's first decode with empty caches, for
  // ~0.6 ms a decode once cached (docs/BENCHMARKS.md, "Session 22"). Plans saved by a process
  // that had it on still load.
  void set_runtime_compile(bool on);
  // What the saved plans depend on besides the GPU and cuDNN: this code's layout of the graphs and
  // the frontend's serialisation (part of the plan cache's identity).
  static std::string cache_tag();
  // y = conv(x, w) (+ bias[cout] broadcast, when bias is not null) (+ residual[n, ho, wo, cout],
  // when not null), summed in fp32 in the plan's epilogue and rounded once.
  Status run(const ConvRequest& r, const void* bias, CachingAllocator& alloc,
             const void* residual = nullptr);
  // Loads the plans of `dt` the cache has a saved copy of (at most 64), ahead of their first
  // run(), and has the driver load their kernels (a recorded, never executed, warm-up on
  // `side_stream`, under capture_guard.h's lock). What a new process's first decode paid (issue
  // 24, measured on an H100: 76-99 ms for cuDNN's start at the first plan, up to 80 ms for a
  // plan's first launch) moves to whichever thread calls this, off the critical path. Returns
  // the plans loaded. Safe beside run() on another thread, but meant for the load, before the
  // first convolution; never fails (a plan not loaded here loads at its first use as before).
  // The plans of inputs {n, h, w} in `first` (the first image's decode) come first: a cache that
  // also holds other sizes' plans fills the 64 before the ones the next image runs. With
  // `scratch_bytes` > 0 those plans are also executed once on zeroed scratch operands of their
  // shape (stream-ordered memory on `side_stream`, at most that many bytes at a time, freed
  // after): a recorded warm-up loads the kernels, but a new process's first real execution still
  // cost 5-60 ms of host time a plan (session 18's debug watch); `executed` counts them.
  int preload_saved(cudaStream_t side_stream, DType dt,
                    const std::vector<std::array<int64_t, 3>>& first = {}, size_t scratch_bytes = 0,
                    int* executed = nullptr) noexcept;
  // The order preload_saved() takes the cache's keys in: the convolution keys of dtype `dt`
  // whose input {n, h, w} is in `first`, then the others of `dt`, each group in the cache's
  // order; keys of other dtypes and malformed ones are left out.
  static std::vector<std::string> preload_order(const std::vector<std::string>& keys, DType dt,
                                                const std::vector<std::array<int64_t, 3>>& first);

 private:
  struct Impl;
  ConvGraphs();
  std::unique_ptr<Impl> impl_;
};

}  // namespace zimage::cuda

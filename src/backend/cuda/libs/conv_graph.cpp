// Convolutions as cuDNN graphs: see conv_graph.h.
#include "backend/cuda/libs/conv_graph.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend/cuda/libs/cudnn_fe.h"
#include "backend/cuda/runtime/capture_guard.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "core/log.h"

#if ZIMAGE_WITH_CUDNN_FRONTEND
#include <cudnn_frontend.h>
#endif

namespace zimage::cuda {

namespace {

// The epilogue's operands, the last field of a plan's key: bias = 1, residual = 2. In the cache key
// the bias stays the 12th field as before the residual existed (so saved plans stay valid) and a
// residual adds a 13th, ",1", which an older binary's parser rejects instead of taking the plan
// for a bias-only one.
constexpr int kEpBias = 1, kEpResidual = 2;
[[maybe_unused]] int epilogue_of(const void* bias, const void* residual) {
  return (bias ? kEpBias : 0) | (residual ? kEpResidual : 0);
}

// A plan's map key: the convolution's shape key and its epilogue_of().
using PlanKey = decltype(std::tuple_cat(std::declval<ConvShapeKey>(), std::tuple<int>{}));

[[maybe_unused]] PlanKey key_of(const ConvRequest& r, int epilogue) {
  return std::tuple_cat(conv_shape_key(r), std::make_tuple(epilogue));
}

std::string cache_key(const PlanKey& key) {
  const auto& [n, h, w, cin, cout, kh, kw, stride, pad_h, pad_w, dt, epilogue] = key;
  std::string k = "conv";
  for (int64_t v : {n, h, w, cin, cout, kh, kw, int64_t{stride}, int64_t{pad_h}, int64_t{pad_w},
                    int64_t{dt}, int64_t{epilogue & kEpBias}})
    k += "," + std::to_string(v);
  if (epilogue & kEpResidual) k += ",1";
  return k;
}
[[maybe_unused]] std::string cache_key(const ConvRequest& r, int epilogue) {
  return cache_key(key_of(r, epilogue));
}

// The map key of a cache key written by cache_key(); false for anything else (the key written
// back from what was parsed must be the same string).
bool parse_cache_key(const std::string& k, PlanKey& out) {
  long long v[13] = {};
  const int n = std::sscanf(
      k.c_str(), "conv,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld", &v[0],
      &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], &v[8], &v[9], &v[10], &v[11], &v[12]);
  if ((n != 12 && n != 13) || v[11] < 0 || v[11] > 1) return false;
  const PlanKey parsed{v[0],
                       v[1],
                       v[2],
                       v[3],
                       v[4],
                       v[5],
                       v[6],
                       static_cast<int>(v[7]),
                       static_cast<int>(v[8]),
                       static_cast<int>(v[9]),
                       static_cast<int>(v[10]),
                       static_cast<int>(v[11]) | (n == 13 ? kEpResidual : 0)};
  if (cache_key(parsed) != k) return false;
  out = parsed;
  return true;
}

}  // namespace

#if ZIMAGE_WITH_CUDNN_FRONTEND
namespace fe = cudnn_frontend;

namespace {

enum Uid : int64_t { kX = 1, kW, kBias, kY, kResidual };

constexpr int kMaxTimedPlans = 4;  // candidates timed per shape (heuristics order)
// The plan cache's hint for a graph only runtime-compiled engines take: a later process (with
// runtime compilation off) runs the unfused ops without asking cuDNN's heuristics again.
constexpr int64_t kOnlyCompiled = -2;
constexpr int kTimedRuns = 2;  // after one warm-up run

Status fe_status(fe::error_t e, const char* step) {
  if (e.is_good()) return Status::Ok();
  return Unsupported(std::string("cuDNN conv graph: ") + step + ": " + e.get_message());
}

// NHWC activations as cuDNN's [N, C, H, W] dims with strides.
std::vector<int64_t> nhwc_strides(int64_t c, int64_t h, int64_t w) {
  return {h * w * c, 1, w * c, c};
}

// The graph's tensors by uid: x, w, y, and the epilogue's operands it has.
std::unordered_map<int64_t, void*> variant_pack(const ConvRequest& r, const void* bias,
                                                const void* residual) {
  std::unordered_map<int64_t, void*> pack{
      {kX, const_cast<void*>(r.x)}, {kW, const_cast<void*>(r.w)}, {kY, r.y}};
  if (bias) pack.emplace(kBias, const_cast<void*>(bias));
  if (residual) pack.emplace(kResidual, const_cast<void*>(residual));
  return pack;
}

}  // namespace

struct ConvGraphs::Impl {
  struct Plan {
    bool supported = false;
    std::shared_ptr<fe::graph::Graph> graph;
    int64_t index = 0;  // the fastest plan; -1: the graph's only one (loaded from the cache)
    // Still to be saved (PlanCache::put_blob) after its first run, and whether the graph's
    // current plan is another one (built after it while timing): rebuilt then before saving.
    std::string save_key;
    bool save_rebuild = false;
    int64_t workspace = 0;  // its workspace
    float ms = 0;           // its measured time
  };
  using Key = PlanKey;

  cudaStream_t stream = nullptr;
  cudnnHandle_t handle = nullptr;
  std::mutex mu;  // plans: run() and preload_saved() may be called from different threads
  bool runtime_compile = false;  // set_runtime_compile
  std::map<Key, Plan> plans;
  std::shared_ptr<PlanCache> cache;

  // Whether cuDNN compiles the graph's plan `i` at run time (NVRTC).
  static bool compiles(fe::graph::Graph& g, int64_t i) {
    std::vector<fe::BehaviorNote_t> notes;
    return g.get_behavior_notes_for_plan_at_index(i, notes).is_good() &&
           std::find(notes.begin(), notes.end(), fe::BehaviorNote_t::RUNTIME_COMPILATION) !=
               notes.end();
  }

  // The plan the cache names, built alone; false (and the hint forgotten) when it does not build.
  // A runtime-compiled plan is not built while runtime_compile is off (a cache from before the
  // switch): false, the hint kept, and the search passes it over.
  bool build_cached(fe::graph::Graph& g, const std::string& key, Plan& p) {
    if (!cache) return false;
    const std::optional<int64_t> idx = cache->get(key);
    if (!idx || *idx == kOnlyCompiled) return false;
    if (!runtime_compile && *idx >= 0 && *idx < g.get_execution_plan_count() && compiles(g, *idx))
      return false;
    int64_t ws = 0;
    if (*idx >= 0 && *idx < g.get_execution_plan_count() && g.build_plan_at_index(*idx).is_good() &&
        g.get_workspace_size_plan_at_index(*idx, ws).is_good()) {
      p.index = *idx;
      p.workspace = ws;
      return true;
    }
    ZI_INFO("plan cache: the cached plan %lld of %s no longer builds; searching again",
            static_cast<long long>(*idx), key.c_str());
    cache->forget(key);
    return false;
  }

  // The plan saved for `key` (put_blob), loaded without building anything; false (and the blob
  // dropped) when there is none or it does not load.
  bool load_saved(const std::string& key, Plan& p) {
    if (!cache) return false;
    const std::optional<std::vector<uint8_t>> blob = cache->get_blob(key);
    if (!blob) return false;
    auto g = std::make_shared<fe::graph::Graph>();
    int64_t ws = 0;
    fe::error_t e = g->deserialize(handle, *blob, /*enforce_precompiled=*/false,
                                   /*run_warmup=*/false);
    if (!e.is_good() || !g->get_workspace_size(ws).is_good()) {
      ZI_INFO("plan cache: the saved plan of %s does not load (%s); planning again", key.c_str(),
              e.is_good() ? "no workspace size" : e.get_message().c_str());
      cache->forget_blob(key);
      return false;
    }
    p.graph = std::move(g);
    p.index = -1;
    p.workspace = ws;
    p.supported = true;
    return true;
  }

  // Executes the loaded plan `p` of `key` once on `side` with zeroed scratch operands of its
  // shape (one stream-ordered allocation, freed after), so that what its first execution costs
  // on the host is paid on the caller's thread; false when they would exceed `limit` bytes or
  // anything fails (the plan stays usable either way).
  bool exercise(const PlanKey& key, const Plan& p, cudaStream_t side, size_t limit) {
    const auto& [n, h, w, cin, cout, kh, kw, stride, pad_h, pad_w, dt, epilogue] = key;
    const DType dtype = static_cast<DType>(dt);
    if (dtype != DType::kBF16 && dtype != DType::kF16) return false;
    if (stride <= 0 || h + 2 * pad_h < kh || w + 2 * pad_w < kw) return false;
    const int64_t ho = (h + 2 * pad_h - kh) / stride + 1, wo = (w + 2 * pad_w - kw) / stride + 1;
    auto round = [](int64_t b) { return static_cast<size_t>((b + 255) / 256 * 256); };
    const int64_t es = 2;
    const size_t bx = round(n * h * w * cin * es), bw = round(cout * kh * kw * cin * es);
    const size_t by = round(n * ho * wo * cout * es),
                 bb = (epilogue & kEpBias) ? round(cout * es) : 0;
    const size_t br = (epilogue & kEpResidual) ? by : 0;
    const size_t operands = bx + bw + by + bb + br;
    const size_t total = operands + round(std::max<int64_t>(p.workspace, 0));
    if (total > limit) return false;
    void* base = nullptr;
    if (cudaMallocAsync(&base, total, side) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    auto* b = static_cast<uint8_t*>(base);
    bool ok = cudaMemsetAsync(base, 0, operands, side) == cudaSuccess;
    ConvRequest r{b,  b + bx, b + bx + bw, n,  h,      w,     cin,   cout,
                  kh, kw,     ho,          wo, stride, pad_h, pad_w, dtype};
    const void* bias = bb ? b + bx + bw + by : nullptr;
    const void* residual = br ? b + bx + bw + by + bb : nullptr;
    void* wp = p.workspace > 0 ? b + operands : nullptr;
    if (ok) {
      std::unordered_map<int64_t, void*> pack = variant_pack(r, bias, residual);
      ok = (p.index < 0 ? p.graph->execute(handle, pack, wp)
                        : p.graph->execute_plan_at_index(handle, pack, wp, p.index))
               .is_good();
    }
    cudaFreeAsync(base, side);
    cudaGetLastError();
    return ok;
  }

  // Saves the plan `index` of `g` (built) for later processes. Failures only cost the saving.
  void save(fe::graph::Graph& g, const std::string& key, int64_t index, bool rebuild) {
    if (!cache) return;
    // serialize() writes the graph's current candidate: the last plan built.
    if (rebuild && !g.build_plan_at_index(index).is_good()) return;
    std::vector<uint8_t> blob;
    fe::error_t e = g.serialize(blob, /*serialize_structure=*/false);
    if (!e.is_good()) {
      ZI_DEBUG("plan cache: plan of %s not saved: %s", key.c_str(), e.get_message().c_str());
      return;
    }
    cache->put_blob(key, blob);
  }

  Status build(const ConvRequest& r, const void* bias, const void* residual,
               CachingAllocator& alloc, Plan& p) {
    const std::string key = cache_key(r, epilogue_of(bias, residual));
    if (load_saved(key, p)) return Status::Ok();
    if (!runtime_compile && cache && cache->get(key) == kOnlyCompiled)
      return Unsupported(
          "cuDNN conv graph: only runtime-compiled engines take it (remembered; "
          "ZIMAGE_CONV_RUNTIME_COMPILE=1 compiles them)");
    const fe::DataType_t io =
        r.dt == DType::kBF16 ? fe::DataType_t::BFLOAT16
                             : (r.dt == DType::kF16 ? fe::DataType_t::HALF : fe::DataType_t::FLOAT);
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(io)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    auto x = g->tensor(fe::graph::Tensor_attributes()
                           .set_name("x")
                           .set_uid(kX)
                           .set_dim({r.n, r.cin, r.h, r.w_})
                           .set_stride(nhwc_strides(r.cin, r.h, r.w_)));
    auto w = g->tensor(fe::graph::Tensor_attributes()
                           .set_name("w")
                           .set_uid(kW)
                           .set_dim({r.cout, r.cin, r.kh, r.kw})
                           .set_stride(nhwc_strides(r.cin, r.kh, r.kw)));
    auto conv = g->conv_fprop(x, w,
                              fe::graph::Conv_fprop_attributes()
                                  .set_name("conv")
                                  .set_padding({r.pad_h, r.pad_w})
                                  .set_stride({r.stride, r.stride})
                                  .set_dilation({1, 1}));
    auto y = conv;
    if (bias) {
      auto b = g->tensor(fe::graph::Tensor_attributes()
                             .set_name("bias")
                             .set_uid(kBias)
                             .set_dim({1, r.cout, 1, 1})
                             .set_stride({r.cout, 1, r.cout, r.cout}));
      y = g->pointwise(
          conv, b,
          fe::graph::Pointwise_attributes().set_name("bias").set_mode(fe::PointwiseMode_t::ADD));
    }
    if (residual) {
      auto res = g->tensor(fe::graph::Tensor_attributes()
                               .set_name("residual")
                               .set_uid(kResidual)
                               .set_dim({r.n, r.cout, r.ho, r.wo})
                               .set_stride(nhwc_strides(r.cout, r.ho, r.wo)));
      y = g->pointwise(y, res,
                       fe::graph::Pointwise_attributes()
                           .set_name("residual")
                           .set_mode(fe::PointwiseMode_t::ADD));
    }
    y->set_output(true)
        .set_uid(kY)
        .set_data_type(io)
        .set_dim({r.n, r.cout, r.ho, r.wo})
        .set_stride(nhwc_strides(r.cout, r.ho, r.wo));
    ZI_TRY(fe_status(g->validate(), "validate"));
    ZI_TRY(fe_status(g->build_operation_graph(handle), "build_operation_graph"));
    ZI_TRY(fe_status(g->create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans"));
    ZI_TRY(fe_status(g->check_support(handle), "check_support"));
    if (build_cached(*g, key, p)) {
      p.save_key = key;  // build_cached built exactly that plan: saved after its first run
      p.graph = std::move(g);
      p.supported = true;
      return Status::Ok();
    }
    // Build only the candidates that are timed: the first kMaxTimedPlans, in the heuristics'
    // order, that build. Building every plan (BuildPlanPolicy_t::ALL) compiled engines that were
    // never timed, runtime-compiled ones at a compile each. Unless runtime_compile is on, the
    // engines cuDNN would compile (NVRTC) are passed over: a graph only they take (the conv +
    // bias + residual epilogue: 2.3-2.8 s a shape) answers kUnsupported and its caller runs the
    // unfused ops.
    std::vector<int64_t> candidates;
    const int64_t total = g->get_execution_plan_count();
    bool passed_over = false, precompiled = false;  // engines of each kind seen
    for (int64_t i = 0; i < total && static_cast<int>(candidates.size()) < kMaxTimedPlans; ++i) {
      if (!runtime_compile && compiles(*g, i)) {
        passed_over = true;
        continue;
      }
      precompiled = true;
      if (g->build_plan_at_index(i).is_good()) candidates.push_back(i);
    }
    // Remembered only where no precompiled engine exists (not where one failed to build).
    if (candidates.empty() && passed_over && !precompiled) {
      if (cache) cache->put(key, kOnlyCompiled);
      return Unsupported(
          "cuDNN conv graph: only runtime-compiled engines take it (ZIMAGE_CONV_RUNTIME_COMPILE=1 "
          "compiles them)");
    }
    if (candidates.empty()) return Unsupported("cuDNN conv graph: no plan builds");

    // Time the candidates on the real buffers and keep the fastest.
    std::unordered_map<int64_t, void*> pack = variant_pack(r, bias, residual);
    cudaEvent_t start = nullptr, stop = nullptr;
    ZI_CUDA_TRY(cudaEventCreate(&start));
    if (cudaEventCreate(&stop) != cudaSuccess) {
      cudaEventDestroy(start);
      return DeviceError("cudaEventCreate failed");
    }
    p.index = -1;
    for (const int64_t i : candidates) {
      int64_t ws_bytes = 0;
      if (!g->get_workspace_size_plan_at_index(i, ws_bytes).is_good()) continue;
      std::shared_ptr<Storage> ws;
      if (ws_bytes > 0) {
        auto a = alloc.allocate(static_cast<size_t>(ws_bytes));
        if (!a.ok()) continue;  // too big now: skip this candidate
        ws = *a;
      }
      void* wp = ws ? ws->data() : nullptr;
      if (!g->execute_plan_at_index(handle, pack, wp, i).is_good()) continue;  // warm-up
      cudaEventRecord(start, stream);
      bool ok = true;
      for (int k = 0; k < kTimedRuns && ok; ++k)
        ok = g->execute_plan_at_index(handle, pack, wp, i).is_good();
      cudaEventRecord(stop, stream);
      if (!ok || cudaEventSynchronize(stop) != cudaSuccess) {
        cudaGetLastError();
        continue;
      }
      float ms = 0;
      cudaEventElapsedTime(&ms, start, stop);
      if (p.index < 0 || ms < p.ms) {
        p.index = i;
        p.ms = ms;
        p.workspace = ws_bytes;
      }
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    if (p.index < 0) return Unsupported("cuDNN conv graph: no plan ran");
    p.ms /= kTimedRuns;
    if (cache) cache->put(key, p.index);
    p.save_key = key;
    p.save_rebuild = true;  // the last candidate timed is the graph's current plan
    p.graph = std::move(g);
    p.supported = true;
    return Status::Ok();
  }
};

ConvGraphs::ConvGraphs() : impl_(std::make_unique<Impl>()) {}

ConvGraphs::~ConvGraphs() {
  if (impl_ && impl_->handle) {
    impl_->plans.clear();
    cudnnDestroy(impl_->handle);
  }
}

std::unique_ptr<ConvGraphs> ConvGraphs::create(cudaStream_t stream,
                                               std::shared_ptr<PlanCache> cache) {
  std::unique_ptr<ConvGraphs> c(new ConvGraphs());
  c->impl_->stream = stream;
  c->impl_->cache = std::move(cache);
  c->impl_->handle = cudnn_graph_handle(stream);
  return c;
}

bool ConvGraphs::available() const {
  return impl_->handle != nullptr;
}

void ConvGraphs::set_runtime_compile(bool on) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->runtime_compile = on;
}

std::string ConvGraphs::cache_tag() {
  return "conv-graphs v2 cudnn-frontend " + std::to_string(CUDNN_FRONTEND_MAJOR_VERSION) + "." +
         std::to_string(CUDNN_FRONTEND_MINOR_VERSION) + "." +
         std::to_string(CUDNN_FRONTEND_PATCH_VERSION);
}

Status ConvGraphs::run(const ConvRequest& r, const void* bias, CachingAllocator& alloc,
                       const void* residual) {
  if (!available()) return Unsupported("cuDNN conv graphs unavailable");
  // f32 stays on the legacy path, which pins FMA math (no TF32) to match the CPU oracle.
  if (r.dt == DType::kF32) return Unsupported("cuDNN conv graph: bf16/f16 only");
  const PlanKey key = key_of(r, epilogue_of(bias, residual));
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto it = impl_->plans.find(key);
  using Clock = std::chrono::steady_clock;
  const bool first_use = it == impl_->plans.end();
  Clock::time_point t0;  // read only on a shape's first call: the steady path pays nothing
  if (first_use) {
    t0 = Clock::now();
    Impl::Plan p;
    const Status s = impl_->build(r, bias, residual, alloc, p);
    // Where a first decode's time goes (issue 24: a new process's first decode costs ~0.27 s
    // over a steady one): the plan (loaded, rebuilt from the cached index, or searched) here, its
    // first execution below.
    ZI_DEBUG("conv plan %s: %s in %.1f ms", cache_key(r, epilogue_of(bias, residual)).c_str(),
             !s.ok()       ? "unsupported"
             : p.index < 0 ? "loaded"
                           : "built",
             std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    t0 = Clock::now();
    if (!s.ok()) {
      ZI_DEBUG("%s; conv %lldx%lldx%lldx%lld -> %lld uses the legacy cuDNN call",
               s.message().c_str(), static_cast<long long>(r.n), static_cast<long long>(r.h),
               static_cast<long long>(r.w_), static_cast<long long>(r.cin),
               static_cast<long long>(r.cout));
      p = Impl::Plan{};
    }
    it = impl_->plans.emplace(key, std::move(p)).first;
  }
  Impl::Plan& p = it->second;
  if (!p.supported) return Unsupported("cuDNN conv graph: not supported for this shape");
  std::unordered_map<int64_t, void*> pack = variant_pack(r, bias, residual);
  std::shared_ptr<Storage> ws;
  if (p.workspace > 0) {
    ZI_ASSIGN_OR_RETURN(ws, alloc.allocate(static_cast<size_t>(p.workspace)));
  }
  void* wp = ws ? ws->data() : nullptr;
  fe::error_t e = p.index < 0 ? p.graph->execute(impl_->handle, pack, wp)
                              : p.graph->execute_plan_at_index(impl_->handle, pack, wp, p.index);
  if (!e.is_good()) return DeviceError("cuDNN conv graph: execute: " + e.get_message());
  if (first_use)  // host time of the first launch (module loading, lazy kernel loading)
    ZI_DEBUG("conv plan %s: first execute queued in %.1f ms",
             cache_key(r, epilogue_of(bias, residual)).c_str(),
             std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  // Saved once it has run: a plan serialised before its first execution did not load again on
  // the GPU (measured: PlanCacheGpu), presumably for state cudnn-frontend fills at execution.
  if (!p.save_key.empty()) {
    impl_->save(*p.graph, p.save_key, p.index, p.save_rebuild);
    p.save_key.clear();
  }
  return Status::Ok();
}

int ConvGraphs::preload_saved(cudaStream_t side_stream, DType dt,
                              const std::vector<std::array<int64_t, 3>>& first,
                              size_t scratch_bytes, int* executed) noexcept {
  if (executed) *executed = 0;
  if (!available() || !impl_->cache) return 0;
  constexpr int kMaxPlans = 64;  // a cache of many models and sizes: the load does not wait long
  int loaded = 0;
  std::lock_guard<std::mutex> lock(impl_->mu);
  try {
    // The warm-up records on the handle's stream: a side stream, so nothing queued on the
    // compute stream (the uploads) meets a capture. run() takes the handle back afterwards.
    if (cudnnSetStream(impl_->handle, side_stream) != CUDNN_STATUS_SUCCESS) return 0;
    for (const std::string& k : preload_order(impl_->cache->keys("conv,"), dt, first)) {
      if (loaded >= kMaxPlans) break;
      PlanKey key;
      if (!parse_cache_key(k, key) || std::get<10>(key) != static_cast<int>(dt) ||
          impl_->plans.count(key))
        continue;
      Impl::Plan p;
      if (!impl_->load_saved(k, p)) continue;
      {
        // cudnn-frontend's warm-up records (never runs) one execution into a throwaway CUDA
        // graph on the side stream, so the driver loads the plan's kernels now rather than at
        // its first real execution. Its failure costs only that (the plan stays, and so does
        // its saved copy); a capture it left open is closed.
        std::lock_guard<std::mutex> sync_lock(device_sync_mutex());
        OpenCaptureGuard close_capture(side_stream);
        (void)p.graph->warmup(impl_->handle);
      }
      // The first image's plans, where memory was granted: executed once as well.
      const std::array<int64_t, 3> in{std::get<0>(key), std::get<1>(key), std::get<2>(key)};
      if (scratch_bytes > 0 && std::find(first.begin(), first.end(), in) != first.end() &&
          impl_->exercise(key, p, side_stream, scratch_bytes) && executed)
        ++*executed;
      impl_->plans.emplace(key, std::move(p));
      ++loaded;
    }
  } catch (...) {  // out of host memory: the plans not loaded here load at their first use
  }
  cudnnSetStream(impl_->handle, impl_->stream);
  cudaGetLastError();
  return loaded;
}

#else  // built without the cudnn-frontend headers

struct ConvGraphs::Impl {};
ConvGraphs::ConvGraphs() : impl_(std::make_unique<Impl>()) {}
ConvGraphs::~ConvGraphs() = default;
std::unique_ptr<ConvGraphs> ConvGraphs::create(cudaStream_t, std::shared_ptr<PlanCache>) {
  return std::unique_ptr<ConvGraphs>(new ConvGraphs());
}
bool ConvGraphs::available() const {
  return false;
}
void ConvGraphs::set_runtime_compile(bool) {}
std::string ConvGraphs::cache_tag() {
  return "conv-graphs v2";
}
Status ConvGraphs::run(const ConvRequest&, const void*, CachingAllocator&, const void*) {
  return Unsupported("built without cuDNN conv graphs (no cudnn-frontend headers)");
}
int ConvGraphs::preload_saved(cudaStream_t, DType, const std::vector<std::array<int64_t, 3>>&,
                              size_t, int* executed) noexcept {
  if (executed) *executed = 0;
  return 0;
}

#endif

std::vector<std::string> ConvGraphs::preload_order(
    const std::vector<std::string>& keys, DType dt,
    const std::vector<std::array<int64_t, 3>>& first) {
  std::vector<std::string> preferred, rest;
  for (const std::string& k : keys) {
    PlanKey key;
    if (!parse_cache_key(k, key) || std::get<10>(key) != static_cast<int>(dt)) continue;
    const std::array<int64_t, 3> input{std::get<0>(key), std::get<1>(key), std::get<2>(key)};
    const bool match = std::find(first.begin(), first.end(), input) != first.end();
    (match ? preferred : rest).push_back(k);
  }
  preferred.insert(preferred.end(), rest.begin(), rest.end());
  return preferred;
}

}  // namespace zimage::cuda

// See bench_common.h.
#include "bench_common.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <utility>

#include "commands.h"
#include "io/model/model_folder.h"

#ifdef ZIMAGE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace zimage::cli::bench {

// The prompt diffusers_baseline.py and diffusers_compare.py use (35 tokens after the template).
const char* const kPrompt =
    "A snow fairy with long silver hair in a blue dress standing in a snowy forest, "
    "anime style, soft lighting, intricate details, masterpiece";

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

[[noreturn]] void fail(const Status& s) {
  std::fprintf(stderr, "zimage bench: %s\n", s.to_string().c_str());
  throw CLI::RuntimeError(1);
}
void check(const Status& s) {
  if (!s.ok()) fail(s);
}

// Runs fn `warm` times, then `iters` timed times (the backend synchronised around each).
Stats timed(Backend& be, int warm, int iters, const std::function<Status()>& fn) {
  for (int i = 0; i < warm; ++i) check(fn());
  check(be.synchronize());
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    const double t0 = now_s();
    check(fn());
    check(be.synchronize());
    ms.push_back((now_s() - t0) * 1e3);
  }
  std::sort(ms.begin(), ms.end());
  return Stats{ms[ms.size() / 2], ms.front(), ms.back()};
}

// GPU memory the process holds (device total - free): the caching allocator keeps what it took,
// so sampling after a phase gives the peak of that phase. 0 on the CPU.
double gpu_used_gib() {
#ifdef ZIMAGE_WITH_CUDA
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
    return static_cast<double>(total_b - free_b) / (1024.0 * 1024 * 1024);
#endif
  return 0;
}

#ifdef ZIMAGE_WITH_CUDA
cuda::CudaBackend* as_cuda(Backend& be) {
  return dynamic_cast<cuda::CudaBackend*>(&be);
}
#endif

AllocCounters alloc_counters(Backend& be) {
  AllocCounters c;
#ifdef ZIMAGE_WITH_CUDA
  if (auto* cb = as_cuda(be)) {
    constexpr double kGiB = 1024.0 * 1024 * 1024;
    const auto st = cb->memory_stats();
    c.in_use_gib = static_cast<double>(st.in_use_bytes) / kGiB;
    c.peak_gib = static_cast<double>(st.peak_in_use_bytes) / kGiB;
    c.reserved_peak_gib = static_cast<double>(st.peak_reserved_bytes) / kGiB;
    c.device_calls = st.num_device_mallocs + st.num_device_frees;
  }
#else
  (void)be;
#endif
  return c;
}

void reset_alloc_peak(Backend& be) {
#ifdef ZIMAGE_WITH_CUDA
  if (auto* cb = as_cuda(be)) cb->reset_peak_memory();
#else
  (void)be;
#endif
}

void fresh_memory(Backend& be, ZImageDiT& dit) {
  dit.release_graphs();
#ifdef ZIMAGE_WITH_CUDA
  if (auto* cb = as_cuda(be)) check(cb->empty_cache());
#else
  (void)be;
#endif
}

Result<std::unique_ptr<Backend>> make_backend(const std::string& device, DType act, int threads) {
  if (device == "cpu") return create_cpu_backend(threads);  // checked count, refused threads
  return make_cuda_backend(0, act);
}

Result<Loaded> load_all(const std::string& dir, const std::string& device, DType act, int threads,
                        const WeightPlacement& dit_placement) {
  Loaded L;
  ZI_ASSIGN_OR_RETURN(L.be, make_backend(device, act, threads));
  const double t0 = now_s();
  ZI_ASSIGN_OR_RETURN(ModelFolder folder, ModelFolder::open(dir));
  TextToImageComponents parts;
  ZI_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::load(dir));
  L.tok = std::make_unique<Tokenizer>(tok);
  parts.tokenizer = std::make_unique<Tokenizer>(tok);
  {
    ZI_ASSIGN_OR_RETURN(WeightStore ws, folder.open_weights("text_encoder"));
    ZI_ASSIGN_OR_RETURN(parts.text_encoder, Qwen3Encoder::load(folder.text_encoder(), ws, *L.be));
  }
  {
    ZI_ASSIGN_OR_RETURN(WeightStore ws, folder.open_weights("transformer"));
    ZI_ASSIGN_OR_RETURN(parts.transformer,
                        ZImageDiT::load(folder.transformer(), ws, *L.be, dit_placement));
  }
  {
    ZI_ASSIGN_OR_RETURN(WeightStore ws, folder.open_weights("vae"));
    ZI_ASSIGN_OR_RETURN(parts.vae, VaeDecoder::load(folder.vae(), ws, *L.be));
  }
  parts.scheduler = folder.scheduler();
  ZI_TRY(L.be->finish_uploads());  // every copy landed: the time is the whole load
  L.load_s = now_s() - t0;
  L.te = parts.text_encoder.get();
  L.dit = parts.transformer.get();
  L.vae = parts.vae.get();
  ZI_ASSIGN_OR_RETURN(L.pipe, TextToImage::create(std::move(parts), *L.be));
  return L;
}

}  // namespace zimage::cli::bench

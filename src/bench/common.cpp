// See common.h.
#include "bench/common.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <utility>

#include "io/fs/file_io.h"
#include "io/model/model_folder.h"
#include "pipeline/rng.h"

namespace zimage::bench {

// The prompt diffusers_baseline.py and diffusers_compare.py use (35 tokens after the template).
const char* const kPrompt =
    "A snow fairy with long silver hair in a blue dress standing in a snowy forest, "
    "anime style, soft lighting, intricate details, masterpiece";

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

[[noreturn]] void fail(const Status& s, const char* who) {
  std::fprintf(stderr, "%s: %s\n", who, s.to_string().c_str());
  throw Abort{s};
}
void check(const Status& s) {
  if (!s.ok()) fail(s);
}

void emit_json(const Options& o, const json& R, const char* who) {
  const std::string js = R.dump(1);
  if (!o.json_path.empty()) {
    const Status st = write_output_file(o.json_path, js + "\n");
    if (!st.ok()) fail(st, who);
  } else {
    std::printf("\n%s\n", js.c_str());
  }
}

// Runs fn `warm` times, then `iters` timed times (the backend synchronised around each).
Stats timed(Backend& be, int warm, int iters, const std::function<Status()>& fn,
            GpuSampler* sampler) {
  for (int i = 0; i < warm; ++i) check(fn());
  check(be.synchronize());
  if (sampler) sampler->start();
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    const double t0 = now_s();
    check(fn());
    check(be.synchronize());
    ms.push_back((now_s() - t0) * 1e3);
  }
  std::sort(ms.begin(), ms.end());
  Stats st{ms[ms.size() / 2], ms.front(), ms.back(), {}, iters};
  if (sampler) st.gpu = sampler->stop();
  return st;
}

std::string Stats::clock_note() const {
  char buf[128];
  if (gpu.samples > 0 && gpu.energy_j > 0) {  // the mean power from the energy counter
    std::snprintf(buf, sizeof buf, " (SM %.0f MHz, %.0f W of %.0f, %.1f J a run)",
                  gpu.sm_mhz_median, mean_power_w(), gpu.power_limit_w, joules_per_run());
  } else if (gpu.samples > 0 && gpu.power_samples > 0) {
    std::snprintf(buf, sizeof buf, " (SM %.0f MHz, %.0f W of %.0f)", gpu.sm_mhz_median,
                  gpu.power_w_mean, gpu.power_limit_w);
  } else if (gpu.samples > 0) {
    std::snprintf(buf, sizeof buf, " (SM %.0f MHz)", gpu.sm_mhz_median);
  } else {
    return "";
  }
  return buf;
}

// The caching allocator keeps what it took, so sampling after a phase gives the peak of that
// phase. Read without a backend: the first reading comes before the model's backend exists.
double gpu_used_gib() {
  auto m = cuda_device_memory();  // {total, free}
  if (m.ok()) return static_cast<double>(m->first - m->second) / (1024.0 * 1024 * 1024);
  return 0;
}

AllocCounters alloc_counters(const Backend& be) {
  constexpr double kGiB = 1024.0 * 1024 * 1024;
  const Backend::AllocatorCounters st = be.allocator_counters();
  AllocCounters c;
  c.in_use_gib = static_cast<double>(st.in_use) / kGiB;
  c.peak_gib = static_cast<double>(st.peak_in_use) / kGiB;
  c.reserved_peak_gib = static_cast<double>(st.peak_reserved) / kGiB;
  c.device_calls = st.device_calls;
  return c;
}

Tensor random_latents(Backend& be, uint64_t seed, int bs, int res, int fac) {
  TorchCpuGenerator gen(seed);
  auto host = gen.randn({bs, 16, res / fac, res / fac});
  if (!host.ok()) fail(host.status());
  auto lat = be.upload(*host, DType::kF32);
  if (!lat.ok()) fail(lat.status());
  return *lat;
}

void fresh_memory(Backend& be, ZImageDiT& dit) {
  dit.release_graphs();
  check(be.empty_cache());
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
  L.pipe->set_float_image(false);  // as the engine runs it
  return L;
}

}  // namespace zimage::bench

// The default `zimage bench` figures: load time, text encoder at true prompt length, one DiT
// forward per resolution and batch, VAE decode, the whole pipeline (first call and steady state)
// for one and several images, and the GPU memory the process holds. With --ablation it re-runs
// the DiT forward and the whole image with techniques switched off (fp32, general attention) so
// each row of the table shows what one technique buys (ablation.cpp). Output: a Markdown table on
// stdout and every figure as JSON (on stdout, or to --json).
#include "bench/standard.h"

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "bench/common.h"
#include "model/common/linear.h"

namespace zimage::bench {
namespace {

std::string fmt_ms(double ms) {
  char b[32];
  std::snprintf(b, sizeof b, ms >= 100 ? "%.0f ms" : "%.1f ms", ms);
  return b;
}

// The peaks of the caching allocator and the device memory held since mem0, into j.
void memory_figures(const StandardRun& s, json& j) {
  j["gpu_gib"] = gpu_used_gib() - s.mem0;
  const AllocCounters ac = alloc_counters(*s.L.be);
  j["alloc_peak_gib"] = ac.peak_gib;
  j["alloc_peak_reserved_gib"] = ac.reserved_peak_gib;
}

void load_phase(StandardRun& s) {
  s.mem0 = gpu_used_gib();
  WeightPlacement place;
  if (!s.o.fp8_layers.empty()) {
    auto bits = parse_fp8_layers(s.o.fp8_layers);
    if (!bits.ok()) fail(bits.status());
    place.fp8_compute = *bits;
    s.R["fp8_layers"] = fp8_layers_string(*bits);
  }
  auto loaded = load_all(s.dir, s.o.device, DType::kBF16, s.o.threads, place);
  if (!loaded.ok()) fail(loaded.status());
  s.L = std::move(*loaded);
  Backend& be = *s.L.be;
  s.R["device"] = be.name();
  s.R["load_s"] = s.L.load_s;
  s.R["gpu_gib_after_load"] = gpu_used_gib() - s.mem0;
  s.R["alloc_in_use_gib_after_load"] = alloc_counters(be).in_use_gib;
  std::fprintf(stderr, "bench: loaded in %.2f s on %s%s%s\n", s.L.load_s, be.name().c_str(),
               s.o.fp8_layers.empty() ? "" : ", FP8 layers ",
               s.o.fp8_layers.empty() ? "" : fp8_layers_string(place.fp8_compute).c_str());
  s.sampler = GpuSampler::open(be.pci_bus_id());
  if (!s.sampler->active() && !be.pci_bus_id().empty())
    std::fprintf(stderr, "bench: no clock or power readings (%s)\n", s.sampler->why().c_str());
  s.fac = s.L.pipe->vae_factor();
  s.res0 = s.o.sizes.front();
}

// Text encoder at the prompt's true length.
void text_encoder_phase(StandardRun& s) {
  auto ids = encode_prompt(*s.L.tok, kPrompt, 512);
  if (!ids.ok()) fail(ids.status());
  s.ids = std::move(*ids);
  s.R["prompt_tokens"] = s.ids.size();
  s.R["text_encoder"] = timed(*s.L.be, 2, s.o.iters, [&]() -> Status {
                          auto r = s.L.te->encode({s.ids});
                          if (!r.ok()) return r.status();
                          s.caps = std::move(*r);
                          return Status::Ok();
                        }).to_json();
  std::fprintf(stderr, "bench: text encoder done\n");
}

// One DiT forward per resolution and batch (t = 0.5, as diffusers_baseline.py).
void dit_phase(StandardRun& s) {
  Backend& be = *s.L.be;
  for (int res : s.o.sizes) {
    for (int bs : s.o.batches) {
      const Tensor lat = random_latents(be, 1, bs, res, s.fac);
      std::vector<Tensor> cb(bs, s.caps[0]);
      Tensor out;
      be.reset_peak_memory();
      Stats st = timed(
          be, 2, s.o.iters,
          [&] { return s.L.dit->forward(lat, std::vector<float>(bs, 0.5f), cb, out); },
          s.sampler.get());
      json j = st.to_json();
      memory_figures(s, j);
      s.R["dit_forward_" + std::to_string(res) + "_bs" + std::to_string(bs)] = j;
      std::fprintf(stderr, "bench: DiT %d bs%d %.1f ms%s\n", res, bs, st.median_ms,
                   st.clock_note().c_str());
    }
  }
}

void vae_phase(StandardRun& s) {
  Backend& be = *s.L.be;
  for (int res : s.o.sizes) {
    const Tensor lat = random_latents(be, 2, 1, res, s.fac);
    be.reset_peak_memory();
    // What the pipeline runs (RGB8 made on the backend), then decode() to a host f32 image (the
    // row of sessions before 17).
    auto decode_rgb8 = [&]() -> Status {
      int64_t bad = 0;
      auto r = s.L.vae->decode_rgb8(lat, &bad);
      return r.ok() ? Status::Ok() : r.status();
    };
    auto decode_f32 = [&]() -> Status {
      auto r = s.L.vae->decode(lat);
      return r.ok() ? Status::Ok() : r.status();
    };
    check(decode_rgb8());  // warm-up: plans the convolutions
    check(decode_f32());
    const uint64_t calls0 = alloc_counters(be).device_calls;
    Stats st = timed(be, 0, std::max(3, s.o.iters - 2), decode_rgb8, s.sampler.get());
    json j = st.to_json();
    std::fprintf(stderr, "bench: VAE decode %d %.1f ms%s\n", res, st.median_ms,
                 st.clock_note().c_str());
    j["device_alloc_calls_steady"] = alloc_counters(be).device_calls - calls0;
    memory_figures(s, j);
    s.R["vae_decode_" + std::to_string(res)] = j;
    Stats sf = timed(be, 0, std::max(3, s.o.iters - 2), decode_f32, s.sampler.get());
    std::fprintf(stderr, "bench: VAE decode %d to a host f32 image %.1f ms%s\n", res, sf.median_ms,
                 sf.clock_note().c_str());
    s.R["vae_decode_f32_" + std::to_string(res)] = sf.to_json();
  }
  std::fprintf(stderr, "bench: VAE done\n");
}

// Whole pipeline: the first call (plans GEMMs/convs) and then the steady state.
void whole_image_phase(StandardRun& s) {
  Backend& be = *s.L.be;
  for (int bs : s.o.batches) {
    GenerateRequest req;
    req.prompts.assign(bs, kPrompt);
    req.width = req.height = s.res0;
    req.steps = s.o.steps;
    req.seed = 42;
    PhaseTimings last;
    fresh_memory(be, *s.L.dit);
    be.reset_peak_memory();
    const double t0 = now_s();
    auto first = s.L.pipe->run(req, {});
    if (!first.ok()) fail(first.status());
    const double first_s = now_s() - t0;
    const uint64_t calls0 = alloc_counters(be).device_calls;
    Stats st = timed(
        be, 0, 3,
        [&]() -> Status {
          auto r = s.L.pipe->run(req, {});
          if (!r.ok()) return r.status();
          last = r->timings;
          return Status::Ok();
        },
        s.sampler.get());
    json j = st.to_json();
    j["first_call_s"] = first_s;
    j["device_alloc_calls_steady"] = alloc_counters(be).device_calls - calls0;
    memory_figures(s, j);
    j["text_encoder_s"] = last.text_encoder_s;
    j["denoise_s"] = last.denoise_s();
    j["vae_s"] = last.vae_s;
    j["tokenize_s"] = last.tokenize_s;
    j["total_s"] = last.total_s;  // from the request's start to its images, inside run()
    s.R["pipeline_" + std::to_string(s.res0) + "_bs" + std::to_string(bs)] = j;
    std::fprintf(stderr,
                 "bench: pipeline %d bs%d %.0f ms (first call %.2f s)%s; last call: text encoder "
                 "%.1f ms, denoise %.1f ms, VAE %.1f ms, the rest %.1f ms\n",
                 s.res0, bs, st.median_ms, first_s, st.clock_note().c_str(),
                 last.text_encoder_s * 1e3, last.denoise_s() * 1e3, last.vae_s * 1e3,
                 (last.total_s - last.text_encoder_s - last.denoise_s() - last.vae_s) * 1e3);
  }
  s.R["gpu_gib_peak"] = gpu_used_gib() - s.mem0;
}

void print_ablation_table(const Options& o, int res0, const json& rows) {
  std::printf(
      "\n| technique (cumulative) | DiT forward %d² | image (%d forwards) | speed-up | GiB in "
      "tensors (peak) |\n| --- | --- | --- | --- | --- |\n",
      res0, o.steps);
  for (const auto& r : rows) {
    auto num = [&](const char* k, const char* f) {
      char b[32] = "-";
      if (r.contains(k) && r[k].is_number()) std::snprintf(b, sizeof b, f, r[k].get<double>());
      return std::string(b);
    };
    std::printf("| %s | %s | %s | %s | %s |\n", r["row"].get<std::string>().c_str(),
                r.contains("dit_ms") ? fmt_ms(r["dit_ms"]).c_str() : "-",
                r.contains("image_ms") ? fmt_ms(r["image_ms"]).c_str() : "-",
                num("speedup", "%.1fx").c_str(), num("alloc_peak_gib", "%.1f").c_str());
  }
}

// The Markdown table of every timed figure, the ablation table, then the JSON.
void report(const StandardRun& s) {
  const json& R = s.R;
  std::printf(
      "| what | zimage median | min-max | GPU GiB held | GiB in tensors (peak) | GiB reserved "
      "(peak) |\n| --- | --- | --- | --- | --- | --- |\n");
  std::printf("| load (folder -> device) | %.2f s | | %.1f | %.1f | |\n", s.L.load_s,
              R["gpu_gib_after_load"].get<double>(),
              R["alloc_in_use_gib_after_load"].get<double>());
  for (auto it = R.begin(); it != R.end(); ++it) {
    if (!it->is_object() || !it->contains("median_ms")) continue;
    const json& j = *it;
    auto gib = [&](const char* key) {
      return j.contains(key) ? std::to_string(j[key].get<double>()).substr(0, 5) : std::string();
    };
    std::printf("| %s | %s | %s - %s | %s | %s | %s |\n", it.key().c_str(),
                fmt_ms(j["median_ms"]).c_str(), fmt_ms(j["min_ms"]).c_str(),
                fmt_ms(j["max_ms"]).c_str(), gib("gpu_gib").c_str(), gib("alloc_peak_gib").c_str(),
                gib("alloc_peak_reserved_gib").c_str());
  }
  if (R.contains("ablation")) print_ablation_table(s.o, s.res0, R["ablation"]);
  emit_json(s.o, R);
}

}  // namespace

void run_standard(const Options& o, const std::string& dir, json& R) {
  StandardRun s{o, dir, R, {}, 0, {}, {}, 8, 0};
  load_phase(s);
  text_encoder_phase(s);
  dit_phase(s);
  vae_phase(s);
  whole_image_phase(s);
  if (o.profile && o.device != "cpu") profile_ops(s);
  if (o.ablation && o.device != "cpu") run_ablation(s);
  report(s);
}

}  // namespace zimage::bench

// zimage bench: the numbers docs/BENCHMARKS.md reports, measured the way the reference is
// (tools/diffusers_compare.py): load time, text encoder at true prompt length, one DiT forward
// per resolution and batch, VAE decode, the whole pipeline (first call and steady state) for one
// and several images, and the GPU memory the process holds. With --ablation it re-runs the DiT
// forward and the whole image with techniques switched off (fp32, general attention) so each
// row of the table shows what one technique buys. Output: a Markdown table on stdout and, with
// --json, every figure as JSON.
//
// --random-weights runs the full published Z-Image-Turbo architecture on random weights: the
// folder is written once (zimage make-random-model) into --random-dir and reused, so the load
// path is the real one.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "bench_common.h"
#include "bench_lora.h"
#include "bench_seqpar.h"
#include "builtin_model.h"
#include "commands.h"
#include "io/fs/file_io.h"
#include "io/model/model_folder.h"
#include "io/writers/random_model.h"
#include "model/text_encoder/qwen3_encoder.h"
#include "model/vae/vae.h"
#include "model/dit/zimage_dit.h"
#include "number_flags.h"
#include "pipeline/rng.h"
#include "pipeline/text_to_image.h"
#include "pipeline/tokenizer/tokenizer.h"

#ifdef ZIMAGE_WITH_CUDA
#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_backend.h"
#endif

namespace zimage::cli {
namespace {

using namespace bench;
namespace fs = std::filesystem;

// Host -> device rate from pinned memory (GB/s): what bounds streamed weights.
double link_rate_gbs(Backend& be) {
  constexpr int64_t kBytes = int64_t{1} << 30;
  auto host = be.alloc_pinned(DType::kU8, {kBytes});
  auto dev = be.alloc(DType::kU8, {kBytes});
  if (!host.ok() || !dev.ok()) return 0;
  check(be.stream_in(0, {{*host, *dev}}));  // warm
  check(be.wait_slot(0));
  check(be.synchronize());
  const double t0 = now_s();
  for (int i = 0; i < 3; ++i) {
    check(be.stream_in(0, {{*host, *dev}}));
    check(be.wait_slot(0));
  }
  check(be.synchronize());
  return 3.0 * static_cast<double>(kBytes) / (now_s() - t0) / 1e9;
}

std::string fmt_ms(double ms) {
  char b[32];
  std::snprintf(b, sizeof b, ms >= 100 ? "%.0f ms" : "%.1f ms", ms);
  return b;
}

#ifdef ZIMAGE_WITH_CUDA
// Runs `fn` with the backend's per-op GPU timing on and prints the table (the 40 costliest ops);
// the rows go to prof[phase].
void profile_phase(cuda::CudaBackend& cb, const std::string& phase,
                   const std::function<Status()>& fn, json& prof) {
  check(cb.synchronize());
  cb.set_profiling(true);
  const Status st = fn();
  cb.set_profiling(false);
  check(st);
  auto rows = cb.profile_report();
  if (!rows.ok()) fail(rows.status());
  double total = 0;
  for (const auto& r : *rows) total += r.total_ms;
  std::printf(
      "\n### GPU time per op: %s (%.1f ms in ops)\n\n"
      "| op and shapes | calls | GPU ms | %% | host ms |\n| --- | --- | --- | --- | --- |\n",
      phase.c_str(), total);
  json arr = json::array();
  for (size_t i = 0; i < rows->size(); ++i) {
    const auto& r = (*rows)[i];
    if (i < 40)
      std::printf("| %s | %lld | %.3f | %.1f | %.3f |\n", r.key.c_str(),
                  static_cast<long long>(r.count), r.total_ms,
                  100.0 * r.total_ms / std::max(total, 1e-9), r.host_ms);
    arr.push_back({{"op", r.key}, {"calls", r.count}, {"ms", r.total_ms}, {"host_ms", r.host_ms}});
  }
  prof[phase] = {{"total_ms", total}, {"ops", arr}};
}
#endif

// `zimage bench --vram-budget A B ...`: per budget a fresh pipeline loaded under it (the memory
// planner decides what streams), one whole 1024² image first, then the median of --iters; the
// driver-side peak, the bytes streamed host -> device per image and the plan. The link rate
// gives each row's physical bound: streamed bytes / rate.
void run_budget_rows(const Options& o, const std::string& dir, json& R) {
  const int res = o.sizes.front();
  json rows = json::array();
  double rate = 0;
  std::printf(
      "| budget | weights | plan | s / image | first image s | driver peak GiB | "
      "H2D GB / image | link bound s |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (double budget : o.budgets) {
    auto be = make_backend(o.device, DType::kBF16, o.threads);
    if (!be.ok()) fail(be.status());
    if (rate == 0) rate = link_rate_gbs(**be);
    check((*be)->synchronize());
    PipelineLoadOptions lo;
    lo.vram_budget = static_cast<uint64_t>(budget * 1024.0 * 1024.0 * 1024.0);
    lo.fp8_weights = o.weights == "fp8";
    lo.keep_quantized = o.keep_quantized;
    lo.plan_width = lo.plan_height = res;
    json row = {{"budget_gib", budget}, {"weights", o.weights}};
    ModelPaths paths;
    paths.model_dir = dir;
    paths.transformer_file = o.dit_file;
    paths.text_encoder_file = o.text_encoder_file;
    paths.vae_file = o.vae_file;
    if (!o.dit_file.empty()) row["dit_file"] = o.dit_file;
    if (!o.text_encoder_file.empty()) row["text_encoder_file"] = o.text_encoder_file;
    if (!o.vae_file.empty()) row["vae_file"] = o.vae_file;
    row["keep_quantized"] = o.keep_quantized;
    DriverPeak peak(**be);
    const double t0 = now_s();
    auto pipe = TextToImage::load(paths, **be, lo);
    if (!pipe.ok()) {
      row["error"] = pipe.status().to_string();
      std::printf("| %.0f GiB | %s | %s | | | | | |\n", budget, o.weights.c_str(),
                  pipe.status().to_string().c_str());
      rows.push_back(row);
      continue;
    }
    row["load_s"] = now_s() - t0;
    row["plan"] = (*pipe)->memory_plan().describe();
    GenerateRequest req;
    req.prompts = {kPrompt};
    req.width = req.height = res;
    req.steps = o.steps;
    req.seed = 42;
    const double f0 = now_s();
    auto first = (*pipe)->run(req, {});
    if (!first.ok()) fail(first.status());
    row["first_image_s"] = now_s() - f0;
    const uint64_t h2d0 = (*be)->streamed_bytes();
    Stats s = timed(**be, 0, std::max(2, o.iters), [&]() -> Status {
      auto r = (*pipe)->run(req, {});
      return r.ok() ? Status::Ok() : r.status();
    });
    const double h2d_gb =
        static_cast<double>((*be)->streamed_bytes() - h2d0) / std::max(2, o.iters) / 1e9;
    row["image_s"] = s.median_ms / 1e3;
    row["image_s_min"] = s.min_ms / 1e3;
    row["driver_peak_gib"] = static_cast<double>(peak.peak()) / (1024.0 * 1024 * 1024);
    row["h2d_gb_per_image"] = h2d_gb;
    row["link_gbs"] = rate;
    row["link_bound_s"] = rate > 0 ? h2d_gb / rate : 0;
    const MemoryPlan& plan = (*pipe)->memory_plan();
    char pl[96];
    std::snprintf(pl, sizeof pl, "DiT %d/%zu, TE %d/%zu resident", plan.dit_resident_blocks(),
                  plan.dit_streamed.size(), plan.te_resident_layers(), plan.te_streamed.size());
    std::printf("| %s | %s | %s | %.3f | %.2f | %.2f | %.1f | %.3f |\n",
                budget > 0 ? (std::to_string(static_cast<int>(budget)) + " GiB").c_str() : "none",
                o.weights.c_str(), pl, s.median_ms / 1e3, row["first_image_s"].get<double>(),
                row["driver_peak_gib"].get<double>(), h2d_gb, rate > 0 ? h2d_gb / rate : 0);
    std::fflush(stdout);
    rows.push_back(row);
  }
  R["budget_rows"] = rows;
  R["link_gbs"] = rate;
  if (!o.json_path.empty()) {
    check(write_output_file(o.json_path, R.dump(2) + "\n"));
  }
}

void run_bench(const Options& o) {
  json R;
  std::string dir = o.model;
  if (o.random_weights) {
    dir = o.random_dir;
    if (!fs::exists(fs::path(dir) / "model_index.json")) {
      std::fprintf(stderr, "bench: writing the full-size random-weight folder %s (once)\n",
                   dir.c_str());
      RandomModelOptions ro;
      const ZImageConfigs cfg = zimage_turbo_reference_configs();
      ro.dit = cfg.transformer;
      ro.text_encoder = cfg.text_encoder;
      ro.vae = cfg.vae;
      auto builtin = builtin_model_dir();
      if (!builtin.ok()) fail(builtin.status());
      ro.tokenizer_dir = *builtin + "/tokenizer";
      const double t0 = now_s();
      check(write_random_model(dir, ro));
      R["random_model_write_s"] = now_s() - t0;
    }
  }
  if (dir.empty()) fail(InvalidArgument("give --model DIR or --random-weights"));
  R["model"] = o.random_weights ? "random weights, full Z-Image-Turbo architecture" : dir;
  if (!o.parallel.parallel.empty() || !o.parallel.devices.empty()) {
    std::vector<std::string> devices;
    std::string error;
    if (o.parallel.parallel != "sequence")
      fail(InvalidArgument(
          "bench --devices: needs --parallel sequence (the data-parallel throughput is "
          "measured through the server: tools/dp_scaling.py)"));
    if (!sequence_parallel_devices(o.parallel, &devices, &error)) fail(InvalidArgument(error));
    run_seqpar_bench(o, dir, devices, o.parallel.comm, R);
    if (!o.json_path.empty()) check(write_output_file(o.json_path, R.dump(1) + "\n"));
    return;
  }
  if (!o.budgets.empty()) {
    run_budget_rows(o, dir, R);
    return;
  }
  if (!o.pipelines.empty()) {
    run_pipeline_bench(o, dir, R);  // bench_pipelines.cpp
    return;
  }
  if (!o.lora.empty()) {
    LoraBenchOptions lb;
    lb.model_dir = dir;
    lb.device = o.device;
    lb.weights = o.weights;
    lb.lora = o.lora;
    lb.scale = o.lora_scale;
    lb.prompt = kPrompt;
    lb.size = o.sizes.front();
    lb.steps = o.steps;
    lb.iters = o.iters;
    lb.threads = o.threads;
    lb.json_path = o.json_path;
    run_lora_bench(lb);
    return;
  }
  if (!o.fp8_groups.empty()) {
    run_fp8_quality(o, dir, R);
    if (!o.json_path.empty()) check(write_output_file(o.json_path, R.dump(1) + "\n"));
    return;
  }
  if (!o.dit_file.empty() || !o.text_encoder_file.empty() || !o.vae_file.empty())
    fail(
        InvalidArgument("--dit, --text-encoder and --vae are measured by the --vram-budget rows "
                        "(use --vram-budget 0 for no limit)"));

  const double mem0 = gpu_used_gib();
  auto loaded = load_all(dir, o.device, DType::kBF16, o.threads);
  if (!loaded.ok()) fail(loaded.status());
  Loaded& L = *loaded;
  Backend& be = *L.be;
  R["device"] = be.name();
  R["load_s"] = L.load_s;
  R["gpu_gib_after_load"] = gpu_used_gib() - mem0;
  R["alloc_in_use_gib_after_load"] = alloc_counters(be).in_use_gib;
  std::fprintf(stderr, "bench: loaded in %.2f s on %s\n", L.load_s, be.name().c_str());

  // Text encoder at the prompt's true length.
  auto ids = encode_prompt(*L.tok, kPrompt, 512);
  if (!ids.ok()) fail(ids.status());
  R["prompt_tokens"] = ids->size();
  std::vector<Tensor> caps;
  R["text_encoder"] = timed(be, 2, o.iters, [&]() -> Status {
                        auto r = L.te->encode({*ids});
                        if (!r.ok()) return r.status();
                        caps = std::move(*r);
                        return Status::Ok();
                      }).to_json();
  std::fprintf(stderr, "bench: text encoder done\n");

  // One DiT forward per resolution and batch (t = 0.5, as diffusers_baseline.py).
  const int fac = L.pipe->vae_factor();
  for (int res : o.sizes) {
    for (int bs : o.batches) {
      TorchCpuGenerator gen(1);
      auto host = gen.randn({bs, 16, res / fac, res / fac});
      if (!host.ok()) fail(host.status());
      auto lat = be.upload(*host, DType::kF32);
      if (!lat.ok()) fail(lat.status());
      std::vector<Tensor> cb(bs, caps[0]);
      Tensor out;
      reset_alloc_peak(be);
      Stats s = timed(be, 2, o.iters,
                      [&] { return L.dit->forward(*lat, std::vector<float>(bs, 0.5f), cb, out); });
      json j = s.to_json();
      j["gpu_gib"] = gpu_used_gib() - mem0;
      j["alloc_peak_gib"] = alloc_counters(be).peak_gib;
      j["alloc_peak_reserved_gib"] = alloc_counters(be).reserved_peak_gib;
      R["dit_forward_" + std::to_string(res) + "_bs" + std::to_string(bs)] = j;
      std::fprintf(stderr, "bench: DiT %d bs%d %.1f ms\n", res, bs, s.median_ms);
    }
  }

  for (int res : o.sizes) {
    TorchCpuGenerator gen(2);
    auto host = gen.randn({1, 16, res / fac, res / fac});
    if (!host.ok()) fail(host.status());
    auto lat = be.upload(*host, DType::kF32);
    if (!lat.ok()) fail(lat.status());
    reset_alloc_peak(be);
    auto decode = [&]() -> Status {
      auto r = L.vae->decode(*lat);
      return r.ok() ? Status::Ok() : r.status();
    };
    check(decode());  // warm-up: plans the convolutions
    const uint64_t calls0 = alloc_counters(be).device_calls;
    Stats s = timed(be, 0, std::max(3, o.iters - 2), decode);
    json j = s.to_json();
    j["device_alloc_calls_steady"] = alloc_counters(be).device_calls - calls0;
    j["gpu_gib"] = gpu_used_gib() - mem0;
    j["alloc_peak_gib"] = alloc_counters(be).peak_gib;
    j["alloc_peak_reserved_gib"] = alloc_counters(be).reserved_peak_gib;
    R["vae_decode_" + std::to_string(res)] = j;
  }
  std::fprintf(stderr, "bench: VAE done\n");

  // Whole pipeline: the first call (plans GEMMs/convs) and then the steady state.
  const int res0 = o.sizes.front();
  for (int bs : o.batches) {
    GenerateRequest req;
    req.prompts.assign(bs, kPrompt);
    req.width = req.height = res0;
    req.steps = o.steps;
    req.seed = 42;
    PhaseTimings last;
    fresh_memory(be, *L.dit);
    reset_alloc_peak(be);
    const double t0 = now_s();
    auto first = L.pipe->run(req, {});
    if (!first.ok()) fail(first.status());
    const double first_s = now_s() - t0;
    Stats s = timed(be, 0, 3, [&]() -> Status {
      auto r = L.pipe->run(req, {});
      if (!r.ok()) return r.status();
      last = r->timings;
      return Status::Ok();
    });
    json j = s.to_json();
    j["first_call_s"] = first_s;
    j["gpu_gib"] = gpu_used_gib() - mem0;
    j["alloc_peak_gib"] = alloc_counters(be).peak_gib;
    j["alloc_peak_reserved_gib"] = alloc_counters(be).reserved_peak_gib;
    j["text_encoder_s"] = last.text_encoder_s;
    j["denoise_s"] = last.denoise_s();
    j["vae_s"] = last.vae_s;
    R["pipeline_" + std::to_string(res0) + "_bs" + std::to_string(bs)] = j;
    std::fprintf(stderr, "bench: pipeline %d bs%d %.0f ms (first call %.2f s)\n", res0, bs,
                 s.median_ms, first_s);
  }
  R["gpu_gib_peak"] = gpu_used_gib() - mem0;

#ifdef ZIMAGE_WITH_CUDA
  if (o.profile && o.device != "cpu") {
    auto* cb = as_cuda(be);
    json prof;
    L.dit->set_use_graphs(false);  // a replayed graph's kernels are not seen op by op
    auto profile = [&](const std::string& phase, const std::function<Status()>& fn) {
      profile_phase(*cb, phase, fn, prof);
    };
    TorchCpuGenerator gen(3);
    auto host = gen.randn({1, 16, res0 / fac, res0 / fac});
    if (!host.ok()) fail(host.status());
    auto lat = be.upload(*host, DType::kF32);
    if (!lat.ok()) fail(lat.status());
    Tensor out;
    profile("DiT forward " + std::to_string(res0) + " bs1",
            [&] { return L.dit->forward(*lat, {0.5f}, {caps[0]}, out); });
    profile("VAE decode " + std::to_string(res0), [&]() -> Status {
      auto r = L.vae->decode(*lat);
      return r.ok() ? Status::Ok() : r.status();
    });
    profile("text encoder", [&]() -> Status {
      auto r = L.te->encode({*ids});
      return r.ok() ? Status::Ok() : r.status();
    });
    R["profile"] = prof;
    L.dit->set_use_graphs(true);
  }
  if (o.ablation && o.device != "cpu") {
    // The optimisation literature's table, cumulative rows, each measured in this run: DiT
    // forward (median of 3) and whole image (median of 2, 8 forwards), peak memory in tensors.
    json rows = json::array();
    struct Setup {
      const char* name;
      cuda::AttentionPath attention;
      bool fused, graphs;
      bool device_step = true;  // CFG + Euler step on the device (else downloaded every step)
    };
    auto measure = [&](Loaded& M, const Setup& st, int image_iters) {
      auto* mb = as_cuda(*M.be);
      mb->set_attention_path(st.attention);
      mb->set_fused(st.fused);
      M.dit->set_use_graphs(st.graphs);
      M.pipe->set_device_step(st.device_step);
      TorchCpuGenerator gen(1);
      auto host = gen.randn({1, 16, res0 / fac, res0 / fac});
      if (!host.ok()) fail(host.status());
      auto lat = M.be->upload(*host, DType::kF32);
      if (!lat.ok()) fail(lat.status());
      auto cap = M.te->encode({*ids});
      if (!cap.ok()) fail(cap.status());
      Tensor out;
      reset_alloc_peak(*M.be);
      const double dit =
          timed(*M.be, 1, 3, [&] { return M.dit->forward(*lat, {0.5f}, *cap, out); }).median_ms;
      GenerateRequest req;
      req.prompts = {kPrompt};
      req.width = req.height = res0;
      req.steps = o.steps;
      req.seed = 42;
      const double img = timed(*M.be, 1, image_iters, [&]() -> Status {
                           auto r = M.pipe->run(req, {});
                           return r.ok() ? Status::Ok() : r.status();
                         }).median_ms;
      json row{{"row", st.name},
               {"dit_ms", dit},
               {"image_ms", img},
               {"alloc_peak_gib", alloc_counters(*M.be).peak_gib}};
      std::fprintf(stderr, "bench: ablation %s: DiT %.1f ms, image %.0f ms\n", st.name, dit, img);
      mb->set_attention_path(cuda::AttentionPath::kAuto);
      mb->set_fused(true);
      M.dit->set_use_graphs(true);
      M.pipe->set_device_step(true);
      return row;
    };
    const Setup bf16_rows[] = {
        {"bf16", cuda::AttentionPath::kGeneral, false, false, false},
        {"+ fused kernels", cuda::AttentionPath::kGeneral, true, false, false},
        {"+ flash attention (own FA2-style kernel)", cuda::AttentionPath::kOwn, true, false, false},
        {"+ cuDNN fused attention", cuda::AttentionPath::kAuto, true, false, false},
        {"+ CUDA graphs", cuda::AttentionPath::kAuto, true, true, false},
        {"+ CFG and Euler step on the device", cuda::AttentionPath::kAuto, true, true, true},
    };
    for (const Setup& st : bf16_rows) rows.push_back(measure(L, st, 2));
    if (std::find(o.batches.begin(), o.batches.end(), 4) != o.batches.end()) {
      const json& p4 = R["pipeline_" + std::to_string(res0) + "_bs4"];
      rows.push_back(
          json{{"row", "+ batching (4 images in one forward, per image)"},
               {"dit_ms",
                R["dit_forward_" + std::to_string(res0) + "_bs4"]["median_ms"].get<double>() / 4},
               {"image_ms", p4["median_ms"].get<double>() / 4},
               {"alloc_peak_gib", p4["alloc_peak_gib"]}});
    }
    // W8A8 FP8 on every DiT linear (--precision fp8): a second load of the folder, after the
    // bf16 rows, its memory figure from the device's view.
    L.pipe.reset();
    L.be.reset();
    {
      WeightPlacement fp8;
      fp8.fp8_compute = kFp8Default;
      const double before = gpu_used_gib();
      auto f8 = load_all(dir, o.device, DType::kBF16, o.threads, fp8);
      if (f8.ok()) {
        // First the cuBLASLt path (per-tensor FP8 GEMM, then a pass applying both scales),
        // then what ships: the scales in a CUTLASS epilogue (where built).
        auto* fb = as_cuda(*f8->be);
        fb->set_cutlass(false);
        rows.push_back(measure(*f8,
                               {"+ W8A8 FP8 on every DiT linear, cuBLASLt + scaling pass",
                                cuda::AttentionPath::kAuto, true, true},
                               2));
        rows.back()["gpu_gib_held"] = gpu_used_gib() - before;
        fb->set_cutlass(true);
        fb->set_fp8_fast_accum(false);
        f8->dit->release_graphs();
        rows.push_back(measure(*f8,
                               {"+ scales in a CUTLASS epilogue, sums promoted to fp32 "
                                "(ZIMAGE_FP8_ACCUM=fp32)",
                                cuda::AttentionPath::kAuto, true, true},
                               2));
        fb->set_fp8_fast_accum(true);
        f8->dit->release_graphs();
        rows.push_back(measure(*f8,
                               {"+ CUTLASS FP8 fast accumulation (--precision fp8)",
                                cuda::AttentionPath::kAuto, true, true},
                               2));
        if (o.profile) {
          // The shipped FP8 forward op by op (beside the bf16 profile above).
          f8->dit->set_use_graphs(false);
          TorchCpuGenerator g3(3);
          auto h = g3.randn({1, 16, res0 / fac, res0 / fac});
          if (!h.ok()) fail(h.status());
          auto l = f8->be->upload(*h, DType::kF32);
          if (!l.ok()) fail(l.status());
          auto c = f8->te->encode({*ids});
          if (!c.ok()) fail(c.status());
          Tensor o8;
          profile_phase(
              *fb, "DiT forward " + std::to_string(res0) + " bs1, W8A8 FP8 (--precision fp8)",
              [&] { return f8->dit->forward(*l, {0.5f}, *c, o8); }, R["profile"]);
          f8->dit->set_use_graphs(true);
        }
      } else {
        rows.push_back(json{{"row", "FP8"}, {"error", f8.status().to_string()}});
      }
    }
    // fp32 last: it needs its own copy of the weights, loaded after the bf16 copy is freed.
    auto f32 = load_all(dir, o.device, DType::kF32, o.threads);
    json row;
    if (f32.ok()) {
      row = measure(
          *f32, {"fp32 (no TF32), general attention", cuda::AttentionPath::kGeneral, false, false},
          1);
    } else {
      row = {{"row", "fp32"}, {"error", f32.status().to_string()}};
    }
    rows.insert(rows.begin(), row);
    if (row.contains("image_ms")) {
      for (json& r : rows)
        r["speedup"] = row["image_ms"].get<double>() / r["image_ms"].get<double>();
    }
    R["ablation"] = rows;
  }
#endif

  // Markdown table.
  std::printf(
      "| what | zimage median | min-max | GPU GiB held | GiB in tensors (peak) | GiB reserved "
      "(peak) |\n| --- | --- | --- | --- | --- | --- |\n");
  std::printf("| load (folder -> device) | %.2f s | | %.1f | %.1f | |\n", L.load_s,
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
  if (R.contains("ablation")) {
    std::printf(
        "\n| technique (cumulative) | DiT forward %d² | image (%d forwards) | speed-up | GiB in "
        "tensors (peak) |\n| --- | --- | --- | --- | --- |\n",
        res0, o.steps);
    for (const auto& r : R["ablation"]) {
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
  const std::string js = R.dump(1);
  if (!o.json_path.empty()) {
    const Status st = write_output_file(o.json_path, js + "\n");
    if (!st.ok()) fail(st);
  } else {
    std::printf("\n%s\n", js.c_str());
  }
}

}  // namespace

void register_bench_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "bench", "Measure load, text encoder, DiT forward, VAE and whole-image times and GPU memory");
  auto o = std::make_shared<Options>();
  cmd->add_option("--model", o->model, "Model folder (diffusers layout)");
  cmd->add_flag("--random-weights", o->random_weights,
                "Full-size Z-Image-Turbo architecture with random weights (folder written once to "
                "--random-dir)");
  cmd->add_option("--random-dir", o->random_dir, "Where the random-weight folder lives");
  cmd->add_option("--device", o->device, "cuda or cpu")->check(CLI::IsMember({"cuda", "cpu"}));
  cmd->add_option("--sizes", o->sizes, "Square image sizes (the first is used for whole images)")
      ->delimiter(',')
      ->check(CLI::Range(16, 4096));
  cmd->add_option("--batch", o->batches, "Batch sizes for the DiT forward and whole images")
      ->delimiter(',')
      ->check(CLI::Range(1, 64));
  cmd->add_option("--steps", o->steps, "DiT forwards per image")->check(CLI::Range(1, 1000));
  cmd->add_option("--iters", o->iters, "Timed repetitions (median reported)")
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--threads", o->threads, "CPU threads (cpu device)")
      ->check(CLI::Range(0, max_cpu_threads()));
  cmd->add_flag("--ablation", o->ablation,
                "Also time with techniques switched off (fp32, general attention)");
  cmd->add_flag("--profile", o->profile,
                "Also print GPU time per op (name and shapes) for one DiT forward, one VAE decode "
                "and one text encoding");
  cmd->add_option("--json", o->json_path, "Write all figures as JSON to this file");
  cmd->add_option("--vram-budget", o->budgets,
                  "Whole-image rows under these device-memory budgets (GiB, context included; "
                  "0 = no limit), each with a fresh pipeline and its memory plan")
      ->check(CLI::Range(0.0, 1e6))
      ->check(finite_number(false));
  cmd->add_option("--lora", o->lora,
                  "Per-request LoRA costs instead: merge vs side GEMM switch and image times with "
                  "this LoRA file (zimage make-random-lora makes one), at the first --sizes");
  cmd->add_option("--lora-scale", o->lora_scale, "Strength of the --lora LoRA (default 1)")
      ->check(finite_number(true));
  cmd->add_option("--fp8-quality", o->fp8_groups,
                  "Instead of the other figures: --precision fp8's quality (DiT output, image) "
                  "and speed against bf16, one row per group of FP8 linears, e.g. qkv out w13 w2 "
                  "all")
      ->expected(1, -1);
  cmd->add_option("--weights", o->weights,
                  "bf16 or fp8 weights for the --vram-budget and --lora rows")
      ->check(CLI::IsMember({"bf16", "fp8"}));
  cmd->add_option("--dit", o->dit_file,
                  "Transformer single file (safetensors, FP8, GGUF) replacing --model's "
                  "(--vram-budget rows)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--text-encoder", o->text_encoder_file,
                  "Text-encoder single file replacing --model's (--vram-budget rows)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--vae", o->vae_file, "VAE single file replacing --model's (--vram-budget rows)")
      ->check(CLI::ExistingFile);
  cmd->add_flag(
      "--widen-quantized", [o](int64_t) { o->keep_quantized = false; },
      "Widen FP8 / GGUF weights to bf16 at load instead of keeping them quantised");
  cmd->add_option("--pipeline", o->pipelines,
                  "Instead of the other figures: s / image and peak GPU memory of these "
                  "pipelines at the first --sizes (t2i, img2img, inpaint, controlnet, "
                  "controlnet-inpaint), median of --iters after one warm-up")
      ->delimiter(',')
      ->check(CLI::IsMember({"t2i", "img2img", "inpaint", "controlnet", "controlnet-inpaint"}));
  cmd->add_option("--controlnet", o->controlnet,
                  "ControlNet folder or single file for the --pipeline controlnet rows "
                  "(zimage make-random-model --controlnet writes a full-size one)");
  cmd->add_option("--init-image", o->init_image,
                  "Init image of the --pipeline rows (default: a generated one)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--mask", o->mask, "Inpainting mask (default: a white centre square)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--control-image", o->control_image, "Control image (default: generated edges)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--inputs-dir", o->inputs_dir,
                  "Where the generated init image, mask and control image are written (PNG), "
                  "for tools/diffusers_pipelines_bench.py to read the same files (default: a "
                  "temporary folder)");
  cmd->add_option("--strength", o->strength, "img2img / inpaint strength (default 0.6)")
      ->check(CLI::Range(1e-6, 1.0))
      ->check(finite_number(false));
  cmd->add_option("--control-scale", o->control_scale, "ControlNet scale (default 0.75)")
      ->check(CLI::Range(-100.0, 100.0))
      ->check(finite_number(true));
  add_parallel_options(cmd, o->parallel);
  cmd->callback([o] { run_bench(*o); });
}

}  // namespace zimage::cli

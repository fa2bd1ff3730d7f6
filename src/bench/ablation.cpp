// `zimage bench --profile` and `--ablation` (standard.h): the per-op device-time tables and the
// optimisation literature's table, cumulative rows each measured in this run: DiT forward (median
// of 3) and whole image (median of 2, 8 forwards), peak memory in tensors. Both need a backend
// with the machinery (an op profiler, technique switches: Backend's measurement block); the
// caller runs them on a device, not on the CPU.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/standard.h"

namespace zimage::bench {
namespace {

using Attention = Backend::AttentionChoice;

struct Setup {
  const char* name;
  Attention attention;
  bool fused, graphs;
  bool device_step = true;  // CFG + Euler step on the device (else downloaded every step)
};

// One ablation row on M: the techniques as `st` says, DiT forward and whole image timed, then
// every technique back on.
json measure(const StandardRun& s, Loaded& M, const Setup& st, int image_iters) {
  Backend& mb = *M.be;
  mb.set_attention_choice(st.attention);
  mb.set_fused(st.fused);
  M.dit->set_use_graphs(st.graphs);
  M.pipe->set_device_step(st.device_step);
  const Tensor lat = random_latents(mb, 1, 1, s.res0, s.fac);
  auto cap = M.te->encode({s.ids});
  if (!cap.ok()) fail(cap.status());
  Tensor out;
  mb.reset_peak_memory();
  const double dit =
      timed(mb, 1, 3, [&] { return M.dit->forward(lat, {0.5f}, *cap, out); }).median_ms;
  GenerateRequest req;
  req.prompts = {kPrompt};
  req.width = req.height = s.res0;
  req.steps = s.o.steps;
  req.seed = 42;
  const double img = timed(mb, 1, image_iters, [&]() -> Status {
                       auto r = M.pipe->run(req, {});
                       return r.ok() ? Status::Ok() : r.status();
                     }).median_ms;
  json row{{"row", st.name},
           {"dit_ms", dit},
           {"image_ms", img},
           {"alloc_peak_gib", alloc_counters(mb).peak_gib}};
  std::fprintf(stderr, "bench: ablation %s: DiT %.1f ms, image %.0f ms\n", st.name, dit, img);
  mb.set_attention_choice(Attention::kAuto);
  mb.set_fused(true);
  M.dit->set_use_graphs(true);
  M.pipe->set_device_step(true);
  return row;
}

// The bf16 rows on the loaded model, then batching from the bs4 figures already measured.
void bf16_rows(StandardRun& s, json& rows) {
  const Setup setups[] = {
      {"bf16", Attention::kGeneral, false, false, false},
      {"+ fused kernels", Attention::kGeneral, true, false, false},
      {"+ flash attention (own FA2-style kernel)", Attention::kOwn, true, false, false},
      {"+ cuDNN fused attention", Attention::kAuto, true, false, false},
      {"+ CUDA graphs", Attention::kAuto, true, true, false},
      {"+ CFG and Euler step on the device", Attention::kAuto, true, true, true},
  };
  for (const Setup& st : setups) rows.push_back(measure(s, s.L, st, 2));
  const std::vector<int>& batches = s.o.batches;
  if (std::find(batches.begin(), batches.end(), 4) != batches.end()) {
    const json& p4 = s.R["pipeline_" + std::to_string(s.res0) + "_bs4"];
    rows.push_back(
        json{{"row", "+ batching (4 images in one forward, per image)"},
             {"dit_ms",
              s.R["dit_forward_" + std::to_string(s.res0) + "_bs4"]["median_ms"].get<double>() / 4},
             {"image_ms", p4["median_ms"].get<double>() / 4},
             {"alloc_peak_gib", p4["alloc_peak_gib"]}});
  }
}

// W8A8 FP8 on every DiT linear (--precision fp8): a second load of the folder, after the bf16
// rows, its memory figure from the device's view. First the cuBLASLt path (per-tensor FP8 GEMM,
// then a pass applying both scales), then what ships: the scales in a CUTLASS epilogue.
void fp8_rows(StandardRun& s, json& rows) {
  WeightPlacement fp8;
  fp8.fp8_compute = kFp8Default;
  const double before = gpu_used_gib();
  auto f8 = load_all(s.dir, s.o.device, DType::kBF16, s.o.threads, fp8);
  if (!f8.ok()) {
    rows.push_back(json{{"row", "FP8"}, {"error", f8.status().to_string()}});
    return;
  }
  Backend& fb = *f8->be;
  fb.set_cutlass(false);
  rows.push_back(measure(
      s, *f8,
      {"+ W8A8 FP8 on every DiT linear, cuBLASLt + scaling pass", Attention::kAuto, true, true},
      2));
  rows.back()["gpu_gib_held"] = gpu_used_gib() - before;
  fb.set_cutlass(true);
  fb.set_fp8_fast_accum(false);
  f8->dit->release_graphs();
  rows.push_back(measure(s, *f8,
                         {"+ scales in a CUTLASS epilogue, sums promoted to fp32 "
                          "(ZIMAGE_FP8_ACCUM=fp32)",
                          Attention::kAuto, true, true},
                         2));
  fb.set_fp8_fast_accum(true);
  f8->dit->release_graphs();
  rows.push_back(measure(
      s, *f8, {"+ CUTLASS FP8 fast accumulation (--precision fp8)", Attention::kAuto, true, true},
      2));
  if (s.o.profile) {
    // The shipped FP8 forward op by op (beside the bf16 profile).
    f8->dit->set_use_graphs(false);
    const Tensor l = random_latents(fb, 3, 1, s.res0, s.fac);
    auto c = f8->te->encode({s.ids});
    if (!c.ok()) fail(c.status());
    Tensor o8;
    profile_phase(
        fb, "DiT forward " + std::to_string(s.res0) + " bs1, W8A8 FP8 (--precision fp8)",
        [&] { return f8->dit->forward(l, {0.5f}, *c, o8); }, s.R["profile"]);
    f8->dit->set_use_graphs(true);
  }
}

}  // namespace

void profile_phase(Backend& be, const std::string& phase, const std::function<Status()>& fn,
                   json& prof) {
  check(be.synchronize());
  be.set_profiling(true);
  const Status st = fn();
  be.set_profiling(false);
  check(st);
  auto rows = be.op_profile();
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
      std::printf("| %s | %lld | %.3f | %.1f | %.3f |\n", r.op.c_str(),
                  static_cast<long long>(r.calls), r.total_ms,
                  100.0 * r.total_ms / std::max(total, 1e-9), r.host_ms);
    arr.push_back({{"op", r.op}, {"calls", r.calls}, {"ms", r.total_ms}, {"host_ms", r.host_ms}});
  }
  prof[phase] = {{"total_ms", total}, {"ops", arr}};
}

void profile_ops(StandardRun& s) {
  Loaded& L = s.L;
  Backend& be = *L.be;
  json prof;
  L.dit->set_use_graphs(false);  // a replayed graph's kernels are not seen op by op
  const Tensor lat = random_latents(be, 3, 1, s.res0, s.fac);
  Tensor out;
  profile_phase(
      be, "DiT forward " + std::to_string(s.res0) + " bs1",
      [&] { return L.dit->forward(lat, {0.5f}, {s.caps[0]}, out); }, prof);
  // The forward that ships, recorded as a CUDA graph, op by op: timing marks inside the graph,
  // read after the last of kForwards back-to-back forwards (the GPU as hot as in a denoising
  // loop; the first records the graph, its warm-up run being its forward, the others replay it),
  // with the time between ops as a row of its own.
  L.dit->set_use_graphs(true);
  L.dit->release_graphs();
  be.set_profile_recorded(true);
  constexpr int kForwards = 6;
  profile_phase(
      be,
      "DiT forward " + std::to_string(s.res0) + " bs1, recorded (last of " +
          std::to_string(kForwards - 1) + " replays)",
      [&]() -> Status {
        for (int i = 0; i < kForwards; ++i) ZI_TRY(L.dit->forward(lat, {0.5f}, {s.caps[0]}, out));
        return Status::Ok();
      },
      prof);
  be.set_profile_recorded(false);
  L.dit->release_graphs();  // recorded again without the marks by the next forward
  L.dit->set_use_graphs(false);
  profile_phase(
      be, "VAE decode " + std::to_string(s.res0),
      [&]() -> Status {
        auto r = L.vae->decode(lat);
        return r.ok() ? Status::Ok() : r.status();
      },
      prof);
  profile_phase(
      be, "text encoder",
      [&]() -> Status {
        auto r = L.te->encode({s.ids});
        return r.ok() ? Status::Ok() : r.status();
      },
      prof);
  s.R["profile"] = prof;
  L.dit->set_use_graphs(true);
}

void run_ablation(StandardRun& s) {
  json rows = json::array();
  bf16_rows(s, rows);
  s.L.pipe.reset();
  s.L.be.reset();
  fp8_rows(s, rows);
  // fp32 last: it needs its own copy of the weights, loaded after the bf16 copy is freed.
  auto f32 = load_all(s.dir, s.o.device, DType::kF32, s.o.threads);
  json row;
  if (f32.ok()) {
    row = measure(s, *f32, {"fp32 (no TF32), general attention", Attention::kGeneral, false, false},
                  1);
  } else {
    row = {{"row", "fp32"}, {"error", f32.status().to_string()}};
  }
  rows.insert(rows.begin(), row);
  if (row.contains("image_ms")) {
    for (json& r : rows) r["speedup"] = row["image_ms"].get<double>() / r["image_ms"].get<double>();
  }
  s.R["ablation"] = rows;
}

}  // namespace zimage::bench

// `zimage bench --vram-budget A B ...`: per budget a fresh pipeline loaded under it (the memory
// planner decides what streams), one whole 1024² image first, then the median of --iters; the
// driver-side peak, the bytes streamed host -> device per image and the plan. The link rate
// gives each row's physical bound: streamed bytes / rate.
#include <algorithm>
#include <cstdio>
#include <string>

#include "bench/common.h"
#include "io/fs/file_io.h"

namespace zimage::bench {
namespace {

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

// The row's identity: budget, weights and the single files replacing --model's.
json row_header(const Options& o, double budget) {
  json row = {
      {"budget_gib", budget}, {"weights", o.weights}, {"streamed_weights", o.streamed_weights}};
  if (!o.dit_file.empty()) row["dit_file"] = o.dit_file;
  if (!o.text_encoder_file.empty()) row["text_encoder_file"] = o.text_encoder_file;
  if (!o.vae_file.empty()) row["vae_file"] = o.vae_file;
  row["keep_quantized"] = o.keep_quantized;
  return row;
}

// One budget's row: a pipeline loaded under it on `be`, timed; printed as it lands.
json budget_row(const Options& o, const std::string& dir, double budget, Backend& be, double rate) {
  const int res = o.sizes.front();
  PipelineLoadOptions lo;
  lo.vram_budget = static_cast<uint64_t>(budget * 1024.0 * 1024.0 * 1024.0);
  lo.fp8_weights = o.weights == "fp8";
  lo.stream_from_files = o.streamed_weights != "copy";
  lo.lock_files = o.streamed_weights == "locked-files";
  // As the engine: in files mode (no host-memory limit here) what is still copied stays pageable.
  lo.pin_host_copies = o.streamed_weights != "files";
  lo.keep_quantized = o.keep_quantized;
  lo.plan_width = lo.plan_height = res;
  json row = row_header(o, budget);
  ModelPaths paths;
  paths.model_dir = dir;
  paths.transformer_file = o.dit_file;
  paths.text_encoder_file = o.text_encoder_file;
  paths.vae_file = o.vae_file;
  DriverPeak peak(be);
  const double t0 = now_s();
  auto pipe = TextToImage::load(paths, be, lo);
  if (!pipe.ok()) {
    row["error"] = pipe.status().to_string();
    std::printf("| %.0f GiB | %s | %s | | | | | |\n", budget, o.weights.c_str(),
                pipe.status().to_string().c_str());
    return row;
  }
  row["load_s"] = now_s() - t0;
  row["plan"] = (*pipe)->memory_plan().describe();
  (*pipe)->set_float_image(false);  // as the engine runs it
  GenerateRequest req;
  req.prompts = {kPrompt};
  req.width = req.height = res;
  req.steps = o.steps;
  req.seed = 42;
  const double f0 = now_s();
  auto first = (*pipe)->run(req, {});
  if (!first.ok()) fail(first.status());
  row["first_image_s"] = now_s() - f0;
  const uint64_t h2d0 = be.streamed_bytes();
  Stats s = timed(be, 0, std::max(2, o.iters), [&]() -> Status {
    auto r = (*pipe)->run(req, {});
    return r.ok() ? Status::Ok() : r.status();
  });
  const double h2d_gb =
      static_cast<double>(be.streamed_bytes() - h2d0) / std::max(2, o.iters) / 1e9;
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
  return row;
}

}  // namespace

void run_budget_rows(const Options& o, const std::string& dir, json& R) {
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
    rows.push_back(budget_row(o, dir, budget, **be, rate));
  }
  R["budget_rows"] = rows;
  R["link_gbs"] = rate;
  if (!o.json_path.empty()) {
    check(write_output_file(o.json_path, R.dump(2) + "\n"));
  }
}

}  // namespace zimage::bench

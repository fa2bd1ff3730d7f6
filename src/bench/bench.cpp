// zimage bench's entry (bench.h): the model folder (the random-weight one written once with
// --random-weights), then the one mode the options select. --random-weights runs the full published
// Z-Image-Turbo architecture on random weights: the folder is written once (as zimage
// make-random-model does) into --random-dir and reused, so the load path is the real one.
#include "bench/bench.h"

#include <cstdio>
#include <filesystem>
#include <string>

#include "bench/common.h"
#include "io/fs/file_io.h"
#include "io/writers/random_model.h"

namespace zimage::bench {
namespace {

namespace fs = std::filesystem;

// The folder the measurements load: --model, or the random-weight folder (written if missing).
std::string model_folder(const Options& o, json& R) {
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
      auto tokenizer = o.random_tokenizer_dir
                           ? o.random_tokenizer_dir()
                           : Result<std::string>(InvalidArgument("no tokenizer folder given"));
      if (!tokenizer.ok()) fail(tokenizer.status());
      ro.tokenizer_dir = *tokenizer;
      const double t0 = now_s();
      check(write_random_model(dir, ro));
      R["random_model_write_s"] = now_s() - t0;
    }
  }
  if (dir.empty()) fail(InvalidArgument("give --model DIR or --random-weights"));
  R["model"] = o.random_weights ? "random weights, full Z-Image-Turbo architecture" : dir;
  return dir;
}

// The sequence-parallel scaling rows, once the flags are known to fit.
void run_seqpar(const Options& o, const std::string& dir, json& R) {
  if (o.parallel.parallel != "sequence")
    fail(InvalidArgument(
        "bench --devices: needs --parallel sequence (the data-parallel throughput is "
        "measured through the server: tools/dp_scaling.py)"));
  if (!o.parallel.devices_error.empty()) fail(InvalidArgument(o.parallel.devices_error));
  run_seqpar_bench(o, dir, R);
  if (!o.json_path.empty()) check(write_output_file(o.json_path, R.dump(1) + "\n"));
}

void run_mode(const Options& o) {
  json R;
  const std::string dir = model_folder(o, R);
  if (o.parallel.requested) return run_seqpar(o, dir, R);
  if (!o.budgets.empty()) return run_budget_rows(o, dir, R);
  if (!o.pipelines.empty()) return run_pipeline_bench(o, dir, R);
  if (!o.lora.empty()) return run_lora_bench(o, dir);
  if (!o.fp8_groups.empty()) {
    run_fp8_quality(o, dir, R);
    if (!o.json_path.empty()) check(write_output_file(o.json_path, R.dump(1) + "\n"));
    return;
  }
  if (!o.dit_file.empty() || !o.text_encoder_file.empty() || !o.vae_file.empty())
    fail(
        InvalidArgument("--dit, --text-encoder and --vae are measured by the --vram-budget rows "
                        "(use --vram-budget 0 for no limit)"));
  run_standard(o, dir, R);
}

}  // namespace

Status run(const Options& o) {
  try {
    run_mode(o);
  } catch (const Abort& a) {
    return a.status;
  }
  return Status::Ok();
}

}  // namespace zimage::bench

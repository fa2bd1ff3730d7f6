// zimage bench: the flags of the measurements in src/bench (bench.h says what each mode measures;
// docs/BENCHMARKS.md reports the numbers). Output: a Markdown table on stdout and, with --json,
// every figure as JSON.
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "bench/bench.h"
#include "builtin/builtin_model.h"
#include "commands.h"
#include "number_flags.h"
#include "parallel_args.h"

namespace zimage::cli {
namespace {

// The flags that need the CLI's helpers, into the library's options; then the run. Failures are
// printed by the library.
void run_bench(bench::Options o, const ParallelArgs& parallel) {
  o.random_tokenizer_dir = []() -> Result<std::string> {
    ZI_ASSIGN_OR_RETURN(std::string dir, builtin_model_dir());
    return dir + "/tokenizer";
  };
  o.parallel.requested = !parallel.parallel.empty() || !parallel.devices.empty();
  o.parallel.parallel = parallel.parallel;
  o.parallel.comm = parallel.comm;
  // false: devices_error says why, reported once the model folder is known.
  if (o.parallel.requested && parallel.parallel == "sequence")
    (void)sequence_parallel_devices(parallel, &o.parallel.devices, &o.parallel.devices_error);
  if (!bench::run(o).ok()) throw CLI::RuntimeError(1);
}

}  // namespace

void register_bench_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "bench", "Measure load, text encoder, DiT forward, VAE and whole-image times and GPU memory");
  auto o = std::make_shared<bench::Options>();
  auto parallel = std::make_shared<ParallelArgs>();
  cmd->add_option("--model", o->model, "Model folder (diffusers layout)");
  cmd->add_flag("--random-weights", o->random_weights,
                "Full-size Z-Image-Turbo architecture with random weights (folder written once to "
                "--random-dir)");
  cmd->add_option("--random-dir", o->random_dir, "Where the random-weight folder lives");
  cmd->add_option("--device", o->device, "cuda or cpu")->check(CLI::IsMember({"cuda", "cpu"}));
  cmd->add_option("--sizes", o->sizes, "Square image sizes (the first is used for whole images)")
      ->delimiter(',')
      ->check(CLI::Range(16, 4096));
  CLI::Option* batch =
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
                "Also print GPU time per op (name and shapes) for one DiT forward (eager, and "
                "inside its recorded CUDA graph with the time between ops), one VAE decode and "
                "one text encoding");
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
  CLI::Option* fp8_quality =
      cmd->add_option(
             "--fp8-quality", o->fp8_groups,
             "Instead of the other figures: --precision fp8's quality (DiT output, image) "
             "and speed against bf16, one row per group of FP8 linears, e.g. qkv out w13 w2 "
             "all")
          ->expected(1, -1);
  // Its rows are batch 1 at the first size: a --batch it would not use is refused rather than
  // left out silently.
  fp8_quality->excludes(batch);
  cmd->add_option("--fp8-layers", o->fp8_layers,
                  "The DiT forward, image and profile rows with these DiT layers in FP8, as "
                  "zimage generate --precision fp8 --fp8-layers (e.g. all, or all,sdpa)")
      ->excludes(fp8_quality);
  cmd->add_option("--weights", o->weights,
                  "bf16 or fp8 weights for the --vram-budget and --lora rows")
      ->check(CLI::IsMember({"bf16", "fp8"}));
  cmd->add_option(
         "--streamed-weights", o->streamed_weights,
         "copy, files or locked-files: where the --vram-budget rows' streamed weights come from "
         "(zimage generate --streamed-weights)")
      ->check(CLI::IsMember({"copy", "files", "locked-files"}));
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
  add_parallel_options(cmd, *parallel);
  cmd->callback([o, parallel] { run_bench(*o, *parallel); });
}

}  // namespace zimage::cli

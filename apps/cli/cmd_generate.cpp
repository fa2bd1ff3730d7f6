// `zimage generate`: text to PNG through the public Engine API. Why here and not in the engine:
// everything a person at a terminal needs (defaults, the built-in tiny model, file naming,
// progress bar, PNG metadata, exit codes, Ctrl-C) lives at this edge; the engine stays a library.
//
//   zimage generate --model DIR --prompt TEXT [--prompt TEXT ...] [--negative-prompt TEXT]
//                   --width W --height H --steps N --guidance G --seed S [--device cpu|cuda]
//                   [--devices cuda:0,cuda:1,... --images-per-prompt N]  (the batch split)
//                   [--devices cuda:0,cuda:1,... --parallel sequence]  (one image split)
//                   [--init-image FILE [--mask FILE] [--strength S]]
//                   [--controlnet PATH --control-image FILE [--control-scale S]] --output FILE.png
//   zimage generate --dit FILE --text-encoder FILE --vae FILE --prompt TEXT ...  (single files)
// Exit codes: 0 success, 1 failure (model, device, I/O), 2 usage (bad flag or value),
// 130 cancelled by Ctrl-C.
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "builtin/builtin_model.h"
#include "commands.h"
#include "core/log.h"
#include "generate_devices.h"
#include "lora_args.h"
#include "model_flags.h"
#include "number_flags.h"
#include "output_paths.h"
#include "parallel_args.h"
#include "progress.h"
#include "serve/device_pool.h"
#include "zimage/zimage.h"

namespace zimage::cli {

namespace {

constexpr int kTinyDefaultSide = 64;

struct GenerateArgs {
  EngineFlags engine;  // --model, the single files, --device ... --threads, --lora
  std::vector<std::string> prompts;
  std::string negative_prompt;
  int width = 1024;
  int height = 1024;
  int steps = 8;
  float guidance = 0.0f;
  std::string seed = "0";  // parsed by parse_seed: 0..2^64-1, or -1 for a random seed
  int images_per_prompt = 1;
  float cfg_truncation = 1.0f;
  float cfg_normalization = 0.0f;
  int max_sequence_length = 512;
  std::string output = "zimage.png";
  int png_compression = kPngCompression;
  std::string init_image;  // img2img / inpainting inputs (PNG, JPEG, WebP)
  std::string mask;
  double strength = 0.0;
  std::string controlnet;  // ControlNet folder or single file, its control image and scale
  std::string control_image;
  float control_scale = 0.75f;
  std::string dump_dir;
  std::string dump_filter;
  bool verbose = false;
  bool quiet = false;
  bool progress = false;
  ParallelArgs parallel;  // --devices / --parallel sequence (parallel_args.h)
};

std::atomic<bool> g_cancel{false};
// First Ctrl-C: stop at the next step or VAE block and write nothing. A second: leave now.
extern "C" void on_sigint(int) {
  if (g_cancel.exchange(true)) ::_exit(130);
}

[[noreturn]] void fail(int code, const std::string& message) {
  std::fprintf(stderr, "zimage generate: %s\n", message.c_str());
  throw CLI::RuntimeError(code);
}

// --seed: a decimal number in 0..2^64-1, or -1 (also "random") for a random seed, as other tools
// spell it. Anything else, a value >= 2^64 included, is a usage error: nothing wraps silently.
bool parse_seed(const std::string& text, uint64_t* seed, bool* random) {
  *random = text == "-1" || text == "random";
  if (*random) {
    std::random_device rd;
    *seed = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    return true;
  }
  if (text == "-0") {  // -0 is 0, as the server's and the worker's JSON "seed": -0
    *seed = 0;
    return true;
  }
  if (text.empty() || text.size() > 20) return false;
  uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    const uint64_t d = static_cast<uint64_t>(c - '0');
    if (v > (UINT64_MAX - d) / 10) return false;  // would pass 2^64 - 1
    v = v * 10 + d;
  }
  *seed = v;
  return true;
}

void print_timings(const GenerateResult& r) {
  const PhaseTimings& t = r.timings;
  const double denoise = t.denoise_s();
  std::fprintf(stderr, "device        %s\n", r.device.c_str());
  std::fprintf(stderr, "tokenize      %8.3f s\n", t.tokenize_s);
  std::fprintf(stderr, "text encoder  %8.3f s\n", t.text_encoder_s);
  if (t.vae_encode_s > 0) std::fprintf(stderr, "vae encode    %8.3f s\n", t.vae_encode_s);
  for (size_t i = 0; i < t.dit_s.size(); ++i)
    std::fprintf(stderr, "  step %-6zu  %8.3f s\n", i, t.dit_s[i]);
  std::fprintf(stderr, "denoise       %8.3f s (%zu steps, %.3f s/step)\n", denoise, t.dit_s.size(),
               t.dit_s.empty() ? 0.0 : denoise / t.dit_s.size());
  std::fprintf(stderr, "vae decode    %8.3f s\n", t.vae_s);
  std::fprintf(stderr, "total         %8.3f s\n", t.total_s);
}

// An engine error about a request field, worded with the flag and the file the user gave:
// "mask: 30x20 differs from ..." -> "--mask m.png: 30x20 differs from ...". Errors about other
// fields, or with a context before the field, keep their message.
std::string with_flags(const Status& st, const GenerateArgs& a) {
  const std::pair<const char*, std::string> flags[] = {
      {"init_image", "--init-image " + a.init_image},
      {"mask", "--mask " + a.mask},
      {"strength", "--strength"},
      {"guidance", "--guidance"},
      {"cfg_truncation", "--cfg-truncation"},
      {"cfg_normalization", "--cfg-normalization"},
      {"control_image", "--control-image " + a.control_image},
      {"control_scale", "--control-scale"}};
  const std::optional<std::string> detail = st.field_detail();
  if (detail)
    for (const auto& [field, flag] : flags)
      if (st.field() == field) return flag + ": " + *detail;
  return st.message();
}

// Reads an --init-image / --mask file: a missing, unreadable or undecodable file is a usage
// error (exit 2) naming the flag; the reader's message names the file.
Image read_input(const std::string& flag, const std::string& path, bool is_mask) {
  auto img = is_mask ? mask_load(path) : image_load(path);
  if (!img.ok()) {
    const ErrorCode c = img.status().code();
    fail(c == ErrorCode::kOutOfMemory || c == ErrorCode::kInternal ? 1 : 2,
         flag + ": " + img.status().message());
  }
  return std::move(img).value();
}

void run_generate(const GenerateArgs& a, const CLI::App& cmd) {
  apply_log_flags(a.verbose, a.quiet);
  EngineOptions eo = engine_options(a.engine);
  GenerateRequest req;
  req.width = a.width;
  req.height = a.height;
  // --model, --dit, --text-encoder, --vae; the built-in model (embedded, unpacked into the
  // user's cache) without any. A path of the wrong kind is a usage error (exit 2).
  auto choice = apply_model_flags(a.engine.model, eo);
  if (!choice.ok())
    fail(choice.status().code() == ErrorCode::kInvalidArgument ? 2 : 1,
         choice.status().code() == ErrorCode::kInvalidArgument ? choice.status().message()
                                                               : choice.status().to_string());
  if (choice->builtin) {
    if (cmd.count("--width") == 0) req.width = kTinyDefaultSide;
    if (cmd.count("--height") == 0) req.height = kTinyDefaultSide;
  }
  bool random_seed = false;
  if (!parse_seed(a.seed, &req.seed, &random_seed))
    fail(2, "--seed: '" + a.seed + "' is not a whole number in 0..18446744073709551615 (or -1 " +
                "for a random seed)");
  {
    std::string error;
    if (!sequence_parallel_devices(a.parallel, &eo.sequence_parallel_devices, &error))
      fail(2, error);
    if (!eo.sequence_parallel_devices.empty() && cmd.count("--device") > 0)
      fail(2, "--device: not with --devices (the first of --devices is rank 0's device)");
    eo.sequence_parallel_comm = a.parallel.comm;
  }
  std::string lora_error;
  if (!parse_lora_args(a.engine.lora, &eo.loras, &lora_error)) fail(2, lora_error);
  req.prompts = a.prompts;
  if (cmd.count("--negative-prompt") > 0) req.negative_prompt = a.negative_prompt;
  req.steps = a.steps;
  req.guidance = a.guidance;
  req.images_per_prompt = a.images_per_prompt;
  req.cfg_truncation = a.cfg_truncation;
  req.cfg_normalization = a.cfg_normalization;
  req.max_sequence_length = a.max_sequence_length;
  // Image inputs are read before the model loads, so a bad file fails at once.
  if (cmd.count("--mask") > 0 && cmd.count("--init-image") == 0)
    fail(2, "--mask: needs --init-image (the image to inpaint)");
  if (cmd.count("--strength") > 0 && cmd.count("--init-image") == 0)
    fail(2, "--strength: needs --init-image");
  if (cmd.count("--init-image") > 0)
    req.init_image = read_input("--init-image", a.init_image, false);
  if (cmd.count("--mask") > 0) req.mask = read_input("--mask", a.mask, true);
  if (cmd.count("--strength") > 0) req.strength = a.strength;
  if (cmd.count("--control-image") > 0 && cmd.count("--controlnet") == 0)
    fail(2, "--control-image: needs --controlnet (the ControlNet that reads it)");
  if (cmd.count("--controlnet") > 0 && cmd.count("--control-image") == 0)
    fail(2, "--controlnet: needs --control-image (the pose, depth, edge... image)");
  if (!std::isfinite(a.control_scale))
    fail(2, "--control-scale: must be a finite number, got " + std::to_string(a.control_scale));
  if (cmd.count("--controlnet") > 0) {
    std::error_code ec;
    if (!std::filesystem::exists(a.controlnet, ec))
      fail(2, "--controlnet " + a.controlnet + ": no such file or folder");
  }
  if (cmd.count("--control-image") > 0) {
    req.control_image = read_input("--control-image", a.control_image, false);
    req.control_scale = a.control_scale;
    eo.controlnet = a.controlnet;
  }

  const size_t count = req.prompts.size() * static_cast<size_t>(std::max(1, a.images_per_prompt));
  const std::vector<std::string> paths = output_paths(a.output, count);
  for (const std::string& path : paths) {  // fail before the model loads, not after generating
    const Status st = check_writable_path(path, "--output");
    if (!st.ok()) fail(st.code() == ErrorCode::kInvalidArgument ? 2 : 1, st.message());
  }
  if (random_seed && !a.quiet)
    std::fprintf(stderr, "seed %llu\n", static_cast<unsigned long long>(req.seed));

  // --devices (data parallel, without --parallel sequence): one engine per device, as many as
  // there are images at most.
  std::vector<std::string> devices = {eo.device};
  if (!a.parallel.devices.empty() && eo.sequence_parallel_devices.empty()) {
    if (cmd.count("--device") > 0) fail(2, "--device: not with --devices");
    if (!a.dump_dir.empty()) fail(2, "--dump: not with --devices (the parts' files would collide)");
    auto list = zimage::parse_device_list(a.parallel.devices);
    if (!list.ok())
      fail(list.status().code() == ErrorCode::kInvalidArgument ? 2 : 1,
           "--devices: " + list.status().message());
    devices = std::move(list).value();
    if (devices.size() > count) {
      if (!a.quiet)
        std::fprintf(stderr, "--devices: %zu images, so %zu of the %zu engines\n", count, count,
                     devices.size());
      devices.resize(count);
    }
    if (!a.quiet)
      for (const std::string& note : serve::shared_device_notes(devices))
        std::fprintf(stderr, "%s\n", note.c_str());
  }
  auto loaded = load_engines(eo, devices);
  if (!loaded.ok()) {
    const bool usage = loaded.status().code() == ErrorCode::kInvalidArgument;
    fail(usage ? 2 : 1, usage ? loaded.status().message()  // names the option at fault
                              : "cannot load the model: " + loaded.status().to_string());
  }
  std::vector<Engine*> engines;
  for (const auto& e : *loaded) engines.push_back(e.get());
  Engine* engine = engines[0];
  if (req.init_image) {
    // As diffusers: without an asked-for size the output takes the image's size, each side
    // rounded down to the model's size multiple (the image is then resized to it).
    const int m = engine->info().size_multiple;
    if (cmd.count("--width") == 0) req.width = req.init_image->width / m * m;
    if (cmd.count("--height") == 0) req.height = req.init_image->height / m * m;
    if (req.width == 0 || req.height == 0)
      fail(2, "--init-image " + a.init_image + ": " + std::to_string(req.init_image->width) + "x" +
                  std::to_string(req.init_image->height) +
                  " is smaller than this model's size multiple " + std::to_string(m) +
                  "; give --width and --height");
  }
  const std::vector<GenerateRequest> parts = split_batch(req, static_cast<int>(engines.size()));
  for (size_t k = 0; k < parts.size(); ++k) {
    const Status valid = engines[k]->validate(parts[k]);
    if (!valid.ok()) fail(2, with_flags(valid, a));
  }

  ProgressBar bar(!a.quiet && (a.progress || is_terminal(stderr)), stderr);
  GenerateHooks hooks;
  hooks.on_progress = [&bar](const Progress& p) { bar.update(p); };
  hooks.cancel = &g_cancel;
  hooks.dump_dir = a.dump_dir;
  hooks.dump_filter = a.dump_filter;
  g_cancel.store(false);
  auto previous = std::signal(SIGINT, on_sigint);
  auto result = parts.size() == 1 ? engine->generate(req, hooks)
                                  : generate_joined(engines, devices, parts, hooks);
  // A Ctrl-C after the last check inside generate() still means: write nothing.
  const bool cancelled =
      g_cancel.load() || (!result.ok() && result.status().code() == ErrorCode::kCancelled);
  bar.finish(result.ok() && !cancelled ? "done" : cancelled ? "cancelled" : "failed");
  if (cancelled) {
    std::signal(SIGINT, previous == SIG_ERR ? SIG_DFL : previous);
    fail(130, "cancelled");
  }
  if (!result.ok()) {
    std::signal(SIGINT, previous == SIG_ERR ? SIG_DFL : previous);
    fail(result.status().code() == ErrorCode::kInvalidArgument ? 2 : 1,
         result.status().to_string());
  }
  if (result->images.size() != paths.size())
    fail(1, "internal error: " + std::to_string(result->images.size()) + " images for " +
                std::to_string(paths.size()) + " output files");
  // Every image is encoded first, then all files are written at once: a failure (full disk)
  // leaves no half-written batch and no damaged file behind.
  std::vector<std::vector<uint8_t>> encoded;
  for (size_t i = 0; i < paths.size(); ++i) {
    auto png = png_encode(result->images[i], png_metadata(req, i), a.png_compression);
    if (!png.ok()) fail(1, png.status().to_string());
    encoded.push_back(std::move(png).value());
  }
  std::signal(SIGINT, previous == SIG_ERR ? SIG_DFL : previous);
  if (g_cancel.load()) fail(130, "cancelled");
  const Status written = write_files_atomically(paths, encoded);
  if (!written.ok()) fail(1, written.to_string());
  if (!a.quiet) {
    for (const std::string& path : paths) std::printf("wrote %s\n", path.c_str());
  }
  if (a.verbose) print_timings(*result);
  // Done: every file is written and renamed, the plan cache saved as it was filled. Tearing the
  // engines down (freeing ~20 GB of device memory, destroying the CUDA context, unmapping the
  // weight files) would only make the user wait for what the OS reclaims at exit anyway; the one
  // thing left to do is removing a temporary copy of the built-in model.
  release_builtin_model();
  // The log's clock at the end: against the shell's time for the whole process, what the exit
  // and the shared libraries' loading before the log's clock started cost.
  ZI_DEBUG("generate: %zu file(s) written", paths.size());
  std::fflush(nullptr);
  std::_Exit(0);
}

}  // namespace

void register_generate_command(CLI::App& app) {
  auto args = std::make_shared<GenerateArgs>();
  // One process, a few images: the streamed weights come from the files (no load-time copy).
  // Measured on an H100 (docs/BENCHMARKS.md, "Session 15"), whole processes of one 1024² image:
  // 3.1 / 4.6 / 4.1 s under --vram-budget 12 / 8 / 4 against 7.9 / 12.7 / 14.7 s with copies,
  // which win only from about 9 / 6 / 14 images a process on. The server and workers keep copy.
  args->engine.options.streamed_weights = "files";
  CLI::App* cmd = app.add_subcommand(
      "generate",
      "Generate images from text prompts. Defaults are the Z-Image-Turbo recipe (1024x1024, 8 "
      "steps, guidance 0, seed 0). Without --model the tiny built-in test model is used (random "
      "weights: the picture is noise-like) and the default size is 64x64.");
  add_model_flags(cmd, args->engine.model,
                  "Model folder in the diffusers layout (default: the tiny built-in model)");
  cmd->add_option("--prompt,-p", args->prompts,
                  "Prompt (UTF-8); repeat for a batch: --prompt A --prompt B")
      ->required()
      ->allow_extra_args(false);
  cmd->add_option("--negative-prompt,-n", args->negative_prompt,
                  "Negative prompt, used when --guidance > 0 (default: empty)");
  cmd->add_option("--width,-W", args->width, "Image width in pixels (default 1024; 64 built-in)");
  cmd->add_option("--height,-H", args->height,
                  "Image height in pixels (default 1024; 64 built-in)");
  cmd->add_option("--steps,-s", args->steps, "Denoising steps (default 8)");
  cmd->add_option("--guidance,-g", args->guidance,
                  "Classifier-free guidance scale, diffusers form (0 = off, the Turbo default)")
      ->check(finite_number(true));
  cmd->add_option("--seed", args->seed,
                  "Seed of the PyTorch-compatible CPU noise, 0..2^64-1, or -1 for a random seed "
                  "(printed and stored in the PNG) (default 0)");
  cmd->add_option("--images-per-prompt", args->images_per_prompt, "Images per prompt (default 1)");
  cmd->add_option("--cfg-truncation", args->cfg_truncation,
                  "Skip CFG on steps whose normalised time exceeds this (default 1 = never)")
      ->check(finite_number(true));
  cmd->add_option("--cfg-normalization", args->cfg_normalization,
                  "Clip the guided prediction's norm to this x the positive one's (0 = off)")
      ->check(finite_number(true));
  cmd->add_option("--max-sequence-length", args->max_sequence_length,
                  "Prompt tokens kept, chat template included (default 512)");
  add_engine_flags(
      cmd, args->engine,
      {EngineFlag::kDevice,
       {EngineFlag::kVramBudget,
        "GPU memory the process may use, in GiB, CUDA context included (default 0 = no limit); "
        "what does not fit streams from host memory (--verbose shows the plan)"},
       EngineFlag::kHostMemory,
       {EngineFlag::kStreamedWeights,
        "Where weights streamed under --vram-budget come from: copy (host copies made at load: "
        "faster steps, seconds more to load), files (read from the weight files each step, no "
        "load-time copy: the first image sooner) or locked-files (experimental: the files' pages "
        "page-locked in place up to --host-memory; very slow to lock on some hosts) (default "
        "files: copies pay off from about 6-14 images a process on)"},
       {EngineFlag::kWeights,
        "bf16, or fp8: DiT and text-encoder linear weights stored as FP8 with per-channel "
        "scales (half the memory; small quality cost)"},
       {EngineFlag::kPrecision,
        "auto, bf16, f32, or fp8 (bf16 with the DiT's linears as W8A8 FP8 GEMMs; CUDA, "
        "Ada/Hopper or newer) (default auto)"},
       {EngineFlag::kFp8Layers,
        "With --precision fp8: the DiT linears in FP8, all or a comma-separated subset of qkv, "
        "out, w13, w2, ffn, attn, refiners (default all)"},
       {EngineFlag::kVaeTiling,
        "Decode in overlapping tiles as diffusers' enable_tiling(): on, off, or auto (tiled "
        "when the untiled decode would not fit free GPU memory) (default auto)"},
       {EngineFlag::kThreads, "CPU threads, at most 4x the hardware threads (default 0 = all)"}});
  cmd->add_option("--output,-o", args->output,
                  "Output PNG; with several images FILE_0.png, FILE_1.png, ... (default "
                  "zimage.png)");
  cmd->add_option("--png-compression", args->png_compression,
                  "zlib level of the PNG, 0 (stored) to 9 (smallest, slowest); the default 1 "
                  "writes a 1024x1024 picture 4-9x faster than 6 (PIL's default) for 12-17 % more "
                  "bytes (default 1)")
      ->check(CLI::Range(0, 9));
  cmd->add_option("--init-image", args->init_image,
                  "Image-to-image: start from this PNG, JPEG or WebP (EXIF orientation applied, as "
                  "diffusers' load_image); the output size defaults to the image's, rounded down "
                  "to the size multiple, and the image is resized (PIL Lanczos) when it differs");
  cmd->add_option("--mask", args->mask,
                  "Inpainting: repaint where this mask (grayscale or RGB, the init image's size) "
                  "is white (>= 128), keep the rest");
  cmd->add_option("--strength", args->strength,
                  "How far the init image is noised, in (0, 1]: steps run = steps - int(steps - "
                  "steps x strength) (default 0.6, or 1.0 with --mask: diffusers' defaults)")
      ->check(finite_number(false));
  cmd->add_option("--controlnet", args->controlnet,
                  "ControlNet (Z-Image Fun-Controlnet-Union: diffusers folder or single "
                  ".safetensors, versions 1.0, 2.0, 2.1, 2.1-lite); needs --control-image");
  cmd->add_option("--control-image", args->control_image,
                  "ControlNet condition image (pose, depth, edges...; PNG, JPEG, WebP), resized "
                  "to the output size; with --init-image and --mask: ControlNet inpainting (2.x)");
  cmd->add_option("--control-scale", args->control_scale,
                  "ControlNet conditioning scale (default 0.75, diffusers' default)")
      ->check(finite_number(true));
  cmd->add_option("--dump", args->dump_dir,
                  "Write named intermediate tensors as .npy files into this folder");
  cmd->add_option("--dump-filter", args->dump_filter,
                  "Only dump tensors whose name contains this text");
  add_lora_options(cmd, args->engine.lora);
  add_parallel_options(cmd, args->parallel);
  cmd->add_flag("--verbose,-v", args->verbose,
                "Print load information (each LoRA's format and targets) and per-phase times");
  cmd->add_flag("--quiet,-q", args->quiet, "Print nothing but errors");
  cmd->add_flag("--progress", args->progress,
                "Show the progress bar even when stderr is not a terminal");
  cmd->callback([args, cmd] { run_generate(*args, *cmd); });
}

}  // namespace zimage::cli

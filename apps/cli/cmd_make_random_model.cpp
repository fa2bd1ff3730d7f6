// zimage make-random-model: writes a complete model folder in the published diffusers layout
// with random weights of realistic scale (io/writers/random_model.h). The real checkpoint cannot be
// downloaded everywhere zimage is developed; this folder stands in for it in speed runs and in
// the full-size comparison with diffusers (both load the same files).
#include <cstdio>
#include <string>

#include "builtin/builtin_model.h"
#include "commands.h"
#include "io/model/model_folder.h"
#include "io/writers/random_controlnet.h"
#include "io/writers/random_model.h"
#include "number_flags.h"

namespace zimage::cli {

void register_make_random_model_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "make-random-model",
      "Write a Z-Image model folder (diffusers layout) with random weights: the full-size "
      "Z-Image-Turbo architecture by default, or the configs of an existing folder (--like); "
      "with --controlnet, a Fun-Controlnet-Union ControlNet folder for that transformer");
  auto out = std::make_shared<std::string>();
  auto like = std::make_shared<std::string>();
  auto tokenizer = std::make_shared<std::string>();
  auto seed = std::make_shared<uint64_t>(0);
  auto dtype = std::make_shared<std::string>("bf16");
  auto controlnet = std::make_shared<std::string>();
  auto cn_version = std::make_shared<std::string>("2.1");
  cmd->add_option("--out", *out, "Folder to create (must not exist or be empty)");
  cmd->add_option("--controlnet", *controlnet,
                  "Also (or, without --out, only) write a random ControlNet folder here "
                  "(config.json + safetensors, diffusers' ZImageControlNetModel layout) for the "
                  "transformer of --like or the full-size one");
  cmd->add_option("--controlnet-version", *cn_version,
                  "Published ControlNet layout: 1.0, 2.0, 2.1 (default) or 2.1-lite")
      ->check(CLI::IsMember({"1.0", "2.0", "2.1", "2.1-lite"}));
  cmd->add_option("--like", *like,
                  "Copy the configs of this model folder instead of the full-size ones");
  cmd->add_option("--tokenizer", *tokenizer,
                  "Tokenizer folder to copy (tokenizer.json, tokenizer_config.json; default: the "
                  "built-in model's)");
  cmd->add_option("--seed", *seed, "Seed of the random values");
  cmd->add_option("--dtype", *dtype, "Stored dtype: bf16, f16 or f32")
      ->check(CLI::IsMember({"bf16", "f16", "f32"}));
  auto outlier_fraction = std::make_shared<double>(0.0);
  auto outlier_scale = std::make_shared<float>(30.0f);
  cmd->add_option("--outlier-channels", *outlier_fraction,
                  "Fraction of input channels of the DiT blocks' linear weights scaled by "
                  "--outlier-scale, as trained transformers show (e.g. 0.005; default 0)")
      ->check(CLI::Range(0.0, 1.0))
      ->check(finite_number(false));
  cmd->add_option("--outlier-scale", *outlier_scale, "Factor of the outlier channels (default 30)")
      ->check(CLI::Range(-1e6, 1e6))
      ->check(finite_number(true));
  cmd->callback([=] {
    if (out->empty() && controlnet->empty()) {
      std::fprintf(stderr, "zimage make-random-model: give --out DIR and/or --controlnet DIR\n");
      throw CLI::RuntimeError(2);
    }
    RandomModelOptions o;
    ZImageConfigs cfg = zimage_turbo_reference_configs();
    if (!like->empty()) {
      auto folder = ModelFolder::open(*like);
      if (!folder.ok()) {
        std::fprintf(stderr, "zimage make-random-model: %s\n", folder.status().to_string().c_str());
        throw CLI::RuntimeError(1);
      }
      cfg = folder->configs();
    }
    o.dit = cfg.transformer;
    o.text_encoder = cfg.text_encoder;
    o.vae = cfg.vae;
    o.scheduler_shift = cfg.scheduler.shift;
    o.seed = *seed;
    o.dtype = *dtype == "f32" ? DType::kF32 : *dtype == "f16" ? DType::kF16 : DType::kBF16;
    o.tokenizer_dir = *tokenizer;
    o.outlier_fraction = *outlier_fraction;
    o.outlier_scale = *outlier_scale;
    if (o.tokenizer_dir.empty() && !out->empty()) {
      auto builtin = builtin_model_dir();
      if (!builtin.ok()) {
        std::fprintf(stderr, "zimage make-random-model: %s\n",
                     builtin.status().to_string().c_str());
        throw CLI::RuntimeError(1);
      }
      o.tokenizer_dir = *builtin + "/tokenizer";
    }
    auto progress = [](const std::string& file) {
      std::fprintf(stderr, "wrote %s\n", file.c_str());
    };
    Status s = Status::Ok();
    if (!out->empty()) s = write_random_model(*out, o, progress);
    if (s.ok() && !controlnet->empty())
      s = write_random_controlnet(*controlnet, *cn_version, o, progress);
    if (!s.ok()) {
      std::fprintf(stderr, "zimage make-random-model: %s\n", s.to_string().c_str());
      throw CLI::RuntimeError(1);
    }
  });
}

}  // namespace zimage::cli

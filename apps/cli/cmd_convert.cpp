// zimage convert: writes any loadable model (--model DIR and/or --dit / --text-encoder / --vae
// files) as ComfyUI-named bf16 single files, ComfyUI scaled FP8 files or GGUF DiT files
// (io/writers/convert.h; docs/FORMATS.md has examples). Why: people with little RAM or VRAM can
// make the smaller files themselves from the published folder, with the tool that will load them.
#include <cstdio>
#include <memory>
#include <string>

#include "commands.h"
#include "io/model/model_source.h"
#include "io/writers/convert.h"
#include "model_flags.h"

namespace zimage::cli {

void register_convert_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "convert",
      "Write a model as ComfyUI single files (bf16), ComfyUI scaled FP8 files (fp8, fp8-rows) or "
      "a GGUF DiT (q8_0, q4_0, q4_k, q5_k, q6_k)");
  auto flags = std::make_shared<ModelFlags>();
  auto format = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto only = std::make_shared<std::string>("all");
  auto threads = std::make_shared<int>(0);
  auto quiet = std::make_shared<bool>(false);
  cmd->add_option("--model", flags->model, "Model folder (diffusers layout) to convert");
  add_single_file_flags(cmd, *flags);
  cmd->add_option("--format", *format, "Output format: " + convert_format_list())->required();
  cmd->add_option("--out", *out, "Folder to write the files into (created if missing)")->required();
  cmd->add_option("--component", *only,
                  "Which components: all (default; GGUF writes the transformer only), "
                  "transformer, text_encoder or vae")
      ->check(CLI::IsMember({"all", "transformer", "text_encoder", "vae"}));
  cmd->add_option("--threads", *threads, "Quantisation threads (0: all cores)")
      ->check(CLI::Range(0, 1024));
  cmd->add_flag("--quiet", *quiet, "No progress lines");
  cmd->callback([=] {
    auto fail = [](const Status& s) {
      std::fprintf(stderr, "zimage convert: %s\n", s.to_string().c_str());
      throw CLI::RuntimeError(1);
    };
    if (flags->model.empty() && flags->dit.empty() && flags->text_encoder.empty() &&
        flags->vae.empty())
      fail(
          InvalidArgument("give the model to convert: --model DIR and/or --dit, "
                          "--text-encoder, --vae files"));
    EngineOptions eo;
    auto choice = apply_model_flags(*flags, eo);
    if (!choice.ok()) fail(choice.status());
    ModelPaths paths;
    paths.model_dir = eo.model_dir;
    paths.transformer_file = eo.dit_file;
    paths.text_encoder_file = eo.text_encoder_file;
    paths.vae_file = eo.vae_file;
    paths.tokenizer_dir = eo.tokenizer_dir;
    auto src = ModelSource::open(paths);
    if (!src.ok()) fail(src.status());
    ConvertOptions o;
    o.format = *format;
    o.out_dir = *out;
    o.threads = *threads;
    o.transformer = *only == "all" || *only == "transformer";
    o.text_encoder = *only == "all" || *only == "text_encoder";
    o.vae = *only == "all" || *only == "vae";
    if (!*quiet) {
      // One line per file, redrawn when the whole percentage changes.
      auto last = std::make_shared<int>(-1);
      o.progress = [last](const std::string& file, uint64_t done, uint64_t total) {
        const int pct =
            total ? static_cast<int>(100 * static_cast<double>(done) / static_cast<double>(total))
                  : 100;
        if (pct == *last && done < total) return;
        *last = done >= total ? -1 : pct;
        std::fprintf(stderr, "\r%s: %3d%% of %.2f GB%s", file.c_str(), pct,
                     static_cast<double>(total) / 1e9, done >= total ? "\n" : "");
        std::fflush(stderr);
      };
    }
    auto files = convert_model(*src, o);
    if (!files.ok()) fail(files.status());
    for (const ConvertedFile& f : *files)
      std::printf("%s: %s (%d tensors, %d quantised, %.3f GB)\n", f.component.c_str(),
                  f.path.c_str(), f.tensors, f.quantized, static_cast<double>(f.bytes) / 1e9);
  });
}

}  // namespace zimage::cli

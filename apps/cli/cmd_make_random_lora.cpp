// zimage make-random-lora: a random LoRA in diffusers/PEFT keys for the full-size Z-Image
// transformer (or the one of a model folder, --like), for `zimage bench --lora`
// (io/writers/random_lora.h).
#include <cstdio>
#include <memory>
#include <string>

#include "commands.h"
#include "io/model/model_folder.h"
#include "io/writers/random_lora.h"
#include "io/writers/random_model.h"

namespace zimage::cli {

void register_make_random_lora_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "make-random-lora",
      "Write a random LoRA (PEFT keys, bf16) on every attention and feed-forward weight of the "
      "full-size Z-Image transformer (or that of --like DIR)");
  auto out = std::make_shared<std::string>();
  auto like = std::make_shared<std::string>();
  auto o = std::make_shared<RandomLoraOptions>();
  auto targets = std::make_shared<std::string>("all");
  cmd->add_option("--out", *out, "The .safetensors file to write")->required();
  cmd->add_option("--like", *like, "Use this model folder's transformer config");
  cmd->add_option("--rank", o->rank, "LoRA rank (default 32)")->check(CLI::Range(1, 4096));
  cmd->add_option("--seed", o->seed, "Seed of the random values");
  cmd->add_option("--targets", *targets, "all, attention or ffn (default all)")
      ->check(CLI::IsMember({"all", "attention", "ffn"}));
  cmd->callback([=] {
    TransformerConfig cfg = zimage_turbo_reference_configs().transformer;
    auto fail = [](const Status& s) {
      std::fprintf(stderr, "zimage make-random-lora: %s\n", s.to_string().c_str());
      throw CLI::RuntimeError(1);
    };
    if (!like->empty()) {
      auto folder = ModelFolder::open(*like);
      if (!folder.ok()) fail(folder.status());
      cfg = folder->transformer();
    }
    RandomLoraOptions ro = *o;
    ro.attention = *targets != "ffn";
    ro.feed_forward = *targets != "attention";
    auto params = write_random_lora(*out, cfg, ro);
    if (!params.ok()) fail(params.status());
    std::printf("wrote %s: rank %d, %lld parameters\n", out->c_str(), ro.rank,
                static_cast<long long>(*params));
  });
}

}  // namespace zimage::cli

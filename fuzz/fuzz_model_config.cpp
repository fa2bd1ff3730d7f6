// libFuzzer target for the JSON-driven parsers of a model folder: strict JSON (duplicate keys,
// depth), model_index.json, the four component configs and *.safetensors.index.json. The first
// input byte picks the parser, the rest is the file text. Every input must give a value or an
// error, never a crash, and every accepted config must pass its own validation again.
//
// Build and run (ASan + UBSan, clang 14):
//   cmake --preset fuzz -B build/fuzz && cmake --build build/fuzz --target fuzz_model_config
//   mkdir -p build/fuzz/corpus_cfg && build/fuzz/fuzz/fuzz_model_config -max_total_time=600 \
//       -max_len=8192 -timeout=10 build/fuzz/corpus_cfg fuzz/corpus/config
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "io/fs/json_util.h"
#include "io/model/model_folder.h"
#include "io/weights/weights.h"

namespace {

// Every error says something, and nothing from the input reaches a terminal raw.
void check_status(const zimage::Status& s) {
  if (s.ok()) return;
  if (s.message().empty() || s.message() != zimage::json_util::printable(s.message())) std::abort();
}

template <typename T>
void check(const zimage::Result<T>& r) {
  check_status(r.status());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  const std::string file = "fuzz.json";
  switch (data[0] % 7) {
    case 0:
      check(zimage::json_util::parse_strict(text, file));
      break;
    case 1: {
      check_status(zimage::check_model_index(text, file));
      break;
    }
    case 2: {
      auto r = zimage::parse_transformer_config(text, file);
      check(r);
      if (r.ok() && !zimage::validate_transformer_config(*r, file).ok()) std::abort();
      break;
    }
    case 3: {
      auto r = zimage::parse_text_encoder_config(text, file);
      check(r);
      if (r.ok() && !zimage::validate_text_encoder_config(*r, file).ok()) std::abort();
      break;
    }
    case 4: {
      auto r = zimage::parse_vae_config(text, file);
      check(r);
      if (r.ok() && !zimage::validate_vae_config(*r, file).ok()) std::abort();
      break;
    }
    case 5: {
      auto r = zimage::parse_scheduler_config(text, file);
      check(r);
      if (r.ok() && !zimage::validate_scheduler_config(*r, file).ok()) std::abort();
      break;
    }
    default: {
      auto r = zimage::parse_weight_index(text, file);
      check(r);
      if (r.ok()) {
        for (const auto& [name, shard] : *r) {
          if (shard.empty() || shard.find('/') != std::string::npos ||
              shard.find("..") != std::string::npos) {
            std::abort();
          }
        }
      }
      break;
    }
  }
  return 0;
}

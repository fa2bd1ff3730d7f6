// libFuzzer target for the HTTP server's request parsing and validation (src/serve/
// request_parse.cpp): the first input byte picks the dialect (OpenAI Images / Automatic1111), the
// rest is the request body. Every input must give a JobSpec or an error, never a crash; every
// error must name a field (so the 4xx response has "param") and serialise to valid JSON; every
// accepted spec must pass the engine's model-free checks and respect the limits.
//
// Build and run (ASan + UBSan, clang 14):
//   cmake --preset fuzz && cmake --build --preset fuzz --target fuzz_serve_request
//   mkdir -p build/fuzz/corpus_serve && build/fuzz/fuzz/fuzz_serve_request -max_total_time=600 \
//       -max_len=4096 -timeout=10 build/fuzz/corpus_serve fuzz/corpus/serve
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string_view>

#include "api/request_check.h"
#include "serve/api_error.h"
#include "serve/request_parse.h"

namespace {

const zimage::serve::ParseLimits& limits() {
  static const zimage::serve::ParseLimits l = [] {
    zimage::serve::ParseLimits p;
    p.request.max_prompt_bytes = 1024;
    p.default_width = 64;
    p.default_height = 64;
    return p;
  }();
  return l;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace zimage::serve;
  if (size < 1) return 0;
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  const bool openai = (data[0] & 1) == 0;
  auto spec = openai ? parse_openai(body, limits(), 12345) : parse_a1111(body, limits(), 12345);
  if (!spec.ok()) {
    const zimage::Status& st = spec.status();
    if (st.code() != zimage::ErrorCode::kInvalidArgument || st.message().empty()) std::abort();
    const ApiError e = api_error(st);
    if (e.param.empty() || e.status != 400) std::abort();
    const auto j = nlohmann::json::parse(error_body(e), nullptr, false);
    if (j.is_discarded() || !j["error"]["message"].is_string()) std::abort();
    return 0;
  }
  const JobSpec& s = *spec;
  if (s.runs.empty() || s.images() < 1 || s.images() > limits().request.max_batch) std::abort();
  if (s.quality < 0 || s.quality > 100) std::abort();
  for (const zimage::GenerateRequest& r : s.runs) {
    if (!zimage::check_request(r, limits().request).ok()) std::abort();
    if (r.prompts.size() != 1 || r.prompts[0].empty()) std::abort();
  }
  return 0;
}

// libFuzzer target for the HTTP server's request reading, from the bytes on the wire to a job.
// The first input byte picks the path, the rest is its input:
//   0: an OpenAI Images JSON body, 1: an Automatic1111 one (src/serve/request_parse.cpp);
//   2: a whole HTTP request (src/serve/http/framing.h: Beast's parser and the strict framing
//      checks, limits, chunked bodies, multipart parts), its body then parsed as case 0 or 3;
//   3: a multipart/form-data body (boundary "B") into the edits form parser.
// Every input must give a JobSpec or an error, never a crash; every error must name a field (so
// the 4xx response has "param") and serialise to valid JSON; every accepted spec must pass the
// engine's model-free checks and respect the limits; every request the transport accepts has an
// origin-form path, one Host and a body within the limit.
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
#include <utility>
#include <vector>

#include "zimage/request_check.h"
#include "serve/api_error.h"
#include "serve/http/framing.h"
#include "serve/http/multipart.h"
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

void check_spec(const zimage::Result<zimage::serve::JobSpec>& spec) {
  using namespace zimage::serve;
  if (!spec.ok()) {
    const zimage::Status& st = spec.status();
    if (st.code() != zimage::ErrorCode::kInvalidArgument || st.message().empty()) std::abort();
    const ApiError e = api_error(st);
    if (e.param.empty() || e.status != 400) std::abort();
    const auto j = nlohmann::json::parse(error_body(e), nullptr, false);
    if (j.is_discarded() || !j["error"]["message"].is_string()) std::abort();
    return;
  }
  const JobSpec& s = *spec;
  if (s.runs.empty() || s.images() < 1 || s.images() > limits().request.max_batch) std::abort();
  if (s.quality < 0 || s.quality > 100) std::abort();
  for (const zimage::GenerateRequest& r : s.runs) {
    if (!zimage::check_request(r, limits().request).ok()) std::abort();
    if (r.prompts.size() != 1 || r.prompts[0].empty()) std::abort();
  }
}

void check_form(const std::vector<std::pair<std::string, zimage::serve::http::FormFile>>& parts) {
  std::vector<zimage::serve::FormPart> form;
  for (const auto& [name, f] : parts) {
    if (name.empty()) std::abort();
    form.push_back({name, f.filename, f.content});
  }
  check_spec(zimage::serve::parse_openai_edit(form, limits(), 12345));
}

constexpr size_t kBodyLimit = 8192;

void check_http(std::string_view bytes) {
  using namespace zimage::serve::http;
  const FramingLimits framing{2048, 32};
  const ParsedRequest p = parse_request(bytes, kBodyLimit, framing);
  if (p.error) {
    const int s = p.error->status;
    if (s != 400 && s != 413 && s != 414 && s != 415 && s != 417 && s != 431) std::abort();
    if (p.error->param.empty() || p.error->message.rfind(p.error->param, 0) != 0) std::abort();
    return;
  }
  const Request& r = p.request;
  if (r.path.empty() || r.target.empty() || r.target[0] != '/') std::abort();
  if (r.body.size() > kBodyLimit || r.headers.size() > framing.max_headers) std::abort();
  if (r.version >= 11 && r.headers.count("Host") != 1) std::abort();
  if (r.headers.count("Content-Length") > 1) std::abort();
  if (r.is_multipart_form_data())
    check_form(r.files);
  else
    check_spec(zimage::serve::parse_openai(r.body, limits(), 12345));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace zimage::serve;
  if (size < 1) return 0;
  const std::string_view input(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (data[0] & 3) {
    case 0:
      check_spec(parse_openai(input, limits(), 12345));
      break;
    case 1:
      check_spec(parse_a1111(input, limits(), 12345));
      break;
    case 2:
      check_http(input);
      break;
    default: {
      auto parts = http::parse_multipart(input, "B");
      if (parts.ok())
        check_form(*parts);
      else if (parts.status().message().rfind("body: malformed multipart/form-data", 0) != 0)
        std::abort();
      break;
    }
  }
  return 0;
}

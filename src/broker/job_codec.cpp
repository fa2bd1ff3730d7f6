// See job_codec.h.
#include "broker/job_codec.h"

#include <charconv>
#include <nlohmann/json.hpp>

#include "zimage/request_check.h"

namespace zimage::broker {

namespace {

using nlohmann::json;

bool parse_u64(const std::string& s, uint64_t* out) {
  if (s.empty()) return false;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && p == s.data() + s.size();
}

bool parse_i64(const std::string& s, int64_t* out) {
  if (s.empty()) return false;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && p == s.data() + s.size();
}

}  // namespace

std::string result_key(const std::string& prefix, const std::string& id) {
  return prefix + ":result:" + id;
}
std::string progress_key(const std::string& prefix, const std::string& id) {
  return prefix + ":progress:" + id;
}
std::string results_stream(const std::string& prefix) {
  return prefix + ":results";
}

Result<std::string> request_json(const GenerateRequest& req) {
  if (req.prompts.size() != 1)
    return InvalidArgument("prompt: a broker job has exactly one prompt, got " +
                           std::to_string(req.prompts.size()));
  // JSON has no NaN or infinity (nlohmann writes null, which parses as "absent"): refused here,
  // with the range the worker's parser applies (zimage/request_check.h).
  ZI_TRY(check_number("guidance_scale", req.guidance, kMinGuidance, kMaxGuidance));
  try {
    json j = {{"prompt", req.prompts.front()},
              {"size", std::to_string(req.width) + "x" + std::to_string(req.height)},
              {"num_inference_steps", req.steps},
              {"guidance_scale", req.guidance},
              {"seed", req.seed},
              {"n", req.images_per_prompt}};
    if (req.negative_prompt) j["negative_prompt"] = *req.negative_prompt;
    return j.dump();  // throws on invalid UTF-8
  } catch (const std::exception& e) {
    return InvalidArgument(std::string("prompt: cannot be encoded as JSON: ") + e.what());
  }
}

Result<std::string> job_request(const Fields& fields) {
  const std::string* found = nullptr;
  for (const auto& [k, v] : fields) {
    if (k != kRequestField) continue;
    if (found != nullptr) return InvalidArgument("job entry: more than one 'request' field");
    found = &v;
  }
  if (found == nullptr)
    return InvalidArgument("job entry: no 'request' field (the JSON request body)");
  return *found;
}

Result<serve::JobSpec> decode_job(const std::string& text, const serve::ParseLimits& limits,
                                  uint64_t random_seed) {
  ZI_ASSIGN_OR_RETURN(serve::JobSpec spec, serve::parse_openai(text, limits, random_seed));
  for (const GenerateRequest& r : spec.runs)
    if (!r.loras.empty())
      return InvalidArgument("loras: not supported by zimage worker (load LoRAs with --lora)");
  return spec;
}

uint64_t seed_from_id(const std::string& id) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : id) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

Fields encode_result(const JobResult& r) {
  Fields f;
  f.emplace_back("status", r.ok ? "ok" : "error");
  if (!r.ok) {
    f.emplace_back("error", r.error);
    f.emplace_back("error_code", r.error_code);
  }
  f.emplace_back("seed", std::to_string(r.seed));
  f.emplace_back("width", std::to_string(r.width));
  f.emplace_back("height", std::to_string(r.height));
  f.emplace_back("format", r.format);
  f.emplace_back("images", std::to_string(r.images.size()));
  for (size_t i = 0; i < r.images.size(); ++i)
    f.emplace_back("image:" + std::to_string(i), r.images[i]);
  f.emplace_back("timings", r.timings_json.empty() ? "{}" : r.timings_json);
  f.emplace_back("worker", r.worker);
  f.emplace_back("deliveries", std::to_string(r.deliveries));
  return f;
}

Result<JobResult> decode_result(const Fields& fields) {
  auto get = [&fields](const std::string& k) -> const std::string* {
    for (const auto& [key, v] : fields)
      if (key == k) return &v;
    return nullptr;
  };
  auto need = [&get](const std::string& k) -> Result<std::string> {
    const std::string* v = get(k);
    if (v == nullptr) return FormatError("job result: no '" + k + "' field");
    return *v;
  };
  JobResult r;
  ZI_ASSIGN_OR_RETURN(std::string status, need("status"));
  if (status != "ok" && status != "error")
    return FormatError("job result: status '" + status + "' is neither ok nor error");
  r.ok = status == "ok";
  if (!r.ok) {
    ZI_ASSIGN_OR_RETURN(r.error, need("error"));
    if (const std::string* c = get("error_code")) r.error_code = *c;
  }
  ZI_ASSIGN_OR_RETURN(std::string seed, need("seed"));
  if (!parse_u64(seed, &r.seed))
    return FormatError("job result: seed '" + seed + "' is not a number");
  for (auto [name, out] :
       {std::pair<const char*, int*>{"width", &r.width}, {"height", &r.height}}) {
    ZI_ASSIGN_OR_RETURN(std::string s, need(name));
    int64_t v = 0;
    if (!parse_i64(s, &v) || v < 0 || v > 1'000'000)
      return FormatError(std::string("job result: ") + name + " '" + s + "' is not a size");
    *out = static_cast<int>(v);
  }
  ZI_ASSIGN_OR_RETURN(r.format, need("format"));
  ZI_ASSIGN_OR_RETURN(std::string count, need("images"));
  int64_t n = 0;
  if (!parse_i64(count, &n) || n < 0 || n > 4096)
    return FormatError("job result: images '" + count + "' is not a count in 0..4096");
  if (r.ok && n == 0) return FormatError("job result: status ok without images");
  for (int64_t i = 0; i < n; ++i) {
    ZI_ASSIGN_OR_RETURN(std::string img, need("image:" + std::to_string(i)));
    r.images.push_back(std::move(img));
  }
  if (const std::string* t = get("timings")) r.timings_json = *t;
  if (const std::string* w = get("worker")) r.worker = *w;
  if (const std::string* d = get("deliveries"); d != nullptr && !parse_i64(*d, &r.deliveries))
    return FormatError("job result: deliveries '" + *d + "' is not a number");
  return r;
}

std::string encode_progress(const Progress& p, const std::string& worker) {
  json j = {{"phase", phase_name(p.phase)},
            {"step", p.step},
            {"total", p.total},
            {"elapsed_s", p.elapsed_s},
            {"worker", worker}};
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

Result<Progress> decode_progress(const std::string& text) {
  const json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return FormatError("progress: not a JSON object");
  Progress p;
  const auto phase = j.find("phase");
  if (phase == j.end() || !phase->is_string()) return FormatError("progress: no phase");
  const std::string name = phase->get<std::string>();
  bool known = false;
  for (Phase ph :
       {Phase::kTokenize, Phase::kTextEncoder, Phase::kDenoise, Phase::kVae, Phase::kVaeEncode})
    if (name == phase_name(ph)) {
      p.phase = ph;
      known = true;
    }
  if (!known) return FormatError("progress: unknown phase '" + name + "'");
  for (auto [k, out] : {std::pair<const char*, int*>{"step", &p.step}, {"total", &p.total}}) {
    const auto v = j.find(k);
    if (v == j.end() || !v->is_number_integer())
      return FormatError(std::string("progress: no ") + k);
    const int64_t x = v->get<int64_t>();
    if (x < 0 || x > 1'000'000) return FormatError(std::string("progress: ") + k + " out of range");
    *out = static_cast<int>(x);
  }
  const auto e = j.find("elapsed_s");
  if (e != j.end() && e->is_number()) p.elapsed_s = e->get<double>();
  return p;
}

}  // namespace zimage::broker

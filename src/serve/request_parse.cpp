// Request parsing and validation (see request_parse.h). The order of checks: JSON syntax (strict:
// no duplicate keys, bounded depth, valid UTF-8), the body is an object, each known field's type
// and range under the client's name, then the engine's model-free checks as a backstop.
#include "serve/request_parse.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>

#include "serve/api_error.h"
#include "serve/lora_request.h"
#include "serve/request_images.h"
#include "zimage/json.h"

namespace zimage::serve {

namespace {

using nlohmann::json;

const char* type_of(const json& v) {
  return json_util::type_name(v);
}

// The value of `key`, or nullptr when absent or null.
const json* field(const json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

// An integer field in [min, max]; integral floats (8.0) are accepted, other numbers are not.
Status get_int(const json& obj, const char* key, int64_t min, int64_t max, int64_t* out) {
  const json* v = field(obj, key);
  if (v == nullptr) return Status::Ok();
  const std::string k(key);
  int64_t x = 0;
  if (v->is_number_unsigned()) {
    const uint64_t u = v->get<uint64_t>();
    if (u > static_cast<uint64_t>(max))
      return InvalidArgument(k + ": " + std::to_string(u) + " is outside " + std::to_string(min) +
                             ".." + std::to_string(max));
    x = static_cast<int64_t>(u);
  } else if (v->is_number_integer()) {
    x = v->get<int64_t>();
  } else if (v->is_number_float()) {
    const double d = v->get<double>();
    if (!std::isfinite(d)) return InvalidArgument(k + ": must be a finite integer");
    if (d != std::floor(d)) return InvalidArgument(k + ": must be an integer, got a fraction");
    if (d < static_cast<double>(min) || d > static_cast<double>(max))
      return InvalidArgument(k + ": " + json(d).dump() + " is outside " + std::to_string(min) +
                             ".." + std::to_string(max));
    x = static_cast<int64_t>(d);
  } else {
    return InvalidArgument(k + ": must be an integer, got " + type_of(*v));
  }
  if (x < min || x > max)
    return InvalidArgument(k + ": " + std::to_string(x) + " is outside " + std::to_string(min) +
                           ".." + std::to_string(max));
  *out = x;
  return Status::Ok();
}

Status get_int(const json& obj, const char* key, int64_t min, int64_t max, int* out) {
  int64_t v = *out;
  ZI_TRY(get_int(obj, key, min, max, &v));
  *out = static_cast<int>(v);
  return Status::Ok();
}

// A finite number in [min, max] (the library's rule, zimage/request_check.h), checked as the double
// given, before it is narrowed to a float.
Status get_number(const json& obj, const char* key, double min, double max, float* out) {
  const json* v = field(obj, key);
  if (v == nullptr) return Status::Ok();
  const std::string k(key);
  if (!v->is_number()) return InvalidArgument(k + ": must be a number, got " + type_of(*v));
  const double d = v->get<double>();
  if (!std::isfinite(d)) return InvalidArgument(k + ": must be a finite number");
  ZI_TRY(check_number(k, d, min, max));
  *out = static_cast<float>(d);
  return Status::Ok();
}

// A finite number in (0, 1] kept as a double (strength: Python multiplies it in double).
Status get_strength(const json& obj, const char* key, std::optional<double>* out) {
  const json* v = field(obj, key);
  if (v == nullptr) return Status::Ok();
  const std::string k(key);
  if (!v->is_number()) return InvalidArgument(k + ": must be a number, got " + type_of(*v));
  const double d = v->get<double>();
  if (!std::isfinite(d) || !(d > 0.0) || d > 1.0)
    return InvalidArgument(k + ": must be in (0, 1], got " + v->dump());
  *out = d;
  return Status::Ok();
}

// A UTF-8 string (the JSON parser already rejected invalid UTF-8); NUL bytes and the byte cap are
// checked here so the message names the field before the engine sees it.
Status get_string(const json& obj, const char* key, size_t max_bytes, bool required,
                  std::string* out, bool* present = nullptr) {
  const json* v = field(obj, key);
  const std::string k(key);
  if (v == nullptr) {
    if (required) return InvalidArgument(k + ": is required");
    return Status::Ok();
  }
  if (!v->is_string()) return InvalidArgument(k + ": must be a string, got " + type_of(*v));
  const std::string& s = v->get_ref<const std::string&>();
  if (s.size() > max_bytes)
    return InvalidArgument(k + ": " + std::to_string(s.size()) + " bytes exceeds the " +
                           std::to_string(max_bytes) + "-byte limit");
  const std::string problem = text_problem(s);
  if (!problem.empty()) return InvalidArgument(k + ": " + problem);
  *out = s;
  if (present != nullptr) *present = true;
  return Status::Ok();
}

// "seed": absent, null or -1 -> random; else an integer in 0..2^64-1.
Status get_seed(const json& obj, uint64_t random_seed, uint64_t* seed, bool* random) {
  const json* v = field(obj, "seed");
  *random = true;
  *seed = random_seed;
  if (v == nullptr) return Status::Ok();
  if (v->is_number_unsigned()) {
    *seed = v->get<uint64_t>();
    *random = false;
    return Status::Ok();
  }
  if (v->is_number_integer()) {  // a signed JSON integer: written with a minus sign
    const int64_t x = v->get<int64_t>();
    if (x == -1) return Status::Ok();
    if (x == 0) {  // "-0" is 0 (as -0.0 below)
      *seed = 0;
      *random = false;
      return Status::Ok();
    }
    return InvalidArgument("seed: " + std::to_string(x) +
                           " is outside 0..18446744073709551615 (-1 = random)");
  }
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (d == -1.0) return Status::Ok();
    // Integral doubles are exact only up to 2^53; past that the client's number was rounded.
    if (std::isfinite(d) && d == std::floor(d) && d >= 0 && d <= 9007199254740992.0) {
      *seed = static_cast<uint64_t>(d);
      *random = false;
      return Status::Ok();
    }
    return InvalidArgument(
        "seed: must be an integer in 0..18446744073709551615 (-1 = random), got " +
        v->dump(-1, ' ', false, json::error_handler_t::replace));
  }
  return InvalidArgument(std::string("seed: must be an integer (-1 = random), got ") + type_of(*v));
}

// Finds which top-level field a JSON syntax error sits in, so the 400 can name it: nlohmann's
// SAX parser reports each key, and the error (or a number too large for a double, JSON's only
// way to say "infinity") arrives while that key's value is being read.
class FieldLocator : public nlohmann::json_sax<json> {
 public:
  std::string field;  // set when the error was inside a top-level field's value

  bool null() override { return value(); }
  bool boolean(bool) override { return value(); }
  bool number_integer(number_integer_t) override { return value(); }
  bool number_unsigned(number_unsigned_t) override { return value(); }
  bool number_float(number_float_t v, const string_t&) override {
    if (!std::isfinite(v)) return fail();
    return value();
  }
  bool string(string_t&) override { return value(); }
  bool binary(binary_t&) override { return value(); }
  bool start_object(std::size_t) override {
    ++depth_;
    return depth_ <= json_util::kMaxJsonDepth;
  }
  bool key(string_t& k) override {
    if (depth_ == 1) {
      key_ = k;
      in_value_ = true;
    }
    return true;
  }
  bool end_object() override {
    --depth_;
    return value();
  }
  bool start_array(std::size_t) override {
    ++depth_;
    return depth_ <= json_util::kMaxJsonDepth;
  }
  bool end_array() override {
    --depth_;
    return value();
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return fail();
  }

 private:
  bool value() {
    if (depth_ == 1) in_value_ = false;
    return true;
  }
  bool fail() {
    if (in_value_) field = key_;
    return false;
  }
  int depth_ = 0;
  bool in_value_ = false;
  std::string key_;
};

std::string field_at_error(std::string_view body) {
  try {
    FieldLocator loc;
    json::sax_parse(body.data(), body.data() + body.size(), &loc, json::input_format_t::json,
                    /*strict=*/true);
    if (loc.field.empty() || loc.field.size() > 64) return "";
    for (char c : loc.field)  // only plain names make a "param"
      if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'))
        return "";
    return loc.field;
  } catch (...) {
    return "";
  }
}

Status parse_body(std::string_view body, json* out) {
  if (body.empty()) return InvalidArgument("body: empty; expected a JSON object");
  auto parsed = json_util::parse_strict(body, "body");
  if (!parsed.ok()) {
    // An error inside a field's value (invalid UTF-8 in the prompt, 1e400 as guidance) names
    // that field; other syntax errors are the body's.
    const std::string& m = parsed.status().message();
    const std::string key = body.find('\0') == std::string_view::npos ? field_at_error(body) : "";
    if (!key.empty()) return InvalidArgument(key + ": invalid value (" + m + ")");
    return InvalidArgument(m);
  }
  if (!parsed->is_object())
    return InvalidArgument(std::string("body: must be a JSON object, got ") + type_of(*parsed));
  *out = std::move(parsed).value();
  return Status::Ok();
}

Status parse_size(const json& obj, int* width, int* height) {
  const json* v = field(obj, "size");
  if (v == nullptr) return Status::Ok();
  if (!v->is_string())
    return InvalidArgument(std::string("size: must be a string, got ") + type_of(*v));
  const std::string& s = v->get_ref<const std::string&>();
  if (s == "auto") return Status::Ok();
  const size_t x = s.find('x');
  auto digits = [](std::string_view d) {
    if (d.empty() || d.size() > 6) return false;
    for (char c : d)
      if (c < '0' || c > '9') return false;
    return true;
  };
  if (x == std::string::npos || !digits(std::string_view(s).substr(0, x)) ||
      !digits(std::string_view(s).substr(x + 1)))
    return InvalidArgument("size: expected \"WIDTHxHEIGHT\" such as \"1024x1024\", got \"" +
                           json_util::printable(s.substr(0, 40)) + "\"");
  *width = std::stoi(s.substr(0, x));
  *height = std::stoi(s.substr(x + 1));
  return Status::Ok();
}

Status check_fields(const json& obj, const std::set<std::string>& known) {
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    if (known.count(it.key()) != 0) continue;
    // A plain name is the error's field ("steps: unknown field"); any other key is shown quoted
    // (and made printable) as a problem of the body, so "param" is always a clean name.
    const std::string named = it.key() + ": unknown field";
    if (!field_of(named).empty() && field_of(named).size() == it.key().size())
      return InvalidArgument(named);
    return InvalidArgument("body: unknown field \"" + json_util::printable(it.key().substr(0, 64)) +
                           "\"");
  }
  return Status::Ok();
}

// The dialects' names of the GenerateRequest fields whose names differ in one of them (the
// prompts[i] take "prompt" in both).
struct FieldNames {
  const char* engine;
  const char* openai;
  const char* a1111;
};
constexpr FieldNames kFieldNames[] = {{"width", "size", "width"},
                                      {"height", "size", "height"},
                                      {"steps", "num_inference_steps", "steps"},
                                      {"guidance", "guidance_scale", "cfg_scale"},
                                      {"images_per_prompt", "n", "batch_size"},
                                      {"init_image", "image", "init_images"},
                                      {"strength", "strength", "denoising_strength"}};

// The client's name of the engine's `field` in `dialect`; empty when it has none of its own.
std::string client_name(const std::string& field, Dialect dialect) {
  if (field.rfind("prompts[", 0) == 0) return "prompt";
  for (const FieldNames& n : kFieldNames)
    if (field == n.engine) return dialect == Dialect::kOpenAi ? n.openai : n.a1111;
  return "";
}

// "prompt" (required, not empty) and "negative_prompt" (optional): the same in both dialects.
Status get_prompts(const json& obj, size_t max_bytes, GenerateRequest* req) {
  std::string prompt;
  ZI_TRY(get_string(obj, "prompt", max_bytes, true, &prompt));
  if (prompt.empty()) return InvalidArgument("prompt: must not be empty");
  req->prompts = {prompt};
  std::string negative;
  bool has_negative = false;
  ZI_TRY(get_string(obj, "negative_prompt", max_bytes, false, &negative, &has_negative));
  if (has_negative) req->negative_prompt = negative;
  return Status::Ok();
}

}  // namespace

const char* format_name(OutputFormat f) {
  switch (f) {
    case OutputFormat::kJpeg:
      return "jpeg";
    case OutputFormat::kWebp:
      return "webp";
    default:
      return "png";
  }
}

const char* mime_type(OutputFormat f) {
  switch (f) {
    case OutputFormat::kJpeg:
      return "image/jpeg";
    case OutputFormat::kWebp:
      return "image/webp";
    default:
      return "image/png";
  }
}

int JobSpec::images() const {
  int n = 0;
  for (const GenerateRequest& r : runs)
    n += static_cast<int>(r.prompts.size()) * r.images_per_prompt;
  return n;
}

int JobSpec::total_steps() const {
  int n = 0;
  for (const GenerateRequest& r : runs) n += denoising_steps(r);
  return n;
}

Status rename_fields(const Status& st, Dialect dialect) {
  const std::optional<std::string> rest = st.field_detail();
  if (!rest) return st;  // no field, or a context put before it: the message stays as it is
  const std::string& f = st.field();
  const std::string to = client_name(f, dialect);
  if (to.empty()) return st;
  // OpenAI's one "size" says which side: "size: width 1000 exceeds the limit 512".
  const bool side = (f == "width" || f == "height") && to != f;
  return Status(st.code(), to + ": " + (side ? f + " " : "") + *rest).with_field(to);
}

namespace {

// The OpenAI Images fields of `obj` (a JSON body, or an edits form made into one). `req` may
// already hold an init image (edits): then "strength" is known too and the default size is the
// image's.
Result<JobSpec> openai_spec(const json& obj, const ParseLimits& lim, uint64_t random_seed,
                            GenerateRequest req) {
  static const std::set<std::string> kKnown = {
      "prompt", "n", "size", "response_format", "output_format", "output_compression",
      "negative_prompt", "num_inference_steps", "guidance_scale", "seed", "loras",
      "preview",  // live previews in the job's event stream (docs/SERVER.md)
      // OpenAI fields accepted and ignored:
      "model", "quality", "style", "user", "background", "moderation"};
  std::set<std::string> known = kKnown;
  if (req.init_image) known.insert({"strength", "input_fidelity"});
  if (req.control_image) known.insert("control_scale");
  ZI_TRY(check_fields(obj, known));
  const size_t max_bytes = lim.request.max_prompt_bytes;
  JobSpec spec;
  spec.dialect = Dialect::kOpenAi;
  ZI_TRY(get_prompts(obj, max_bytes, &req));
  ZI_TRY(parse_lora_field(obj, &req.loras));  // names; admit() resolves them (lora_request.h)
  ZI_TRY(get_int(obj, "n", 1, lim.request.max_batch, &req.images_per_prompt));
  req.width = lim.default_width;
  req.height = lim.default_height;
  if (req.init_image)
    ZI_TRY(
        default_size(*req.init_image, lim.request.size_multiple, "image", &req.width, &req.height));
  ZI_TRY(parse_size(obj, &req.width, &req.height));
  if (req.init_image && !req.control_image) ZI_TRY(get_strength(obj, "strength", &req.strength));
  ZI_TRY(get_number(obj, "control_scale", -kMaxControlScale, kMaxControlScale, &req.control_scale));
  req.steps = lim.default_steps;
  ZI_TRY(get_int(obj, "num_inference_steps", 1, lim.request.max_steps, &req.steps));
  ZI_TRY(get_number(obj, "guidance_scale", kMinGuidance, kMaxGuidance, &req.guidance));
  ZI_TRY(get_seed(obj, random_seed, &req.seed, &spec.random_seed));
  for (const char* k :
       {"model", "quality", "style", "user", "background", "moderation", "input_fidelity"}) {
    const json* v = field(obj, k);
    if (v != nullptr && !v->is_string())
      return InvalidArgument(std::string(k) + ": must be a string, got " + type_of(*v));
  }
  std::string s;
  bool present = false;
  ZI_TRY(get_string(obj, "response_format", 64, false, &s, &present));
  if (present) {
    if (s == "b64_json")
      spec.response_format = ResponseFormat::kB64Json;
    else if (s == "url")
      spec.response_format = ResponseFormat::kUrl;
    else
      return InvalidArgument("response_format: must be \"b64_json\" or \"url\"");
  }
  present = false;
  ZI_TRY(get_string(obj, "output_format", 64, false, &s, &present));
  if (present) {
    if (s == "png")
      spec.output_format = OutputFormat::kPng;
    else if (s == "jpeg" || s == "jpg")
      spec.output_format = OutputFormat::kJpeg;
    else if (s == "webp")
      spec.output_format = OutputFormat::kWebp;
    else
      return InvalidArgument("output_format: must be \"png\", \"jpeg\" or \"webp\"");
  }
  ZI_TRY(get_int(obj, "output_compression", 0, 100, &spec.quality));
  if (const json* v = field(obj, "preview"); v != nullptr && !v->is_null()) {
    if (!v->is_boolean())
      return InvalidArgument(std::string("preview: must be true or false, got ") + type_of(*v));
    spec.preview = v->get<bool>();
  }
  ZI_TRY(rename_fields(check_request(req, lim.request), Dialect::kOpenAi));
  spec.runs = {std::move(req)};
  return spec;
}

// The ControlNet extension's unit in an A1111 body ("alwayson_scripts": {"controlnet": {"args":
// [{"image" (or "input_image"): base64, "weight": scale, "enabled": bool, ...}]}}): the engine's
// ControlNet (--controlnet) reads the image; "model", "module" and the other unit fields are
// ignored (no preprocessor runs: the image is the condition as given). One enabled unit at most.
Status a1111_controlnet(const json& obj, GenerateRequest* req) {
  const json* scripts = field(obj, "alwayson_scripts");
  if (scripts == nullptr || !scripts->is_object()) return Status::Ok();
  const json* cn = field(*scripts, "controlnet");
  if (cn == nullptr) cn = field(*scripts, "ControlNet");
  if (cn == nullptr) return Status::Ok();
  const json* args = cn->is_object() ? field(*cn, "args") : nullptr;
  if (args == nullptr || !args->is_array())
    return InvalidArgument("alwayson_scripts.controlnet.args: must be an array of units");
  const json* unit = nullptr;
  for (const json& u : *args) {
    if (!u.is_object())
      return InvalidArgument("alwayson_scripts.controlnet.args: each unit must be an object");
    const json* en = field(u, "enabled");
    if (en != nullptr && !en->is_boolean())
      return InvalidArgument("alwayson_scripts.controlnet.args[].enabled: must be a boolean");
    if (en != nullptr && !en->get<bool>()) continue;
    if (unit != nullptr)
      return InvalidArgument("alwayson_scripts.controlnet.args: one enabled unit at most");
    unit = &u;
  }
  if (unit == nullptr) return Status::Ok();
  const json* img = field(*unit, "image");
  if (img == nullptr) img = field(*unit, "input_image");
  if (img == nullptr || !img->is_string())
    return InvalidArgument("alwayson_scripts.controlnet.args[].image: a base64 image is required");
  ZI_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes,
                      base64_decode(img->get_ref<const std::string&>(), "control_image"));
  ZI_ASSIGN_OR_RETURN(req->control_image, decode_request_image(bytes, "control_image"));
  req->control_scale = 1.0f;  // the extension's default weight
  return get_number(*unit, "weight", -100.0, 100.0, &req->control_scale);
}

// The A1111 fields of `obj`; `req` may already hold an init image (img2img).
Result<JobSpec> a1111_spec(const json& obj, const ParseLimits& lim, uint64_t random_seed,
                           GenerateRequest req) {
  const size_t max_bytes = lim.request.max_prompt_bytes;
  JobSpec spec;
  spec.dialect = Dialect::kA1111;
  ZI_TRY(get_prompts(obj, max_bytes, &req));
  ZI_TRY(parse_lora_field(obj, &req.loras));
  ZI_TRY(take_prompt_loras(&req.prompts.front(), &req.loras));  // <lora:name:0.8>
  if (req.loras.size() > kMaxLorasPerRequest)
    return InvalidArgument("loras: more than " + std::to_string(kMaxLorasPerRequest) + " LoRAs");
  req.width = lim.default_width;
  req.height = lim.default_height;
  if (req.init_image)
    ZI_TRY(default_size(*req.init_image, lim.request.size_multiple, "init_images", &req.width,
                        &req.height));
  const int64_t side = lim.request.max_side;
  ZI_TRY(get_int(obj, "width", 1, side, &req.width));
  ZI_TRY(get_int(obj, "height", 1, side, &req.height));
  req.steps = lim.default_steps;
  ZI_TRY(get_int(obj, "steps", 1, lim.request.max_steps, &req.steps));
  ZI_TRY(get_number(obj, "cfg_scale", 0.0, 100.0, &req.guidance));
  ZI_TRY(get_seed(obj, random_seed, &req.seed, &spec.random_seed));
  int n_iter = 1;
  ZI_TRY(get_int(obj, "batch_size", 1, lim.request.max_batch, &req.images_per_prompt));
  ZI_TRY(get_int(obj, "n_iter", 1, lim.request.max_batch, &n_iter));
  if (req.images_per_prompt * n_iter > lim.request.max_batch)
    return InvalidArgument(
        "n_iter: batch_size x n_iter = " + std::to_string(req.images_per_prompt * n_iter) +
        " images exceeds the limit " + std::to_string(lim.request.max_batch));
  ZI_TRY(a1111_controlnet(obj, &req));
  // img2img without denoising_strength: A1111's default, 0.75. Not with a ControlNet unit: that
  // is ControlNet inpainting, which takes no strength (the engine refuses one, so an explicit
  // denoising_strength is still a 400 naming it, but an absent one must not be invented).
  if (req.init_image && !req.control_image && !req.strength) req.strength = 0.75;
  ZI_TRY(rename_fields(check_request(req, lim.request), Dialect::kA1111));
  // As A1111: iteration i uses seed + i * batch_size (wrapping past 2^64 - 1).
  for (int i = 0; i < n_iter; ++i) {
    GenerateRequest r = req;
    r.seed = req.seed + static_cast<uint64_t>(i) * static_cast<uint64_t>(req.images_per_prompt);
    spec.runs.push_back(std::move(r));
  }
  return spec;
}

}  // namespace

Result<JobSpec> parse_openai(std::string_view body, const ParseLimits& lim, uint64_t random_seed) {
  json obj;
  ZI_TRY(parse_body(body, &obj));
  return openai_spec(obj, lim, random_seed, GenerateRequest());
}

Result<JobSpec> parse_a1111(std::string_view body, const ParseLimits& lim, uint64_t random_seed) {
  json obj;
  ZI_TRY(parse_body(body, &obj));
  return a1111_spec(obj, lim, random_seed, GenerateRequest());
}

Result<JobSpec> parse_openai_edit(const std::vector<FormPart>& form, const ParseLimits& lim,
                                  uint64_t random_seed) {
  // Text fields become a JSON object for openai_spec; numbers are parsed from their text.
  static const std::set<std::string> kNumbers = {
      "n",        "num_inference_steps", "guidance_scale", "seed", "output_compression",
      "strength", "control_scale"};
  json obj = json::object();
  const FormPart* image = nullptr;
  const FormPart* mask = nullptr;
  const FormPart* control = nullptr;  // ControlNet inpainting: the control image
  for (const FormPart& p : form) {
    if (p.name == "control_image") {
      if (control != nullptr) return InvalidArgument("control_image: one file per request");
      control = &p;
      continue;
    }
    const bool is_image = p.name == "image" || p.name == "image[]";
    if (is_image || p.name == "mask") {
      const FormPart*& slot = is_image ? image : mask;
      if (slot != nullptr)
        return InvalidArgument(std::string(is_image ? "image" : "mask") + ": one file per request");
      slot = &p;
      continue;
    }
    if (obj.contains(p.name))
      return InvalidArgument(field_of(p.name + ": x") == p.name
                                 ? p.name + ": given twice"
                                 : "body: a form field is given twice");
    if (p.name == "preview") {  // a form's boolean: its text
      if (p.content != "true" && p.content != "false" && p.content != "1" && p.content != "0")
        return InvalidArgument("preview: must be true, false, 1 or 0, got \"" +
                               json_util::printable(p.content.substr(0, 40)) + "\"");
      obj[p.name] = p.content == "true" || p.content == "1";
    } else if (kNumbers.count(p.name) != 0) {
      json v = json::parse(p.content, nullptr, false);
      if (v.is_discarded() || !v.is_number())
        return InvalidArgument(p.name + ": must be a number, got \"" +
                               json_util::printable(p.content.substr(0, 40)) + "\"");
      obj[p.name] = v;
    } else {
      const std::string problem = text_problem(p.content);
      if (!problem.empty())
        return InvalidArgument((field_of(p.name + ": x") == p.name ? p.name : "body") + ": " +
                               problem);
      obj[p.name] = p.content;
    }
  }
  if (image == nullptr) return InvalidArgument("image: is required (a PNG, JPEG or WebP file)");
  GenerateRequest req;
  const std::vector<uint8_t> image_bytes(image->content.begin(), image->content.end());
  ZI_ASSIGN_OR_RETURN(req.init_image, decode_request_image(image_bytes, "image"));
  if (mask != nullptr) {
    const std::vector<uint8_t> mask_bytes(mask->content.begin(), mask->content.end());
    ZI_ASSIGN_OR_RETURN(req.mask, decode_openai_mask(mask_bytes, "mask"));
  }
  if (control != nullptr) {
    const std::vector<uint8_t> bytes(control->content.begin(), control->content.end());
    ZI_ASSIGN_OR_RETURN(req.control_image, decode_request_image(bytes, "control_image"));
  }
  return openai_spec(obj, lim, random_seed, std::move(req));
}

Result<JobSpec> parse_a1111_img2img(std::string_view body, const ParseLimits& lim,
                                    uint64_t random_seed) {
  json obj;
  ZI_TRY(parse_body(body, &obj));
  const json* images = field(obj, "init_images");
  if (images == nullptr) return InvalidArgument("init_images: is required (one base64 image)");
  if (!images->is_array() || images->size() != 1 || !(*images)[0].is_string())
    return InvalidArgument("init_images: must be an array of one base64 image");
  GenerateRequest req;
  ZI_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes,
                      base64_decode((*images)[0].get_ref<const std::string&>(), "init_images"));
  ZI_ASSIGN_OR_RETURN(req.init_image, decode_request_image(bytes, "init_images"));
  int invert = 0;
  ZI_TRY(get_int(obj, "inpainting_mask_invert", 0, 1, &invert));
  if (const json* m = field(obj, "mask"); m != nullptr) {
    if (!m->is_string())
      return InvalidArgument(std::string("mask: must be a base64 string, got ") + type_of(*m));
    ZI_ASSIGN_OR_RETURN(std::vector<uint8_t> mb,
                        base64_decode(m->get_ref<const std::string&>(), "mask"));
    ZI_ASSIGN_OR_RETURN(req.mask, decode_a1111_mask(mb, "mask", invert == 1));
  }
  int resize_mode = 0;
  ZI_TRY(get_int(obj, "resize_mode", 0, 3, &resize_mode));
  if (resize_mode != 0)
    return InvalidArgument(
        "resize_mode: only 0 (just resize: the image stretched to width x height) is "
        "supported");
  // Only a value the client sent here; A1111's default (0.75) is filled in by a1111_spec once it
  // knows there is no ControlNet unit (ControlNet inpainting has no strength).
  ZI_TRY(get_strength(obj, "denoising_strength", &req.strength));
  return a1111_spec(obj, lim, random_seed, std::move(req));
}

}  // namespace zimage::serve

// Per-request LoRAs in the server (zimage serve --lora-dir DIR): the request field
//   "loras": [{"name": "style.safetensors", "scale": 0.8}, ...]
// on the OpenAI-style and A1111 endpoints, A1111's prompt syntax <lora:style:0.8> (the tag is
// removed from the prompt; ".safetensors" is added to a name without it), and the names resolved
// to files inside the LoRA folder. Why names and not paths: a client must never make the server
// open a file of its choosing, so a name is a relative path of plain components (no "..", no
// absolute path, no backslash, no NUL), and the resolved file (symlinks followed) must still lie
// inside the folder. Parsing is pure (request_parse.h's rules); resolving reads the folder.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "serve/request_parse.h"
#include "zimage/status.h"
#include "zimage/zimage.h"

namespace zimage::serve {

inline constexpr size_t kMaxLorasPerRequest = 16;
inline constexpr double kMaxLoraScale = 16.0;  // |scale| at most this

// A name as a client may give it; the error names `field` ("loras[0].name: ...").
Status check_lora_name(const std::string& name, const std::string& field);

// The "loras" field of a request body (absent or null: none). Each entry an object with "name"
// (string) and optional "scale" (finite number, default 1); unknown keys are errors. A string
// value is parsed as JSON first (multipart forms carry it as text). The names go into
// LoraSpec::path, unresolved.
Status parse_lora_field(const nlohmann::json& obj, std::vector<LoraSpec>* out);

// A1111's <lora:NAME> and <lora:NAME:SCALE> tags: each one removed from `prompt` and appended to
// `out` (NAME without ".safetensors" gets it). A malformed tag is an error naming "prompt".
Status take_prompt_loras(std::string* prompt, std::vector<LoraSpec>* out);

// Replaces each run's LoRA names by the files' paths inside `lora_dir`. Errors (kInvalidArgument,
// naming "loras[i].name"): LoRAs asked of a server without a LoRA folder, a bad name, a file that
// does not exist, is not a regular file, or lies outside the folder.
Status resolve_lora_names(std::vector<GenerateRequest>& runs, const std::string& lora_dir);

// resolve_lora_names, then the engine's check of each run's files (key layouts, keys matching
// the transformer, shapes: Engine::check_loras), so a bad LoRA is a 400 before the job queues.
// Messages name the LoRA as the client did ("loras: style.safetensors: ..."), never the server's
// path.
Status check_request_loras(const Engine& engine, std::vector<GenerateRequest>& runs,
                           const std::string& lora_dir);

// GET /v1/loras: the .safetensors files under `lora_dir` (names relative to it, sizes), sorted;
// at most `max_files`. An empty list when there is no folder.
nlohmann::json list_loras(const std::string& lora_dir, size_t max_files = 10000);

}  // namespace zimage::serve

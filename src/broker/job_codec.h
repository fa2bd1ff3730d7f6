// What travels through Redis: a job (a stream entry), its progress and its result. Why its own
// file: this is the wire format other languages implement (docs/BROKER.md); it is pure (no
// network, no engine) and unit-tested. A job's request is the JSON body of the server's
// POST /v1/jobs (OpenAI Images fields), parsed and checked by the server's own parser
// (serve/request_parse.h), so the worker accepts exactly what the server accepts.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "serve/request_parse.h"
#include "zimage/status.h"
#include "zimage/zimage.h"

namespace zimage::broker {

using Fields = std::vector<std::pair<std::string, std::string>>;

// The stream entry's one field holding the request JSON.
inline constexpr const char* kRequestField = "request";

// Key names under a prefix ("zimage"): PREFIX:result:<id>, PREFIX:progress:<id>,
// PREFIX:results (the notification stream).
std::string result_key(const std::string& prefix, const std::string& id);
std::string progress_key(const std::string& prefix, const std::string& id);
std::string results_stream(const std::string& prefix);

// The OpenAI-style request body for `req` (prompt, negative_prompt, size, num_inference_steps,
// guidance_scale, seed, n): what `zimage submit` sends. One prompt only.
Result<std::string> request_json(const GenerateRequest& req);

// A stream entry's fields -> its request JSON text (exactly one "request" field).
Result<std::string> job_request(const Fields& fields);

// The request JSON -> a checked job, as the server's jobs endpoint parses it. A job without a
// seed (or with -1) gets `random_seed`. Per-request LoRAs are refused (a worker has no LoRA
// folder). Errors are kInvalidArgument naming the field.
Result<serve::JobSpec> decode_job(const std::string& request_json, const serve::ParseLimits& limits,
                                  uint64_t random_seed);

// A seed drawn from the entry id (FNV-1a), so that a redelivered job without a seed gets the
// same seed on every worker.
uint64_t seed_from_id(const std::string& id);

// One job's outcome, stored as the hash PREFIX:result:<id>.
struct JobResult {
  bool ok = false;
  std::string error;       // when !ok: what went wrong
  std::string error_code;  // when !ok: "invalid_argument", "poison", "internal", ...
  uint64_t seed = 0;
  int width = 0;
  int height = 0;
  std::string format = "png";       // png, jpeg or webp
  std::vector<std::string> images;  // encoded image files (bytes), in the engine's order
  std::string timings_json;         // {"total_s":..,"denoise_s":..,...} ("{}" when not run)
  std::string worker;               // the consumer that ran it
  int64_t deliveries = 0;           // the entry's delivery count when it finished
};

// Hash fields: status ("ok"/"error"), error, error_code, seed (decimal), width, height, format,
// images (count), image:0 .. image:N-1, timings (JSON), worker, deliveries.
Fields encode_result(const JobResult& r);
// The hash read back (HGETALL), every field checked (counts, numbers, the image fields present).
Result<JobResult> decode_result(const Fields& fields);

// Progress, stored as JSON under PREFIX:progress:<id>:
// {"phase":"denoise","step":3,"total":8,"elapsed_s":0.52,"worker":"host:12"}.
std::string encode_progress(const Progress& p, const std::string& worker);
Result<Progress> decode_progress(const std::string& text);

}  // namespace zimage::broker

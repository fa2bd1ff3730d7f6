// Small pieces every route uses: JSON and error responses, the handler guard that turns any
// exception into a JSON 500, request admission (validate -> job table -> queue), base URLs, and
// the server-wide hooks (API key, cross-origin refusal, access log, JSON bodies for errors that
// cpp-httplib produces itself such as 404 and 413).
#pragma once

#include <httplib.h>

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "serve/api_error.h"
#include "serve/context.h"

namespace zimage::serve {

void send_json(httplib::Response& res, int status, const nlohmann::json& body);
void send_error(httplib::Response& res, const ApiError& e);

// Wraps a handler: any exception becomes a JSON 500 (bad_alloc a 503); nothing escapes.
httplib::Server::Handler guard(std::function<void(const httplib::Request&, httplib::Response&)> f);

// Validates `spec` against the engine, makes the job and queues it. On failure fills `error`
// (400 naming the field, 429 when the queue is full, 503 while loading or stopping) and returns
// nullptr. `res` gets Retry-After on 429/503.
std::shared_ptr<Job> admit(ServeContext& ctx, JobSpec spec, httplib::Response& res,
                           ApiError* error);

// Parses a body with `parse` and admits it: the shared path of every generation endpoint.
using ParseFn = Result<JobSpec> (*)(std::string_view, const ParseLimits&, uint64_t);
std::shared_ptr<Job> parse_and_admit(ServeContext& ctx, ParseFn parse, const httplib::Request& req,
                                     httplib::Response& res);
// The same for a request that is not one JSON body (multipart forms): `make` builds the spec
// from the server's limits and a fresh random seed.
using SpecFn = std::function<Result<JobSpec>(const ParseLimits&, uint64_t)>;
std::shared_ptr<Job> make_and_admit(ServeContext& ctx, const SpecFn& make, httplib::Response& res);

// Responses that wait on a job (sync generations, SSE streams) each hold an HTTP thread; past
// http_threads - 8 of them a new one gets 503, so /healthz and short requests always find a thread.
// Returns false after sending that 503.
bool reserve_waiting_slot(ServeContext& ctx, httplib::Response& res);

// The synchronous generation endpoints' shared path: reserves a waiting slot, parses and admits
// the body, waits for the job to end. Returns the job when it succeeded; otherwise sends the error
// (503 for a job cancelled by shutdown) and returns nullptr.
std::shared_ptr<Job> generate_and_wait(ServeContext& ctx, ParseFn parse,
                                       const httplib::Request& req, httplib::Response& res);
std::shared_ptr<Job> generate_and_wait(ServeContext& ctx, const SpecFn& make,
                                       httplib::Response& res);

// Paths whose bodies carry images (multipart /v1/images/edits, A1111's img2img): they may be
// up to ServeOptions::max_image_body_bytes; every other body stays under max_body_bytes.
bool takes_image_body(const std::string& path);

// "http://host:port" as the client addressed us (from a well-formed Host header), else "".
std::string base_url(const httplib::Request& req);

// Constant-time comparison (no early exit on the first differing byte).
bool constant_time_equal(const std::string& a, const std::string& b);

// Installs the pre-routing checks, error handler, exception handler and access logger.
void install_hooks(httplib::Server& svr, ServeContext& ctx);

}  // namespace zimage::serve
